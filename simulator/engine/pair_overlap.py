"""DualPipe's forward&backward pair: each chunk's expert-parallel all-to-all runs beside the
other chunk's compute.

DeepSeek-V3 report (arXiv 2412.19437, sec. 3.2.1): a pair of a forward and a backward
chunk is split into attention, all-to-all dispatch, MLP and all-to-all combine, and the
components are rearranged so that "both all-to-all and PP communication can be fully
hidden", with a share of the SMs given to communication. Here, for a pair ``(a, b)`` in a
stage's order (``Unit.paired`` marks ``a``): ``a``'s exposed EP seconds run beside ``b``'s
compute and ``b``'s beside ``a``'s, each hidden up to the other's compute
(``min(x_a, c_b)``, ``min(x_b, c_a)``), and the compute they run beside is slowed as any
compute beside communication is (``cost.layer.interference_s``, ``Profile.overlap_slowdown``:
Lee et al. 2025's measured average; DeepSeek gives 20 of 132 SMs to communication, a
15 % share of the same order). Only EP is overlapped: that is what the report claims;
pipeline sends already leave when the pair ends (``engine.step``), and TP's collectives
stay in their pass (DeepSeek-V3 ran without TP).

Both engines read the same numbers: the event engine plays each pass for
``duration_s`` and its breakdown moves ``hidden_s`` from exposed EP to hidden and adds
``interference_s``; the analytic engine sums the same durations (``host_span``) and uses
the pair in DualPipe's closed-form bubble.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cost.layer import PassCost, interference_s
from ..hardware.profile import Profile
from ..parallel.plan import Plan
from ..parallel.schedule import stage_order
from ..parallel.units import Unit

OVERLAPPED_GROUPS = ("ep",)


@dataclass(frozen=True)
class PassTime:
    """One pass as played: device seconds, exposed communication hidden beside the other
    pass of its pair (by group), and compute slowed by the other pass's communication."""

    duration_s: float
    hidden_s: dict[str, float] = field(default_factory=dict)
    interference_s: float = 0.0


def _exposed(pc: PassCost) -> dict[str, float]:
    return {g: pc.comm_s[g] for g in OVERLAPPED_GROUPS if pc.comm_s.get(g, 0.0) > 0.0}


def _hide(comm: dict[str, float], room_s: float) -> dict[str, float]:
    """Up to ``room_s`` seconds of ``comm``, taken from each group in proportion."""
    total = sum(comm.values())
    if total <= 0.0 or room_s <= 0.0:
        return {}
    f = min(1.0, room_s / total)
    return {g: v * f for g, v in comm.items()}


def pair_times(a: PassCost, b: PassCost, prof: Profile | None) -> tuple[PassTime, PassTime]:
    """The two passes of a pair: each one's EP communication hidden behind the other's
    compute, each one's compute slowed while the other's communication runs beside it
    (no slowdown without a profile)."""
    ha = _hide(_exposed(a), b.compute_s)
    hb = _hide(_exposed(b), a.compute_s)
    ia = interference_s(sum(hb.values()), prof) if prof else 0.0   # b's comm beside a
    ib = interference_s(sum(ha.values()), prof) if prof else 0.0
    return (PassTime(a.total_s - sum(ha.values()) + ia, ha, ia),
            PassTime(b.total_s - sum(hb.values()) + ib, hb, ib))


def pass_times(order: Sequence[Unit], costs: Sequence[PassCost], prof: Profile | None
               ) -> list[PassTime]:
    """Every pass of a stage's order as played: a paired unit and the unit after it as a
    pair (``pair_times``), every other pass as its cost."""
    out: list[PassTime] = []
    i = 0
    while i < len(order):
        if order[i].paired and order[i].overlapped and i + 1 < len(order):
            out.extend(pair_times(costs[i], costs[i + 1], prof))
            i += 2
        else:
            out.append(PassTime(costs[i].total_s))
            i += 1
    return out


def played_passes(chunks: Sequence, plan: Plan, stage: int, m: int, prof: Profile | None
                  ) -> list[tuple[Unit, PassCost, PassTime]]:
    """Stage ``stage``'s passes in schedule order over ``m`` micro-batches, each with its
    cost (``chunks[u.chunk].pass_cost``) and how it is played (``pass_times``): what both
    engines read."""
    order = stage_order(plan.schedule, stage, plan.pp, m, plan.vpp)
    costs = [chunks[u.chunk].pass_cost(u) for u in order]
    return list(zip(order, costs, pass_times(order, costs, prof)))


def overlapped_ep_s(pc: PassCost) -> float:
    """Exposed seconds of ``pc`` a pair can hide (``OVERLAPPED_GROUPS``)."""
    return sum(_exposed(pc).values())


def pair_saving_s(compute_a: float, comm_a: float, compute_b: float, comm_b: float,
                  prof: Profile | None) -> float:
    """Seconds a pair saves against playing its passes one after the other (the closed
    form of ``pair_times``: hidden communication less the slowdown it causes)."""
    hidden = min(comm_a, compute_b) + min(comm_b, compute_a)
    return hidden - (interference_s(hidden, prof) if prof else 0.0)


def stage_pair_totals(times: Sequence[PassTime]) -> tuple[dict[str, float], float]:
    """(hidden seconds by group, added interference seconds) over a stage's passes."""
    hidden: dict[str, float] = {}
    for t in times:
        for g, v in t.hidden_s.items():
            hidden[g] = hidden.get(g, 0.0) + v
    return hidden, sum(t.interference_s for t in times)
