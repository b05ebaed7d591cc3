"""The event engine at a cost that does not grow with the number of micro-batches.

A pipeline schedule is a warm-up, a steady state that repeats once per round of ``pp``
micro-batches (1F1B: one forward and one backward; interleaved: every chunk of ``pp``
micro-batches) and a cool-down. Once the steady state repeats, one more round adds the same
time to every quantity the engine reports: the step time, each part of the critical stage's
breakdown and its busy time are affine in the number of micro-batches, with the same slope
per round.

``periodic_event_step`` plays the step on the event engine (``play``: contention and
overlap included) at ``FIRST_ROUND``, ``FIRST_ROUND + 1``, ... rounds of ``pp``
micro-batches until the last three results lie on one line (same critical stage; every
quantity's second difference below ``AFFINE_REL`` of its size), and extends that line to
the plan's micro-batches: a cost of about ``9 pp`` micro-batches whatever their number. It
names no schedule: a schedule, a host model or a contention pattern whose cost does not
repeat fails the check, and the caller plays the whole step instead
(``simulate._event_step``, the reference path; tests compare the two). Plans of fewer than
``MIN_ROUNDS`` rounds or ``MIN_PASSES`` passes, and timelines, are always played in full.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..errors import InvalidInputError
from ..parallel.plan import Plan, validate

AFFINE_REL = 1e-9          # second difference allowed, relative to the quantity
FIRST_ROUND = 2            # rounds of pp micro-batches in the first play (round 1 is often
                           # all warm-up and cool-down: interleaved stage 0 warms up ~2 pp)
MIN_ROUNDS = 12            # play in full below this many rounds (three plays cost 9 rounds)
MIN_PASSES = 2048          # ... or below this many passes (pp * vpp * micro-batches * 2): a
                           # full play then costs tens of milliseconds, and it is exact to
                           # the last bit where the extended line agrees only to ~1e-13

Played = tuple[float, int, dict[str, float], float]     # step end, critical stage, parts, busy


def period_microbatches(plan: Plan) -> int:
    """Micro-batches per round of the steady state: ``pp`` (every stage's order repeats
    after each stage has taken ``pp`` more micro-batches through all its chunks)."""
    return plan.pp


def truncated(plan: Plan, m: int) -> Plan:
    """``plan`` with ``m`` micro-batches per step (same micro-batch and data-parallel size)."""
    return replace(plan, global_batch=m * plan.micro_batch * plan.dp)


def _affine(values: list[float]) -> bool:
    a, b, c = values[-3:]
    return abs((c - b) - (b - a)) <= AFFINE_REL * max(abs(a), abs(b), abs(c), 1e-12)


def _extend(values: list[float], rounds: float) -> float:
    """The line through the last two values, ``rounds`` rounds past the last."""
    return values[-1] + rounds * (values[-1] - values[-2])


def periodic_event_step(plan: Plan, model, cluster, play: Callable[[Plan], Played]
                        ) -> Played | None:
    """The event engine's (step, critical stage, parts, busy) for ``plan`` from plays of
    ``FIRST_ROUND``, ``FIRST_ROUND + 1``, ... rounds until the last three lie on one line;
    ``None`` when the plan is shorter than ``MIN_ROUNDS`` rounds or ``MIN_PASSES`` passes,
    a shortened plan is invalid, or no three plays within the plan's own length are
    affine."""
    q = period_microbatches(plan)
    m = plan.num_microbatches
    if m % q or m < MIN_ROUNDS * q or 2 * m * plan.pp * plan.vpp < MIN_PASSES:
        return None
    plays: list[Played] = []
    k, spent = FIRST_ROUND, 0
    while spent + k * q < m:
        p = truncated(plan, k * q)
        try:
            validate(p, model, cluster)
        except InvalidInputError:
            return None
        plays.append(play(p))
        spent, k = spent + k * q, k + 1
        if len(plays) >= 3 and _on_a_line(plays[-3:]):
            return _extended(plays[-2:], (m - (k - 1) * q) / q)
    return None


def _series(plays: list[Played]) -> dict[str, list[float]] | None:
    """Each reported quantity over the plays; ``None`` if the critical stage or the parts
    differ between plays."""
    if len({c for _, c, _, _ in plays}) != 1 or len({tuple(d) for _, _, d, _ in plays}) != 1:
        return None
    out = {"step": [s for s, _, _, _ in plays], "busy": [b for _, _, _, b in plays]}
    for key in plays[0][2]:
        out["part " + key] = [d[key] for _, _, d, _ in plays]
    return out


def _on_a_line(plays: list[Played]) -> bool:
    series = _series(plays)
    return series is not None and all(_affine(v) for v in series.values())


def _extended(plays: list[Played], rounds: float) -> Played:
    series = _series(plays)
    parts = {key: _extend(series["part " + key], rounds) for key in plays[0][2]}
    return _extend(series["step"], rounds), plays[0][1], parts, _extend(series["busy"], rounds)
