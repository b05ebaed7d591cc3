"""Play a pipeline schedule alone: given pass times, no model, no network.

The same task lists and dependency wiring the step simulation uses (``step.stage_passes``:
``stage_units`` and ``pipeline_sends``, or DeepSpeed's instruction stream), with every forward lasting ``f_s``, every B ``b_s``, every W
``w_s`` (a whole backward ``b_s + w_s``) and each hand-off between stages ``send_s`` on
the sender's link. This is how the schedules are checked against their papers' closed
forms, which assume exactly this: equal passes on every stage, communication aside.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cost.layer import PassCost
from ..parallel.plan import Plan, Schedule
from ..parallel.schedule import Part, Unit
from .events import Engine
from .step import stage_passes


@dataclass(frozen=True)
class PassTimes:
    """Seconds of one pass of one micro-batch through one stage's share of the model.
    For two-chunk schedules each chunk pass takes its share: half for ZB-V (a chunk is
    half a stage), all for DualPipe (a chunk is a whole stage, kept twice)."""

    f_s: float
    b_s: float                 # backward for the inputs (B)
    w_s: float                 # backward for the weights (W)


@dataclass(frozen=True)
class ScheduleRun:
    """Per stage: first pass start, last pass end, busy seconds."""

    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    busy_s: tuple[float, ...]

    @property
    def makespan_s(self) -> float:
        return max(self.end_s) - min(self.start_s)

    @property
    def bubble_s(self) -> float:
        """Idle time of the longest stage, from its own first pass to its last: the
        zero-bubble papers' measure (a stage may start late when nothing waits for it,
        as with optimizer post-validation; Qi et al. 2024 sec. 4)."""
        return max(e - s - b for s, e, b in zip(self.start_s, self.end_s, self.busy_s))

    @property
    def bubble_fraction(self) -> float:
        """Bubble over the longest stage's span."""
        spans = [e - s for s, e in zip(self.start_s, self.end_s)]
        i = max(range(len(spans)), key=lambda k: (spans[k] - self.busy_s[k], -k))
        return (spans[i] - self.busy_s[i]) / spans[i] if spans[i] > 0 else 0.0


def layer_share(schedule: Schedule, vpp: int) -> float:
    """Fraction of a stage's layers one chunk holds."""
    return 1.0 if schedule == Schedule.DUALPIPE else 1.0 / vpp


class _FixedChunk:
    """A chunk whose passes take given times (what ``stage_units`` asks of a chunk); no
    host time, no communication."""

    layers = (0,)

    def __init__(self, times: PassTimes, share: float) -> None:
        self.t, self.share = times, share

    def pass_cost(self, u: Unit) -> PassCost:
        if u.fwd:
            return PassCost(compute_s=self.share * self.t.f_s)
        per = {Part.WHOLE: self.t.b_s + self.t.w_s, Part.INPUT: self.t.b_s,
               Part.WEIGHT: self.t.w_s}
        return PassCost(compute_s=self.share * per[u.part])


def play_schedule(schedule: Schedule | str, pp: int, m: int, times: PassTimes, vpp: int = 1,
                  send_s: float = 0.0, rendezvous: bool = False) -> ScheduleRun:
    """Play ``schedule`` for ``pp`` stages and ``m`` micro-batches (validated as a plan).
    ``rendezvous``: DeepSpeed's pipeline engine (``engine.ds_pipe``; 1F1B only), each
    hand-off a blocking send and receive of ``send_s`` on the two stages' streams."""
    plan = Plan(pp=pp, vpp=vpp, global_batch=m, schedule=schedule, pp_blocking_p2p=rendezvous,
                pp_rendezvous=rendezvous)
    chunk = _FixedChunk(times, layer_share(plan.schedule, plan.vpp))
    eng = Engine()
    st = stage_passes(eng, [[chunk] * plan.vpp] * plan.pp, plan, m, (send_s, send_s), None,
                      "network")
    eng.run()
    starts, ends, busy = [], [], []
    for stage in st:
        tasks = [eng.tasks[t] for t in stage.units.values()]
        starts.append(min(t.start_s for t in tasks))
        ends.append(max(t.end_s for t in tasks))
        busy.append(sum(t.work_s for t in tasks))
    return ScheduleRun(tuple(starts), tuple(ends), tuple(busy))
