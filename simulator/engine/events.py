"""A small discrete-event core: tasks with dependencies on two kinds of resources.

* ``Stream``: runs its tasks strictly in the order they were added (a CUDA stream, a
  NCCL stream), one at a time; a task starts when it is the head, its dependencies have
  released it, and the stream is free.
* ``Link``: processor sharing; every active flow progresses at ``1/k`` of its standalone
  rate while ``k`` flows share the link (concurrent collectives on one NIC).

A dependency ``(task, frac)`` releases at ``start + frac * duration`` of a stream task
(``frac=1``: at its end); on a link task only ``frac=1`` is allowed, since its duration
depends on contention. The heap key is ``(time, sequence)``, so equal-time events run in
creation order and the same inputs give the same timeline.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from ..errors import ComplexityError


@dataclass
class Task:
    tid: int
    name: str
    resource: str
    work_s: float                              # standalone duration
    deps: list[tuple[int, float]]
    meta: dict[str, Any] = field(default_factory=dict)
    start_s: float = -1.0
    end_s: float = -1.0
    ready_s: float = -1.0
    critical_dep: int = -1                     # dependency that released last


class Engine:
    """Build with ``stream``/``link``/``add``; ``run()`` fills start/end times."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self._kinds: dict[str, str] = {}
        self._queues: dict[str, list[int]] = {}

    def stream(self, name: str) -> None:
        self._kinds.setdefault(name, "stream")
        self._queues.setdefault(name, [])

    def link(self, name: str) -> None:
        self._kinds.setdefault(name, "link")
        self._queues.setdefault(name, [])

    def add(self, name: str, resource: str, work_s: float,
            deps: list[tuple[int, float]] | None = None, **meta: Any) -> int:
        if resource not in self._kinds:
            raise ComplexityError(f"unknown resource {resource!r}")
        if work_s < 0:
            raise ComplexityError(f"negative duration for task {name!r}")
        t = Task(len(self.tasks), name, resource, float(work_s), [], dict(meta))
        self.tasks.append(t)
        self._queues[resource].append(t.tid)
        for d, frac in deps or []:
            self.depend(t.tid, d, frac)
        return t.tid

    def depend(self, tid: int, dep: int, frac: float = 1.0) -> None:
        """Task ``tid`` may start only once ``dep`` has released it (see module doc)."""
        if not (0 <= dep < len(self.tasks) and 0 <= tid < len(self.tasks)) or dep == tid:
            raise ComplexityError(f"bad dependency {dep} -> {tid}")
        if self._kinds[self.tasks[dep].resource] == "link" and frac < 1:
            raise ComplexityError(f"task {self.tasks[tid].name!r}: partial dependency on a link task")
        self.tasks[tid].deps.append((dep, min(1.0, max(0.0, float(frac)))))

    # ---- simulation --------------------------------------------------------------------
    def run(self) -> float:
        """Simulate; returns the makespan in seconds."""
        sim = _Sim(self)
        sim.go()
        unfinished = [t.name for t in self.tasks if t.end_s < 0]
        if unfinished:
            raise ComplexityError(f"deadlock: {len(unfinished)} tasks never ran, e.g. {unfinished[:3]}")
        return max((t.end_s for t in self.tasks), default=0.0)


class _Sim:
    def __init__(self, eng: Engine) -> None:
        self.e = eng
        self.heap: list[tuple[float, int, str, int, int]] = []   # time, seq, kind, task, aux
        self.seq = 0
        self.pending = [len(t.deps) for t in eng.tasks]
        self.dependents: list[list[tuple[int, float]]] = [[] for _ in eng.tasks]
        for t in eng.tasks:
            for d, frac in t.deps:
                self.dependents[d].append((t.tid, frac))
        self.head = {r: 0 for r in eng._queues}
        self.busy = {r: False for r in eng._queues}
        self.flows: dict[str, dict[int, float]] = {r: {} for r in eng._queues}  # tid -> remaining work
        self.link_clock = {r: 0.0 for r in eng._queues}
        self.version = {r: 0 for r in eng._queues}

    def push(self, time: float, kind: str, tid: int, aux: int = 0) -> None:
        """``aux``: link version for "flow" events, releasing task for "release" events."""
        heapq.heappush(self.heap, (time, self.seq, kind, tid, aux))
        self.seq += 1

    def go(self) -> None:
        for t in self.e.tasks:
            if not t.deps:
                self.push(0.0, "ready", t.tid)
        while self.heap:
            now, _, kind, tid, ver = heapq.heappop(self.heap)
            if kind == "ready":
                self.on_ready(now, tid)
            elif kind == "end":
                self.on_end(now, tid)
            elif kind == "release":
                self.on_release(now, tid, ver)
            elif kind == "flow" and ver == self.version[self.e.tasks[tid].resource]:
                self.on_flow_end(now, self.e.tasks[tid].resource)

    def on_release(self, now: float, tid: int, source: int) -> None:
        self.pending[tid] -= 1
        t = self.e.tasks[tid]
        if now >= t.ready_s:
            t.ready_s = now
            t.critical_dep = source
        if self.pending[tid] == 0:
            self.push(now, "ready", tid)

    def release_dependents(self, task: Task, now: float, at_end: bool) -> None:
        for dep, frac in self.dependents[task.tid]:
            if (frac >= 1) == at_end:
                when = now if at_end else task.start_s + frac * task.work_s
                self.push(when, "release", dep, task.tid)

    def on_ready(self, now: float, tid: int) -> None:
        t = self.e.tasks[tid]
        t.ready_s = max(t.ready_s, now)
        r = t.resource
        if self.e._kinds[r] == "stream":
            self.try_start_stream(now, r)
        else:
            self.advance_link(now, r)
            self.flows[r][tid] = t.work_s
            t.start_s = now
            self.schedule_link(now, r)

    def try_start_stream(self, now: float, r: str) -> None:
        q = self.e._queues[r]
        if self.busy[r] or self.head[r] >= len(q):
            return
        t = self.e.tasks[q[self.head[r]]]
        if self.pending[t.tid] > 0 or t.ready_s < 0 or t.ready_s > now:
            return
        self.busy[r] = True
        t.start_s = now
        self.push(now + t.work_s, "end", t.tid)
        self.release_dependents(t, now, at_end=False)

    def on_end(self, now: float, tid: int) -> None:
        t = self.e.tasks[tid]
        t.end_s = now
        self.busy[t.resource] = False
        self.head[t.resource] += 1
        self.release_dependents(t, now, at_end=True)
        self.try_start_stream(now, t.resource)

    # ---- processor-sharing links -------------------------------------------------------
    def advance_link(self, now: float, r: str) -> None:
        flows = self.flows[r]
        if flows:
            dt = (now - self.link_clock[r]) / len(flows)
            for k in flows:
                flows[k] -= dt
        self.link_clock[r] = now

    def schedule_link(self, now: float, r: str) -> None:
        self.version[r] += 1
        flows = self.flows[r]
        if not flows:
            return
        tid = min(flows, key=lambda k: (flows[k], k))
        finish = now + max(0.0, flows[tid]) * len(flows)
        self.push(finish, "flow", tid, self.version[r])

    def on_flow_end(self, now: float, r: str) -> None:
        self.advance_link(now, r)
        flows = self.flows[r]
        done = [k for k, w in flows.items() if w <= 1e-12 * max(1.0, now)]
        if not done:
            done = [min(flows, key=lambda k: (flows[k], k))]
        for k in sorted(done):
            del flows[k]
            t = self.e.tasks[k]
            t.end_s = now
            self.release_dependents(t, now, at_end=True)
        self.schedule_link(now, r)
