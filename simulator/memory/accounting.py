"""Peak memory per pipeline stage: weights, gradients, optimizer states, activations and the
transient working set, under the framework's conventions (``Plan.memory``).

State bytes per parameter follow the plan's conventions (``simulator.parallel.conventions``,
facts in ``frameworks.json``): Megatron's mixed precision keeps 16-bit weights, a gradient
buffer in ``grad_dtype`` and fp32 master weights + Adam m, v (2 + 4 + 12 B, or 2 + 2 + 12 B
with 16-bit gradients: Megatron's ``theoretical_memory_usage.py``, the ZeRO paper's
2 + 2 + K); FSDP keeps fp32 parameters, gradients and m, v (16 B). ZeRO-1 shards the optimizer
state over the data-parallel group (DP x CP), ZeRO-2 also gradients, ZeRO-3 also weights.

Activations are the op graph's saved tensors (Korthikanti et al. 2022's ``sbh(34 + 5as/h)``
per GPT layer without parallelism) times the micro-batches each chunk holds at the stage's
worst moment of the schedule. The working set is the largest of the transients that occur at
different moments: the loss at its peak, one layer's backward (its gradients, and with
recompute the layer's re-created activations), and ZeRO-3 / FSDP's gathered parameters;
gradient buckets that are separate buffers are added to all of them. The optimizer step has
its own transient (an fp32 copy of 16-bit gradients, unfused temporaries) while activations
are gone: the peak is ``state + max(activations + working set, step transient)``.
"""
from __future__ import annotations

import math

from dataclasses import dataclass

from ..hardware.specs import Dtype
from ..parallel.conventions import BucketKind
from ..parallel.in_flight import live_chunk_counts  # noqa: F401  (re-exported)
from ..parallel.plan import Plan, Recompute
from ..workload.ops import Op, OpKind


@dataclass(frozen=True)
class StageMemory:
    """Bytes one rank of a pipeline stage holds. ``weights_bytes`` includes the FP8 weight
    copies (``fp8_weight_copy_bytes``). ``workspace_bytes``: the transient working set at the
    forward/backward peak (``workspace_source`` names which one); ``optimizer_step_bytes``:
    the transient of the optimizer step. ``total_bytes`` is the peak."""

    stage: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    workspace_bytes: float
    optimizer_step_bytes: float = 0.0
    fp8_weight_copy_bytes: float = 0.0
    workspace_source: str = ""

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + max(self.activations_bytes + self.workspace_bytes,
                                      self.optimizer_step_bytes)

    def parts(self) -> dict[str, float]:
        """The components of ``total_bytes`` at the peak (names as in reports)."""
        step = self.optimizer_step_bytes > self.activations_bytes + self.workspace_bytes
        return {"weights": self.weights_bytes, "grads": self.grads_bytes,
                "optimizer": self.optimizer_bytes + (self.optimizer_step_bytes if step else 0.0),
                "activations": 0.0 if step else self.activations_bytes,
                "workspace": 0.0 if step else self.workspace_bytes}


@dataclass(frozen=True)
class ChunkMemory:
    """Memory facts of one model chunk on one rank, for one micro-batch."""

    params: float                 # parameters on this rank (after TP / EP split)
    dense_params: float           # of which replicated over the whole DP group
    linear_params: float          # of which decoder linear weights (FP8 copies)
    edge_params: float            # embedding / output layer (an FSDP root's parameters)
    max_layer_params: float       # the largest decoder layer (an FSDP unit)
    act_bytes: float              # activations kept per micro-batch
    layer_transient_bytes: float  # the largest layer-backward working set
    loss_transient_bytes: float   # the loss's own peak (last chunk only)
    head_saved_bytes: float = 0.0  # of act_bytes, kept by the output layer and the loss
    wgrad_hold_bytes: float = 0.0  # kept per micro-batch from its B to its W (split backward)
    zero3_kept_layers: int = 0     # layers ZeRO-3 keeps gathered into backward (reuse window)


# ---- state ----------------------------------------------------------------------------------
def bytes_per_param(plan: Plan) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter before ZeRO sharding."""
    c, fp32 = plan.memory, plan.precision == Dtype.FP32
    w = 4.0 if fp32 or c.weights_fp32 else 2.0
    g = float(plan.grad_bytes)
    master = 4.0 if c.master_weights and w < 4 else 0.0
    o = 0.0 if c.optimizer_offload else master + c.optimizer_state_bytes_per_param
    return w, g + c.extra_grad_bytes_per_param, o


def state_bytes(params: float, plan: Plan, shard_degree: int) -> tuple[float, float, float]:
    """Weights, grads, optimizer bytes for ``params`` parameters on one rank. The extra
    16-bit gradients of DeepSpeed's BF16_Optimizer are never sharded."""
    w, g, o = bytes_per_param(plan)
    z, extra = plan.zero_stage, plan.memory.extra_grad_bytes_per_param
    return (params * w / (shard_degree if z >= 3 else 1),
            params * ((g - extra) / (shard_degree if z >= 2 else 1) + extra),
            params * o / (shard_degree if z >= 1 else 1))


def optimizer_step_bytes(params: float, plan: Plan, shard_degree: int) -> float:
    """Transient of the optimizer step: the fp32 copy of 16-bit gradients the optimizer
    makes for its shard (Megatron) and an unfused optimizer's temporaries."""
    c = plan.memory
    copy = 4.0 if c.optimizer_grad_copy and plan.precision != Dtype.FP32 \
        and c.grad_dtype != Dtype.FP32 and not c.optimizer_offload else 0.0
    per = copy + c.optimizer_step_temp_bytes_per_param
    return params * per / (shard_degree if plan.zero_stage >= 1 else 1)


def fp8_weight_copy_bytes(linear_params: float, plan: Plan) -> float:
    """Change of the weights' bytes from FP8 for the decoder linears: Transformer Engine's
    cached FP8 copy (kept across micro-batches; ZeRO-3 / FSDP disables the cache, TE's
    ``is_fsdp2``), or, with FP8 primary weights, the FP8 bytes in place of 16-bit ones."""
    c = plan.memory
    if plan.precision != Dtype.FP8 or (plan.zero_stage >= 3 and not c.fp8_primary_weights):
        return 0.0
    if c.fp8_primary_weights:
        return linear_params * (c.fp8_weight_copy_bytes_per_param - 2.0)
    return linear_params * c.fp8_weight_copy_bytes_per_param


# ---- activations and transients -------------------------------------------------------------
def layer_activation_bytes(fwd_ops: list[Op], recompute: Recompute, input_bytes: float) -> float:
    """Bytes one layer keeps for backward for one micro-batch."""
    if recompute == Recompute.FULL:
        return input_bytes
    if recompute == Recompute.SELECTIVE:
        return sum(op.saved_bytes for op in fwd_ops if not op.recomputed)
    return sum(op.saved_bytes for op in fwd_ops)


def _grad_bytes(op: Op, act_bytes: int) -> float:
    """Gradient tensors alive while ``op`` runs backward: its output's and its input's."""
    if op.kind == OpKind.GEMM:
        return op.batch * op.m * (op.n + op.k) * act_bytes
    if op.kind in (OpKind.ATTENTION, OpKind.MEMORY):
        # what the op reads and writes: inputs and outputs (an eager op: its fused twin's)
        return op.bytes_moved if op.live_bytes < 0 else op.live_bytes
    return 0.0


def wgrad_hold_bytes(fwd_ops: list[Op], act_bytes: int) -> float:
    """Bytes a micro-batch keeps between its B and its W when the backward is split: for
    every weight GEMM its input as saved for backward and the gradient of its output that
    B computed, which the deferred weight-gradient GEMM reads (the zero-bubble and DualPipe
    implementations keep this pair per linear layer in their ``WeightGradStore``);
    everything else the layer saved is freed by B. The input is the GEMM's saved bytes up
    to its input's size (sharded under sequence parallelism, FP8 under FP8; a GEMM's saved
    bytes may also carry outputs kept for later ops, e.g. Q, K, V); the output gradient is
    counted at the size the GEMM reads it (for row-parallel layers the gathered full
    sequence: assumed; an implementation keeping the sequence shard and gathering again at
    W holds tp times less of it). Without parallelism a GPT layer holds 32 sbh bytes in
    16-bit (inputs h + h + h + 4h, output gradients 3h + h + 4h + h, per token), against the
    34 sbh + 5 as^2 b it keeps from F to B (Korthikanti et al. 2022)."""
    return sum(min(op.saved_bytes, op.batch * op.m * op.k * act_bytes)   # input, as saved
               + op.batch * op.m * op.n * act_bytes                          # output gradient
               for op in fwd_ops if op.kind == OpKind.GEMM and op.has_weights)


def layer_transient_bytes(fwd_ops: list[Op], recompute: Recompute, act_bytes: int,
                          remade_names: frozenset[str] | None = None) -> float:
    """The most one layer's backward holds beyond the activations counted for it, over
    the moments its ops run backward (in reverse order): the op's input and output
    gradients, plus what recompute re-created for ops up to this one (every op under full
    recompute, the recomputed ones under selective), minus what the ops after it kept and
    have already released. ``remade_names``: the ops recompute re-runs where that is not
    the plan's rule (op-level SAC, ``workload.sac``)."""
    def recomputes(op: Op) -> bool:
        if remade_names is not None:
            return op.name in remade_names
        return recompute == Recompute.FULL or (recompute == Recompute.SELECTIVE and op.recomputed)
    worst = freed = 0.0
    remade = sum(op.saved_bytes for op in fwd_ops if recomputes(op))
    for op in reversed(fwd_ops):
        worst = max(worst, _grad_bytes(op, act_bytes) + remade - freed)
        if recomputes(op):
            remade -= op.saved_bytes
        else:
            freed += op.saved_bytes
    return worst


def peak_activation_bytes(plan: Plan, stage: int, chunk_act_bytes: list[float],
                          chunk_wgrad_hold_bytes: list[float] = ()) -> float:
    """Largest sum over live micro-batches of their chunk's activations (chunks differ:
    the first holds the embedding, the last the output layer and the loss), plus, with a
    split backward, what those between B and W hold."""
    counts = live_chunk_counts(plan.schedule, stage, plan.pp, plan.num_microbatches, plan.vpp)
    per = list(chunk_act_bytes) + list(chunk_wgrad_hold_bytes)
    return max(sum(n * a for n, a in zip(v, per)) for v in counts)


# ---- the stage ------------------------------------------------------------------------------
def _compute_param_bytes(plan: Plan) -> float:
    return 4.0 if plan.precision == Dtype.FP32 else 2.0


def grad_reduce_bytes(plan: Plan) -> int:
    """fp32 main-grad reduction (Megatron, DeepSpeed); under FSDP mixed precision the
    framework's reduce dtype (``MemoryConventions.fsdp_reduce_fp32``: fp32 in torchtitan /
    FSDP2's usual policy and Composer's DEFAULT, which llm-foundry's benchmarks ran; 16-bit
    under Composer's PURE)."""
    if plan.zero_stage >= 3:
        return 4 if plan.precision.value == "fp32" or plan.memory.fsdp_reduce_fp32 else 2
    return 4


def zero3_kept_layers(layers: float, layer_params: float, head_params: float,
                      window: float) -> int:
    """Layers of a chunk (of ``layer_params`` each) whose gathered parameters ZeRO-3 keeps
    from forward to backward: those for which the trace between the layer's two uses (the
    ``j`` layers after it, forward and backward, and the output layer's ``head_params``
    twice) fetches fewer than ``window`` parameter elements, ``2 j layer_params + 2
    head_params < window``: the last layer (j = 0) first (DeepSpeed's
    stage3_max_reuse_distance, ``MemoryConventions.zero3_reuse_window_params``; 0: none;
    the layer's own modules between its uses, counted per module there, are left out)."""
    room = window - 2.0 * head_params
    if window <= 0 or layer_params <= 0 or room <= 0 or layers <= 0:
        return 0
    return int(min(layers, math.ceil(room / (2.0 * layer_params))))


def fsdp_transient_bytes(chunks: list[ChunkMemory], plan: Plan) -> tuple[float, float, float]:
    """ZeRO-3 / FSDP gathered parameters and gradients at three moments: the loss, the
    start of a layer's backward, its end. The root's parameters (embedding, output layer)
    stay gathered from forward to backward unless resharded. The loss's backward starts
    with the first layer of backward being gathered. A layer runs backward gathered with
    ``fsdp_prefetch_layers`` more gathered ahead; by its end it has produced unsharded
    gradients in the compute dtype and then, after it frees its own gathered parameters,
    copies them into the reduce-scatter input in the reduce dtype while they are still
    alive (FSDP2 ``foreach_reduce``: ``_chunk_cat`` into the new buffer before
    ``unsharded_grads.clear()``; FSDP1 ``_post_backward_hook``: ``grad.to(reduce_dtype)``,
    the 16-bit gradient kept until the reduce-scatter by ``record_stream``): compute-dtype
    plus reduce-dtype bytes per parameter, or the parameters and gradients before the
    free, whichever is more. The largest layer stands for every layer.

    Under pipeline parallelism with ``fsdp_pp_once_per_step`` (torchtitan) nothing is
    resharded or reduced until the step's last backward (torch pipelining:
    ``set_reshard_after_backward`` / ``set_requires_gradient_sync(False)`` per micro-batch;
    no reshard after forward): the stage's parameters stay gathered and its unsharded
    gradients accumulate in the reduce dtype, both for the whole stage, at every moment."""
    if plan.zero_stage < 3:
        return 0.0, 0.0, 0.0
    c, pb = plan.memory, _compute_param_bytes(plan)
    if plan.pp > 1 and c.fsdp_pp_once_per_step:
        held = sum(ch.params for ch in chunks) * (pb + grad_reduce_bytes(plan))
        return held, held, held
    root = 0.0 if c.fsdp_root_resharded else pb * sum(ch.edge_params for ch in chunks)
    layer = max(ch.max_layer_params for ch in chunks)
    ahead = c.fsdp_prefetch_layers * layer * pb
    kept = max(ch.zero3_kept_layers for ch in chunks)
    root += max(0, kept - 1) * layer * pb           # kept beyond the one gathered anyway
    return (root + layer * pb, root + layer * pb + ahead,
            root + ahead + layer * max(2 * pb, pb + grad_reduce_bytes(plan)))


def bucket_bytes(params: float, plan: Plan) -> float:
    """Gradient-reduction buffers that are not views of the gradient buffer."""
    c = plan.memory
    if plan.dp * plan.cp == 1 or c.dp_buckets == BucketKind.VIEWS:
        return 0.0
    g = float(plan.grad_bytes)
    if c.dp_buckets == BucketKind.COPIES:
        return params * g if plan.zero_stage < 2 else 0.0
    return min(params, c.dp_bucket_buffer_elements) * g if plan.zero_stage in (1, 2) else 0.0


def workspace(chunks: list[ChunkMemory], plan: Plan) -> tuple[float, str]:
    """(the largest transient at the forward/backward peak, which one)."""
    at_loss, at_start, at_end = fsdp_transient_bytes(chunks, plan)
    # a chunk's layers run backward after its output layer and loss released their tensors
    layer = max(c.layer_transient_bytes - c.head_saved_bytes for c in chunks)
    head = max(c.head_saved_bytes for c in chunks)
    moments = {"loss": max(c.loss_transient_bytes for c in chunks) + at_loss,
               "layer backward": max(0.0, layer + at_start),
               "fsdp reduce-scatter": max(0.0, at_end - head) if at_end else 0.0}
    name = max(moments, key=lambda k: (moments[k], k))
    buckets = bucket_bytes(sum(c.params for c in chunks), plan)
    return moments[name] + buckets, name + (" + dp buckets" if buckets else "")


def stage_memory(stage: int, chunks: list[ChunkMemory], plan: Plan) -> StageMemory:
    """Peak memory of one rank of pipeline stage ``stage`` holding ``chunks``."""
    shard = plan.shard_ranks
    dense = sum(c.dense_params for c in chunks)
    expert = sum(c.params - c.dense_params for c in chunks)
    expert_shard = max(1, shard // plan.ep)
    w1, g1, o1 = state_bytes(dense, plan, shard)
    w2, g2, o2 = state_bytes(expert, plan, expert_shard)
    fp8 = fp8_weight_copy_bytes(sum(c.linear_params for c in chunks), plan)
    step = optimizer_step_bytes(dense, plan, shard) + optimizer_step_bytes(expert, plan, expert_shard)
    acts = peak_activation_bytes(plan, stage, [c.act_bytes for c in chunks],
                                 [c.wgrad_hold_bytes for c in chunks])
    ws, source = workspace(chunks, plan)
    return StageMemory(stage, w1 + w2 + fp8, g1 + g2, o1 + o2, acts, ws, step, fp8, source)
