"""Why a plan is as fast as it is, and what one change would buy.

``roofline_ops``: every op of one layer (forward, recompute, backward) plus the embedding
and output head, with FLOPs, bytes, arithmetic intensity (FLOP/byte) and its roofline
class: compute-bound when the intensity reaches the ridge point
``peak FLOP/s / HBM bytes/s`` of the plan's precision, memory-bound below it;
collectives are communication.

``bottleneck_report``: that op split in time, plus the step's exposed communication by
kind, pipeline bubble and optimizer from ``Result.breakdown``.

``sensitivity``: one variable at a time (NIC bandwidth, NIC count, micro-batch,
recompute, precision), the plan otherwise fixed, and the throughput change each gives.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, Sequence

from ..cost.layer import comm_op_cost, compute_time_s
from ..engine.recompute import recompute_ops
from ..engine.result import Result
from ..engine.simulate import simulate
from ..engine.stage_work import chunk_layers, layer_shape, place_groups
from ..errors import ComplexityError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec, Dtype
from ..parallel.plan import Plan, Recompute
from ..search.driver import Bottleneck, main_bottleneck
from ..workload.ops import OpKind, backward_ops, embedding_ops, head_ops, layer_ops
from ..workload.spec import TransformerSpec


class RooflineClass(str, Enum):
    COMPUTE_BOUND = "compute-bound"
    MEMORY_BOUND = "memory-bound"
    COMMUNICATION = "communication"


@dataclass(frozen=True)
class OpRoofline:
    name: str
    kind: str
    phase: str                   # forward, recompute, backward
    where: str                   # layer, dense-layer, moe-layer, embedding, head
    flops: float
    bytes_moved: float
    intensity_flop_per_byte: float
    roofline: RooflineClass
    time_s: float                # one micro-batch on one rank


def ridge_flop_per_byte(cluster: ClusterSpec, precision: Dtype) -> float:
    return cluster.gpu.peak(precision) * 1e12 / (cluster.gpu.mem_bw_gbytes_per_s * 1e9)


def _layer_groups(model: TransformerSpec, plan: Plan) -> list[tuple[str, list]]:
    sh = layer_shape(model, plan)
    if model.moe is None:
        return [("layer", layer_ops(model, sh, 0))]
    groups = []
    if model.n_moe_layers() < model.n_layers:
        groups.append(("dense-layer", layer_ops(model, sh, model.first_layer(False))))
    groups.append(("moe-layer", layer_ops(model, sh, model.first_layer(True))))
    return groups


def roofline_ops(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                 profile: Profile) -> list[OpRoofline]:
    """Per-op roofline of one layer (of each kind) and the embedding/head, one micro-batch."""
    ridge = ridge_flop_per_byte(cluster, plan.precision)
    groups = place_groups(cluster, plan)
    sh = layer_shape(model, plan)
    out: list[OpRoofline] = []
    parts = _layer_groups(model, plan) + [("embedding", embedding_ops(model, sh)),
                                          ("head", head_ops(model, sh))]
    for where, fwd in parts:
        # what a recomputed layer re-runs (early stop, op SAC as simulated); the embedding
        # and head are never re-run
        again = recompute_ops(fwd, plan, model, sh) if where.endswith("layer") else []
        phases = [("forward", fwd), ("recompute", again),
                  ("backward", backward_ops(fwd))]
        for phase, ops in phases:
            out += [_op_row(op, phase, where, ridge, cluster, profile, groups) for op in ops]
    return out


def _op_row(op, phase, where, ridge, cluster, profile, groups) -> OpRoofline:
    if op.kind == OpKind.COMM:
        t = comm_op_cost(op, groups, profile).time_s
        return OpRoofline(op.name, op.kind.value, phase, where, 0.0, op.comm_bytes, 0.0,
                          RooflineClass.COMMUNICATION, t)
    intensity = op.flops / op.bytes_moved if op.bytes_moved else float("inf")
    cls = RooflineClass.COMPUTE_BOUND if intensity >= ridge else RooflineClass.MEMORY_BOUND
    return OpRoofline(op.name, op.kind.value, phase, where, op.flops, op.bytes_moved, intensity,
                      cls, compute_time_s(op, cluster.gpu, profile))


# ---- bottleneck report ---------------------------------------------------------------------
@dataclass(frozen=True)
class BottleneckReport:
    step_time_s: float
    ridge_flop_per_byte: float
    compute_bound_s: float           # per micro-batch per layer-set, summed over ops
    memory_bound_s: float
    communication_s: float           # un-overlapped collective time inside layers (per op)
    exposed_comm_s: dict[str, float]  # from the step breakdown, by kind
    bubble_s: float
    optimizer_s: float
    interference_s: float            # compute slowed by collectives sharing the GPU
    overhead_s: float
    main: Bottleneck
    ops: tuple[OpRoofline, ...]

    @property
    def memory_bound_share(self) -> float:
        t = self.compute_bound_s + self.memory_bound_s
        return self.memory_bound_s / t if t else 0.0

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        d = {"step_time_s": self.step_time_s, "ridge_flop_per_byte": self.ridge_flop_per_byte,
             "compute_bound_op_s": self.compute_bound_s, "memory_bound_op_s": self.memory_bound_s,
             "memory_bound_share": self.memory_bound_share,
             "exposed_comm_s": dict(self.exposed_comm_s), "bubble_s": self.bubble_s,
             "optimizer_s": self.optimizer_s, "interference_s": self.interference_s,
             "overhead_s": self.overhead_s,
             "main_bottleneck": self.main.value}
        if ops:
            d["ops"] = [{**o.__dict__, "roofline": o.roofline.value} for o in self.ops]
        return d


def recomputed_share(model: TransformerSpec, plan: Plan) -> float:
    """Share of the layers a (partial) recompute re-runs: the first ``recompute_layers`` of
    each model chunk."""
    if not plan.recompute_layers:
        return 1.0
    return sum(min(len(p), plan.recompute_layers)
               for p in chunk_layers(model, plan)) / model.n_layers


def bottleneck_report(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                      profile: Profile, result: Result | None = None) -> BottleneckReport:
    res = result or simulate(model, plan, cluster, profile, engine="analytic")
    ops = roofline_ops(model, plan, cluster, profile)
    share = recomputed_share(model, plan)        # recompute rows: a recomputed layer's
    by = {c: sum(o.time_s * (share if o.phase == "recompute" else 1.0) for o in ops
                 if o.roofline == c) for c in RooflineClass}
    bd = res.breakdown
    comm = {"tp": bd.tp_comm_s, "cp": bd.cp_comm_s, "ep": bd.ep_comm_s, "dp": bd.dp_comm_s,
            "pp": bd.pp_comm_s}
    return BottleneckReport(res.step_time_s, ridge_flop_per_byte(cluster, plan.precision),
                            by[RooflineClass.COMPUTE_BOUND], by[RooflineClass.MEMORY_BOUND],
                            by[RooflineClass.COMMUNICATION], comm, bd.bubble_s, bd.optimizer_s,
                            getattr(bd, "interference_s", 0.0), bd.overhead_s,
                            main_bottleneck(bd.as_dict()), tuple(ops))


# ---- sensitivity ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Sensitivity:
    knob: str
    change: str
    step_time_s: float | None
    throughput_change_pct: float | None     # + is faster
    fits_in_memory: bool | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


ClusterVariant = Callable[[float | None, int | None], ClusterSpec]
"""Rebuild the cluster with (NIC Gb/s per NIC, NICs per node); None keeps the current."""


def _plan_variants(plan: Plan, cluster: ClusterSpec) -> list[tuple[str, str, Plan]]:
    out = []
    for mb in (plan.micro_batch * 2, plan.micro_batch // 2):
        if mb >= 1:
            out.append(("micro_batch", f"{plan.micro_batch} -> {mb}", replace(plan, micro_batch=mb)))
    now = plan.recompute.value + (f":{plan.recompute_layers}" if plan.recompute_layers else "")
    for rc in Recompute:
        if rc != plan.recompute:
            out.append(("recompute", f"{now} -> {rc.value}",
                        replace(plan, recompute=rc, recompute_layers=0)))
    if plan.recompute_layers:                # a partial full recompute: every layer
        out.append(("recompute", f"{now} -> full", replace(plan, recompute_layers=0)))
    has_fp8 = cluster.gpu.peak_tflops.get("fp8", 0) > 0
    if plan.precision == Dtype.BF16 and has_fp8:
        out.append(("precision", "bf16 -> fp8", replace(plan, precision=Dtype.FP8)))
    elif plan.precision == Dtype.FP8:
        out.append(("precision", "fp8 -> bf16", replace(plan, precision=Dtype.BF16)))
    return out


def _hw_variants(cluster: ClusterSpec) -> list[tuple[str, str, float | None, int | None]]:
    gbps = cluster.node.nic_gbits_per_s
    nics = cluster.node.nics_per_node
    out = [("nic_bandwidth", f"{gbps:g} -> {2 * gbps:g} Gb/s per NIC", 2 * gbps, None),
           ("nic_bandwidth", f"{gbps:g} -> {gbps / 2:g} Gb/s per NIC", gbps / 2, None),
           ("nic_count", f"{nics} -> {2 * nics} NICs per node", None, 2 * nics)]
    if nics >= 2:
        out.append(("nic_count", f"{nics} -> {nics // 2} NICs per node", None, nics // 2))
    return out


def sensitivity(model: TransformerSpec, plan: Plan, cluster: ClusterSpec, profile: Profile,
                rebuild: ClusterVariant | None = None, engine: str = "analytic") -> list[Sensitivity]:
    """Throughput change of each one-variable change, relative to ``plan`` on ``cluster``."""
    base = simulate(model, plan, cluster, profile, engine=engine)
    rows = [Sensitivity("baseline", "as planned", base.step_time_s, 0.0, base.fits_in_memory)]
    cases = [(k, c, p, cluster) for k, c, p in _plan_variants(plan, cluster)]
    if rebuild is not None:
        cases += [(k, c, plan, (gb, n)) for k, c, gb, n in _hw_variants(cluster)]
    for knob, change, p, cl in cases:
        rows.append(_one(model, p, cl, profile, rebuild, engine, base, knob, change))
    return rows


def _one(model, plan, cl, profile, rebuild, engine, base, knob, change) -> Sensitivity:
    try:
        cluster = rebuild(*cl) if isinstance(cl, tuple) else cl
        r = simulate(model, plan, cluster, profile, engine=engine)
    except ComplexityError as exc:
        return Sensitivity(knob, change, None, None, None, f"not applicable: {exc}")
    pct = 100.0 * (base.step_time_s / r.step_time_s - 1.0)
    note = "" if r.fits_in_memory else "does not fit in memory"
    return Sensitivity(knob, change, r.step_time_s, pct, r.fits_in_memory, note)


def rank_knobs(rows: Sequence[Sensitivity]) -> list[Sensitivity]:
    """Changes that fit in memory, biggest throughput gain first."""
    ok = [r for r in rows if r.knob != "baseline" and r.throughput_change_pct is not None
          and r.fits_in_memory]
    return sorted(ok, key=lambda r: -r.throughput_change_pct)
