"""How evenly a pipeline's stages are loaded: each stage's device work per step, and what
the slowest one spends its time on.

The step's breakdown is the critical stage's, the one that finishes last (in 1F1B the
first stage, which runs the last backward). Where another stage has more work, the
critical stage's idle time is waiting on that one and the breakdown shows it as bubble:
DeepSeek-V3's first stage holds three dense layers, the others four MoE layers and the
last the output layer too. ``imbalance`` names the slowest stage and its split so a
report can say where the time goes.
"""
from __future__ import annotations

from ..parallel.plan import Plan
from ..parallel.schedule import chunk_share
from .result import StageLoad
from .stage_work import ChunkWork

# a stage is reported as the bottleneck when its work exceeds the critical stage's by this
# share (below it the difference is within the fill/drain the breakdown already shows)
IMBALANCE_SHARE = 0.10


def stage_work_s(stages: list[list[ChunkWork]], plan: Plan) -> list[float]:
    """Device seconds of work per step of each stage: its passes' kernels, exposed
    communication and the host waits the passes carry, micro-batches times chunks (DualPipe
    runs each chunk for half the micro-batches: ``chunk_share``); no waits on other stages."""
    m = plan.num_microbatches * chunk_share(plan.schedule)
    return [m * sum(ch.fwd.total_s + ch.bwd.total_s for ch in chunks) for chunks in stages]


def imbalance(stages: list[list[ChunkWork]], plan: Plan, critical: int) -> StageLoad | None:
    """The slowest stage when it is not ``critical`` and carries more than
    ``IMBALANCE_SHARE`` more work than it; else None (and always with one stage)."""
    if len(stages) < 2:
        return None
    work = stage_work_s(stages, plan)
    slow = max(range(len(work)), key=lambda i: (work[i], -i))
    if slow == critical or work[slow] <= (1.0 + IMBALANCE_SHARE) * work[critical]:
        return None
    m = plan.num_microbatches * chunk_share(plan.schedule)
    compute = interference = 0.0
    comm: dict[str, float] = {}
    for ch in stages[slow]:
        for pc in (ch.fwd, ch.bwd):
            compute += m * pc.compute_s
            interference += m * pc.interference_s
            for g, v in pc.comm_s.items():
                comm[g] = comm.get(g, 0.0) + m * v
    return StageLoad(slow, work[slow], compute, {g: v for g, v in comm.items() if v > 0},
                     interference, work[critical])


def describe(load: StageLoad) -> str:
    """One line for a report."""
    parts = [f"compute {load.compute_s:.3f} s"] + [
        f"{g}_comm {v:.3f} s" for g, v in sorted(load.comm_s.items(), key=lambda x: -x[1])
        if g != "host"]
    if load.interference_s > 0:
        parts.append(f"interference {load.interference_s:.3f} s")
    return (f"pipeline imbalance: stage {load.stage} has the most work, {load.work_s:.3f} s a "
            f"step ({', '.join(parts)}), against {load.critical_work_s:.3f} s on the stage "
            "shown, whose bubble is mostly waiting on it; balance the layers per stage "
            "(Megatron-Core --decoder-first-pipeline-num-layers / "
            "--decoder-last-pipeline-num-layers) or lower pp")
