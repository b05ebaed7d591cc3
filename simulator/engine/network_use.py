"""How long each fabric tier is busy during one step of the critical stage, and which tier
is the busiest: every collective the stage's rank takes part in (layer collectives of every
micro-batch, gradient buckets, parameter gathers, pipeline sends) adds the seconds it keeps
each tier's links busy (``CollectiveCost.tier_busy_s``: bytes over the link's effective
rate, so a tier can be busy while its collectives are hidden behind compute)."""
from __future__ import annotations

from dataclasses import replace

from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..network.price import CollectiveCost
from ..parallel.placement import GroupPlacement
from ..parallel.plan import Plan
from ..parallel.schedule import SPLIT_BACKWARD, sends_downstream, stage_order
from ..workload.spec import TransformerSpec
from .result import Result
from .stage_work import ChunkWork
from .step import (
    chunk_params,
    dp_reduce_costs,
    grad_buffer_buckets,
    param_gather_costs,
    pipeline_send_costs,
)


def _add(busy: dict[str, float], costs: list[CollectiveCost], times: float = 1.0) -> None:
    for c in costs:
        for tier, s in c.tier_busy_s:
            busy[tier] = busy.get(tier, 0.0) + times * s


def link_busy_s(chunks: list[ChunkWork], model: TransformerSpec, plan: Plan,
                cluster: ClusterSpec, prof: Profile,
                groups: dict[str, GroupPlacement]) -> dict[str, float]:
    """Seconds per step each tier is busy for one rank of the stage of ``chunks``."""
    m = plan.num_microbatches
    busy: dict[str, float] = {}
    for ch in chunks:
        for pc in (ch.fwd, ch.bwd):
            for tier, s in pc.link_busy_s.items():
                busy[tier] = busy.get(tier, 0.0) + m * s
        if plan.zero_stage < 3:
            dense, expert = chunk_params([ch])
            n = grad_buffer_buckets(ch, plan)
            _add(busy, dp_reduce_costs(dense / n, expert / n, plan, groups, prof), n)
    _add(busy, param_gather_costs(chunks, plan, groups, prof))
    _add(busy, pipeline_send_costs(model, plan, cluster, prof, groups),
         _sends_per_step(chunks[0].stage, plan))
    return {k: v for k, v in sorted(busy.items()) if v > 0}


def _sends_per_step(stage: int, plan: Plan) -> int:
    """Pipeline sends a stage makes per step (``schedule.sends_downstream``): every forward
    pass but the last chunk's on the last stage, every backward but the first chunk's on the
    first stage."""
    if plan.pp == 1:
        return 0
    if plan.schedule in SPLIT_BACKWARD:
        return sum(sends_downstream(u, stage, plan.pp, plan.vpp, plan.schedule)
                   for u in stage_order(plan.schedule, stage, plan.pp, plan.num_microbatches,
                                        plan.vpp))
    m, v = plan.num_microbatches, plan.vpp
    return m * (v - (stage == plan.pp - 1)) + m * (v - (stage == 0))


def with_link_use(res: Result, chunks: list[ChunkWork], model: TransformerSpec, plan: Plan,
                  cluster: ClusterSpec, prof: Profile,
                  groups: dict[str, GroupPlacement]) -> Result:
    """``res`` with ``link_busy_s`` and ``busiest_link`` ("nic (infiniband)", ...) filled."""
    busy = link_busy_s(chunks, model, plan, cluster, prof, groups)
    if not busy:
        return res
    tier = max(busy, key=lambda k: (busy[k], k))
    kind = cluster.node.scale_up.kind.value if tier == "scale-up" else cluster.node.nic.kind.value
    return replace(res, link_busy_s=busy, busiest_link=f"{tier} ({kind})" if tier != "pcie" else tier)
