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
import itertools
from dataclasses import dataclass, field
from typing import Any

from ..errors import ComplexityError


@dataclass(slots=True)
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
        t = Task(len(self.tasks), name, resource, float(work_s), [], meta)
        self.tasks.append(t)
        self._queues[resource].append(t.tid)
        for d, frac in deps or []:
            self.depend(t.tid, d, frac)
        return t.tid

    def last_on(self, resource: str) -> int:
        """The task added last to ``resource`` (-1: none yet)."""
        q = self._queues[resource]
        return q[-1] if q else -1

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


_READY, _END, _RELEASE, _FLOW = 0, 1, 2, 3      # event kinds, in no particular order


class _Sim:
    """The event loop over flat per-task lists (resources numbered, task fields copied out
    and written back at the end): same events, same order, same arithmetic as playing on
    the ``Task`` objects, at a fraction of the attribute traffic."""

    def __init__(self, eng: Engine) -> None:
        tasks = eng.tasks
        names = list(eng._queues)
        rid = {r: i for i, r in enumerate(names)}
        self.tasks = tasks
        self.is_link = [eng._kinds[r] == "link" for r in names]
        self.queues = [eng._queues[r] for r in names]
        self.res = [rid[t.resource] for t in tasks]
        self.work = [t.work_s for t in tasks]
        n = len(tasks)
        self.start = [-1.0] * n
        self.end = [-1.0] * n
        self.ready = [-1.0] * n
        self.crit = [-1] * n
        self.pending = [len(t.deps) for t in tasks]
        self.at_end: list[list[int]] = [[] for _ in range(n)]
        self.partial: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for t in tasks:
            for d, frac in t.deps:
                if frac >= 1:
                    self.at_end[d].append(t.tid)
                else:
                    self.partial[d].append((t.tid, frac))
        k = len(names)
        self.heap: list[tuple[float, int, int, int, int]] = []   # time, seq, kind, task, aux
        self.seq = itertools.count()
        self.head = [0] * k
        self.busy = [False] * k
        self.flows: list[dict[int, float]] = [{} for _ in range(k)]   # tid -> remaining work
        self.link_clock = [0.0] * k
        self.version = [0] * k

    def push(self, time: float, kind: int, tid: int, aux: int = 0) -> None:
        """``aux``: link version for flow events, releasing task for release events."""
        heapq.heappush(self.heap, (time, next(self.seq), kind, tid, aux))

    def go(self) -> None:
        """The loop, with the stream events written out inline (``on_release``,
        ``on_end``, ``on_ready`` and ``try_start_stream`` do the same, one call each)."""
        for t in self.tasks:
            if not t.deps:
                self.push(0.0, _READY, t.tid)
        heap, pop, push, seq = self.heap, heapq.heappop, heapq.heappush, self.seq
        pending, ready, crit, res, is_link = (self.pending, self.ready, self.crit, self.res,
                                              self.is_link)
        end, at_end, start_stream = self.end, self.at_end, self.try_start_stream
        while heap:
            now, _, kind, tid, aux = pop(heap)
            if kind == _RELEASE:
                pending[tid] -= 1
                if now >= ready[tid]:
                    ready[tid] = now
                    crit[tid] = aux
                if pending[tid] == 0:
                    push(heap, (now, next(seq), _READY, tid, 0))
            elif kind == _END:
                end[tid] = now
                r = res[tid]
                self.busy[r] = False
                self.head[r] += 1
                for dep in at_end[tid]:
                    push(heap, (now, next(seq), _RELEASE, dep, tid))
                start_stream(now, r)
            elif kind == _READY:
                ready[tid] = max(ready[tid], now)
                r = res[tid]
                if is_link[r]:
                    self.on_ready(now, tid)
                else:
                    start_stream(now, r)
            elif aux == self.version[res[tid]]:
                self.on_flow_end(now, res[tid])
        for t in self.tasks:
            i = t.tid
            t.start_s, t.end_s, t.ready_s, t.critical_dep = (self.start[i], self.end[i],
                                                              self.ready[i], self.crit[i])

    def on_release(self, now: float, tid: int, source: int) -> None:
        self.pending[tid] -= 1
        if now >= self.ready[tid]:
            self.ready[tid] = now
            self.crit[tid] = source
        if self.pending[tid] == 0:
            self.push(now, _READY, tid)

    def release_dependents(self, tid: int, now: float, at_end: bool) -> None:
        if at_end:
            for dep in self.at_end[tid]:
                self.push(now, _RELEASE, dep, tid)
        else:
            start, work = self.start[tid], self.work[tid]
            for dep, frac in self.partial[tid]:
                self.push(start + frac * work, _RELEASE, dep, tid)

    def on_ready(self, now: float, tid: int) -> None:
        self.ready[tid] = max(self.ready[tid], now)
        r = self.res[tid]
        if not self.is_link[r]:
            self.try_start_stream(now, r)
        else:
            self.advance_link(now, r)
            self.flows[r][tid] = self.work[tid]
            self.start[tid] = now
            self.schedule_link(now, r)

    def try_start_stream(self, now: float, r: int) -> None:
        q = self.queues[r]
        if self.busy[r] or self.head[r] >= len(q):
            return
        tid = q[self.head[r]]
        ready = self.ready[tid]
        if self.pending[tid] > 0 or ready < 0 or ready > now:
            return
        self.busy[r] = True
        self.start[tid] = now
        self.push(now + self.work[tid], _END, tid)
        if self.partial[tid]:
            self.release_dependents(tid, now, at_end=False)

    def on_end(self, now: float, tid: int) -> None:
        self.end[tid] = now
        r = self.res[tid]
        self.busy[r] = False
        self.head[r] += 1
        self.release_dependents(tid, now, at_end=True)
        self.try_start_stream(now, r)

    # ---- processor-sharing links -------------------------------------------------------
    def advance_link(self, now: float, r: int) -> None:
        flows = self.flows[r]
        if flows:
            dt = (now - self.link_clock[r]) / len(flows)
            for k in flows:
                flows[k] -= dt
        self.link_clock[r] = now

    def schedule_link(self, now: float, r: int) -> None:
        self.version[r] += 1
        flows = self.flows[r]
        if not flows:
            return
        tid = min(flows, key=lambda k: (flows[k], k))
        finish = now + max(0.0, flows[tid]) * len(flows)
        self.push(finish, _FLOW, tid, self.version[r])

    def on_flow_end(self, now: float, r: int) -> None:
        self.advance_link(now, r)
        flows = self.flows[r]
        done = [k for k, w in flows.items() if w <= 1e-12 * max(1.0, now)]
        if not done:
            done = [min(flows, key=lambda k: (flows[k], k))]
        for k in sorted(done):
            del flows[k]
            self.end[k] = now
            self.release_dependents(k, now, at_end=True)
        self.schedule_link(now, r)
