"""The regime of a prediction: the features along which the model's error changes.

Each feature is a short label (buckets, not raw numbers), so the learned table stays
readable and a new prediction finds validation rows "like it". ``UNKNOWN`` marks a
feature the caller does not know (e.g. ``simulate`` without a framework): the table then
ignores that feature instead of treating it as a mismatch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

from ..frameworks.defaults import canonical_framework
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec

UNKNOWN = "?"
FEATURES = ("gpu", "framework", "moe", "context", "size", "kernel", "scale")


@dataclass(frozen=True)
class Regime:
    """``gpu``: GPU family (``a100``, ``h100``, ...); ``framework``: training framework,
    canonical name (``megatron`` and ``megatron-lm`` are one framework); ``moe``: dense or
    moe; ``context``: sequence length bucket (``<=2k``, ``4k``, ``8k``, ``>8k``: the public
    rows end at 8k tokens, so longer contexts are a value no row has); ``size``: total
    parameters bucket (small models run small kernels and few micro-batches); ``kernel``:
    per-GPU GEMM width ``hidden / tp`` bucket; ``scale``: GPU count bucket."""

    gpu: str
    framework: str
    moe: str
    context: str
    size: str
    kernel: str
    scale: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def key(self) -> str:
        return " ".join(f"{f}={getattr(self, f)}" for f in FEATURES)

    @classmethod
    def from_dict(cls, d: Mapping[str, str]) -> "Regime":
        return cls(**{f: str(d.get(f, UNKNOWN)) for f in FEATURES})


def _bucket(v: float, edges: tuple[float, ...], labels: tuple[str, ...]) -> str:
    for edge, label in zip(edges, labels):
        if v <= edge:
            return label
    return labels[-1]


def gpu_family(gpu_key: str) -> str:
    """``a100-sxm-80gb`` -> ``a100``; ``h100-sxm`` -> ``h100``."""
    return gpu_key.lower().split("-")[0] or UNKNOWN


def regime_of(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
              framework: str | None = None) -> Regime:
    params = model.total_params()
    return Regime(
        gpu=gpu_family(cluster.gpu.key),
        framework=canonical_framework(framework or "") or UNKNOWN,   # one name per framework
        moe="moe" if model.moe is not None else "dense",
        context=_bucket(model.seq_len, (2048, 4096, 8192), ("<=2k", "4k", "8k", ">8k")),
        size=_bucket(params, (10e9, 100e9), ("<10B", "10-100B", ">100B")),
        kernel=_bucket(model.hidden / plan.tp, (1024, 2048), ("<=1k", "<=2k", ">2k")),
        scale=_bucket(cluster.n_gpus, (8, 64, 512), ("<=8", "<=64", "<=512", ">512")))
