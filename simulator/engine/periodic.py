"""The event engine at a cost that does not grow with the number of micro-batches.

A pipeline schedule is a warm-up, a steady state that repeats and a cool-down. The period
of the steady state is one micro-batch where the schedule takes any count (1F1B, GPipe:
each stage runs one more forward and one more backward) and a round of ``pp`` micro-batches
where it takes multiples of ``pp`` (interleaved 1F1B: every chunk of ``pp`` micro-batches).
Once the steady state repeats, one more period adds the same time to every quantity the
engine reports: the step time, each part of the critical stage's breakdown and its busy
time are affine in the number of micro-batches.

``periodic_event_step`` plays the step on the event engine (``play``: contention and
overlap included) at ``FIRST_ROUND * pp`` micro-batches, then one period more each time,
until the last three results lie on one line (same critical stage; every quantity's second
difference below ``AFFINE_REL`` of its size) whose slope is at least every engine
resource's work per period (``_saturated``: a line below that bound has not reached the
steady state yet - e.g. a host issuing ops slower than the device runs them takes over
only after some micro-batches), and extends that line to the plan's
micro-batches: a cost of about ``6 pp`` micro-batches (1F1B) or ``9 pp`` (interleaved)
whatever their number. It names no schedule (the period is asked of ``validate``): a
schedule, a host model or a contention pattern whose cost does not repeat fails the check,
and the caller plays the whole step instead (``simulate._event_step``, the reference path;
tests compare the two). Plans of fewer than ``MIN_ROUNDS`` rounds or ``MIN_PASSES`` passes,
and timelines, are always played in full.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..errors import InvalidInputError
from ..parallel.plan import Plan, validate

AFFINE_REL = 1e-9          # second difference allowed, relative to the quantity
FIRST_ROUND = 2            # rounds of pp micro-batches in the first play (round 1 is often
                           # all warm-up and cool-down: interleaved stage 0 warms up ~2 pp)
MIN_ROUNDS = 12            # play in full below this many rounds of pp (plays cost 6-9)
MIN_PASSES = 2048          # ... or below this many passes (pp * vpp * micro-batches * 2): a
                           # full play then costs tens of milliseconds, and it is exact to
                           # the last bit where the extended line agrees only to ~1e-13

# step end, critical stage, breakdown parts, busy time, work per engine resource
Played = tuple[float, int, dict[str, float], float, dict[str, float]]
Result4 = tuple[float, int, dict[str, float], float]


def long_enough(plan: Plan) -> bool:
    """Whether the plan is long enough for short plays to pay (``MIN_ROUNDS``,
    ``MIN_PASSES``)."""
    m = plan.num_microbatches
    return m >= MIN_ROUNDS * plan.pp and 2 * m * plan.pp * plan.vpp >= MIN_PASSES


def period_microbatches(plan: Plan, model, cluster) -> int:
    """Micro-batches per period of the steady state: one where the schedule accepts any
    count (1F1B and GPipe: one forward and one backward per micro-batch on every stage),
    else ``pp`` (a round: every stage takes ``pp`` more micro-batches through all its
    chunks; interleaved 1F1B needs micro-batches in multiples of ``pp``). Asked of
    ``validate``, not of the schedule's name."""
    try:
        validate(truncated(plan, FIRST_ROUND * plan.pp + 1), model, cluster)
    except InvalidInputError:
        return plan.pp
    return 1


def truncated(plan: Plan, m: int) -> Plan:
    """``plan`` with ``m`` micro-batches per step (same micro-batch and data-parallel size)."""
    return replace(plan, global_batch=m * plan.micro_batch * plan.dp)


def _affine(values: list[float]) -> bool:
    a, b, c = values[-3:]
    return abs((c - b) - (b - a)) <= AFFINE_REL * max(abs(a), abs(b), abs(c), 1e-12)


def _extend(values: list[float], periods: float) -> float:
    """The line through the last two values, ``periods`` periods past the last."""
    return values[-1] + periods * (values[-1] - values[-2])


def periodic_event_step(plan: Plan, model, cluster, play: Callable[[Plan], Played]
                        ) -> Result4 | None:
    """The event engine's (step, critical stage, parts, busy) for ``plan`` from plays of
    ``FIRST_ROUND * pp`` micro-batches and one period more each time until the last three
    lie on one line; ``None`` when the plan is shorter than ``MIN_ROUNDS`` rounds or
    ``MIN_PASSES`` passes, a shortened plan is invalid, or no three plays within the
    plan's own length are affine and saturated."""
    m = plan.num_microbatches
    if not long_enough(plan):
        return None
    q = period_microbatches(plan, model, cluster)
    if m % q:
        return None
    plays: list[Played] = []
    n, spent = FIRST_ROUND * plan.pp, 0
    while spent + n < m:
        p = truncated(plan, n)
        try:
            validate(p, model, cluster)
        except InvalidInputError:
            return None
        plays.append(play(p))
        spent, n = spent + n, n + q
        if len(plays) >= 3 and _on_a_line(plays[-3:]) and _saturated(plays[-2:]):
            return _extended(plays[-2:], (m - (n - q)) / q)
    return None


def _series(plays: list[Played]) -> dict[str, list[float]] | None:
    """Each reported quantity over the plays; ``None`` if the critical stage or the parts
    differ between plays."""
    if len({p[1] for p in plays}) != 1 or len({tuple(p[2]) for p in plays}) != 1:
        return None
    out = {"step": [p[0] for p in plays], "busy": [p[3] for p in plays]}
    for key in plays[0][2]:
        out["part " + key] = [p[2][key] for p in plays]
    return out


def _on_a_line(plays: list[Played]) -> bool:
    series = _series(plays)
    return series is not None and all(_affine(v) for v in series.values())


def _saturated(plays: list[Played]) -> bool:
    """Whether the step grows per period at least as fast as the work on every engine
    resource (a stream runs its tasks one at a time, a link shares its rate): below that
    the line cannot last, a slower resource (a host issuing ops, a link) must take over
    further on, and more plays are needed."""
    (s0, *_, w0), (s1, *_, w1) = plays
    slope = s1 - s0
    return all(w1[r] - w0.get(r, 0.0) <= slope + AFFINE_REL * max(abs(s1), 1e-12) for r in w1)


def _extended(plays: list[Played], periods: float) -> Result4:
    series = _series(plays)
    parts = {key: _extend(series["part " + key], periods) for key in plays[0][2]}
    return _extend(series["step"], periods), plays[0][1], parts, _extend(series["busy"], periods)
