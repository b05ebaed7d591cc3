"""What one traced step measured: time per op family, host time, communication exposed and
overlapped. Shared by the trace fit (``calibrate.trace_fit``) and the doctor.

Intervals are unions on a line (seconds from the trace start). On a CPU-only trace the
"device" is the host thread itself: an op's time is its host time (``OpRecord.cpu_s``),
and host time is what is left of the step outside operators and exposed communication
(Python, autograd bookkeeping, views, dispatch). On a GPU trace an op's time is its kernel
time, and the device is idle where no kernel runs.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .trace_import import SIM_FAMILIES, KinetoTrace, OpRecord, StepWindow

Interval = tuple[float, float]
CLEAN_PRESSURE = 0.30      # a traced step with more host CPU pressure than this is skipped


# ---- interval arithmetic -------------------------------------------------------------------
def union(iv: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(x for x in iv if x[1] > x[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(iv: Sequence[Interval]) -> float:
    return sum(b - a for a, b in iv)


def intersect(x: Sequence[Interval], y: Sequence[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(iv: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in iv if min(b, hi) > max(a, lo)]


# ---- steps --------------------------------------------------------------------------------
def clean_steps(tr: KinetoTrace, limit: float = CLEAN_PRESSURE) -> tuple[list[StepWindow], str]:
    """Steps other load did not disturb (pressure recorded by validate-run), else all; the
    first step is dropped when there are three or more (allocator and cache warm-up)."""
    steps = list(tr.steps[1:] if len(tr.steps) >= 3 else tr.steps)
    known = [s for s in steps if s.pressure is not None]
    if not known:
        return steps, f"{len(steps)} step(s) (no pressure recorded)"
    clean = [s for s in known if s.pressure <= limit]
    if clean:
        return clean, f"{len(clean)} of {len(steps)} step(s) with host CPU pressure <= {limit:.0%}"
    return steps, (f"all {len(steps)} step(s): none ran with host CPU pressure <= {limit:.0%} "
                   "(other load on the host; times are pessimistic)")


def op_time_s(op: OpRecord, gpu: bool, event_cost_s: float = 0.0) -> float:
    """Kernel time on a GPU trace; host time on a CPU trace, less the profiler's cost of the
    events recorded inside the operator."""
    return op.kernel_s if gpu else max(0.0, op.cpu_s - event_cost_s * op.n_events)


def event_cost(tr: KinetoTrace, steps: Sequence[StepWindow]) -> tuple[float, str]:
    """The profiler's cost per recorded host event: (traced step - unprofiled step) / events
    when validate-run recorded both away from other load, else its microbenchmark of the
    profiler (``profiler_s_per_event``, a lower bound: it records small ``add`` calls),
    else 0 (a trace from elsewhere)."""
    meta = tr.meta
    ref = meta.get("unprofiled_median_step_s")
    clean = [s for s in steps if s.pressure is not None and s.pressure <= CLEAN_PRESSURE]
    counts = [tr.events_per_step[s.index] for s in clean if s.index < len(tr.events_per_step)]
    micro = float(meta.get("profiler_s_per_event") or 0.0)
    if ref and meta.get("unprofiled_clean_steps", 0) >= 3 and len(clean) >= 2 and counts:
        diff = statistics.median(s.wall_s for s in clean) - float(ref)
        per = diff / statistics.median(counts)
        if per > micro:
            return per, (f"{per * 1e6:.2f} us per recorded event: traced step minus "
                         f"unprofiled step ({diff * 1e3:.3f} ms) over "
                         f"{statistics.median(counts):.0f} events")
    if micro > 0:
        return micro, (f"{micro * 1e6:.2f} us per recorded event (microbenchmark of the "
                       "profiler; a lower bound)")
    return 0.0, "no correction for the profiler's own cost (the trace does not say)"


# ---- one step -----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepMeasure:
    """Measured time of one step, split the way the simulator splits it (seconds)."""

    step: int
    wall_s: float
    family_s: dict[str, float]               # simulator families (op time, not host)
    other_s: dict[str, float]                # ops the simulator does not price, by label
    n_ops: dict[str, int]                    # leaf ops per family
    phase_family_s: dict[str, float]         # "family:phase" -> seconds
    host_s: float                            # CPU: outside ops and exposed comm; GPU: device idle
    comm_s: float                            # collectives in flight (union)
    comm_exposed_s: float                    # ... while no compute ran
    comm_overlapped_s: float
    bwd_compute_s: float                     # compute in backward (what comm could hide behind)
    comm_by_op: dict[str, float] = field(default_factory=dict)
    streams_s: dict[str, float] = field(default_factory=dict)   # GPU: busy time per stream
    host_by_family: dict[str, float] = field(default_factory=dict)  # CPU: host time before
    # each operator (since the previous one on its thread, blocked collectives left out),
    # by the family of the operator it led to
    profiler_s: float = 0.0                  # the profiler's own cost, taken out of the above

    @property
    def priced_s(self) -> float:
        return sum(self.family_s.values())

    @property
    def unpriced_s(self) -> float:
        return sum(self.other_s.values())


def _compute_intervals(ops: Sequence[OpRecord], tr: KinetoTrace, s: StepWindow) -> list[Interval]:
    if tr.has_gpu:
        return union(clip(((k.ts_s, k.ts_s + k.dur_s) for k in tr.kernels
                           if k.step == s.index and k.family != "comm"), s.start_s, s.end_s))
    return union(clip(((o.ts_s, o.end_s) for o in ops), s.start_s, s.end_s))


def _comm_intervals(tr: KinetoTrace, s: StepWindow) -> tuple[list[Interval], dict[str, float]]:
    """Device-side executions where the trace has them, else the blocking host calls."""
    recs = [c for c in tr.comms if c.step == s.index and c.collective != "wait"]
    dev = [c for c in recs if c.where == "device"]
    use = dev or [c for c in recs if c.where == "host"]
    by: dict[str, float] = {}
    for c in use:
        by[c.collective] = by.get(c.collective, 0.0) + c.dur_s
    return union(clip(((c.ts_s, c.ts_s + c.dur_s) for c in use), s.start_s, s.end_s)), by


def measure_step(tr: KinetoTrace, s: StepWindow, event_cost_s: float = 0.0) -> StepMeasure:
    """``event_cost_s``: the profiler's cost per recorded host event (``event_cost``), taken
    out of each operator's time (per event inside it) and of the host time (the rest)."""
    gpu = tr.has_gpu
    c = 0.0 if gpu else event_cost_s
    ops = [o for o in tr.ops if o.step == s.index]
    fam: dict[str, float] = {f: 0.0 for f in SIM_FAMILIES}
    other: dict[str, float] = {}
    n_ops: dict[str, int] = {}
    phase: dict[str, float] = {}
    for o in ops:
        t = op_time_s(o, gpu, c)
        if o.family == "other":
            other[o.label] = other.get(o.label, 0.0) + t
            continue
        fam[o.family] += t
        n_ops[o.family] = n_ops.get(o.family, 0) + 1
        key = f"{o.family}:{o.phase}"
        phase[key] = phase.get(key, 0.0) + t
    comp = _compute_intervals(ops, tr, s)
    comm, by = _comm_intervals(tr, s)
    overlapped = length(intersect(comm, comp))
    exposed = length(comm) - overlapped
    events = tr.events_per_step[s.index] if s.index < len(tr.events_per_step) else 0
    prof = c * events
    if gpu:
        host = s.wall_s - length(union(comp + comm))
    else:        # the profiler's cost outside operators comes out of the host time
        host = s.wall_s - length(comp) - exposed - c * (events - sum(o.n_events for o in ops))
    bwd = [o for o in ops if o.phase == "bwd"]
    return StepMeasure(s.index, s.wall_s, fam, other, n_ops, phase, max(0.0, host),
                       length(comm), exposed, overlapped,
                       length(_compute_intervals(bwd, tr, s)) if bwd else 0.0, by,
                       _streams(tr, s) if gpu else {},
                       {} if gpu else host_by_family(ops, comm, s, tr.main_tid, max(0.0, host)),
                       prof)


def host_by_family(ops: Sequence[OpRecord], comm: Sequence[Interval], s: StepWindow,
                   main_tid: int, host_s: float | None = None) -> dict[str, float]:
    """Host time on the main thread before each operator, charged to that operator's family
    (time after the last operator goes to the last one's); scaled to sum to ``host_s``
    when given (the host time with the profiler's cost taken out)."""
    mine = sorted((o for o in ops if o.tid == main_tid), key=lambda o: o.ts_s)
    out: dict[str, float] = {}
    prev = s.start_s
    for o in mine + [None]:
        end = o.ts_s if o is not None else s.end_s
        fam = (o if o is not None else (mine[-1] if mine else None))
        if fam is None or end <= prev:
            prev = max(prev, o.end_s) if o is not None else prev
            continue
        gap = [(prev, end)]
        t = length(gap) - length(intersect(gap, comm))
        out[fam.family] = out.get(fam.family, 0.0) + max(0.0, t)
        if o is not None:
            prev = max(prev, o.end_s)
    raw = sum(out.values())
    if host_s is not None and raw > 0:
        out = {k: v * host_s / raw for k, v in out.items()}
    return out


def _streams(tr: KinetoTrace, s: StepWindow) -> dict[str, float]:
    by: dict[int, list[Interval]] = {}
    for k in tr.kernels:
        if k.step == s.index:
            by.setdefault(k.stream, []).append((k.ts_s, k.ts_s + k.dur_s))
    return {f"stream {sid}": length(union(clip(iv, s.start_s, s.end_s)))
            for sid, iv in sorted(by.items())}


def representative(measures: Sequence[StepMeasure]) -> StepMeasure:
    """The step with the median wall time (lower median)."""
    ordered = sorted(measures, key=lambda m: m.wall_s)
    return ordered[(len(ordered) - 1) // 2]


def median_wall_s(measures: Sequence[StepMeasure]) -> float:
    return statistics.median(m.wall_s for m in measures)
