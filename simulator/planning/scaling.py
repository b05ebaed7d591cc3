"""Strong- and weak-scaling curves over GPU counts, each point with its own best plan.

* strong scaling: fixed global batch; ``speedup = X(N) / X(N0)`` (X = tokens/s),
  ``efficiency = speedup / (N / N0)``;
* weak scaling: global batch grows with N (``B(N) = B0 * N / N0``);
  ``efficiency = x(N) / x(N0)`` with x = tokens/s per GPU;
* classes: >= 85 % good, 70-85 % acceptable, < 70 % poor;
* Amdahl fit (strong scaling): ``speedup(p) = 1 / (f + (1 - f) / p)``, p = N / N0, with
  the serial fraction ``f`` fitted by least squares (``scipy.optimize.curve_fit``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

from .. import progress
from ..errors import ComplexityError, InvalidInputError
from ..search.driver import RankedPlan, SearchOptions
from ..workload.spec import TransformerSpec
from .capacity import HardwareCatalog, HardwareChoice, best_plan


class ScalingKind(str, Enum):
    STRONG = "strong"
    WEAK = "weak"


class EfficiencyClass(str, Enum):
    GOOD = "good"                 # >= 85 %
    ACCEPTABLE = "acceptable"     # 70 - 85 %
    POOR = "poor"                 # < 70 %


def efficiency_class(eff: float) -> EfficiencyClass:
    if eff >= 0.85:
        return EfficiencyClass.GOOD
    if eff >= 0.70:
        return EfficiencyClass.ACCEPTABLE
    return EfficiencyClass.POOR


@dataclass(frozen=True)
class ScalingPoint:
    n_gpus: int
    global_batch: int
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    speedup: float | None
    efficiency: float | None
    efficiency_class: EfficiencyClass | None
    plan: RankedPlan | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"n_gpus": self.n_gpus, "global_batch": self.global_batch,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "speedup": self.speedup, "efficiency": self.efficiency,
                "efficiency_class": self.efficiency_class.value if self.efficiency_class else None,
                "plan": self.plan.to_dict() if self.plan else None, "note": self.note}


@dataclass(frozen=True)
class ScalingCurve:
    kind: ScalingKind
    gpu: str
    points: tuple[ScalingPoint, ...]
    serial_fraction: float | None           # Amdahl fit (strong scaling, >= 2 points)

    @property
    def max_speedup(self) -> float | None:
        """Amdahl's asymptote ``1 / f`` relative to the first point."""
        f = self.serial_fraction
        return None if f is None else (math.inf if f <= 0 else 1.0 / f)

    def to_dict(self) -> dict[str, Any]:
        ms = self.max_speedup
        return {"kind": self.kind.value, "gpu": self.gpu, "serial_fraction": self.serial_fraction,
                "amdahl_max_speedup": ms if ms is not None and math.isfinite(ms) else None,
                "points": [p.to_dict() for p in self.points]}


def amdahl_speedup(p, f):
    return 1.0 / (f + (1.0 - f) / p)


def fit_serial_fraction(rel_gpus: Sequence[float], speedups: Sequence[float]) -> float | None:
    """Least-squares Amdahl serial fraction in [0, 1]; None with fewer than two points."""
    pts = [(p, s) for p, s in zip(rel_gpus, speedups) if p and s and p > 0 and s > 0]
    if len(pts) < 2:
        return None
    import numpy as np
    from scipy.optimize import curve_fit
    x = np.array([p for p, _ in pts], dtype=float)
    y = np.array([s for _, s in pts], dtype=float)
    popt, _ = curve_fit(amdahl_speedup, x, y, p0=[0.01], bounds=(0.0, 1.0))
    return float(popt[0])


def _check_counts(counts: Sequence[int]) -> list[int]:
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        raise InvalidInputError("gpus", list(counts), "one or more positive GPU counts")
    return sorted(set(counts))


def _point(model, gpu, n, gb, catalog, options) -> tuple[RankedPlan | None, str]:
    try:
        rep = best_plan(model, HardwareChoice(gpu, n), gb, catalog, options)
    except ComplexityError as exc:
        return None, str(exc)
    if rep.winner is None:
        return None, f"no feasible plan ({rep.rejection_summary()})"
    return rep.winner, ""


def scaling_curve(model: TransformerSpec, gpu: str, counts: Sequence[int], global_batch: int,
                  kind: ScalingKind, catalog: HardwareCatalog,
                  options: SearchOptions) -> ScalingCurve:
    """Best plan per GPU count; efficiencies relative to the smallest feasible count."""
    counts = _check_counts(counts)
    kind = ScalingKind(kind)
    n0 = counts[0]
    raw = []
    for n in progress.track(counts, f"scaling ({kind.value}): GPU counts",
                            describe=lambda c: f"{c} x {gpu}"):
        gb = global_batch if kind == ScalingKind.STRONG else max(1, global_batch * n // n0)
        best, note = _point(model, gpu, n, gb, catalog, options)
        raw.append((n, gb, best, note))
    base = next(((n, b) for n, _, b, _ in raw if b is not None), None)
    points = tuple(_scaled(n, gb, b, note, base, kind) for n, gb, b, note in raw)
    serial = None
    if kind == ScalingKind.STRONG and base is not None:
        serial = fit_serial_fraction([p.n_gpus / base[0] for p in points if p.speedup],
                                     [p.speedup for p in points if p.speedup])
    return ScalingCurve(kind, gpu, points, serial)


def _scaled(n, gb, best, note, base, kind) -> ScalingPoint:
    if best is None or base is None:
        return ScalingPoint(n, gb, None, None, None, None, None, None, note)
    n0, b0 = base
    speedup = best.tokens_per_s / b0.tokens_per_s
    if kind == ScalingKind.STRONG:
        eff = speedup / (n / n0)
    else:
        eff = best.tokens_per_s_per_gpu / b0.tokens_per_s_per_gpu
    return ScalingPoint(n, gb, best.tokens_per_s, best.tokens_per_s_per_gpu, speedup, eff,
                        efficiency_class(eff), best, note)
