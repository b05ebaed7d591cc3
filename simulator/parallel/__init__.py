"""The parallel strategy: the plan and its validation against model and cluster (``plan``),
pipeline schedules (``schedule``), and where each parallel group's ranks sit on the
cluster, hence which link class its traffic crosses (``placement``)."""
from __future__ import annotations

from .plan import AttentionImpl, Plan, Recompute, Schedule, validate

__all__ = ["AttentionImpl", "Plan", "Recompute", "Schedule", "validate"]
