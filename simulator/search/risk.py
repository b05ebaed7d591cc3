"""Intervals on ranked plans, and risk-averse ranking.

Every plan the search lists carries the 80 % interval of its step time
(``simulator.uncertainty``: coefficient spread from a few extra analytic simulations, plus
the model-form spread of its regime; the search does not know the training framework, so
that feature is left out of the regime). Risk-averse objectives (``*-p90``) rank by the
pessimistic end: the P90 time-to-train (throughput at the P90 step time) or the P90 cost
per token. Because intervals need extra simulations, they are computed only for the plans
ranked at the end: the best ``RISK_POOL`` by the point objective are re-ranked by their
P90, so a plan outside that pool is never considered.

Two plans of the same search share most of their model-form error (same GPU, model and
software), so "not distinguishable" (80 % intervals overlapping by more than half) is a
conservative verdict between plans of one search; it is the fitting one across GPU types.
"""
from __future__ import annotations

from ..uncertainty.interval import Interval, distinguishable, estimate_uncertainty
from .executor import EvalContext, parallel_map

RISK_POOL = 20


def step_interval(ctx: EvalContext, plan, step_time_s: float) -> Interval:
    u = estimate_uncertainty(ctx.model, plan, ctx.cluster, ctx.profile)
    return u.interval(step_time_s)


def _interval_job(job: tuple[EvalContext, object, float]) -> Interval:
    return step_interval(*job)


def step_intervals(jobs: list[tuple[EvalContext, object, float]], workers: int) -> list[Interval]:
    """``step_interval`` of each (context, plan, step seconds), over ``workers`` processes
    (each costs a dozen extra analytic simulations: ``uncertainty.coefficients``)."""
    return parallel_map(_interval_job, jobs, workers)


def pessimistic_tokens_per_s(tokens_per_s: float, iv: Interval) -> float:
    """Throughput at the P90 step time."""
    return tokens_per_s * iv.p50 / iv.p90


def indistinguishable_from_best(intervals: list[Interval | None]) -> list[int]:
    """1-based ranks (after the first) whose interval overlaps the first's by more than half."""
    if not intervals or intervals[0] is None:
        return []
    return [n + 1 for n, iv in enumerate(intervals)
            if n > 0 and iv is not None and not distinguishable(intervals[0], iv)]
