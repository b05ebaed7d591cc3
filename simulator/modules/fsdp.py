"""FSDP / ZeRO-3 on a traced operator graph: per-unit all-gather prefetch and reduce-scatter.

Wrapping: every module at ``wrap_depth`` in the module tree that owns parameters is one
FSDP unit (what an auto-wrap policy around the model's blocks produces); parameters above
that depth form the root unit, which stays gathered for the whole step. ``wrap_depth=0``
picks the shallowest depth with at least ``min_units`` units.

Timeline (``simulator.engine.events.Engine``), after PyTorch FSDP's defaults:

* forward: unit ``i``'s all-gather is issued in order after unit ``i-1``'s; with
  ``limit_all_gathers`` at most two are in flight (it also waits for the forward of unit
  ``i-2``); a unit's forward ops wait for its gather; parameters are freed after the
  unit's forward (``reshard_after_forward``) except the root's;
* backward: each unit is gathered again before its first backward op; with
  ``backward_prefetch`` (BACKWARD_PRE) the gather for the next unit is issued when the
  current unit's backward starts, otherwise when it ends; the unit's gradients are
  reduce-scattered as soon as its backward is over;
* all-gathers and reduce-scatters share the rank's link (processor sharing); the optimizer
  runs on the local shard once every reduce-scatter is done.

Collective sizes: a unit's full parameter bytes in ``param_bytes`` per element (2 under
bf16 mixed precision) for the gather, gradient bytes in ``reduce_bytes`` for the
reduce-scatter; times from ``simulator.cost.kernels`` via the DP group (``ddp.DPComm``).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from ..engine.events import Engine
from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..network.collectives import Collective
from ..workload.traced import BACKWARD, TracedGraph
from .ddp import OPTIMIZERS, DPComm, optimizer_time_s

ROOT = "<root>"


@dataclass(frozen=True)
class FSDPConfig:
    wrap_depth: int = 0                   # 0 = auto (see fsdp_units)
    min_units: int = 4
    max_unit_share: float = 0.35
    reshard_after_forward: bool = True
    backward_prefetch: bool = True
    limit_all_gathers: bool = True
    param_bytes: int | None = None        # per element on the wire (None: the param dtype)
    reduce_bytes: int | None = None


@dataclass(frozen=True)
class Unit:
    name: str
    params: tuple[str, ...]
    numel: int
    nbytes: int


def _prefix(path: str, depth: int) -> str | None:
    parts = path.split(".") if path else []
    return ".".join(parts[:depth]) if len(parts) >= depth else None


def fsdp_units(graph: TracedGraph, cfg: FSDPConfig = FSDPConfig()) -> tuple[int, tuple[Unit, ...]]:
    """(wrap depth used, units in parameter order; the root unit, if any, first).

    Auto depth: the shallowest with at least ``min_units`` units none of which holds more
    than ``max_unit_share`` of the parameters (else the deepest tried)."""
    depths = [cfg.wrap_depth] if cfg.wrap_depth > 0 else range(1, 12)
    best: tuple[int, tuple[Unit, ...]] | None = None
    for d in depths:
        groups: OrderedDict[str, list] = OrderedDict([(ROOT, [])])
        for p in graph.params:
            key = _prefix(p.module, d) if p.module else None
            groups.setdefault(key or ROOT, []).append(p)
        units = tuple(Unit(k, tuple(p.name for p in v), sum(p.numel for p in v),
                           sum(p.nbytes for p in v)) for k, v in groups.items() if v)
        best = (d, units)
        wrapped = [u.nbytes for u in units if u.name != ROOT]
        total = sum(u.nbytes for u in units) or 1
        if len(wrapped) >= cfg.min_units and max(wrapped) <= cfg.max_unit_share * total:
            break
    assert best is not None
    return best


def _unit_of(module: str, depth: int, names: set[str]) -> str:
    key = _prefix(module, depth) if module else None
    return key if key in names else ROOT


@dataclass(frozen=True)
class FSDPResult:
    step_time_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    exposed_comm_s: float
    optimizer_s: float
    wrap_depth: int
    units: tuple[dict[str, Any], ...]
    memory: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


def _segments(graph: TracedGraph, times: Sequence[float], depth: int, names: set[str]):
    """Consecutive ops of one unit and phase -> (unit, backward?, seconds)."""
    segs: list[list[Any]] = []
    for op, t in zip(graph.ops, times):
        key = (_unit_of(op.module, depth, names), op.phase == BACKWARD)
        if segs and (segs[-1][0], segs[-1][1]) == key:
            segs[-1][2] += t
        else:
            segs.append([key[0], key[1], t])
    return segs


class _FSDPBuild:
    def __init__(self, graph, times, comm: DPComm, cfg: FSDPConfig, units, depth, scale):
        self.g, self.comm, self.cfg, self.scale = graph, comm, cfg, scale
        self.units = {u.name: u for u in units}
        self.segs = _segments(graph, times, depth, set(self.units))
        self.eng = Engine()
        self.eng.stream("compute")
        self.eng.link("net")
        self.comp: list[int] = []
        self.comm_tasks: list[int] = []

    def _bytes(self, u: Unit, reduce: bool) -> float:
        per = self.cfg.reduce_bytes if reduce else self.cfg.param_bytes
        return u.numel * per if per else u.nbytes

    def _coll(self, name: str, coll: Collective, u: Unit, deps: list, reduce: bool) -> int:
        t = self.comm.collective_s(coll, self._bytes(u, reduce))
        tid = self.eng.add(name, "net", t, deps, kind="comm", unit=u.name)
        self.comm_tasks.append(tid)
        return tid

    def build(self, optimizer: str, gpu: GPUSpec, prof: Profile) -> float:
        gathered: dict[str, int] = {}
        ag_order: list[int] = []
        first_bwd_seg: dict[str, int] = {}
        last_seg: dict[tuple[str, bool], int] = {}
        prev = -1
        for i, (u, bwd, secs) in enumerate(self.segs):
            has_params = u in self.units
            need = has_params and (u not in gathered or (
                bwd and u != ROOT and self.cfg.reshard_after_forward and u not in first_bwd_seg))
            if need:
                gathered[u] = self._gather(u, bwd, prev, ag_order)
            deps = ([(gathered[u], 1.0)] if has_params else []) + ([(prev, 1.0)] if prev >= 0 else [])
            prev = self.eng.add(f"{'B' if bwd else 'F'} {u}", "compute",
                                secs * (self.scale[i] if i < len(self.scale) else 1.0), deps,
                                kind="compute", unit=u)
            self.comp.append(prev)
            last_seg[(u, bwd)] = prev
            if bwd:
                first_bwd_seg.setdefault(u, prev)
        rs = [self._coll(f"reduce-scatter {u}", Collective.REDUCE_SCATTER, self.units[u],
                         [(tid, 1.0)], True) for (u, bwd), tid in last_seg.items()
              if bwd and u in self.units]
        self.opt = self.eng.add("optimizer (local shard)", "compute",
                                optimizer_time_s(self.g, optimizer, gpu, prof, self.comm.size),
                                [(t, 1.0) for t in rs] + [(prev, 1.0)], kind="optimizer")
        return self.eng.run()

    def _gather(self, u: str, bwd: bool, prev: int, order: list[int]) -> int:
        deps = [(order[-1], 1.0)] if order else []
        if bwd and prev >= 0:                         # prefetch: at the start (PRE) or end
            deps.append((prev, 0.0 if self.cfg.backward_prefetch else 1.0))
        elif not bwd and self.cfg.limit_all_gathers and len(self.comp) >= 2:
            deps.append((self.comp[-2], 1.0))
        tid = self._coll(f"all-gather {u}{' (bwd)' if bwd else ''}", Collective.ALL_GATHER,
                         self.units[u], deps, False)
        order.append(tid)
        return tid


def simulate_fsdp(graph: TracedGraph, times: Sequence[float], comm: DPComm, gpu: GPUSpec,
                  prof: Profile, cfg: FSDPConfig = FSDPConfig(),
                  optimizer: str = "adam") -> FSDPResult:
    """One FSDP (ZeRO-3) training step of ``graph`` on each rank of ``comm``."""
    if len(times) != len(graph.ops):
        raise InvalidInputError("times", len(times), f"one time per op ({len(graph.ops)})")
    depth, units = fsdp_units(graph, cfg)
    b = _FSDPBuild(graph, times, comm, cfg, units, depth, [])
    b.build(optimizer, gpu, prof)
    slow = prof.overlap_slowdown.value
    if slow != 1.0 and comm.size > 1:
        spans = [(b.eng.tasks[t].start_s, b.eng.tasks[t].end_s) for t in b.comm_tasks]
        scale = []
        for tid in b.comp:
            t = b.eng.tasks[tid]
            dur = t.end_s - t.start_s
            ov = sum(max(0.0, min(t.end_s, e) - max(t.start_s, s)) for s, e in spans)
            scale.append(1.0 + (slow - 1.0) * min(1.0, ov / dur) if dur > 0 else 1.0)
        b = _FSDPBuild(graph, times, comm, cfg, units, depth, scale)
        b.build(optimizer, gpu, prof)
    return _fsdp_result(graph, times, comm, b, depth, units, optimizer)


def _fsdp_result(graph, times, comm: DPComm, b: _FSDPBuild, depth, units, optimizer) -> FSDPResult:
    tasks = b.eng.tasks
    makespan = max(t.end_s for t in tasks)
    busy = sum(t.end_s - t.start_s for t in tasks if t.resource == "compute")
    per_unit = []
    for u in units:
        ag = sum(t.work_s for t in tasks if t.meta.get("unit") == u.name and t.name.startswith("all-gather"))
        rs = sum(t.work_s for t in tasks if t.meta.get("unit") == u.name and t.name.startswith("reduce"))
        per_unit.append({"unit": u.name, "params": u.numel, "all_gather_s": ag, "reduce_scatter_s": rs})
    n = max(1, comm.size)
    pbytes = float(graph.param_bytes)
    largest = max((u.nbytes for u in units if u.name != ROOT), default=0)
    root = sum(u.nbytes for u in units if u.name == ROOT)
    state = OPTIMIZERS.get(optimizer, (0, 0, 0.0))[2] * pbytes / 4.0
    mem = {"weights_bytes": pbytes / n + 2 * largest + root, "grads_bytes": pbytes / n + largest,
           "optimizer_bytes": state / n, "activations_bytes": graph.saved_activation_bytes}
    mem["total_bytes"] = sum(mem.values())
    return FSDPResult(step_time_s=makespan + b.comm.prof.step_overhead_s.value,
                      forward_s=sum(t for o, t in zip(graph.ops, times) if o.phase != BACKWARD),
                      backward_s=sum(t for o, t in zip(graph.ops, times) if o.phase == BACKWARD),
                      comm_s=sum(tasks[t].end_s - tasks[t].start_s for t in b.comm_tasks),
                      exposed_comm_s=max(0.0, makespan - busy),
                      optimizer_s=tasks[b.opt].work_s, wrap_depth=depth,
                      units=tuple(per_unit), memory=mem)

