"""Peak memory per pipeline stage: weights, gradients, optimizer states, activations.

Mixed precision with Adam (Megatron / DeepSpeed / FSDP convention, Rajbhandari et al. 2020):
16-bit weights (2 B/param), fp32 gradients (4 B; Megatron's ``main_grad``), and fp32
master weights + Adam m + v (12 B). Pure fp32 keeps 4 B weights, 4 B grads, 8 B states.
ZeRO-1 shards optimizer states over the data-parallel group, ZeRO-2 also gradients,
ZeRO-3 also weights. Activations come from the op graph's saved tensors, which reproduce
Korthikanti et al. 2022 (``sbh(34 + 5as/h)`` per layer for GPT without parallelism); the
number of micro-batches a stage holds comes from playing the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

from .strategy import Plan, Recompute
from .workload.ops import Op


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
    if plan.precision.value == "fp32":
        return 4.0, 4.0, 8.0
    return 2.0, 4.0, 12.0


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
    """Transient buffers: two copies of the largest activation tensor (an op's output and
    its gradient alive together in backward) plus two communication buckets. An estimate,
    stated as such in reports."""
    buckets = 2 * 4 * plan.bucket_params() if plan.dp > 1 else 0
    return 2 * largest_tensor_bytes + buckets
