"""Where the critical stage's time went, read off its played tasks: each compute-stream
task by kind (a pass by its ``PassCost``), each idle gap by the dependency that ended it.
Shared by the event engine and its sweep (``engine.sweep``)."""
from __future__ import annotations

from ..parallel.units import Unit
from .events import Task
from .stage_work import ChunkWork
from .step import StageTasks


def event_breakdown(tasks: list[Task], s: StageTasks, chunks: list[ChunkWork], end: float,
                    by_tid: dict[int, Unit] | None = None) -> tuple[dict[str, float], float]:
    """(parts, busy seconds) of the stage whose tasks are ``s`` and which ends at ``end``:
    each task of its compute stream by kind, and each idle gap before one by what released
    it last (``_attribute_gap``). ``tasks`` is indexed by task id; ``by_tid``: the pass each
    pass task runs (default: from ``s.units``; any unit of the same pass kind and chunk
    will do, its cost is what is read)."""
    comp = [t for t in tasks if t.resource == s.compute]
    parts = {"compute": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0, "dp": 0.0, "pp": 0.0,
             "bubble": 0.0, "optimizer": 0.0, "interference": 0.0, "host": 0.0}
    if by_tid is None:
        by_tid = {tid: u for u, tid in s.units.items()}
    prev_end = 0.0
    for t in comp:
        gap = t.start_s - prev_end
        if gap > 0:
            _attribute_gap(tasks, t, gap, parts)
        prev_end = t.end_s
        if t.tid == s.optimizer:
            parts["optimizer"] += t.work_s
            continue
        if t.meta.get("kind") == "interference":
            parts["interference"] += t.work_s
            continue
        if t.meta.get("kind") in ("pp_send", "pp_recv"):
            parts["pp"] += t.work_s
            continue
        if t.meta.get("kind") in ("host", "host_wait"):
            parts["host"] += t.work_s
            continue
        u = by_tid[t.tid]
        pc = chunks[u.chunk].pass_cost(u)
        parts["compute"] += pc.compute_s
        parts["interference"] += pc.interference_s + t.meta.get("pair_interference_s", 0.0)
        for g, v in pc.comm_s.items():
            parts[g] = parts.get(g, 0.0) + v
        for g, v in t.meta.get("hidden_s", {}).items():     # DualPipe: beside its pair
            parts[g] -= v
    parts["dp"] += max(0.0, end - prev_end)          # exposed param all-gather after optimizer
    busy = sum(t.work_s for t in comp)
    return parts, busy


def _attribute_gap(tasks: list[Task], t: Task, gap: float, parts: dict) -> None:
    """Name what the compute stream waited ``gap`` seconds for before ``t``: the task that
    released ``t`` last. A host issue task counts as host time only from its own start to
    the moment it released ``t`` (the device waits for the first op of a pass, not the
    whole issue); if it started late itself (it waited for a pipeline hand-off, say), the
    rest of the gap goes to what it waited for, followed back along the host stream."""
    while gap > 0:
        dep = tasks[t.critical_dep] if t.critical_dep >= 0 else None
        kind = dep.meta.get("kind") if dep else None
        if dep is not None and t.meta.get("kind") in ("pp_send", "pp_recv") and \
                dep.meta.get("stage") != t.meta.get("stage"):
            parts["bubble"] += gap           # a rendezvous waiting for its partner's stage
            return
        if kind in ("pp_send", "pp_recv"):
            pp = min(gap, dep.end_s - dep.start_s)
            parts["pp"] += pp
            parts["bubble"] += gap - pp
        elif kind == "dp_comm":
            parts["dp"] += gap
        elif kind in ("host", "host_wait"):
            own = min(gap, max(0.0, t.start_s - dep.start_s))   # t waited for a fraction
            parts["host"] += own
            gap, t = gap - own, dep
            continue
        else:
            parts["bubble"] += gap
        return
