"""Playing one training step: per-stage work (``stage_work``), the task graph of a
pipeline schedule (``step``), the discrete-event core (``events``), its answer without
events where no link is shared (``sweep``) and for long plans (``periodic``), the analytic
closed form and the entry point ``simulate`` (``simulate``), and the ``Result`` it
returns."""
from __future__ import annotations

from .result import Breakdown, Result, StageReport
from .simulate import simulate

__all__ = ["Breakdown", "Result", "StageReport", "simulate"]
