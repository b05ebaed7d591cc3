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

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..cost.host import host_waits, lead_layers, lead_release_frac, pass_syncs
from ..hardware.profile import Profile
from ..parallel.plan import Plan
from ..parallel.schedule import is_loss_pass, iter_pass_order
from .pair_overlap import played_passes
from .stage_work import ChunkWork, pass_numbers


@dataclass(frozen=True)
class StageSpan:
    """One stage's passes played alone: makespan, device busy time and host time on the
    device stream (synchronous host)."""

    span_s: float
    device_s: float
    host_on_stream_s: float


def stage_span(chunks: list[ChunkWork], plan: Plan, prof: Profile, stage: int) -> StageSpan:
    m, host = plan.num_microbatches, prof.host
    plain = iter_pass_order(plan.schedule, stage, plan.pp, m, plan.vpp)
    if plain is not None:          # (device s, host s, ops, layers) by pass kind: a tuple each;
        kinds = {(f, ch.chunk): pass_numbers(ch.fwd if f else ch.bwd, ch)   # each kind runs
                 for ch in chunks for f in (True, False)}                # m times a step
        passes: Iterable = (kinds[(f, c)] for f, _, c in plain)
        g_total = m * sum(k[0] for k in kinds.values())
        h_total = m * sum(max(0.0, k[1]) for k in kinds.values())
        each = list(kinds.values())
    else:
        passes = [(pt.duration_s,) + pass_numbers(pc, chunks[u.chunk])[1:]
                  for u, pc, pt in played_passes(chunks, plan, stage, m, prof)]
        g_total = sum(p[0] for p in passes)
        h_total = sum(max(0.0, p[1]) for p in passes)
        each = passes
    if host is None:
        return StageSpan(g_total, g_total, 0.0)
    if host.synchronous:
        return StageSpan(g_total + h_total, g_total, h_total)
    # a lead the device can never lose: every pass runs at least as long as it takes to
    # issue, and the lead covers the longest issue (inf: some pass issues slower than it runs)
    safe = max((p[1] for p in each), default=0.0) if all(p[0] >= p[1] for p in each) else math.inf
    return _asynchronous(passes, lead_layers(plan.host_mechanisms), g_total, h_total, safe,
                         _synced(chunks, plan, stage, m, prof))


def _synced(chunks: list[ChunkWork], plan: Plan, stage: int, m: int, prof: Profile
            ) -> list[bool] | None:
    """Per pass in order: whether the host waits for the device to finish the pass before
    (``cost.host.host_waits``); ``None`` where the framework never waits."""
    syncs = pass_syncs(plan.host_mechanisms)
    if not any(syncs):
        return None
    units = [u for u, _, _ in played_passes(chunks, plan, stage, m, prof)]
    loss = [is_loss_pass(u, stage, plan.pp, plan.vpp, plan.schedule) for u in units]
    return [i > 0 and host_waits(syncs, loss[i - 1], u.fwd) for i, u in enumerate(units)]


def _asynchronous(passes: Iterable, lead: int, g_total: float, h_total: float,
                  safe_lead_s: float = math.inf, synced: list[bool] | None = None
                  ) -> StageSpan:
    """The recursion of the module doc, over ``passes`` (``g_total`` / ``h_total``: their
    device and host seconds). With a host that runs ahead without limit (``lead < 0``) the
    device waits for pass ``k`` only if it trails the host by less than ``k``'s issue time
    (or by less than the pass's issue time minus its run time). So once the device trails
    by ``safe_lead_s`` (the longest issue, where every pass runs at least as long as it
    takes to issue: the trail never shrinks) or by all the host time still to come, it
    never waits again, and the rest of the span is the device's remaining work: the walk
    stops there (a GPU host issuing faster than the device runs stops within a few passes,
    whatever the number of micro-batches)."""
    h = d = g_done = h_done = 0.0
    prev: tuple[float, float, int] | None = None        # device start, duration, layers
    for i, (g, hh, first, layers) in enumerate(passes):
        if synced is not None and synced[i]:
            h = max(h, d)                # the host waits for the device (it loses its lead)
        elif lead < 0 and synced is None and (d - h >= safe_lead_s or d - h >= h_total - h_done):
            return StageSpan(d + (g_total - g_done), g_total, 0.0)
        g_done += g
        if hh <= 0:
            prev = (d, g, layers)
            d += g
            continue
        h_done += hh
        hs = h
        if prev is not None and lead >= 0:
            hs = max(hs, prev[0] + lead_release_frac(lead, prev[2]) * prev[1])
        he = hs + hh
        ds = max(d, hs + first * hh)
        prev = (ds, g, layers)
        d, h = max(ds + g, he), he
    return StageSpan(d, g_total, 0.0)
