"""``TrainingConfig``: the typed form of the ``config`` a user hands the analyzer.

A dict with the same keys is accepted everywhere a config is; unknown keys and values
of the wrong type raise ``InvalidInputError`` naming the key. One config serves both
kinds of model: transformers use the parallel-plan fields (``tp`` ... ``zero_stage``),
``torch.nn.Module`` s use ``input_shape`` / ``example_inputs`` and ``strategy``
(``ddp`` or ``fsdp``) with ``bucket_cap_mb``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ..boundary import limits as L
from ..boundary.values import check_float, check_int
from ..errors import InvalidInputError

_INT_FIELDS = ("n_gpus", "seq_len", "global_batch", "micro_batch", "tp", "pp", "dp", "cp",
               "ep", "vpp", "zero_stage", "dp_shard", "recompute_layers")
_INT_RANGES = {"seq_len": (1, L.MAX_SEQ_LEN), "global_batch": (1, L.MAX_BATCH),
               "micro_batch": (1, L.MAX_BATCH), "zero_stage": (0, 3), "vpp": (1, 4096),
               "dp_shard": (0, L.MAX_GPUS), "recompute_layers": (0, L.MAX_LAYERS)}
_ALIASES = {"gpus": "n_gpus", "batch_size": "global_batch", "sequence_length": "seq_len"}


@dataclass(frozen=True)
class TrainingConfig:
    """What to run: hardware, batch, precision and (optionally) the parallel layout.

    ``None`` means "not decided": the analyzer fills it (dp from the GPU count, a
    transformer's own ``seq_len``, ``global_batch = dp x micro_batch``)."""

    gpu: str = "h100-sxm"
    n_gpus: int = 1
    seq_len: int | None = None
    global_batch: int | None = None
    micro_batch: int = 1
    precision: str | None = None          # bf16 for transformers, fp32 for modules
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    zero_stage: int = 0
    dp_shard: int = 0                     # HSDP shard group (Plan.dp_shard); 0 = all of dp x cp
    recompute: str = "none"
    recompute_layers: int = 0             # with recompute "full": first N layers per chunk (0 all)
    sequence_parallel: bool = False
    schedule: str | None = None           # pipeline schedule (Plan.schedule); None: 1f1b/interleaved
    moe_dispatcher: str = "alltoall"      # MoE token dispatcher (Plan.moe_dispatcher): or "flex"
    strategy: str = "ddp"                 # modules: ddp or fsdp
    bucket_cap_mb: float | None = None    # modules, DDP: None = torch's 25 MiB
    input_shape: tuple[int, ...] | None = None
    input_dtype: str = "float32"          # dtype of the tensor built from input_shape
    example_inputs: Any = field(default=None, compare=False, repr=False)
    engine: str = "event"

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if v is None and name in ("seq_len", "global_batch", "dp"):
                continue
            lo, hi = _INT_RANGES.get(name, (1, L.MAX_GPUS))
            check_int(name, v, lo, hi)
        if not isinstance(self.gpu, str) or not self.gpu:
            raise InvalidInputError("gpu", self.gpu, "a GPU key such as h100-sxm")
        if self.strategy not in ("ddp", "fsdp"):
            raise InvalidInputError("strategy", self.strategy, "ddp or fsdp")
        if self.input_shape is not None:
            shape = tuple(self.input_shape) if isinstance(self.input_shape, (list, tuple)) else None
            if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
                raise InvalidInputError("input_shape", self.input_shape,
                                        "a tuple of positive integers, e.g. (32, 3, 224, 224)")
            object.__setattr__(self, "input_shape", shape)
        if self.bucket_cap_mb is not None:
            check_float("bucket_cap_mb", self.bucket_cap_mb, 0.0, 1e6, lo_open=True)
        for name in ("precision", "recompute", "engine", "input_dtype", "moe_dispatcher"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise InvalidInputError(name, v, "a string")
        if not isinstance(self.sequence_parallel, bool):
            raise InvalidInputError("sequence_parallel", self.sequence_parallel, "true or false")

    @classmethod
    def coerce(cls, config: "TrainingConfig | Mapping[str, Any] | None") -> "TrainingConfig":
        """A ``TrainingConfig`` from itself, a dict with its keys, or None (defaults)."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if not isinstance(config, Mapping):
            raise InvalidInputError("config", type(config).__name__,
                                    "a dict or a TrainingConfig (keys: " + ", ".join(KEYS) + ")")
        kw: dict[str, Any] = {}
        for k, v in config.items():
            key = _ALIASES.get(k, k)
            if key not in KEYS:
                raise InvalidInputError(f"config.{k}", v, "one of: " + ", ".join(KEYS))
            kw[key] = v
        return cls(**kw)

    def with_(self, **changes: Any) -> "TrainingConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (``example_inputs`` left out: tensors are not ledger material)."""
        out = {}
        for f in fields(self):
            if f.name == "example_inputs":
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


KEYS: tuple[str, ...] = tuple(f.name for f in fields(TrainingConfig))
