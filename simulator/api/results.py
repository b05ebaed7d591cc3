"""What the analyzer returns: ``BaselineMetrics`` (``analyze_model``) and ``Prediction``
(``predict_performance``). Both are frozen, typed, and turn into plain dicts for the
ledger and JSON."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .config import TrainingConfig


def _plain(v: Any) -> Any:
    if isinstance(v, TrainingConfig):
        return v.to_dict()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return getattr(v, "value", v)


class _Reported:
    """What both result kinds give: every field as plain data, and the headline metrics."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def metrics(self) -> dict[str, float | None]:
        return {"step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "samples_per_s": self.samples_per_s, "mfu": self.mfu,
                "peak_memory_gb": self.peak_memory_bytes_per_gpu / 1e9}


@dataclass(frozen=True)
class BaselineMetrics(_Reported):
    """A model on one configuration, before any tuning.

    ``flops_per_step``: model FLOPs (forward + backward) of one optimizer step over every
    GPU; ``arithmetic_intensity_flop_per_byte``: the step's FLOPs over its HBM bytes on one
    GPU, against ``ridge_flop_per_byte`` (peak FLOP/s over HBM bytes/s); ``roofline_class``:
    where most kernel time goes (compute-bound or memory-bound kernels);
    ``bottleneck``: the main time sink of the step (``compute``, a communication kind,
    ``pipeline-bubble`` ...), or the roofline class when compute dominates."""

    model: str
    kind: str                                   # "transformer" or "module"
    params_total: int
    params_active: int
    flops_per_step: float
    flops_per_token: float | None               # transformers only
    peak_memory_bytes_per_gpu: float
    memory_capacity_bytes: float
    fits_in_memory: bool
    arithmetic_intensity_flop_per_byte: float
    ridge_flop_per_byte: float
    roofline_class: str
    bottleneck: str
    step_time_s: float
    tokens_per_s_per_gpu: float | None          # transformers
    samples_per_s: float
    mfu: float | None
    config: TrainingConfig
    breakdown: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Prediction(_Reported):
    """One configuration simulated: step time, throughput, memory, and where the time
    goes (``breakdown``, seconds per step by kind)."""

    model: str
    config: TrainingConfig
    step_time_s: float
    samples_per_s: float
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_memory_bytes_per_gpu: float
    memory_capacity_bytes: float
    fits_in_memory: bool
    main_bottleneck: str
    breakdown: dict[str, float]
    engine: str
    details: dict[str, Any] = field(default_factory=dict, compare=False)
