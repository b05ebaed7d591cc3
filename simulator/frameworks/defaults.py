"""Framework defaults and mixed-precision conventions, loaded from ``frameworks.json``.

The JSON holds the facts and their sources; this module only gives them types. Loaded once
at import (a small file; no third-party imports).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..boundary.spellings import normalize

DATA = Path(__file__).with_name("frameworks.json")


@dataclass(frozen=True)
class FrameworkDefaults:
    """What a framework does when the source is silent, with the reason (``why``)."""

    attention: str
    dp_overlap: bool
    tp_overlap: bool
    sp_with_tp: bool | None          # None: not fixed by the framework; choose best feasible
    why: str
    pp_scatter_gather: bool = True
    pp_blocking_p2p: bool = True
    pp_rendezvous: bool = False            # DeepSpeed's pipeline engine (engine.ds_pipe)
    pp_blocking_p2p_without_vpp: bool = False   # blocking sends where there are no virtual
                                                # stages (Megatron-Core: batched p2p there)
    grad_nan_check: bool = False           # a norm of each gradient bucket before its reduce
    grad_accum_bytes_per_param: float = 0.0
    zero1_allreduce: bool = False
    dp_overlap_zero3: bool | None = None   # DP overlap under ZeRO-3 when it differs (DeepSpeed)
    dp_bucket_bytes: int = 0               # gradient bucket size (0: Megatron-Core's default)
    dp_bucket_first_chunk_only: bool = False   # buckets only on stage 0's first model chunk
    gpt_tied_embeddings: bool = False      # a GPT (GELU) model given by its dimensions ties
                                           # its input and output embeddings

    def dp_overlap_for(self, zero_stage: int) -> bool:
        """Whether gradient reduction overlaps backward at this ZeRO stage."""
        if zero_stage >= 3 and self.dp_overlap_zero3 is not None:
            return self.dp_overlap_zero3
        return self.dp_overlap

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FrameworkDefaults":
        return cls(**{k: v for k, v in d.items() if k != "source"}, why=d["source"])


@dataclass(frozen=True)
class CrossEntropyBytes:
    """Memory traffic of the loss, per logit (what it keeps: ``LossBytes``)."""

    fwd_bytes_per_logit: float
    bwd_bytes_per_logit: float
    kernels: int


@dataclass(frozen=True)
class Conventions:
    optimizer_traffic_mixed_bytes_per_param: float
    optimizer_traffic_fp32_bytes_per_param: float
    cross_entropy: CrossEntropyBytes


@dataclass(frozen=True)
class LossBytes:
    """Bytes per logit a cross-entropy implementation keeps for backward (``saved``) and
    holds on top of that at its own peak (``transient``), as fp32 copies plus copies in the
    logits' dtype (``logit_bytes``: 2 for 16-bit logits, 4 for fp32 models)."""

    saved_fp32: int
    saved_logit: int
    transient_fp32: int
    transient_logit: int
    why: str = ""

    def saved(self, logit_bytes: int) -> float:
        return 4.0 * self.saved_fp32 + logit_bytes * self.saved_logit

    def transient(self, logit_bytes: int) -> float:
        return 4.0 * self.transient_fp32 + logit_bytes * self.transient_logit


def _load_losses() -> dict[str, LossBytes]:
    data = json.loads(DATA.read_text())["loss_bytes_per_logit"]
    return {k: LossBytes(**{f: v for f, v in d.items() if f != "source"}, why=d["source"])
            for k, d in data.items() if not k.startswith("_")}


LOSS_BYTES = _load_losses()


@dataclass(frozen=True)
class EagerTraffic:
    """One eager elementwise op per element: bytes moved and kernels launched forward and
    backward, bytes autograd saves (``frameworks.json`` "eager_elementwise")."""

    fwd_bytes: float
    bwd_bytes: float
    fwd_kernels: int
    bwd_kernels: int
    saved_bytes: float


def _load_eager() -> dict[str, EagerTraffic]:
    data = json.loads(DATA.read_text())["eager_elementwise"]
    return {k: EagerTraffic(**v) for k, v in data.items() if isinstance(v, dict)}


EAGER = _load_eager()
LOSSES = tuple(LOSS_BYTES)
BUCKETS = ("views", "copies", "ipg")
PRECISIONS = ("bf16", "fp16", "fp8")


PARAM_LAYOUTS = ("fused", "split", "hf")

@dataclass(frozen=True)
class FrameworkMemory:
    """What a framework keeps in GPU memory (``frameworks.json`` "memory"; field meanings in
    its ``_doc``). Values are checked on load so a typo fails at import, not mid-run."""

    name: str
    zero_stage: int
    params: str                              # "16-bit" or "fp32"
    master_weights: bool
    grad_dtype: Mapping[str, str]            # precision -> "fp32" or "16-bit"
    optimizer_state: str                     # "fp32" or "param"
    optimizer_grad_copy: bool
    fp8_weight_copy_bytes_per_param: float
    loss: str
    fused_swiglu: bool
    dropout: bool
    dp_buckets: str
    why: str
    extra_16bit_grads: tuple[str, ...] = ()  # precisions with a 16-bit .grad beside fp32 grads
    optimizer_foreach: bool = False
    optimizer_step_passes: float = 0.0       # tensor passes of an unfused step (0: fused)
    dp_bucket_buffer_elements: float = 0.0
    fsdp_prefetch_layers: int = 1
    fsdp_root_resharded: bool = False
    fsdp_embedding_unit: bool = False        # the embedding is its own FSDP unit (torchtitan)
    fsdp_reduce_fp32: bool = False           # FSDP reduce-scatters gradients in fp32
    fsdp_pp_once_per_step: bool = False      # with PP, FSDP gathers / reduces once per step
    optimizer_offload: bool = False
    fp8_primary_weights: bool = False
    moe_weighted_activation: bool = False    # MoE probabilities applied in the activation
    eager_elementwise: bool = False          # the model code's norms, RoPE, SwiGLU run eagerly
    # whose model code: "" = transformers' modules, else the prefix of its own "<code>:<op>"
    # rows in "eager_elementwise" (ops without such a row move what transformers' do)
    eager_code: str = ""
    # what Recompute.SELECTIVE re-runs: "attention" (Megatron's core attention) or "op"
    # (torchtitan's op-level SAC: simulator.workload.sac)
    selective_recompute: str = "attention"
    # the model code's Linear modules, which per-tensor and per-Linear-call host costs count
    # (``cost.host.ParamLayout``): "fused" (the op graph's: Megatron's fused qkv and gate/up
    # modules), "split" (its own Llama code: one Linear per projection), "hf" (the model's
    # own transformers code, as ``TransformerSpec.split_qkv`` / ``split_gate_up`` say)
    param_layout: str = "fused"
    # full recompute through torch's non-reentrant checkpoint, whose early stop re-runs a
    # layer's forward only up to its last saved tensor (engine.recompute.early_stopped)
    recompute_early_stop: bool = False
    # ZeRO-3 keeps a layer's gathered parameters from its forward to its backward when fewer
    # than this many parameter elements are fetched in between (DeepSpeed's
    # stage3_max_reuse_distance; memory.accounting.zero3_kept_layers); 0: always released
    zero3_reuse_window_params: float = 0.0
    # at ZeRO-3 every Linear is an autograd Function (DeepSpeed's memory-efficient linear)
    zero3_linear_function: bool = False
    # ZeRO-3 keeps whole on every rank each parameter tensor of at most this many elements
    # per hidden unit (DeepSpeed's stage3_param_persistence_threshold over the hidden size;
    # ``cost.persistence``); 0: none
    zero3_persistence_threshold_hidden: float = 0.0
    # DeepSpeed ZeRO-3's all-gathers take the next partitioned tensors until they hold this
    # many elements per hidden^2 (stage3_prefetch_bucket_size), its reduce-scatters one ipg
    # bucket of this many (reduce_bucket_size); a prefetch bucket of 0: one of each per FSDP
    # unit
    zero3_prefetch_bucket_hidden2: float = 0.0
    zero3_reduce_bucket_hidden2: float = 0.0

    def __post_init__(self) -> None:
        checks = (("zero_stage", self.zero_stage in (0, 1, 2, 3)),
                  ("params", self.params in ("16-bit", "fp32")),
                  ("grad_dtype", set(self.grad_dtype) == set(PRECISIONS)
                   and set(self.grad_dtype.values()) <= {"fp32", "16-bit"}),
                  ("optimizer_state", self.optimizer_state in ("fp32", "param")),
                  ("loss", self.loss in LOSSES), ("dp_buckets", self.dp_buckets in BUCKETS),
                  ("extra_16bit_grads", set(self.extra_16bit_grads) <= set(PRECISIONS)),
                  ("selective_recompute", self.selective_recompute in ("attention", "op")),
                  ("param_layout", self.param_layout in PARAM_LAYOUTS),
                  ("eager_code", not self.eager_code
                   or any(k.startswith(f"{self.eager_code}:") for k in EAGER)))
        bad = [k for k, ok in checks if not ok]
        if bad:
            raise ValueError(f"frameworks.json memory.{self.name}: invalid {', '.join(bad)}")

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> "FrameworkMemory":
        kw = {k: v for k, v in d.items() if k != "source"}
        kw["extra_16bit_grads"] = tuple(kw.get("extra_16bit_grads", ()))
        return cls(name=name, why=d["source"], **kw)


def _strip(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "source"}


def _public(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def _load_memory() -> tuple[dict[str, str], dict[str, FrameworkMemory]]:
    data = json.loads(DATA.read_text())
    aliases = _public(data["aliases"])
    mem = {k: FrameworkMemory.from_dict(k, v) for k, v in _public(data["memory"]).items()}
    return aliases, mem


def _load() -> tuple[dict[str, FrameworkDefaults], FrameworkDefaults, Conventions]:
    data = json.loads(DATA.read_text())
    fws = {k: FrameworkDefaults.from_dict(v) for k, v in data["frameworks"].items()}
    c = data["conventions"]
    traffic = c["optimizer_step_traffic_bytes_per_param"]
    conv = Conventions(float(traffic["mixed"]), float(traffic["fp32"]),
                       CrossEntropyBytes(**_strip(c["cross_entropy"])))
    return fws, FrameworkDefaults.from_dict(data["default_framework"]), conv


FRAMEWORKS, DEFAULT_FRAMEWORK, CONVENTIONS = _load()
ALIASES, MEMORY = _load_memory()
SCHEDULES_MISSING: dict[str, dict[str, str]] = {
    k: dict(v) for k, v in _public(json.loads(DATA.read_text())["schedules_missing"]).items()}


def schedule_note(framework: str, schedule: str) -> str | None:
    """Why ``framework`` does not run ``schedule`` (``frameworks.json`` "schedules_missing"),
    or None when it does or nothing is recorded."""
    why = SCHEDULES_MISSING.get(canonical_framework(framework), {}).get(schedule)
    return f"{canonical_framework(framework)} does not implement schedule {schedule}: {why}" \
        if why else None


def canonical_framework(name: str) -> str:
    """The canonical spelling of a framework name ("megatron" -> "megatron-lm"); "" and
    unknown names are returned lower-cased and stripped, with ``_`` and spaces read as
    ``-`` (callers decide what unknown means)."""
    key = (name or "").strip().lower()
    if key in ALIASES:
        return ALIASES[key]
    key = normalize(key)
    return ALIASES.get(key, key)


ERAS: dict[str, str] = {k: v["successor"] for k, v in
                        _public(json.loads(DATA.read_text())["eras"]).items()}


def framework_for_hardware(name: str, fp8_gpu: bool, precision: str) -> str:
    """The framework whose defaults a run of ``name`` gets: its successor (``frameworks.json``
    "eras") when the run is on a GPU with FP8 tensor cores (``fp8_gpu``) or in FP8, which
    only the successor's code ran; else ``name`` unchanged."""
    successor = ERAS.get(canonical_framework(name))
    if successor and (fp8_gpu or str(precision).strip().lower().startswith("fp8")):
        return successor
    return name


def framework_names() -> list[str]:
    """Every name ``--framework`` accepts: the canonical ones and their aliases."""
    return sorted(k for k in set(MEMORY) | set(ALIASES) if k != "default")


def framework_memory(name: str) -> FrameworkMemory:
    """Memory conventions of ``name`` (any spelling); "" gives the "default" entry. Unknown
    names raise ``KeyError`` (the CLI turns it into an ``InvalidInputError``)."""
    key = canonical_framework(name)
    return MEMORY[key or "default"]


def framework_defaults(name: str) -> FrameworkDefaults:
    """Behaviour defaults (attention kernel, overlaps) of ``name`` under either spelling;
    ``DEFAULT_FRAMEWORK`` when the framework table has no entry."""
    key = (name or "").strip().lower()
    if key in FRAMEWORKS:
        return FRAMEWORKS[key]
    canon = canonical_framework(key)
    if canon in FRAMEWORKS:
        return FRAMEWORKS[canon]
    for k in FRAMEWORKS:
        if canonical_framework(k) == canon:
            return FRAMEWORKS[k]
    return DEFAULT_FRAMEWORK
