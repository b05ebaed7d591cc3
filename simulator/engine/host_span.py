"""Closed form of one stage's passes with a host that issues them (the analytic engine's
counterpart of ``step._issue``): the same two-resource recursion the event engine plays,
without the other stages.

Per pass ``k`` with device time ``G`` and host time ``H`` (``PassCost.total_s`` /
``host_s``), an asynchronous host issues passes back to back (``h`` = when it is free) and
the device starts a pass once its first op is issued and it is free, and ends it no earlier
than the host's last issue::

    hs_k = max(h, lead release)        he_k = hs_k + H_k
    ds_k = max(d, hs_k + H_k / n_k)    d    = max(ds_k + G_k, he_k)

A synchronous host (a CPU device) runs each pass's ``H`` and then its ``G`` on one stream.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cost.host import lead_layers
from ..hardware.profile import Profile
from ..parallel.plan import Plan
from ..parallel.schedule import stage_order
from .stage_work import ChunkWork


@dataclass(frozen=True)
class StageSpan:
    """One stage's passes played alone: makespan, device busy time and host time on the
    device stream (synchronous host)."""

    span_s: float
    device_s: float
    host_on_stream_s: float


def stage_span(chunks: list[ChunkWork], plan: Plan, prof: Profile, stage: int) -> StageSpan:
    order = stage_order(plan.schedule, stage, plan.pp, plan.num_microbatches, plan.vpp)
    host = prof.host
    sync = host is not None and host.synchronous
    lead = lead_layers(plan.host_mechanisms)
    h = d = busy = on_stream = 0.0
    prev: tuple[float, float, int] | None = None        # device start, duration, layers
    for u in order:
        ch = chunks[u.chunk]
        pc = ch.pass_cost(u)
        g, hh = pc.total_s, pc.host_s
        busy += g
        if host is None or hh <= 0:
            prev = (d, g, len(ch.layers))
            d += g
            continue
        if sync:
            on_stream += hh
            d = (d + hh) + g
            continue
        hs = h
        if prev is not None and lead >= 0:
            frac = max(0.0, 1.0 - lead / max(1, prev[2]))
            hs = max(hs, prev[0] + frac * prev[1])
        he = hs + hh
        ds = max(d, hs + min(1.0, 1.0 / max(1.0, pc.host_ops)) * hh)
        prev = (ds, g, len(ch.layers))
        d, h = max(ds + g, he), he
    return StageSpan(d, busy, on_stream)
