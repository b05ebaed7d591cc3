"""Max-min fair sharing of links by concurrent flows (progressive filling).

Written here rather than taken from a library: it is a dozen lines over plain dicts, and
networkx / scipy offer max-flow and linear programs, not max-min fairness with weighted
(aggregated) flows.

A flow ``f`` crosses link ``l`` with weight ``w[f][l]``: the link carries ``w * rate(f)``
(a weight of 1 is one flow; an aggregated class of identical flows, or a flow split over
parallel links, carries its multiplicity). Progressive filling raises every unfrozen
flow's rate at the same pace; a link whose load reaches its capacity freezes the flows
crossing it. The result is the max-min fair allocation: no flow can get more without a
flow of equal or smaller rate getting less (Bertsekas & Gallager, *Data Networks*,
sec. 6.5.2).

``completion_s`` plays the allocation forward: when a flow finishes, the others share its
bandwidth from then on.
"""
from __future__ import annotations

import math
from typing import Hashable, Mapping

Weights = Mapping[Hashable, Mapping[Hashable, float]]


def fair_rates(weights: Weights, capacity: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Max-min fair rate of each flow. ``weights[flow][link]``: load per unit of rate;
    ``capacity[link]``: what the link carries (same unit). A flow that crosses no
    finite-capacity link gets ``inf``."""
    rate = {f: 0.0 for f in weights}
    free = {f for f, ws in weights.items() if any(w > 0 for w in ws.values())}
    left = dict(capacity)
    for f in set(weights) - free:
        rate[f] = math.inf
    while free:
        step, tight = _next_saturation(weights, free, left)
        if math.isinf(step):
            for f in free:
                rate[f] = math.inf
            break
        for f in free:
            rate[f] += step
            for link, w in weights[f].items():
                left[link] -= w * step
        frozen = {f for f in free if any(weights[f].get(link, 0.0) > 0 for link in tight)}
        free -= frozen
    return rate


def _next_saturation(weights: Weights, free: set, left: Mapping[Hashable, float]):
    """(rate increment until the next link fills, the links that fill then)."""
    demand: dict[Hashable, float] = {}
    for f in free:
        for link, w in weights[f].items():
            if w > 0:
                demand[link] = demand.get(link, 0.0) + w
    step, tight = math.inf, []
    for link, d in demand.items():
        s = max(0.0, left[link]) / d
        if s < step * (1 - 1e-12):
            step, tight = s, [link]
        elif s <= step * (1 + 1e-12):
            tight.append(link)
    return step, tight


def completion_s(demand: Mapping[Hashable, float], weights: Weights,
                 capacity: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """When each flow finishes moving ``demand[f]`` (in rate-units x seconds), starting
    together at time 0 and re-sharing max-min fairly each time one finishes."""
    left = {f: float(d) for f, d in demand.items() if d > 0}
    done = {f: 0.0 for f, d in demand.items() if d <= 0}
    now = 0.0
    while left:
        rates = fair_rates({f: weights[f] for f in left}, capacity)
        dt = min(left[f] / rates[f] if rates[f] > 0 else math.inf for f in left)
        if math.isinf(dt):
            done.update({f: math.inf for f in left})
            break
        now += dt
        for f in list(left):
            left[f] -= rates[f] * dt
            if left[f] <= 1e-12 * max(1.0, demand[f]):
                done[f] = now
                del left[f]
    return done
