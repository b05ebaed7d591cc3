"""DistributedDataParallel on a traced operator graph: buckets, overlap, step time.

Bucketing follows ``torch.nn.parallel.DistributedDataParallel`` (torch 2.x, steady state
after the first iteration, when the Reducer has rebuilt its buckets): parameters in the
order their gradients became ready in backward (the trace's ``grad_ready``), one running
bucket per dtype, a bucket closes as soon as its size reaches its cap (so it includes the
gradient that crosses it). Caps: the first bucket's is ``first_bucket_bytes_cap``, the
others ``bucket_cap_mb`` MiB. Torch's rule for the first cap: 1 MiB
(``dist._DEFAULT_FIRST_BUCKET_BYTES``) when ``bucket_cap_mb`` is left at its default,
otherwise the same as ``bucket_cap_mb`` (``first_bucket_mib`` overrides; older torch always
used 1 MiB). ``bucket_cap_mb`` is MiB, as torch means it.

Timeline (``simulator.engine.events.Engine``): the traced ops run on one compute stream, cut into
segments at the ops after which a bucket is complete; each bucket's hook (see
``simulator.modules.compression``) runs its pre-communication compute on the compute stream right
there, then its all-reduce(s) on the communication resource (a FIFO stream, as NCCL and
the Reducer launch buckets in order; processor-shared when PowerSGD interleaves several
messages per bucket), and callback compute on a hook stream. Without
``gradient_as_bucket_view`` every gradient is copied into its bucket when ready and back
after the all-reduce (``copy_bucket_to_grad``); with it, neither copy happens (assumes the
gradients persist between steps: ``zero_grad(set_to_none=False)``). The optimizer starts
once every bucket is reduced. Compute that overlaps communication is slowed by the
profile's ``overlap_slowdown`` (two passes: find the overlap, then stretch those segments).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..cost.kernels import memory_time_s
from ..cost.layer import group_collective_s
from ..engine.events import Engine
from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec, GPUSpec
from ..network.collectives import Collective, ring_steps_and_traffic
from ..parallel.placement import GroupPlacement, place_group
from ..workload.traced import BACKWARD, FORWARD, LOSS, TracedGraph
from .compression import CompressionSpec, Step, bucket_steps

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MIB = 25.0
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
FIND_UNUSED_US_PER_OP = 1.0
"""Assumed cost of DDP's per-iteration autograd-graph walk (``find_unused_parameters``
without ``static_graph``), per forward op."""

# name -> (bytes moved per fp32 parameter element, kernels per tensor, state bytes per element)
OPTIMIZERS = {
    "none": (0.0, 0, 0.0),
    "sgd": (12.0, 1, 0.0),                 # read p, g; write p
    "sgd-momentum": (20.0, 3, 4.0),        # read p, g, buf; write buf, p
    "adam": (28.0, 8, 8.0),                # read p, g, m, v; write p, m, v
    "adamw": (28.0, 8, 8.0),
}


@dataclass(frozen=True)
class DDPConfig:
    """The DDP constructor arguments that change the step (torch names, MiB caps)."""

    bucket_cap_mib: float | None = None      # None: torch default (25 MiB, first bucket 1 MiB)
    first_bucket_mib: float | None = None
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    overlap: bool = True                     # False: all-reduce only after backward
    compression: CompressionSpec = field(default_factory=CompressionSpec)

    def __post_init__(self) -> None:
        if self.bucket_cap_mib is not None and self.bucket_cap_mib <= 0:
            raise InvalidInputError("bucket_cap_mb", self.bucket_cap_mib, "a positive size in MiB")

    @property
    def cap_bytes(self) -> int:
        return int((self.bucket_cap_mib or DEFAULT_BUCKET_CAP_MIB) * MIB)

    @property
    def first_cap_bytes(self) -> int:
        if self.first_bucket_mib is not None:
            return int(self.first_bucket_mib * MIB)
        return DEFAULT_FIRST_BUCKET_BYTES if self.bucket_cap_mib is None else self.cap_bytes


@dataclass(frozen=True)
class Bucket:
    index: int
    params: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    numel: int
    nbytes: int
    dtype: str
    ready_after_op: int                      # the op after which its last gradient is ready
    cap_bytes: int


def grad_order(graph: TracedGraph, cfg: DDPConfig) -> list[str]:
    """Parameters in the order DDP sees their gradients ready (unused ones first when
    ``find_unused_parameters`` marks them ready at the start of backward)."""
    order = [g.param for g in graph.grad_ready]
    if cfg.find_unused_parameters or cfg.static_graph:
        order = graph.unused_params() + order
    return order


def assign_buckets(graph: TracedGraph, cfg: DDPConfig = DDPConfig()) -> tuple[Bucket, ...]:
    """DDP's rebuilt buckets (see module doc)."""
    info = {p.name: p for p in graph.params}
    ready = {g.param: g.after_op for g in graph.grad_ready}
    first_bwd = next((o.index for o in graph.ops if o.phase == BACKWARD), 0)
    limits = [cfg.first_cap_bytes, cfg.cap_bytes] if cfg.first_cap_bytes < cfg.cap_bytes else [cfg.cap_bytes]
    open_: dict[str, tuple[list[str], int, int]] = {}           # dtype -> (names, size, limit idx)
    closed: list[tuple[list[str], int]] = []
    for name in grad_order(graph, cfg):
        p = info[name]
        names, size, li = open_.get(p.dtype, ([], 0, 0))
        names, size = names + [name], size + p.nbytes
        if size >= limits[li]:
            closed.append((names, limits[li]))
            names, size, li = [], 0, min(li + 1, len(limits) - 1)
        open_[p.dtype] = (names, size, li)
    closed += [(names, limits[li]) for names, size, li in open_.values() if names]
    out = []
    for i, (names, cap) in enumerate(closed):
        ps = [info[n] for n in names]
        out.append(Bucket(i, tuple(names), tuple(p.shape for p in ps), sum(p.numel for p in ps),
                          sum(p.nbytes for p in ps), ps[0].dtype,
                          max(ready.get(n, first_bwd - 1) for n in names), cap))
    return tuple(out)


# ---- the data-parallel group -------------------------------------------------------------------
@dataclass(frozen=True)
class DPComm:
    """Collectives over the data-parallel group, priced with the profile's link coefficients."""

    size: int
    placement: GroupPlacement
    prof: Profile
    bw_scale: float = 1.0

    def collective_s(self, coll: Collective, nbytes: float) -> float:
        g = self.placement
        if self.bw_scale != 1.0:
            sc = lambda lu: None if lu is None else replace(
                lu, bandwidth_gbytes_per_s=lu.bandwidth_gbytes_per_s * self.bw_scale)
            g = replace(g, intra=sc(g.intra), inter=sc(g.inter),
                        fabric=g.fabric.scaled(self.bw_scale) if g.fabric else None)
        return group_collective_s(coll, nbytes, g, self.prof)

    def allreduce_s(self, nbytes: float) -> float:
        return self.collective_s(Collective.ALL_REDUCE, nbytes)

    def wire_bytes(self, nbytes: float) -> float:
        return ring_steps_and_traffic(Collective.ALL_REDUCE, self.size, nbytes)[1]

    def scaled(self, factor: float) -> "DPComm":
        return replace(self, bw_scale=self.bw_scale * factor)

    def bottleneck_gbytes_per_s(self) -> float:
        links = [lu for lu in (self.placement.intra, self.placement.inter) if lu is not None]
        return min((lu.bandwidth_gbytes_per_s for lu in links), default=0.0) * self.bw_scale

    def describe(self) -> str:
        links = [lu for lu in (self.placement.intra, self.placement.inter) if lu is not None]
        return ", ".join(f"{lu.kind} {lu.bandwidth_gbytes_per_s * self.bw_scale:.3g} GB/s"
                         for lu in links) or "single rank"


def dp_comm(cluster: ClusterSpec, prof: Profile, dp: int | None = None, stride: int = 1) -> DPComm:
    """The DP group of ``dp`` ranks (default: every GPU of the cluster)."""
    n = dp or cluster.n_gpus
    return DPComm(n, place_group(cluster, "dp", n, stride), prof)


# ---- simulation --------------------------------------------------------------------------------
@dataclass(frozen=True)
class BucketTiming:
    index: int
    params: int
    nbytes: int
    messages: tuple[float, ...]
    ready_s: float
    comm_start_s: float
    done_s: float


@dataclass(frozen=True)
class DDPResult:
    step_time_s: float
    forward_s: float
    backward_s: float
    compute_busy_s: float
    comm_s: float
    exposed_comm_s: float
    hook_compute_s: float
    optimizer_s: float
    overhead_s: float
    buckets: tuple[BucketTiming, ...]
    memory: dict[str, float]
    timeline: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        from dataclasses import asdict
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d


def optimizer_time_s(graph: TracedGraph, optimizer: str, gpu: GPUSpec, prof: Profile,
                     shard: int = 1) -> float:
    if optimizer not in OPTIMIZERS:
        raise InvalidInputError("optimizer", optimizer, f"one of {', '.join(OPTIMIZERS)}")
    per_elem, k, _ = OPTIMIZERS[optimizer]
    ps = [p for p in graph.params if p.requires_grad]
    scale = sum(p.nbytes for p in ps) / 4.0 / max(1, shard)           # fp32-element equivalents
    kernels = k * (len(ps) if gpu.sm_count <= 0 else 1)                # CPU: per-tensor loop
    return memory_time_s(per_elem * scale, gpu, prof, kernels=max(1, kernels)) if k else 0.0


def ddp_memory(graph: TracedGraph, cfg: DDPConfig, optimizer: str) -> dict[str, float]:
    w = float(graph.param_bytes)
    grads = float(sum(p.nbytes for p in graph.params if p.requires_grad))
    extra = 0.0 if cfg.gradient_as_bucket_view else grads
    if cfg.compression.hook == "powersgd" and cfg.compression.error_feedback:
        extra += grads
    state = OPTIMIZERS.get(optimizer, (0, 0, 0.0))[2] * grads / 4.0
    d = {"weights_bytes": w, "grads_bytes": grads, "bucket_buffers_bytes": extra,
         "optimizer_bytes": state, "activations_bytes": graph.saved_activation_bytes,
         "buffers_bytes": graph.buffer_bytes}
    d["total_bytes"] = sum(d.values())
    return d


class _Build:
    """One engine build; ``scale[i]`` stretches compute segment ``i`` (interference)."""

    def __init__(self, graph, times, comm, cfg, gpu, prof, buckets, scale, opt_s=None):
        self.g, self.t, self.comm, self.cfg, self.gpu, self.prof = graph, times, comm, cfg, gpu, prof
        self.opt_s = opt_s
        self.buckets, self.scale = buckets, scale
        self.eng = Engine()
        for r in ("compute", "hook"):
            self.eng.stream(r)
        (self.eng.link if cfg.compression.hook == "powersgd" else self.eng.stream)("comm")
        self.segments: list[int] = []
        self.bucket_tasks: list[tuple[int, int, int, list[float]]] = []   # ready, first comm, last

    def run(self, optimizer: str) -> float:
        ends = sorted({max(-1, min(b.ready_after_op, len(self.g.ops) - 1)) for b in self.buckets})
        by_end = {e: [b for b in self.buckets if max(-1, min(b.ready_after_op, len(self.g.ops) - 1)) == e]
                  for e in ends}
        cursor, last = 0, -1
        for e in ends + [len(self.g.ops) - 1]:
            if e >= cursor:
                last = self._segment(cursor, e, last)
                cursor = e + 1
            for b in by_end.get(e, []):
                self._bucket(b, last)
        self.last_compute = last
        if not self.cfg.overlap:                      # reduce only after the whole backward
            for _, first, _, _ in self.bucket_tasks:
                if first >= 0:
                    self.eng.depend(first, last)
        return self._finish(optimizer)

    def _segment(self, a: int, b: int, prev: int) -> int:
        i = len(self.segments)
        work = sum(self.t[a:b + 1]) * (self.scale[i] if i < len(self.scale) else 1.0)
        tid = self.eng.add(f"ops {a}-{b}", "compute", work, [(prev, 1.0)] if prev >= 0 else [],
                           kind="compute", seg=i)
        self.segments.append(tid)
        return tid

    def _bucket(self, b: Bucket, seg: int) -> None:
        eb = b.nbytes // max(1, b.numel)
        steps = bucket_steps(b.shapes, eb, b.dtype, self.cfg.compression, self.gpu, self.prof)
        if not self.cfg.gradient_as_bucket_view:
            steps = [Step("compute", "copy grads into bucket",
                          seconds=memory_time_s(2.0 * b.nbytes, self.gpu, self.prof))] + steps
        prev, first_comm, msgs = seg, -1, []
        for s in steps:
            deps = [(prev, 1.0)] if prev >= 0 else []
            if s.kind == "comm":
                prev = self.eng.add(f"b{b.index} {s.label}", "comm", self.comm.allreduce_s(s.nbytes),
                                    deps, kind="comm", bucket=b.index, nbytes=s.nbytes)
                first_comm = prev if first_comm < 0 else first_comm
                msgs.append(s.nbytes)
            else:
                res = "compute" if s.where == "compute" else "hook"
                prev = self.eng.add(f"b{b.index} {s.label}", res, s.seconds, deps, kind="hook",
                                    bucket=b.index)
        self.bucket_tasks.append((seg, first_comm, prev, msgs))

    def _finish(self, optimizer: str) -> float:
        deps = [(t[2], 1.0) for t in self.bucket_tasks] + [(self.last_compute, 1.0)]
        grads = sum(b.nbytes for b in self.buckets)
        tail = 0.0 if self.cfg.gradient_as_bucket_view else memory_time_s(2.0 * grads, self.gpu, self.prof)
        fin = self.eng.add("finalize: copy bucket to grads", "compute", tail, deps, kind="hook")
        t_opt = self.opt_s if self.opt_s is not None else optimizer_time_s(
            self.g, optimizer, self.gpu, self.prof)
        self.opt = self.eng.add("optimizer", "compute", t_opt, [(fin, 1.0)], kind="optimizer")
        return self.eng.run()


def _overlap_scale(b: _Build, slowdown: float) -> list[float]:
    comm = sorted((t.start_s, t.end_s) for t in b.eng.tasks if t.meta.get("kind") == "comm")
    out = []
    for tid in b.segments:
        t = b.eng.tasks[tid]
        dur = t.end_s - t.start_s
        ov = sum(max(0.0, min(t.end_s, e) - max(t.start_s, s)) for s, e in comm)
        out.append(1.0 + (slowdown - 1.0) * min(1.0, ov / dur) if dur > 0 else 1.0)
    return out


def simulate_ddp(graph: TracedGraph, times: Sequence[float], comm: DPComm, cfg: DDPConfig,
                 gpu: GPUSpec, prof: Profile, optimizer: str = "adam",
                 optimizer_s: float | None = None) -> DDPResult:
    """One DDP training step of ``graph`` (op times ``times``) on each rank of ``comm``;
    ``optimizer_s`` overrides the optimizer's modelled time."""
    if len(times) != len(graph.ops):
        raise InvalidInputError("times", len(times), f"one time per op ({len(graph.ops)})")
    buckets = assign_buckets(graph, cfg) if comm.size > 1 else ()
    b = _Build(graph, times, comm, cfg, gpu, prof, buckets, [], optimizer_s)
    b.run(optimizer)
    slow = prof.overlap_slowdown.value
    if slow != 1.0 and buckets:
        b = _Build(graph, times, comm, cfg, gpu, prof, buckets, _overlap_scale(b, slow), optimizer_s)
        b.run(optimizer)
    return _result(graph, times, cfg, b, optimizer)


def _result(graph, times, cfg, b: _Build, optimizer: str) -> DDPResult:
    tasks = b.eng.tasks
    overhead = b.prof.step_overhead_s.value
    if cfg.find_unused_parameters and not cfg.static_graph:
        overhead += FIND_UNUSED_US_PER_OP * 1e-6 * sum(1 for o in graph.ops if o.phase == FORWARD)
    makespan = max((t.end_s for t in tasks), default=0.0)
    busy = sum(t.end_s - t.start_s for t in tasks if t.resource == "compute")
    comm = sum(t.end_s - t.start_s for t in tasks if t.meta.get("kind") == "comm")
    hook = sum(t.work_s for t in tasks if t.meta.get("kind") == "hook")
    fwd = sum(s for o, s in zip(graph.ops, times) if o.phase in (FORWARD, LOSS))
    bwd = sum(s for o, s in zip(graph.ops, times) if o.phase == BACKWARD)
    timings = []
    for bk, (ready, first, last, msgs) in zip(b.buckets, b.bucket_tasks):
        timings.append(BucketTiming(bk.index, len(bk.params), bk.nbytes, tuple(msgs),
                                    tasks[ready].end_s, tasks[first].start_s if first >= 0 else 0.0,
                                    tasks[last].end_s))
    timeline = tuple({"name": t.name, "resource": t.resource, "start_s": t.start_s,
                      "end_s": t.end_s, "kind": t.meta.get("kind", "")} for t in tasks)
    return DDPResult(step_time_s=makespan + overhead, forward_s=fwd, backward_s=bwd,
                     compute_busy_s=busy, comm_s=comm, exposed_comm_s=max(0.0, makespan - busy),
                     hook_compute_s=hook, optimizer_s=tasks[b.opt].work_s, overhead_s=overhead,
                     buckets=tuple(timings), memory=ddp_memory(graph, cfg, optimizer),
                     timeline=timeline)
