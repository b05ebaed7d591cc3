"""Chrome / Perfetto trace of a simulated step (Trace Event Format, JSON).

One process per pipeline stage (one representative rank). Its threads, in this order:

* one per engine resource the stage's tasks run on (``compute``, and whatever else tasks
  carry, e.g. a host-dispatch stream), named after the resource;
* ``comm <group>`` per parallel group whose collectives the stage runs (``tp``, ``cp``,
  ``ep``, ``dp``, ``pp``), each collective at its place in the pass that contains it;
* ``link <kind>`` per link kind those collectives cross (``nvlink``, ``infiniband``...);

plus flow arrows from each task to the tasks that depend on it on another track (pipeline
hand-offs, gradient buckets, the optimizer), and a ``memory`` counter (GB held by the
rank over the step). Where slices on one track overlap (concurrent flows on a link), the
track is split into lanes (``link nvlink #2``) so that every thread's slices nest.
Timestamps are microseconds. ``validate_trace_events`` checks the format.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from ..boundary.files import atomic_write_bytes, atomic_write_text
from ..engine.result import Result

_ORDER = ("compute", "host", "dispatch", "comm.tp", "comm.cp", "comm.ep", "comm.dp",
          "comm.pp", "comm.", "link")


def _ns(t_s: float) -> int:
    return round(t_s * 1e9)


def _us(t_s: float) -> float:
    """Microseconds, an exact number of nanoseconds (the trace processor's unit)."""
    return _ns(t_s) / 1000


def _track_name(resource: str, stage: int) -> str:
    prefix = f"stage{stage}."
    name = resource[len(prefix):] if resource.startswith(prefix) else resource
    return name.replace(".", " ")


def _track_rank(name: str) -> int:
    key = name.replace(" ", ".")
    return next((i for i, p in enumerate(_ORDER) if key == p or key.startswith(p)), len(_ORDER))


def _lanes(recs: list[dict[str, Any]]) -> dict[int, int]:
    """Lane per record (by list index) so that slices in one lane never partly overlap."""
    ends: list[float] = []
    out: dict[int, int] = {}
    for i, r in sorted(enumerate(recs), key=lambda ir: (_us(ir[1]["start_s"]), ir[0])):
        start = _us(r["start_s"])
        lane = next((k for k, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = max(ends[lane], _us(r["end_s"]))
        out[i] = lane
    return out


def _threads(slices: list[dict[str, Any]]) -> tuple[dict[int, tuple[int, int]], list[dict]]:
    """(record index -> (pid, tid), metadata events) with tracks ordered per stage."""
    by_track: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, r in enumerate(slices):
        by_track[(int(r.get("stage", 0)), r["resource"])].append(i)
    where: dict[int, tuple[int, int]] = {}
    meta: list[dict] = []
    next_tid: dict[int, int] = defaultdict(lambda: 1)
    order = sorted(by_track, key=lambda k: (k[0], _track_rank(_track_name(k[1], k[0])),
                                            _track_name(k[1], k[0])))
    for stage, res in order:
        idx = by_track[(stage, res)]
        lanes = _lanes([slices[i] for i in idx])
        base = next_tid[stage]
        n_lanes = max(lanes.values()) + 1
        for lane in range(n_lanes):
            name = _track_name(res, stage) + (f" #{lane + 1}" if lane else "")
            meta += [{"ph": "M", "name": "thread_name", "pid": stage, "tid": base + lane,
                      "args": {"name": name}},
                     {"ph": "M", "name": "thread_sort_index", "pid": stage, "tid": base + lane,
                      "args": {"sort_index": base + lane}}]
        for j, i in enumerate(idx):
            where[i] = (stage, base + lanes[j])
        next_tid[stage] = base + n_lanes
    for stage in sorted(next_tid):
        meta += [{"ph": "M", "name": "process_name", "pid": stage, "tid": 0,
                  "args": {"name": f"pipeline stage {stage}"}},
                 {"ph": "M", "name": "process_sort_index", "pid": stage, "tid": 0,
                  "args": {"sort_index": stage}}]
    return where, meta


_NOT_ARGS = ("name", "resource", "start_s", "end_s", "deps", "tid")


def _slice_event(r: dict[str, Any], pid: int, tid: int) -> dict[str, Any]:
    a, b = _ns(r["start_s"]), _ns(r["end_s"])
    args = {k: v for k, v in r.items() if k not in _NOT_ARGS}
    if "tid" in r:
        args["task"] = r["tid"]
    return {"ph": "X", "name": r["name"], "cat": r.get("kind", ""), "pid": pid, "tid": tid,
            "ts": a / 1000, "dur": max(0, b - a) / 1000, "args": args}


def _mid_us(r: dict[str, Any]) -> float | None:
    """Midpoint of a slice in whole nanoseconds (None for an empty slice): a v1 flow event
    binds to the slice open at its timestamp on its thread, so it sits strictly inside."""
    a, b = _ns(r["start_s"]), _ns(r["end_s"])
    return (a + (b - a) // 2) / 1000 if b - a >= 2 else None


def _flows(slices: list[dict[str, Any]], where: dict[int, tuple[int, int]]) -> list[dict]:
    """Arrows from a task to each task that waits for it on another track (flow v1 events:
    ``s`` in the source slice, ``f`` with ``bp: e`` in the destination slice)."""
    by_task = {r["tid"]: i for i, r in enumerate(slices) if "tid" in r}
    out: list[dict] = []
    for j, r in enumerate(slices):
        for d in r.get("deps", ()):
            i = by_task.get(d)
            if i is None or where[i] == where[j]:
                continue
            src = slices[i]
            a, b = _mid_us(src), _mid_us(r)
            if a is None or b is None:
                continue
            pipeline = bool({"pp_send", "pp_recv"} & {src.get("kind"), r.get("kind")})
            name, n = ("pipeline" if pipeline else "dependency"), len(out) // 2 + 1
            out += [{"ph": "s", "id": n, "name": name, "cat": "flow", "pid": where[i][0],
                     "tid": where[i][1], "ts": a},
                    {"ph": "f", "bp": "e", "id": n, "name": name, "cat": "flow",
                     "pid": where[j][0], "tid": where[j][1], "ts": b}]
    return out


def _counters(recs: Iterable[dict[str, Any]]) -> list[dict]:
    return [{"ph": "C", "name": "memory", "pid": int(r["stage"]), "tid": 0, "ts": _us(r["t_s"]),
             "args": {"GB": round(r["value"] / 1e9, 6)}}
            for r in recs if r.get("counter") == "memory_bytes"]


def chrome_trace(result: Result) -> dict[str, Any]:
    """Trace-event JSON of ``result.timeline`` (empty for the analytic engine)."""
    slices = [r for r in result.timeline if "resource" in r]
    where, meta = _threads(slices)
    events = meta + [_slice_event(r, *where[i]) for i, r in enumerate(slices)]
    events += _flows(slices, where) + _counters(r for r in result.timeline if "counter" in r)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_time_s": result.step_time_s, "engine": result.engine}}


def write_chrome_trace(path: str | Path, result: Result) -> None:
    """JSON, gzip-compressed when ``path`` ends in ``.gz`` (Perfetto opens both)."""
    text = json.dumps(chrome_trace(result), sort_keys=True) + "\n"
    if str(path).endswith(".gz"):
        import gzip
        atomic_write_bytes(path, gzip.compress(text.encode(), mtime=0))
    else:
        atomic_write_text(path, text)


# ---- format check ----------------------------------------------------------------------------
_REQUIRED = {"X": ("name", "pid", "tid", "ts", "dur"), "M": ("name", "pid", "args"),
             "C": ("name", "pid", "ts", "args"), "s": ("id", "pid", "tid", "ts"),
             "f": ("id", "pid", "tid", "ts")}


def validate_trace_events(trace: dict[str, Any]) -> list[str]:
    """Problems with ``trace`` as Trace Event Format JSON (Google's "Trace Event Format"
    document): required fields per phase, non-negative times, slices on one thread that
    nest (never partly overlap), every flow start with one finish, both strictly inside a
    slice of their thread (what Perfetto's importer binds them to), and numeric counter
    values. Empty when it is well formed."""
    bad: list[str] = []
    evs = trace.get("traceEvents")
    if not isinstance(evs, list):
        return ["traceEvents is not a list"]
    for e in evs:
        need = _REQUIRED.get(e.get("ph"))
        if need is None:
            bad.append(f"unknown phase {e.get('ph')!r}")
        elif any(k not in e for k in need):
            bad.append(f"{e.get('ph')} event without {[k for k in need if k not in e]}")
        elif e.get("ts", 0) < 0 or e.get("dur", 0) < 0:
            bad.append(f"negative time in {e.get('name')}")
        elif e["ph"] == "C" and not all(isinstance(v, (int, float)) for v in e["args"].values()):
            bad.append(f"counter {e['name']} with a non-numeric value")
    return bad + _nesting_problems(evs) + _flow_problems(evs)


def _spans_ns(evs: list[dict]) -> dict[tuple, list[tuple[int, int]]]:
    """Slices per thread in integer nanoseconds, as a trace processor reads them."""
    per: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for e in evs:
        if e.get("ph") == "X" and all(k in e for k in _REQUIRED["X"]):
            a = round(e["ts"] * 1000)
            per[(e["pid"], e["tid"])].append((a, a + round(e["dur"] * 1000)))
    return per


def _nesting_problems(evs: list[dict]) -> list[str]:
    bad = []
    for key, spans in _spans_ns(evs).items():
        stack: list[int] = []
        for a, b in sorted(spans, key=lambda ab: (ab[0], -ab[1])):
            while stack and stack[-1] <= a:
                stack.pop()
            if stack and b > stack[-1]:
                bad.append(f"slices partly overlap on pid/tid {key} at ts {a}")
                break
            stack.append(b)
    return bad


def _flow_problems(evs: list[dict]) -> list[str]:
    spans = _spans_ns(evs)
    starts = {e["id"]: e for e in evs if e.get("ph") == "s" and "ts" in e and "id" in e}
    ends = {e["id"]: e for e in evs if e.get("ph") == "f" and "ts" in e and "id" in e}
    bad = [f"flow {i} without a finish" for i in starts if i not in ends]
    bad += [f"flow {i} without a start" for i in ends if i not in starts]
    bad += [f"flow {i} finish does not bind its enclosing slice" for i, e in ends.items()
            if e.get("bp") != "e"]
    for e in list(starts.values()) + list(ends.values()):
        t = round(e["ts"] * 1000)
        if not any(a < t < b for a, b in spans[(e["pid"], e["tid"])]):
            bad.append(f"flow {e['id']} ({e['ph']}) not inside a slice of its thread")
    return bad
