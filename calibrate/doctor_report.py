"""The doctor's outputs: a terminal table and a Perfetto trace with the measured step and the
simulated one on tracks side by side."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .doctor import Diagnosis
from .sim_ops import SimOp
from .trace_import import KinetoTrace

MEASURED_PID = 1
SIMULATED_PID = 2


def table(d: Diagnosis) -> str:
    real = d.measured_less_profiler_s
    lines = [f"trace {d.trace}, {d.step}",
             f"measured step   {d.measured_step_s * 1e3:10.2f} ms  (median of the steps used "
             f"{d.measured_median_step_s * 1e3:.2f} ms)"
             + (f"; {real * 1e3:.2f} ms without the profiler's own cost"
                if real < d.measured_step_s else ""),
             f"predicted step  {d.predicted_step_s * 1e3:10.2f} ms  "
             f"({100 * (d.predicted_step_s / real - 1):+.1f}%)",
             f"explained       {100 * d.explained_fraction:9.1f} %  of the measured step "
             f"(priced operator families alone {100 * d.priced_fraction:.1f} %)", "",
             f"{'':22s}{'measured ms':>12s}{'predicted ms':>14s}{'gap ms':>10s}"]
    for r in d.rows:
        lines.append(f"{r.what[:22]:22s}{r.measured_s * 1e3:12.2f}{r.predicted_s * 1e3:14.2f}"
                     f"{r.gap_s * 1e3:10.2f}")
    c = d.comm
    lines += ["", f"communication: in flight {c['measured_in_flight_s'] * 1e3:.2f} ms measured / "
              f"{c['predicted_in_flight_s'] * 1e3:.2f} ms predicted; overlapped "
              f"{c['measured_overlapped_s'] * 1e3:.2f} ms of "
              f"{c['measured_overlap_possible_s'] * 1e3:.2f} ms possible (predicted "
              f"{c['predicted_overlapped_s'] * 1e3:.2f} ms)"]
    if d.streams_s:
        lines.append("GPU streams busy: " + ", ".join(f"{k} {v * 1e3:.2f} ms"
                                                     for k, v in d.streams_s.items()))
    lines += ["", "largest gaps:"]
    for i, g in enumerate(d.gaps, 1):
        lines.append(f"{i}. {g.what}: {g.gap_s * 1e3:+.2f} ms. {g.explanation}")
        lines.append(f"   what-if: {g.whatif}")
    if not d.gaps:
        lines.append("   none above 1% of the step")
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)


def _meta(pid: int, name: str, tids: dict[str, int]) -> list[dict[str, Any]]:
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]
    ev += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}}
           for n, t in tids.items()]
    return ev


def _x(pid: int, tid: int, name: str, cat: str, ts_s: float, dur_s: float, **args) -> dict:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
            "ts": round(ts_s * 1e6, 3), "dur": round(max(dur_s, 0.0) * 1e6, 3), "args": args}


def measured_events(tr: KinetoTrace, step: int) -> list[dict[str, Any]]:
    s = tr.steps[step] if 0 <= step < len(tr.steps) else tr.steps[0]
    tids: dict[str, int] = {}

    def tid(name: str) -> int:
        return tids.setdefault(name, len(tids) + 1)
    ev = [_x(MEASURED_PID, tid("step"), s.name, "step", 0.0, s.wall_s)]
    for o in tr.ops:
        if o.step == s.index:
            ev.append(_x(MEASURED_PID, tid(f"ops (thread {o.tid})"), o.label, o.family,
                         o.ts_s - s.start_s, o.cpu_s, phase=o.phase))
    for k in tr.kernels:
        if k.step == s.index:
            ev.append(_x(MEASURED_PID, tid(f"stream {k.stream}"), k.name[:80], k.family,
                         k.ts_s - s.start_s, k.dur_s))
    for c in tr.comms:
        if c.step == s.index:
            ev.append(_x(MEASURED_PID, tid(f"collectives ({c.where})"), c.collective, "comm",
                         c.ts_s - s.start_s, c.dur_s, size_bytes=c.size_bytes))
    return _meta(MEASURED_PID, f"measured: {tr.path} {s.name}", tids) + ev


def simulated_events(res: Any, ops: list[SimOp], cluster_gpu: Any, prof: Any
                     ) -> list[dict[str, Any]]:
    """The engine's timeline (passes, buckets, optimizer) and, inside each pass, the
    simulator's ops laid end to end (one bar per op kind: count x time)."""
    from simulator.cost.layer import compute_time_s
    tids: dict[str, int] = {}
    ev = []
    tasks = [t for t in res.timeline if "resource" in t]      # not the memory counters
    for t in tasks:
        tid = tids.setdefault(t["resource"], len(tids) + 1)
        ev.append(_x(SIMULATED_PID, tid, t["name"], t.get("kind", ""), t["start_s"],
                     t["end_s"] - t["start_s"]))
    op_tid = tids.setdefault("ops (simulated)", len(tids) + 1)
    starts = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}
    for t in tasks:
        k = {"fwd": "fwd", "bwd": "bwd", "optimizer": "opt"}.get(t.get("kind", ""))
        if k and starts[k] == 0.0:
            starts[k] = t["start_s"]
    for s in ops:
        dur = s.count * compute_time_s(s.op, cluster_gpu, prof)
        ev.append(_x(SIMULATED_PID, op_tid, f"{s.op.name} x{s.count}", s.family,
                     starts[s.phase], dur))
        starts[s.phase] += dur
    return _meta(SIMULATED_PID, "simulated", tids) + ev


def write_perfetto(path: str | Path, d: Diagnosis, tr: KinetoTrace, step: int, res: Any,
                   ops: list[SimOp], gpu: Any, prof: Any) -> None:
    """Chrome trace JSON (opens in ui.perfetto.dev): both start at 0."""
    data = {"traceEvents": measured_events(tr, step) + simulated_events(res, ops, gpu, prof),
            "displayTimeUnit": "ms",
            "otherData": {"measured_step_s": d.measured_step_s,
                          "predicted_step_s": d.predicted_step_s}}
    Path(path).write_text(json.dumps(data, sort_keys=True) + "\n")
