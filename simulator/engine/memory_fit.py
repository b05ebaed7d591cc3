"""Memory per stage without pricing any op, and the out-of-memory verdict.

``estimate_stage_memory`` is the simulator's own accounting (``simulate`` reports exactly
these numbers; the search prunes with them). ``memory_verdict`` explains a plan that does
not fit: which stage, by how much, which part is largest, and the single changes (ZeRO
stage, recompute, a smaller micro-batch, twice the TP / PP / CP at the same GPU count) that
would bring the peak under the capacity, each with the peak it would have.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import InvalidInputError
from ..hardware.specs import ClusterSpec
from ..memory.accounting import StageMemory, stage_memory
from ..memory.chunk import chunk_memory
from ..parallel.plan import Plan, Recompute, Schedule, validate
from ..parallel.schedule import chunk_parts
from ..workload.spec import TransformerSpec
from .stage_work import layer_shape, partition_layers


def estimate_stage_memory(model: TransformerSpec, plan: Plan) -> list[StageMemory]:
    """Peak memory of one rank per pipeline stage."""
    C, placed = chunk_parts(plan.schedule, plan.pp, plan.vpp)
    parts = partition_layers(model.n_layers, C)
    sh = layer_shape(model, plan)
    out = []
    for s in range(plan.pp):
        chunks = [chunk_memory(model, plan, sh, parts[g], g == 0, g == C - 1)
                  for g in placed[s]]
        out.append(stage_memory(s, chunks, plan))
    return out


@dataclass(frozen=True)
class MemoryRemedy:
    """One change to the plan and the peak it would give."""

    change: str
    peak_memory_bytes: float
    fits: bool


@dataclass(frozen=True)
class MemoryVerdict:
    """Whether the plan fits, and if not, where and what would help."""

    fits: bool
    stage: int                           # the stage with the highest peak
    peak_memory_bytes: float
    capacity_bytes: float
    excess_bytes: float                  # peak - capacity (<= 0 when it fits)
    largest_part: str                    # weights, grads, optimizer, activations, workspace
    parts_bytes: dict[str, float] = field(default_factory=dict)
    workspace_source: str = ""
    remedies: list[MemoryRemedy] = field(default_factory=list)

    def summary(self) -> str:
        gb = 1e9
        if self.fits:
            return (f"fits: peak {self.peak_memory_bytes / gb:.1f} GB of "
                    f"{self.capacity_bytes / gb:.0f} GB on stage {self.stage}")
        parts = ", ".join(f"{k} {v / gb:.1f}" for k, v in self.parts_bytes.items())
        fixes = [r.change for r in self.remedies if r.fits]
        help_ = ("would fit with any of: " + "; ".join(fixes)) if fixes else \
            "no single change tried fits" + (f" (best: {self.remedies[0].change}, "
                                             f"{self.remedies[0].peak_memory_bytes / gb:.1f} GB)"
                                             if self.remedies else "")
        return (f"DOES NOT FIT: stage {self.stage} needs {self.peak_memory_bytes / gb:.1f} GB, "
                f"{self.excess_bytes / gb:.1f} GB over {self.capacity_bytes / gb:.0f} GB; "
                f"largest part {self.largest_part} (GB: {parts}); {help_}")


def _candidates(plan: Plan) -> list[tuple[str, Plan]]:
    """Single changes that lower memory, at the same GPU count and global batch."""
    out: list[tuple[str, Plan]] = []
    for z in range(plan.zero_stage + 1, 4):
        if z >= 2 and plan.pp > 1:
            break
        out.append((f"zero_stage={z}", replace(plan, zero_stage=z)))
    order = [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL]
    for rc in order[order.index(plan.recompute) + 1:]:
        out.append((f"recompute={rc.value}", replace(plan, recompute=rc)))
    if plan.recompute_layers:                 # a partial full recompute: every layer
        out.append(("recompute=full (every layer)", replace(plan, recompute_layers=0)))
    mb = plan.micro_batch // 2
    while mb >= 1:
        out.append((f"micro_batch={mb}", replace(plan, micro_batch=mb)))
        if mb == 1:
            break
        mb //= 2
    if plan.dp_shard:                           # HSDP: shard over every data-parallel rank
        out.append(("dp_shard=0 (shard over all of dp x cp)", replace(plan, dp_shard=0)))
    if plan.dp % 2 == 0:
        for k in ("tp", "pp", "cp"):
            halved = plan.dp // 2 * (2 * plan.cp if k == "cp" else plan.cp)
            shard = plan.dp_shard if plan.dp_shard and halved % plan.dp_shard == 0 else 0
            try:
                p2 = replace(plan, dp=plan.dp // 2, dp_shard=shard, **{k: 2 * getattr(plan, k)})
            except InvalidInputError:           # a split this plan cannot take (flex: tp 1)
                continue
            out.append((f"{k}={2 * getattr(plan, k)} (dp={plan.dp // 2})", p2))
    return out


def memory_verdict(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                   memory: list[StageMemory]) -> MemoryVerdict:
    """The verdict on ``memory`` (this plan's stages); remedies only when it does not fit."""
    cap = cluster.gpu.mem_bytes
    worst = max(memory, key=lambda m: (m.total_bytes, -m.stage))
    parts = worst.parts()
    largest = max(parts, key=lambda k: (parts[k], k))
    fits = worst.total_bytes <= cap
    remedies: list[MemoryRemedy] = []
    if not fits:
        for change, p in _candidates(plan):
            try:
                validate(p, model, cluster)
                if p.schedule == Schedule.INTERLEAVED and p.num_microbatches % p.pp:
                    continue
            except InvalidInputError:
                continue
            peak = max(m.total_bytes for m in estimate_stage_memory(model, p))
            remedies.append(MemoryRemedy(change, peak, peak <= cap))
        remedies.sort(key=lambda r: (not r.fits, r.peak_memory_bytes, r.change))
    return MemoryVerdict(fits, worst.stage, worst.total_bytes, cap, worst.total_bytes - cap,
                         largest, parts, worst.workspace_source, remedies)
