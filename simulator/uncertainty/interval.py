"""Intervals on a prediction: coefficient uncertainty and model-form error, combined.

Both parts are standard deviations of ln(step time); they add in quadrature (independent
by construction: the model-form table only keeps the part of each validation residual
that coefficient uncertainty does not explain). The step time is taken as log-normal
around the point prediction, which is its median (``p50``): the interval never shifts
it. Every quantity proportional or inversely proportional to the step time (tokens/s,
MFU, time-to-train, cost, energy) gets the same relative interval; for throughput and MFU
``p10`` is the pessimistic end, for times and costs the optimistic one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..engine.result import Result
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec
from .coefficients import CoefficientSpread, coefficient_spread
from .learn import LEVEL, z_of
from .regime import Regime, regime_of
from .table import ModelFormTable, load_table

# Two intervals "overlap by more than half" when their common part is more than this
# fraction of the narrower one: the options are then not distinguishable.
INDISTINGUISHABLE_OVERLAP = 0.5


@dataclass(frozen=True)
class Interval:
    """Central 80 % interval of one quantity: ``p10 <= p50 <= p90``; ``p50`` is the point
    prediction."""

    p10: float
    p50: float
    p90: float

    def contains(self, x: float) -> bool:
        return self.p10 <= x <= self.p90

    @property
    def width_frac(self) -> float:
        return (self.p90 - self.p10) / self.p50 if self.p50 else 0.0

    def scaled(self, factor: float) -> "Interval":
        """The interval of ``factor x`` this quantity (``factor`` > 0)."""
        return Interval(self.p10 * factor, self.p50 * factor, self.p90 * factor)

    def fields(self, name: str, unit: str = "") -> dict[str, float]:
        u = f"_{unit}" if unit else ""
        return {f"{name}_p10{u}": self.p10, f"{name}_p50{u}": self.p50,
                f"{name}_p90{u}": self.p90}


def log_interval(point: float, sigma_log: float, level: float = LEVEL) -> Interval:
    z = z_of(level) * sigma_log
    return Interval(point * math.exp(-z), point, point * math.exp(z))


def overlap_fraction(a: Interval, b: Interval) -> float:
    """Length of the common part over the length of the narrower interval (0..1)."""
    common = min(a.p90, b.p90) - max(a.p10, b.p10)
    narrow = min(a.p90 - a.p10, b.p90 - b.p10)
    if common <= 0:
        return 0.0
    return 1.0 if narrow <= 0 else min(1.0, common / narrow)


def distinguishable(a: Interval, b: Interval) -> bool:
    """False when the 80 % intervals overlap by more than half (of the narrower one)."""
    return overlap_fraction(a, b) <= INDISTINGUISHABLE_OVERLAP


@dataclass(frozen=True)
class Uncertainty:
    """The spread of one prediction: coefficient part, model-form part, and why.
    ``unvalidated``: ``("feature=value", variance)`` pairs for the regime's values that no
    validation row has, each widening the model-form part by its novelty variance
    (already inside ``model_form_sigma_log``)."""

    coefficient: CoefficientSpread
    model_form_sigma_log: float
    regime: Regime
    level: float = LEVEL
    unvalidated: tuple[tuple[str, float], ...] = ()

    @property
    def sigma_log(self) -> float:
        return math.hypot(self.coefficient.sigma_log, self.model_form_sigma_log)

    def interval(self, point: float) -> Interval:
        return log_interval(point, self.sigma_log, self.level)

    def result_fields(self, r: Result) -> dict[str, float]:
        """``step_time_p10_s`` ... ``tokens_per_s_per_gpu_p90``, ``mfu_p10`` ... ``mfu_p90``."""
        return {**self.interval(r.step_time_s).fields("step_time", "s"),
                **self.interval(r.tokens_per_s_per_gpu).fields("tokens_per_s_per_gpu"),
                **self.interval(r.mfu).fields("mfu")}

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "sigma_log": self.sigma_log,
                "model_form_sigma_log": self.model_form_sigma_log,
                "coefficient": self.coefficient.to_dict(), "regime": self.regime.as_dict(),
                "unvalidated_novelty_var": dict(self.unvalidated)}

    def describe(self) -> str:
        new = (f"; not validated: {', '.join(k for k, _ in self.unvalidated)}"
               if self.unvalidated else "")
        return (f"coefficients +/-{100 * self.coefficient.sigma_log:.1f} % "
                f"({self.coefficient.n_simulations} extra analytic simulations), model form "
                f"+/-{100 * self.model_form_sigma_log:.1f} % (1 sd; regime {self.regime.key()}"
                f"{new})")


def estimate_uncertainty(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                         profile: Profile, framework: str | None = None,
                         table: ModelFormTable | None = None) -> Uncertainty:
    """The spread of ``simulate(model, plan, cluster, profile)``'s step time."""
    regime = regime_of(model, plan, cluster, framework)
    table = table or load_table()
    return Uncertainty(coefficient_spread(model, plan, cluster, profile),
                       table.sigma_log(regime), regime,
                       unvalidated=tuple(table.unseen(regime).items()))


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}")


def format_interval(label: str, iv: Interval, unit: str = "", scale: float = 1.0) -> str:
    """``step time 13.9 s (80%: 12.8–15.4 s)``."""
    u = f" {unit}" if unit else ""
    return (f"{label} {_num(iv.p50 * scale)}{u} "
            f"(80%: {_num(iv.p10 * scale)}–{_num(iv.p90 * scale)}{u})")


def format_interval_lines(r: Result, u: Uncertainty) -> str:
    """The ``simulate`` table's interval block."""
    return "\n".join([
        "",
        f"80% interval (P10–P90; see README 'Error bars'): {u.describe()}",
        "  " + format_interval("step time", u.interval(r.step_time_s), "s"),
        "  " + format_interval("tokens/s/GPU", u.interval(r.tokens_per_s_per_gpu)),
        "  " + format_interval("MFU", u.interval(r.mfu), "%", 100.0)])


def log_interval_like(iv: Interval, point: float) -> Interval:
    """``point`` with ``iv``'s relative spread (for quantities proportional or inversely
    proportional to the step time, the spread is the same in log space)."""
    return Interval(point * iv.p10 / iv.p50, point, point * iv.p90 / iv.p50) if iv.p50 else iv
