"""Time an op list on one rank: compute kernels plus the collectives inside the layer.

Returns a ``PassCost`` per forward / backward pass of a pipeline chunk. TP collectives sit
on the critical path of the layer unless ``tp_overlap`` hides them behind the GEMM they
are paired with; CP key/value exchange hides behind the attention core; EP all-to-all is
exposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..network.collectives import (
    Collective,
    LinkUse,
    alpha_beta_time_s,
    collective_time_s,
)
from ..parallel.placement import GroupPlacement
from ..workload.ops import Op, OpKind
from .kernels import attention_time_s, gemm_time_s, memory_time_s


@dataclass
class PassCost:
    """Seconds and FLOPs of one pass (all layers of a chunk, one micro-batch). ``total_s``
    is device time; ``host_s`` the host time to issue it (``simulator.cost.host``)."""

    compute_s: float = 0.0
    comm_s: dict[str, float] = field(default_factory=dict)   # exposed, by group
    interference_s: float = 0.0                               # compute slowed by overlapped comm
    flops: float = 0.0                                        # executed (hardware) FLOPs
    model_flops: float = 0.0
    op_times: dict[str, float] = field(default_factory=dict)  # name -> seconds (summed)
    host_s: float = 0.0                                       # host time issuing the pass
    host_ops: float = 0.0                                     # ops the host issues

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
        for k, v in other.comm_s.items():
            self.comm_s[k] = self.comm_s.get(k, 0.0) + times * v
        for k, v in other.op_times.items():
            self.op_times[k] = self.op_times.get(k, 0.0) + times * v


def compute_time_s(op: Op, gpu: GPUSpec, prof: Profile) -> float:
    """Kernel time of a compute op (0 for collectives)."""
    if op.kind == OpKind.GEMM:
        return gemm_time_s(op.m, op.n, op.k, op.dtype, gpu, prof, batch=op.batch)
    if op.kind == OpKind.ATTENTION:
        return attention_time_s(op.flops, op.dtype, op.name.endswith("_bwd"), gpu, prof,
                                op.kernel or "flash")
    if op.kind == OpKind.MEMORY:
        return memory_time_s(op.bytes_moved, gpu, prof, kernels=op.kernels, kind=op.mem_kind)
    return 0.0


def group_collective_s(coll: Collective, size_bytes: float, g: GroupPlacement,
                       prof: Profile) -> float:
    """Collective over a placed group: the slower of its scale-up and scale-out parts."""
    if g.size <= 1 or size_bytes <= 0:
        return 0.0
    if coll == Collective.ALL_TO_ALL and g.inter is not None:
        return _all_to_all_across_domains_s(size_bytes, g, prof)
    t = 0.0
    if g.intra is not None:
        t = collective_time_s(coll, g.size, size_bytes, g.intra, prof,
                              in_switch=g.in_switch and g.domains == 1)
    if g.inter is not None:
        t = max(t, collective_time_s(coll, g.size, size_bytes, g.inter, prof))
    return t


def interference_s(overlapped_s: float, prof: Profile) -> float:
    """Extra compute time while a collective runs alongside it for ``overlapped_s``
    (communication kernels take SMs and memory bandwidth: ``Profile.overlap_slowdown``)."""
    return max(0.0, prof.overlap_slowdown.value - 1.0) * max(0.0, overlapped_s)


def _all_to_all_across_domains_s(size_bytes: float, g: GroupPlacement, prof: Profile) -> float:
    """All-to-all over several scale-up domains: unlike a ring, every rank pushes its own
    off-domain share ``size * (n - k) / n`` through its own NIC share (``k`` members per
    domain), while the on-domain share ``size * (k - 1) / n`` moves over the scale-up fabric."""
    n, k = g.size, g.members_per_domain
    per_rank_nic = LinkUse(g.inter.kind, g.inter.bandwidth_gbytes_per_s / k, g.inter.latency_us)
    c = prof.link(per_rank_nic.kind)
    t = alpha_beta_time_s(n - 1, size_bytes * (n - k) / n, per_rank_nic.bandwidth_gbytes_per_s * 1e9,
                          per_rank_nic.latency_us * 1e-6, c)
    if g.intra is not None and k > 1:
        ci = prof.link(g.intra.kind)
        t = max(t, alpha_beta_time_s(k - 1, size_bytes * (k - 1) / n,
                                     g.intra.bandwidth_gbytes_per_s * 1e9,
                                     g.intra.latency_us * 1e-6, ci))
    return t


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
            pc.op_times[op.name] = pc.op_times.get(op.name, 0.0) + t
            continue
        t = group_collective_s(op.collective, op.comm_bytes, groups[op.group], prof)
        hidden = 0.0
        if op.group == "cp" or (op.group == "tp" and tp_overlap):
            base = op.overlaps_with
            hidden = times.get(base) or times.get(base + "_dgrad") or times.get(base + "_bwd") or 0.0
        exposed = max(0.0, t - hidden)
        pc.interference_s += interference_s(min(t, hidden), prof)
        pc.comm_s[op.group] = pc.comm_s.get(op.group, 0.0) + exposed
        pc.op_times[op.name] = pc.op_times.get(op.name, 0.0) + exposed
    return pc
