"""How frameworks issue work from the host: launch modes and host-side mechanisms.

Loaded from the "host" section of ``frameworks.json`` (facts with sources; the formulas are
in ``simulator.cost.host`` and ``simulator.engine.step``). Costs of mechanisms are in
*eager ops*: multiples of the profile's ``HostModel.op_fwd_us``, measured relative to that
cost on the same host, so they follow the host's speed (a Grace host is slower than a Xeon
for both).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .defaults import canonical_framework

DATA = Path(__file__).with_name("frameworks.json")


@dataclass(frozen=True)
class HostMode:
    """How kernels are launched: ``op_scale`` x the eager per-op cost per op, plus per layer
    and pass ``region_eager_ops`` (a compiled region's guards and wrapper) and one graph
    replay ``graph_launch_us + graph_node_us * ops`` (CUDA graphs)."""

    op_scale: float
    region_eager_ops: float = 0.0
    graph_launch_us: float = 0.0
    graph_node_us: float = 0.0
    why: str = ""


@dataclass(frozen=True)
class HostMechanism:
    """Host work a framework adds, and how it limits the host's run-ahead.

    ``layer_fwd_eager_ops`` / ``layer_bwd_eager_ops``: per layer (an FSDP unit) and pass;
    ``param_tensor_bwd_eager_ops``: per local parameter tensor and backward pass (DDP's
    autograd hooks, DeepSpeed's per-micro-batch gradient loop, ZeRO's gradient hooks);
    ``param_tensor_fwd_eager_ops``: per parameter tensor and forward pass (ZeRO-3's
    per-module gather and release hooks); ``zero_stages``: the ZeRO stages the mechanism
    exists at (empty: any; ``framework_plan.with_framework`` drops it at others);
    ``device_bytes_per_param_fwd`` / ``device_bytes_per_param_bwd``: device memory traffic per local parameter and pass (DDP's
    bucket copies; FSDP2's all-gather copy-out and reduce-scatter copy-in), in
    ``device_kernels_per_layer_fwd`` / ``_bwd`` kernels per layer, or, where those are 0,
    ``device_kernels_per_tensor_bwd`` per parameter tensor;
    ``linear_call_extra_eager_ops``: per Linear-module call, forward and again backward, the
    host cost beyond an eager ``torch.nn.Linear`` (Transformer Engine's modules);
    ``linear_call_fwd_eager_ops`` / ``linear_call_bwd_eager_ops``: the same, forward only /
    backward only (ZeRO-3's memory-efficient linear replacing ``F.linear``);
    ``layer_module_fwd_eager_ops``: per layer forward (again when full recompute re-runs it),
    the layer module's Python glue beyond its ops (Megatron-Core's ``TransformerLayer``);
    ``bucket_grad_copies_bwd``: gradient-sized copies per backward (each reads and writes the
    gradient dtype's bytes per parameter, one kernel per tensor: DDP's copy into its bucket
    and back), ``bucket_copies_on_sync_only``: only in the backward that synchronises
    (gradient accumulation under ``no_sync``);
    ``model_fwd_eager_ops`` / ``model_bwd_eager_ops``: per micro-batch forward / backward
    pass, the model's Python outside its layers beyond the op graph's embedding, head and
    loss ops (a causal mask, a rotary table, the head's and loss's wrappers), on the chunk
    that holds the output layer (most of it is the head's, the loss's and the batch's; under
    pipeline parallelism the embedding's share, about a sixth of the forward, belongs to the
    first stage and the batch's to every stage); where measured, those shares apart:
    ``model_first_fwd_eager_ops`` / ``model_first_bwd_eager_ops`` on the chunk holding the
    embedding, ``model_every_fwd_eager_ops`` on every chunk;
    ``hooks_per_module``: the per-parameter-tensor costs were measured on modules of one
    tensor each and are hooks per module (ZeRO-3's fetch and release): charged per weight,
    a module's bias not counted;
    ``regather_param_tensor_fwd_eager_ops`` / ``_bwd_``: per parameter tensor (module) of a
    layer ZeRO-3 releases after its forward and gathers again in backward, beyond one kept
    gathered between them (the release, the second fetch);
    ``recompute_param_tensor_bwd_eager_ops``: per parameter tensor of a layer full recompute
    re-runs, in backward (ZeRO-3's module hooks firing again in the re-run forward);
    ``recompute_layer_fwd_eager_ops`` / ``recompute_layer_bwd_eager_ops``: per layer
    forward / backward under full recompute, the checkpoint wrapper's work (RNG state saves
    and restores, input detach, saved-tensor hooks, the nested backward call; in backward
    beyond the re-run forward);
    ``lead_layers``: the host may run at most this many layers ahead of the device (FSDP's
    all-gather rate limiter), -1 = unbounded; ``sync_at_p2p``: the host waits for the device
    after every pipeline send/receive (Megatron's ``batch_p2p_sync``); ``sync_before_fwd``:
    before issuing each forward pass the host waits for the device to finish the pass before
    it (the batch code copies a device tensor to the host: Megatron-LM's legacy
    ``get_batch``); ``sync_after_loss``: after issuing a forward pass that ends in the loss,
    the host waits for the device to finish it (the training script reads the loss:
    Megatron's NaN check in ``loss_func``); ``only_without_vpp``: the mechanism exists only
    in plans without virtual pipeline stages (``framework_plan.with_framework`` drops it
    otherwise);
    ``moe_layer_fwd_eager_ops`` / ``moe_layer_bwd_eager_ops``: the whole MoE block of one MoE
    layer and pass as the framework issues it (the op graph's own MoE-block ops are
    subtracted where charged), ``moe_pre_sync_fwd_eager_ops`` of it issued before
    ``moe_sync_fwd``: the host waits for the device inside every MoE layer's forward
    (Megatron-Core's token dispatcher copies counts to the host); ``launch_blocking``: every
    kernel launch returns only when the kernel has finished (``CUDA_LAUNCH_BLOCKING=1``), so
    the host never runs ahead: each pass costs its host time plus its device time;
    ``grad_cat_on_unshard_stream``: the parameters are views split from a flat parameter on
    the all-gather's stream, so autograd concatenates their gradients into the flat
    gradient on that stream, in series with the gathers (FSDP1); ``reduce_stream_cast`` /
    ``reduce_stream_predivide``: before each gradient reduce-scatter, on the stream that
    issues it (in series with it, beside the compute), the unsharded gradient is cast from
    the compute dtype to the reduce dtype where they differ, and divided in place by the
    pre-divide factor when more than one rank reduces (FSDP1's ``_post_backward_hook`` and
    ``_reduce_grad``);
    ``optimizer_fixed_eager_ops`` / ``optimizer_tensor_eager_ops``: the host work of one
    optimizer step with its gradient clipping, per step and per parameter tensor the
    optimizer steps (local shards count as tensors), issued after the last backward;
    ``optimizer_flat_units``: the optimizer steps one flat parameter per FSDP unit instead
    (FSDP1 with ``use_orig_params=False``); ``optimizer_sync_per_tensor``: the step reads a
    device scalar back per tensor (Composer's DecoupledAdamW ``.item()`` on its step
    counter), so the host waits for the device before issuing each tensor's update and the
    step's host time adds to its device time; ``optimizer_local_shards``: the per-tensor
    cost counts only the tensors that overlap this rank's 1/shard slice of each gradient
    bucket (Megatron-Core's distributed optimizer: about tensors / shard + 1 per bucket);
    ``optimizer_model_tensor_eager_ops``: per step and per parameter tensor of the model
    chunk, whoever steps it (Megatron-Core's ``zero_grad_buffer``);
    ``nonweight_tensor_bwd_eager_ops``: per backward, per parameter tensor that is not a
    Linear's weight (norms, biases, the embedding: tensors less Linear calls), whose
    gradient a hook adds into a buffer; a Linear's weight gradient is accumulated there by
    its GEMM (Megatron-Core's ``main_grad.add_`` skipped under gradient-accumulation
    fusion); ``only_with_dp_overlap``: the mechanism exists only where the gradient
    reduction overlaps the backward (Megatron-Core's parameter-gather hooks come with
    ``--overlap-param-gather``, set with ``--overlap-grad-reduce``);
    ``bucket_fwd_eager_ops`` / ``bucket_bwd_eager_ops``: once per step, per gradient bucket
    of the chunk beyond its first, in the step's first forward / last backward (Megatron-
    Core's forward pre-hooks dispatching each bucket's parameter all-gather, its gradient
    hooks each bucket's reduction), charged as a 1/micro-batches share of it per pass like
    the ``*_accumulating`` boundary extras;
    ``only_with_pp``: the mechanism exists only under pipeline parallelism (DeepSpeed's
    ``PipelineEngine``; without it Megatron-DeepSpeed and DeepSpeed run the plain engine);
    ``only_without_pp``: only without it (torchtitan copies each accumulated micro-batch
    to the device before its forward, but with pipeline stages each accumulation round's
    micro-batches before that round's schedule);
    ``sync_load_edge_stages``: on the first and last pipeline stages the host waits for the
    device before each forward (DeepSpeed's LoadMicroBatch copies the batch with a blocking
    ``.to(device)``; played by the event engine's DeepSpeed instruction stream);
    ``mb_lead_fwd_eager_ops`` / ``mb_lead_layer_fwd_eager_ops``: a training loop's work per
    micro-batch (fixed, and per layer of the model) that the host does before issuing the
    forward's first op, so the device cannot start the pass before it (HF's Trainer:
    ``cost.host.loop_lead_host``, charged on the chunk holding the embedding);
    ``pipe_first_mb_eager_ops`` / ``pipe_middle_mb_eager_ops`` / ``pipe_last_mb_eager_ops``:
    per micro-batch, the pipeline engine's instructions on the first / a middle / the last
    stage beyond the model's passes (forward and backward together, charged half to each),
    and ``pipe_tp_*_mb_eager_ops`` more when the model is tensor-parallel and the hand-offs
    are partitioned over the TP group, ``pipe_tp_fwd_share`` (first, middle, last) of it in
    the forward; ``replaces`` / ``for_code``: this mechanism stands in for ``replaces`` when
    the model's own code is of style ``for_code`` (``TransformerSpec.code_style``: the layer
    Python measured on another model's modules, ``cost.host.code_mechanisms``)."""

    layer_fwd_eager_ops: float = 0.0
    layer_bwd_eager_ops: float = 0.0
    param_tensor_bwd_eager_ops: float = 0.0
    param_tensor_fwd_eager_ops: float = 0.0
    # backward costs of a micro-batch off the gradient-accumulation boundary where they
    # differ (DeepSpeed ZeRO-1 reduces only at the boundary); < 0: every backward alike
    param_tensor_bwd_eager_ops_accumulating: float = -1.0
    model_bwd_eager_ops_accumulating: float = -1.0
    zero_stages: tuple[int, ...] = ()
    device_bytes_per_param_bwd: float = 0.0
    device_bytes_per_param_fwd: float = 0.0
    device_kernels_per_layer_fwd: float = 0.0
    device_kernels_per_layer_bwd: float = 0.0
    device_kernels_per_tensor_bwd: float = 0.0
    # of the backward bytes / per-layer kernels: those the input-gradient pass needs first
    # (B of a split backward: FSDP2's re-gather copy-out); the rest follow the gradients (W)
    device_bytes_per_param_bwd_first: float = 0.0
    device_kernels_per_layer_bwd_first: float = 0.0
    # with gradient sync off across micro-batches (FSDP under PP): unsharded gradients
    # accumulated per backward (first one / later ones) and the reduce's copy of them
    device_bytes_per_param_accumulate_first: float = 0.0
    device_bytes_per_param_accumulate: float = 0.0
    device_bytes_per_param_bwd_accumulated: float = 0.0
    linear_call_extra_eager_ops: float = 0.0
    linear_call_fwd_eager_ops: float = 0.0
    linear_call_bwd_eager_ops: float = 0.0
    layer_module_fwd_eager_ops: float = 0.0
    bucket_grad_copies_bwd: float = 0.0
    bucket_copies_on_sync_only: bool = False
    model_fwd_eager_ops: float = 0.0
    model_bwd_eager_ops: float = 0.0
    model_first_fwd_eager_ops: float = 0.0
    model_first_bwd_eager_ops: float = 0.0
    model_every_fwd_eager_ops: float = 0.0
    recompute_layer_fwd_eager_ops: float = 0.0
    recompute_layer_bwd_eager_ops: float = 0.0
    recompute_param_tensor_bwd_eager_ops: float = 0.0
    regather_param_tensor_fwd_eager_ops: float = 0.0
    regather_param_tensor_bwd_eager_ops: float = 0.0
    hooks_per_module: bool = False
    moe_layer_fwd_eager_ops: float = 0.0
    moe_layer_bwd_eager_ops: float = 0.0
    moe_pre_sync_fwd_eager_ops: float = 0.0
    moe_sync_fwd: bool = False
    lead_layers: int = -1
    sync_at_p2p: bool = False
    sync_before_fwd: bool = False
    only_without_vpp: bool = False
    sync_after_loss: bool = False
    launch_blocking: bool = False
    grad_cat_on_unshard_stream: bool = False
    reduce_stream_cast: bool = False
    reduce_stream_predivide: bool = False
    optimizer_fixed_eager_ops: float = 0.0
    optimizer_tensor_eager_ops: float = 0.0
    optimizer_flat_units: bool = False
    optimizer_sync_per_tensor: bool = False
    optimizer_local_shards: bool = False
    optimizer_model_tensor_eager_ops: float = 0.0
    nonweight_tensor_bwd_eager_ops: float = 0.0
    only_with_dp_overlap: bool = False
    bucket_fwd_eager_ops: float = 0.0
    bucket_bwd_eager_ops: float = 0.0
    only_with_pp: bool = False
    only_without_pp: bool = False
    sync_load_edge_stages: bool = False
    mb_lead_fwd_eager_ops: float = 0.0
    mb_lead_layer_fwd_eager_ops: float = 0.0
    pipe_first_mb_eager_ops: float = 0.0
    pipe_middle_mb_eager_ops: float = 0.0
    pipe_last_mb_eager_ops: float = 0.0
    pipe_tp_first_mb_eager_ops: float = 0.0
    pipe_tp_middle_mb_eager_ops: float = 0.0
    pipe_tp_last_mb_eager_ops: float = 0.0
    pipe_tp_fwd_share: tuple[float, ...] = (0.5, 0.5, 0.5)
    replaces: str = ""
    for_code: str = ""
    why: str = ""


@dataclass(frozen=True)
class FrameworkHost:
    """A framework's default launch mode and host mechanisms."""

    mode: str
    mechanisms: tuple[str, ...]
    why: str = ""


@dataclass(frozen=True)
class HostFacts:
    modes: Mapping[str, HostMode]
    mechanisms: Mapping[str, HostMechanism]
    frameworks: Mapping[str, FrameworkHost] = field(default_factory=dict)
    default: FrameworkHost = FrameworkHost("eager", ())

    def framework(self, name: str) -> FrameworkHost:
        """Host facts of framework ``name`` (any spelling: "megatron" is "megatron-lm");
        unknown names get ``default``."""
        key = canonical_framework(name)
        return self.frameworks.get(key, self.default)


def _split(d: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    return {k: v for k, v in d.items() if k != "source"}, str(d.get("source", ""))


def _fw(d: Mapping[str, Any]) -> FrameworkHost:
    kw, why = _split(d)
    return FrameworkHost(str(kw["mode"]), tuple(kw.get("mechanisms", ())), why)


def _mechanism_fields(kw: dict[str, Any]) -> dict[str, Any]:
    """A mechanism's JSON fields as ``HostMechanism`` takes them (lists as tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}


def load_host(data: Mapping[str, Any] | None = None) -> HostFacts:
    h = (data if data is not None else json.loads(DATA.read_text()))["host"]
    modes = {k: HostMode(**_split(v)[0], why=_split(v)[1]) for k, v in h["modes"].items()}
    mech = {k: HostMechanism(**_mechanism_fields(_split(v)[0]), why=_split(v)[1])
            for k, v in h["mechanisms"].items()}
    fws = {canonical_framework(k): _fw(v) for k, v in h["frameworks"].items()}
    return HostFacts(modes, mech, fws, _fw(h["default"]))


HOST = load_host()
