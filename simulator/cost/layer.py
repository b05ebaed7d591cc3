"""Time an op list on one rank: compute kernels plus the collectives inside the layer.

Returns a ``PassCost`` per forward / backward pass of a pipeline chunk. TP collectives sit
on the critical path of the layer unless ``tp_overlap`` hides them behind the GEMM they
are paired with; CP key/value exchange hides behind the attention core; EP all-to-all is
exposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..network.collectives import Collective
from ..network.price import ZERO_COST, CollectiveCost, collective_cost
from ..parallel.placement import GroupPlacement
from ..workload.ops import Op, OpKind
from .host import pass_first_share
from .kernels import attention_time_s, gemm_time_s, memory_time_s
from .moe_comm import flex_cost


@dataclass(frozen=True)
class Segment:
    """A stretch of a pass in execution order, for the timeline: compute (``group`` "")
    or one collective of a parallel group. A collective runs ``comm_s`` from where it
    starts over ``links`` (link kinds, scale-up first); ``exposed_s`` of it holds the pass
    up, the rest overlaps what follows and slows that compute by ``interference_s``.
    ``duration_s`` is what the segment adds to the pass."""

    name: str
    group: str
    exposed_s: float
    comm_s: float = 0.0
    links: tuple[str, ...] = ()
    comm_bytes: float = 0.0
    interference_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.exposed_s + self.interference_s


def group_links(g: GroupPlacement) -> tuple[str, ...]:
    """Link kinds a placed group's collectives cross (scale-up, then scale-out)."""
    return tuple(x.kind for x in (g.intra, g.inter) if x is not None)


@dataclass
class PassCost:
    """Seconds and FLOPs of one pass (all layers of a chunk, one micro-batch). ``total_s``
    is device time; ``host_s`` the host time to issue it (``simulator.cost.host``).
    ``segments``: the pass in order (timeline only; consecutive compute merged)."""

    compute_s: float = 0.0
    comm_s: dict[str, float] = field(default_factory=dict)   # exposed, by group
    interference_s: float = 0.0                               # compute slowed by overlapped comm
    flops: float = 0.0                                        # executed by the kernels
    model_flops: float = 0.0                                  # MFU convention (PaLM)
    hardware_flops: float = 0.0                               # model + recomputed (HFU)
    op_times: dict[str, float] = field(default_factory=dict)  # name -> seconds (summed)
    host_s: float = 0.0                                       # host time issuing the pass
    host_ops: float = 0.0                                     # ops the host issues
    host_lead_s: float = 0.0                  # of host_s, issued before the pass's first op
    link_busy_s: dict[str, float] = field(default_factory=dict)  # fabric tier -> busy seconds
    _segments: list[Segment] = field(default_factory=list, repr=False)
    # segments of added passes not yet appended (only a timeline reads them: a chunk adds
    # its layers' passes on every simulation, a timeline is asked for once in a while)
    _pending: list[tuple[list[Segment], int]] = field(default_factory=list, repr=False)

    @property
    def segments(self) -> list[Segment]:
        """The pass in order: compute (merged) and collective segments."""
        if self._pending:
            pending, self._pending = self._pending, []
            for segs, times in pending:
                for _ in range(times):
                    for seg in segs:
                        self._append(seg)
        return self._segments

    @property
    def first_share(self) -> float:
        """Share of the pass's host time after which the device may start it
        (``cost.host.pass_first_share``: its lead, then its first op)."""
        return pass_first_share(self.host_s, self.host_ops, self.host_lead_s)

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.comm_s.values()) + self.interference_s

    def add(self, other: "PassCost", times: int = 1) -> None:
        self.compute_s += times * other.compute_s
        self.interference_s += times * other.interference_s
        self.flops += times * other.flops
        self.model_flops += times * other.model_flops
        self.host_s += times * other.host_s
        self.host_ops += times * other.host_ops
        self.host_lead_s += times * other.host_lead_s
        self.hardware_flops += times * other.hardware_flops
        for k, v in other.comm_s.items():
            self.comm_s[k] = self.comm_s.get(k, 0.0) + times * v
        for k, v in other.op_times.items():
            self.op_times[k] = self.op_times.get(k, 0.0) + times * v
        for k, v in other.link_busy_s.items():
            self.link_busy_s[k] = self.link_busy_s.get(k, 0.0) + times * v
        if times > 0 and other.segments:
            self._pending.append((list(other.segments), times))

    def add_each(self, other: "PassCost", n: int) -> None:
        """Exactly ``n`` calls of ``add(other)``: the same sums in the same order (so the
        same floating-point result), without the per-call overhead. Every number and every
        dict of numbers among the fields is summed (``tests/simulator/cost`` checks it
        against ``add`` field by field)."""
        if n <= 0:
            return

        def rep(a: float, v: float) -> float:
            for _ in range(n):
                a += v
            return a

        for name in _SUMMED_NUMBERS:
            setattr(self, name, rep(getattr(self, name), getattr(other, name)))
        for name in _SUMMED_DICTS:
            mine = getattr(self, name)
            for k, v in getattr(other, name).items():
                mine[k] = rep(mine.get(k, 0.0), v)
        if other.segments:
            self._pending.append((list(other.segments), n))

    def add_link_busy(self, cost: CollectiveCost, times: float = 1.0) -> None:
        """Count the seconds ``cost`` (run ``times`` times) keeps each fabric tier busy."""
        for tier, s in cost.tier_busy_s:
            self.link_busy_s[tier] = self.link_busy_s.get(tier, 0.0) + s * times

    def append(self, seg: Segment) -> None:
        """Add a segment at the end, merging it into a compute segment before it."""
        self.segments                                # appends what is pending first
        self._append(seg)

    def _append(self, seg: Segment) -> None:
        segs = self._segments
        last = segs[-1] if segs else None
        if not seg.group and last is not None and not last.group:
            segs[-1] = Segment("compute", "", last.exposed_s + seg.exposed_s)
        else:
            segs.append(seg)


# the fields ``PassCost.add`` sums: numbers and dicts of numbers (not the segments)
_SUMMED_NUMBERS = tuple(f.name for f in fields(PassCost) if f.type in ("float", float))
_SUMMED_DICTS = tuple(f.name for f in fields(PassCost) if str(f.type).startswith("dict"))


def compute_time_s(op: Op, gpu: GPUSpec, prof: Profile) -> float:
    """Kernel time of a compute op (0 for collectives)."""
    if op.kind == OpKind.GEMM:
        return sum(gemm_time_s(m, n, k, op.dtype, gpu, prof, batch=op.batch, grouped=op.grouped)
                   for m, n, k in (op.split or ((op.m, op.n, op.k),)))
    if op.kind == OpKind.ATTENTION:
        return attention_time_s(op.flops, op.dtype, op.name.endswith("_bwd"), gpu, prof,
                                op.kernel or "flash", seq_k=op.n, head_dim=op.k,
                                causal=op.causal, seq_q=op.m, batch=op.batch,
                                grid_rows=op.grid_rows)
    if op.kind == OpKind.MEMORY:
        return memory_time_s(op.bytes_moved, gpu, prof, kernels=op.launches or op.kernels,
                             kind=op.mem_kind)
    return 0.0


def group_collective(coll: Collective, size_bytes: float, g: GroupPlacement,
                     prof: Profile) -> CollectiveCost:
    """A collective over a placed group, routed over the cluster's fabric with every group
    of the same kind running at once (``simulator.network.price``)."""
    if g.size <= 1 or size_bytes <= 0:
        return ZERO_COST
    return collective_cost(coll, size_bytes, g.shape, g.fabric, prof)


def comm_op_cost(op: Op, groups: dict[str, GroupPlacement], prof: Profile) -> CollectiveCost:
    """A communication op on its placed group: a flex (DeepEP) dispatch/combine when the op
    carries routing (``cost.moe_comm``), else its collective."""
    if op.routing is not None:
        return flex_cost(op.routing, groups[op.group], prof)
    return group_collective(op.collective, op.comm_bytes, groups[op.group], prof)


def group_collective_s(coll: Collective, size_bytes: float, g: GroupPlacement,
                       prof: Profile) -> float:
    return group_collective(coll, size_bytes, g, prof).time_s


def interference_s(overlapped_s: float, prof: Profile) -> float:
    """Extra compute time while a collective runs alongside it for ``overlapped_s``
    (communication kernels take SMs and memory bandwidth: ``Profile.overlap_slowdown``)."""
    return max(0.0, prof.overlap_slowdown.value - 1.0) * max(0.0, overlapped_s)


def pass_cost(ops: list[Op], gpu: GPUSpec, prof: Profile, groups: dict[str, GroupPlacement],
              tp_overlap: bool) -> PassCost:
    """Cost of running ``ops`` once, in order, on one rank."""
    pc = PassCost()
    times = {op.name: compute_time_s(op, gpu, prof) for op in ops if op.kind != OpKind.COMM}
    for op in ops:
        if op.kind != OpKind.COMM:
            t = times[op.name]
            pc.compute_s += t
            pc.flops += op.flops
            pc.model_flops += op.model_flops
            pc.hardware_flops += op.model_flops + op.recompute_flops
            pc.op_times[op.name] = pc.op_times.get(op.name, 0.0) + t
            pc.append(Segment(op.name, "", t))
            continue
        cost = comm_op_cost(op, groups, prof)
        t = cost.time_s
        pc.add_link_busy(cost)
        hidden = 0.0
        if op.group == "cp" or (op.group == "tp" and tp_overlap):
            base = op.overlaps_with
            hidden = times.get(base) or times.get(base + "_dgrad") or times.get(base + "_bwd") or 0.0
        exposed = max(0.0, t - hidden)
        slowed = interference_s(min(t, hidden), prof)
        pc.interference_s += slowed
        pc.comm_s[op.group] = pc.comm_s.get(op.group, 0.0) + exposed
        pc.append(Segment(op.name, op.group, exposed, t, group_links(groups[op.group]),
                          op.comm_bytes, slowed))
        pc.op_times[op.name] = pc.op_times.get(op.name, 0.0) + exposed
    return pc
