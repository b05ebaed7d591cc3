"""Peak memory per pipeline stage: weights, gradients, optimizer states, activations.

Bytes per parameter of weights, gradients and optimizer state come from the frameworks'
conventions (``simulator/frameworks/frameworks.json``: mixed-precision Adam after
Rajbhandari et al. 2020, 2 + 4 + 12 B; pure fp32 4 + 4 + 8 B).
ZeRO-1 shards optimizer states over the data-parallel group, ZeRO-2 also gradients,
ZeRO-3 also weights. Activations come from the op graph's saved tensors, which reproduce
Korthikanti et al. 2022 (``sbh(34 + 5as/h)`` per layer for GPT without parallelism); the
number of micro-batches a stage holds comes from playing the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..frameworks import CONVENTIONS
from ..parallel.plan import Plan, Recompute
from ..workload.ops import Op


@dataclass(frozen=True)
class StageMemory:
    """Bytes one rank of a pipeline stage holds at its peak."""

    stage: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    workspace_bytes: float

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.workspace_bytes)


def bytes_per_param(plan: Plan) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter before ZeRO sharding."""
    s = CONVENTIONS.state_fp32 if plan.precision.value == "fp32" else CONVENTIONS.state_mixed
    return s.weights, s.grads, s.optimizer


def state_bytes(params: float, plan: Plan, shard_degree: int) -> tuple[float, float, float]:
    """Weights, grads, optimizer bytes for ``params`` parameters on one rank."""
    w, g, o = bytes_per_param(plan)
    z = plan.zero_stage
    return (params * w / (shard_degree if z >= 3 else 1),
            params * g / (shard_degree if z >= 2 else 1),
            params * o / (shard_degree if z >= 1 else 1))


def layer_activation_bytes(fwd_ops: list[Op], recompute: Recompute, input_bytes: float) -> float:
    """Bytes one layer keeps for backward for one micro-batch."""
    if recompute == Recompute.FULL:
        return input_bytes
    if recompute == Recompute.SELECTIVE:
        return sum(op.saved_bytes for op in fwd_ops if not op.recomputed)
    return sum(op.saved_bytes for op in fwd_ops)


def workspace_bytes(plan: Plan, largest_tensor_bytes: float) -> float:
    """Transient buffers (``CONVENTIONS.workspace``, assumed): copies of the largest
    activation tensor (an op's output and its gradient alive together in backward) plus
    communication buckets. An estimate, stated as such in reports."""
    w = CONVENTIONS.workspace
    buckets = w.comm_buckets * w.bucket_bytes_per_param * plan.bucket_params() \
        if plan.dp > 1 else 0
    return w.largest_tensor_copies * largest_tensor_bytes + buckets
