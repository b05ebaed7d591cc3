"""The result of simulating one training step, and the metrics derived from it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .memory_fit import MemoryVerdict


@dataclass(frozen=True)
class StageLoad:
    """The slowest stage's device seconds of work per step (``engine.balance``) and their
    split: ``compute_s``, exposed communication by group (``comm_s``), interference."""

    stage: int
    work_s: float
    compute_s: float
    comm_s: dict[str, float] = field(default_factory=dict)
    interference_s: float = 0.0
    critical_work_s: float = 0.0          # the critical stage's, the same way


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
    optimizer_step_bytes: float = 0.0     # transient of the optimizer step (peak: see memory)
    fp8_weight_copy_bytes: float = 0.0    # part of weights_bytes
    workspace_source: str = ""            # which transient sets workspace_bytes


@dataclass(frozen=True)
class Result:
    """One simulated step. Throughput counts ``global_batch * seq_len`` tokens per step.

    ``mfu``: model FLOPs per second per GPU over the dense peak of the plan's precision.
    Model FLOPs follow the PaLM convention (Chowdhery et al. 2022, appendix B): every
    matmul of forward and backward, attention counted in full (non-causal: each query
    against every key, or a whole window in a local layer), no recompute. ``hfu``: the
    same FLOPs plus those of forward ops re-run for activation recompute, in the same
    attention convention (Korthikanti et al. 2022's hardware FLOPs), so ``hfu >= mfu``,
    equal without recompute. Neither is what a causal flash kernel executes (about half
    of the attention FLOPs): on long sequences both can exceed what the kernels ran.
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
    # seconds per step each fabric tier ("scale-up", "pcie", "nic", "leaf-spine",
    # "spine-core") is busy for one rank of the critical stage, and the busiest one
    link_busy_s: dict[str, float] = field(default_factory=dict)
    busiest_link: str = ""
    memory_verdict: MemoryVerdict | None = None
    # the stage with the most work when it is not the critical one (``engine.balance``)
    slowest_stage: StageLoad | None = None

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["breakdown"] = self.breakdown.as_dict()
        if not timeline:
            d.pop("timeline")
        return d
