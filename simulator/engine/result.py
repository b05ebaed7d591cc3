"""The result of simulating one training step, and the metrics derived from it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Breakdown:
    """Where the critical stage's step time goes (seconds; they sum to ``step_time_s``)."""

    compute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    dp_comm_s: float            # exposed data-parallel reduction / FSDP gathers
    pp_comm_s: float            # waiting on pipeline sends
    bubble_s: float             # waiting on other stages
    optimizer_s: float
    interference_s: float       # compute slowed by communication running beside it
    overhead_s: float
    host_s: float = 0.0         # device waiting for the host to issue work (or, on a CPU
                                # device, the host's dispatch time itself)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class StageReport:
    stage: int
    layers: int
    peak_memory_bytes: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    workspace_bytes: float
    busy_s: float


@dataclass(frozen=True)
class Result:
    """One simulated step. Throughput counts ``global_batch * seq_len`` tokens per step.

    ``mfu``: model FLOPs (PaLM convention: full non-causal attention, no recompute) per
    second per GPU over the dense peak of the plan's precision; ``hfu`` counts the FLOPs
    the kernels execute (recompute included, causal attention halved).
    """

    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_memory_bytes: list[float]
    memory_capacity_bytes: float
    fits_in_memory: bool
    breakdown: Breakdown
    stages: list[StageReport]
    critical_stage: int
    num_microbatches: int
    n_gpus: int
    engine: str
    sim_wall_s: float = 0.0
    timeline: list[dict[str, Any]] = field(default_factory=list, repr=False, compare=False)
    notes: list[str] = field(default_factory=list)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["breakdown"] = self.breakdown.as_dict()
        if not timeline:
            d.pop("timeline")
        return d
