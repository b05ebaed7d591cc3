"""Are the intervals honest? Coverage of held-out intervals, by group and by level.

Input: ``learn.HeldOut`` rows (each row's interval predicted with its whole source left
out). Coverage at level ``q`` is the fraction of measured values inside the central ``q``
interval; a calibrated model has coverage close to ``q`` at every level (the reliability
curve lies on the diagonal).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Callable, Sequence

from .learn import LEVEL, HeldOut

RELIABILITY_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@dataclass(frozen=True)
class Coverage:
    """``covered`` of ``rows`` measured values inside their ``level`` interval;
    ``median_width_frac``: median (p90 - p10) / prediction."""

    group: str
    rows: int
    covered: int
    median_width_frac: float
    level: float = LEVEL

    @property
    def fraction(self) -> float:
        return self.covered / self.rows if self.rows else 0.0


def coverage(rows: Sequence[HeldOut], group: str = "all", level: float = LEVEL) -> Coverage:
    n = len(rows)
    return Coverage(group, n, sum(h.covered(level) for h in rows),
                    median([h.width_frac(level) for h in rows]) if rows else 0.0, level)


def coverage_by(rows: Sequence[HeldOut], key: Callable[[HeldOut], str],
                level: float = LEVEL) -> list[Coverage]:
    groups: dict[str, list[HeldOut]] = {}
    for h in rows:
        groups.setdefault(key(h), []).append(h)
    return [coverage(groups[g], g, level) for g in sorted(groups)]


def reliability(rows: Sequence[HeldOut],
                levels: Sequence[float] = RELIABILITY_LEVELS) -> list[tuple[float, float]]:
    """(nominal level, observed coverage) pairs."""
    return [(q, coverage(rows, level=q).fraction) for q in levels]
