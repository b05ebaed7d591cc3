"""The simulator's own op list for one training step on one rank, by family and phase.

Built from the same functions the engine prices (``simulator.workload.ops`` layer, embedding
and head ops, ``backward_ops``, recompute as ``simulator.engine.stage_work`` selects it, the
optimizer as ``simulator.engine.step.optimizer_time_s`` prices it), so the trace fit can
align a measured family with exactly the bytes and launches the simulator will charge, and
the doctor can set measured and predicted time side by side. One pipeline stage (pp = 1),
layers priced per layer kind (MoE, local attention), parameters counted by the same
``simulator.memory.chunk.chunk_memory`` the engine uses for a stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.layer import compute_time_s
from simulator.engine.recompute import recompute_ops
from simulator.engine.stage_work import layer_shape
from simulator.engine.step import optimizer_bytes_per_param
from simulator.errors import InvalidInputError
from simulator.hardware.profile import Profile
from simulator.hardware.specs import GPUSpec
from simulator.memory.chunk import chunk_memory, first_of_kind
from simulator.parallel.plan import Plan
from simulator.workload.ops import (
    Op,
    OpKind,
    backward_ops,
    embedding_ops,
    head_ops,
    layer_ops,
)
from simulator.workload.spec import TransformerSpec

OPTIMIZER_KERNELS = 4        # simulator.engine.step.optimizer_time_s prices 4 launches


@dataclass(frozen=True)
class SimOp:
    """One op of the step, ``count`` times (layers x micro-batches)."""

    op: Op
    family: str
    phase: str               # fwd | bwd | opt
    count: int

    @property
    def launches(self) -> int:
        """Fixed-cost launches the cost model charges for it (one per GEMM kernel: a split
        GEMM's parts each; one per attention call; a bandwidth-bound op's ``launches``, else
        its ``kernels``), as ``cost.layer.compute_time_s`` prices them."""
        if self.op.kind == OpKind.MEMORY:
            return self.count * (self.op.launches or max(1, self.op.kernels))
        if self.op.kind == OpKind.GEMM:
            return self.count * max(1, len(self.op.split))
        return self.count


def family_of(op: Op) -> str:
    if op.kind == OpKind.GEMM:
        return "gemm"
    if op.kind == OpKind.ATTENTION:
        return "attention"
    if op.kind == OpKind.COMM:
        return "comm"
    return op.mem_kind or "elementwise"


def step_ops(model: TransformerSpec, plan: Plan) -> list[SimOp]:
    """Every op of one step on one rank of a one-stage plan (see module doc)."""
    if plan.pp != 1:
        raise InvalidInputError("pp", plan.pp, "1 (the trace comparison covers one-stage plans)")
    sh = layer_shape(model, plan)
    m = plan.num_microbatches
    out: list[SimOp] = []

    def add(ops: list[Op], phase: str, times: int) -> None:
        out.extend(SimOp(o, family_of(o), phase, times) for o in ops)
    kinds: dict[tuple, int] = {}                # (layer kind, its recompute): layers
    for layer in range(model.n_layers):           # one stage: the layer is its position
        key = (model.layer_kind(layer), plan.recompute_of(layer))
        kinds[key] = kinds.get(key, 0) + 1
    for (kind, rc), n in sorted(kinds.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        fwd = layer_ops(model, sh, first_of_kind(model, kind))
        add(fwd, "fwd", n * m)
        add(recompute_ops(fwd, plan, model, sh, rc) + backward_ops(fwd), "bwd", n * m)
    extra = embedding_ops(model, sh) + head_ops(model, sh)
    add(extra, "fwd", m)
    add(backward_ops(extra), "bwd", m)
    params = chunk_memory(model, plan, sh, list(range(model.n_layers)), True, True).params
    opt = Op("optimizer", OpKind.MEMORY, bytes_moved=params * optimizer_bytes_per_param(plan),
             kernels=OPTIMIZER_KERNELS, mem_kind="optimizer")
    out.append(SimOp(opt, "optimizer", "opt", 1))
    return [s for s in out if s.family != "comm"]


def family_totals(ops: list[SimOp]) -> dict[str, dict[str, float]]:
    """``family:phase`` -> bytes, FLOPs and launches per step."""
    out: dict[str, dict[str, float]] = {}
    for s in ops:
        d = out.setdefault(f"{s.family}:{s.phase}", {"bytes": 0.0, "flops": 0.0, "launches": 0})
        d["bytes"] += s.count * s.op.bytes_moved
        d["flops"] += s.count * s.op.flops
        d["launches"] += s.launches
    return out


def launches_per_step(ops: list[SimOp]) -> int:
    return sum(s.launches for s in ops)


def predicted_family_s(ops: list[SimOp], gpu: GPUSpec, prof: Profile) -> dict[str, float]:
    """Seconds per family per step as the cost models price each op."""
    out: dict[str, float] = {}
    for s in ops:
        out[s.family] = out.get(s.family, 0.0) + s.count * compute_time_s(s.op, gpu, prof)
    return out
