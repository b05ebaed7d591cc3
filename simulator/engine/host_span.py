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

from ..cost.host import (host_waits, lead_layers, lead_release_frac, load_syncs, pass_syncs,
                         sync_at_p2p)
from ..hardware.profile import Profile
from ..parallel.plan import Plan
from ..parallel.schedule import is_loss_pass, iter_pass_order, plain_loss_pass
from .ds_pipe import uses_rendezvous
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
    syncs = pass_syncs(plan.host_mechanisms)
    if load_syncs(plan.host_mechanisms) and uses_rendezvous(plan) and stage in (0, plan.pp - 1):
        syncs = (True, syncs[1])           # DeepSpeed's LoadMicroBatch: a blocking copy
    every = plan.pp > 1 and sync_at_p2p(plan.host_mechanisms)   # waits before every pass
    plain = iter_pass_order(plan.schedule, stage, plan.pp, m, plan.vpp)
    if plain is not None:          # (device s, host s, ops, layers) by pass kind: a tuple each;
        kinds = {(f, ch.chunk): pass_numbers(ch.fwd if f else ch.bwd, ch)   # each kind runs
                 for ch in chunks for f in (True, False)}                # m times a step
        # the loss is computed by the last stage's last chunk in these placements: a wait
        # after it cannot make another stage wait
        waits_here = (every or syncs[0] or (syncs[1] and stage == plan.pp - 1)) \
            and host is not None and not host.synchronous
        g_total = m * sum(k[0] for k in kinds.values())
        if waits_here and lead_layers(plan.host_mechanisms) < 0:
            return StageSpan(_plain_waits_span(kinds, plan, stage, syncs, m, every), g_total,
                             0.0)
        order = list(plain) if waits_here else None       # waits with a lead limit: walk
        passes: Iterable = (kinds[(f, c)] for f, _, c in (order or plain))
        h_total = m * sum(max(0.0, k[1]) for k in kinds.values())
        each = list(kinds.values())
        marks = None if order is None else [
            (f, plain_loss_pass(f, stage, c, plan.pp, plan.vpp)) for f, _, c in order]
    else:
        played = played_passes(chunks, plan, stage, m, prof)
        passes = [(pt.duration_s,) + pass_numbers(pc, chunks[u.chunk])[1:]
                  for u, pc, pt in played]
        g_total = sum(p[0] for p in passes)
        h_total = sum(max(0.0, p[1]) for p in passes)
        each = passes
        marks = None if not (any(syncs) or every) else [
            (u.fwd, is_loss_pass(u, stage, plan.pp, plan.vpp, plan.schedule)) for u, _, _ in played]
    if host is None:
        return StageSpan(g_total, g_total, 0.0)
    if host.synchronous:
        return StageSpan(g_total + h_total, g_total, h_total)
    # a lead the device can never lose: every pass runs at least as long as it takes to
    # issue, and the lead covers the longest issue (inf: some pass issues slower than it runs)
    safe = max((p[1] for p in each), default=0.0) if all(p[0] >= p[1] for p in each) else math.inf
    synced = None if marks is None else [
        i > 0 and (every or host_waits(syncs, marks[i - 1][1], fwd))
        for i, (fwd, _) in enumerate(marks)]
    lead = lead_layers(plan.host_mechanisms)
    if synced is not None and not any(synced):
        synced = None                    # this stage never waits (the loss is elsewhere)
    return _asynchronous(passes, lead, g_total, h_total, safe, synced)


def _plain_waits_span(kinds: dict, plan: Plan, stage: int, syncs: tuple[bool, bool],
                      m: int, every: bool = False) -> float:
    """Span of one stage of a plain schedule (1F1B, GPipe, interleaved) whose host waits
    (``host_waits``). After warm-up the order repeats every micro-batch (every ``pp`` for
    the interleaved schedule) and a wait leaves no lead to carry over, so the span grows by
    the same amount each period: a long plan is three plays of a short one, extended along
    their line when the three agree (else played in full)."""
    period = plan.pp if plan.vpp > 1 else 1
    base = 4 * plan.pp               # past warm-up (at most 2 pp + vpp pp chunk passes)
    if m >= base + 3 * period and (m - base) % period == 0:
        s0, s1, s2 = (_play_order(kinds, plan, stage, syncs, base + i * period, every)
                      for i in range(3))
        if abs((s2 - s1) - (s1 - s0)) <= 1e-9 * max(1.0, s2):
            return s0 + (m - base) // period * (s1 - s0)
    return _play_order(kinds, plan, stage, syncs, m, every)


def _play_order(kinds: dict, plan: Plan, stage: int, syncs: tuple[bool, bool], m: int,
                every: bool = False) -> float:
    """``_asynchronous`` over the stage's order for ``m`` micro-batches (the loss is the last
    stage's last chunk in these placements; ``every``: the host waits before every pass,
    as Megatron's batched p2p sync makes it, ``step._host_deps``)."""
    order = list(iter_pass_order(plan.schedule, stage, plan.pp, m, plan.vpp))
    synced, prev_loss = [], False
    for i, (f, _, c) in enumerate(order):
        synced.append(i > 0 and (every or host_waits(syncs, prev_loss, f)))
        prev_loss = plain_loss_pass(f, stage, c, plan.pp, plan.vpp)
    return _asynchronous([kinds[(f, c)] for f, _, c in order], -1, 0.0, 0.0, math.inf,
                         synced).span_s


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
    whatever the number of micro-batches). ``synced``: per pass, whether the host first waits
    for the device to finish everything before it (``host_waits``); such a walk has no lead
    to keep and plays every pass."""
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
