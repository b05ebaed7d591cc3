"""Host (CPU) time to issue a pass: every op the framework dispatches costs host time.

In eager PyTorch each op of a pass passes through Python, the dispatcher and autograd
before its kernel is launched; the profile's ``HostModel`` gives that cost per op of the
op graph, forward and backward. How a framework issues kernels changes it
(``frameworks.json`` "host" -> "modes"):

* ``eager``: every op costs ``op_fwd_us`` / ``op_bwd_us``;
* ``compiled`` (torch.compile per transformer block): each kernel is launched by the
  generated wrapper at ``op_scale`` of the eager cost, plus one compiled-region call per
  layer and pass (``region_eager_ops`` eager ops' worth of guards and wrapper);
* ``cuda_graphs`` (one captured graph per layer and pass): one graph replay per layer,
  ``graph_launch_us + graph_node_us * kernels``; ops outside the layers stay eager.

Framework mechanisms that add host work per layer or per parameter tensor (FSDP unit
hooks, DDP's per-parameter hooks, DeepSpeed's per-micro-batch gradient loop) are priced
in ``eager ops`` too (``frameworks.json`` "host" -> "mechanisms"), so they follow the host's
speed. The engine (``simulator.engine.step``) puts the result on a host stream ahead of
the device, or on the device stream itself when the host runs the kernels
(``HostModel.synchronous``: a CPU device).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..frameworks import HOST
from ..frameworks.host import HostMode
from ..hardware.profile import Profile
from ..workload.ops import Op, OpKind
from ..workload.spec import MLP, Norm, TransformerSpec


@dataclass(frozen=True)
class HostCost:
    """Host issue time of one pass and how many ops it issues (the device can start once
    the first is issued)."""

    seconds: float = 0.0
    ops: float = 0.0


def op_count(op: Op) -> int:
    """Host-dispatched ops one op-graph op stands for: one per GEMM, attention core or
    collective; ``kernels`` for a bandwidth-bound op (e.g. an unfused cross-entropy)."""
    return op.kernels if op.kind == OpKind.MEMORY else 1


def is_forward_op(op: Op, backward: bool) -> bool:
    """Forward-type host cost: a forward pass, or a forward op re-run in backward by
    activation recompute (Python module code again, not the autograd engine)."""
    return not backward or op.name.endswith("_recompute")


def eager_host_us(ops: list[Op], prof: Profile, backward: bool) -> float:
    """Microseconds the host spends dispatching ``ops`` one by one in eager mode."""
    h = prof.host
    if h is None:
        return 0.0
    fwd = sum(op_count(o) for o in ops if is_forward_op(o, backward))
    bwd = sum(op_count(o) for o in ops if not is_forward_op(o, backward))
    return fwd * h.op_fwd_us.value + bwd * h.op_bwd_us.value


def host_mode(name: str) -> HostMode:
    return HOST.modes[name]


def layer_host(ops: list[Op], prof: Profile, backward: bool, mode: str) -> HostCost:
    """Host time of one transformer layer's pass under the framework's launch ``mode``."""
    if prof.host is None:
        return HostCost()
    m = host_mode(mode)
    n = float(sum(op_count(o) for o in ops))
    eager = eager_host_us(ops, prof, backward)
    us = m.op_scale * eager + m.region_eager_ops * prof.host.op_fwd_us.value
    if m.graph_launch_us > 0:
        us += m.graph_launch_us + m.graph_node_us * n
        n = 1.0                      # one replay: the whole layer is issued at once
    return HostCost(us * 1e-6, n)


def eager_host(ops: list[Op], prof: Profile, backward: bool, mode: str) -> HostCost:
    """Host time of ops outside the layers (embedding, head, loss): not captured by
    per-layer graphs; compiled with the model under ``compiled``."""
    if prof.host is None:
        return HostCost()
    m = host_mode(mode)
    scale = m.op_scale if m.graph_launch_us <= 0 else 1.0
    n = float(sum(op_count(o) for o in ops))
    return HostCost(scale * eager_host_us(ops, prof, backward) * 1e-6, n)


def mechanism_host(eager_ops: float, prof: Profile) -> HostCost:
    """Host time of ``eager_ops`` eager ops' worth of framework work (hooks, loops)."""
    if prof.host is None or eager_ops <= 0:
        return HostCost()
    return HostCost(eager_ops * prof.host.op_fwd_us.value * 1e-6, eager_ops)


@dataclass(frozen=True)
class ParamLayout:
    """How the model code holds a layer's parameters where the op graph does not say: one
    Linear module each for q, k and v (``split_qkv``) and for a SwiGLU's gate and up
    (``split_gate_up``: transformers' and torchtitan's Llama) where the op graph fuses them
    into one GEMM, a bias beside every Linear weight (``linear_bias``; ``qkv_bias``: only
    the q, k, v projections') and beside every norm weight (``norm_bias``: LayerNorm), and
    whether a layer's routed experts are held as 3-D tensors (one per projection, all experts
    in it) in one module and run as grouped GEMMs outside any Linear module
    (``experts_3d``: transformers 5's ``MixtralExperts`` ``gate_up_proj`` / ``down_proj``
    under its default "grouped_mm" experts implementation; torchtitan's ``GroupedExperts``
    ``w1`` / ``w2`` / ``w3``) rather than one Linear module per expert and projection
    (Megatron-Core's TEGroupedMLP ``weight0..N``, transformers 4), with gate and up in one
    tensor (``experts_gate_up_fused``: transformers 5) or two (torchtitan). ``modules_only``
    counts modules instead of tensors (``weights_only``): a 3-D experts module is one. The
    default is the op graph's own count: fused projections, weights only, per-expert
    weights."""

    split_qkv: bool = False
    split_gate_up: bool = False
    linear_bias: bool = False
    qkv_bias: bool = False
    norm_bias: bool = False
    experts_3d: bool = False
    experts_gate_up_fused: bool = False
    modules_only: bool = False

    @classmethod
    def of(cls, spec: TransformerSpec, code: str) -> "ParamLayout":
        """The layout of ``spec`` under the framework's model code ``code``
        (``frameworks.json`` memory ``param_layout``): "fused" keeps the op graph's fused
        projections, "split" splits them, "hf" as the spec's own code does
        (``TransformerSpec.split_qkv`` / ``split_gate_up``). Assumed where the spec does not
        say: transformers' Llama layout (q, k, v and gate, up split), and a LayerNorm
        carries a bias when the Linears do (GPT-2, BLOOM, Megatron's GPT; MPT's ``no_bias``
        drops both; Falcon's bias-free Linears beside biased LayerNorms are undercounted).
        "hf" and "split" hold the experts as 3-D tensors (transformers 5.24
        ``modeling_mixtral.MixtralExperts``, ``PreTrainedModel.get_correct_experts_
        implementation`` picking "grouped_mm" by default; torchtitan's ``GroupedExperts``),
        "hf" with gate and up in one."""
        own = code == "split" or (code == "hf" and spec.split_qkv is not False)
        gate = code == "split" or (code == "hf" and spec.split_gate_up is not False)
        return cls(split_qkv=own and spec.mla is None,
                   split_gate_up=gate and spec.mlp == MLP.SWIGLU,
                   linear_bias=spec.linear_bias, qkv_bias=spec.qkv_bias,
                   norm_bias=spec.norm == Norm.LAYERNORM and spec.linear_bias,
                   experts_3d=code in ("hf", "split"), experts_gate_up_fused=code == "hf")

    def weights_only(self) -> "ParamLayout":
        """The same modules without their biases: one tensor per module (a 3-D experts
        module counted once)."""
        return replace(self, linear_bias=False, qkv_bias=False, norm_bias=False,
                       modules_only=True)

    def linears(self, op: Op) -> int:
        """Linear modules one weight GEMM of the op graph stands for (per group)."""
        if op.name == "qkv" and self.split_qkv:
            return 3
        if op.name.endswith("fc1") and self.split_gate_up \
                and not (routed_experts(op) and self.experts_gate_up_fused):  # gate_up_proj
            return 2
        return 1

    def biases(self, op: Op) -> int:
        if op.name in PLAIN_LINEARS:          # router and output layer: no bias
            return 0
        return self.linears(op) if self.linear_bias or (self.qkv_bias and op.name == "qkv") \
            else 0


WEIGHTLESS_GEMMS = ("qk", "av")          # attention score GEMMs (materialized attention)
# GEMMs frameworks run outside their layer modules: Megatron-Core's MoE router (a plain
# linear, workload.ops.moe_ops) and output layer (tensor_parallel.ColumnParallelLinear)
PLAIN_LINEARS = ("router", "logits")
NORMS_PER_OP = {"qk_norm": 2}            # one op for the query and the key norm


def param_tensors(ops: list[Op], layout: ParamLayout = ParamLayout()) -> int:
    """Parameter tensors the forward ops ``ops`` use: per weight GEMM (per group of a
    grouped GEMM, or once for all routed experts where they are 3-D tensors) its Linear
    modules' weights and biases (``layout``), per norm its weight (and bias), one per
    embedding table."""
    n = 0
    for o in ops:
        if o.kind == OpKind.GEMM and o.name not in WEIGHTLESS_GEMMS:
            if routed_experts(o) and layout.experts_3d:     # all experts in one tensor each
                if not layout.modules_only:
                    n += layout.linears(o) + layout.biases(o)
                elif o.name.endswith("fc1"):                 # one module holds them all
                    n += 1
                continue
            n += o.batch * (layout.linears(o) + layout.biases(o))
        elif o.kind == OpKind.MEMORY and o.mem_kind == "norm":
            n += NORMS_PER_OP.get(o.name, 1) * (2 if layout.norm_bias else 1)
        elif o.kind == OpKind.MEMORY and o.name == "embedding":
            n += 1
    return n


def linear_weights(ops: list[Op], layout: ParamLayout = ParamLayout()) -> int:
    """Of ``param_tensors``, the GEMMs' weight tensors (per Linear module, per expert of a
    grouped GEMM, the 3-D experts' tensors): those a gradient-accumulation-fusion GEMM
    accumulates itself; not the router's (a plain linear whose gradient autograd returns)."""
    n = 0
    for o in ops:
        if o.kind != OpKind.GEMM or o.name in WEIGHTLESS_GEMMS + ("router",):
            continue
        if routed_experts(o) and layout.experts_3d:
            n += (1 if o.name.endswith("fc1") else 0) if layout.modules_only \
                else layout.linears(o)
            continue
        n += o.batch * layout.linears(o)
    return n


def linear_calls(ops: list[Op], layout: ParamLayout = ParamLayout()) -> int:
    """Layer-module Linear calls the forward ops ``ops`` stand for: per GEMM with weights
    its Linear modules (``layout``; a grouped GEMM of experts is one call), none for the
    attention score GEMMs, the plain linears outside the layer modules
    (``PLAIN_LINEARS``) or 3-D experts (``ParamLayout.experts_3d``: grouped GEMMs, no
    Linear module)."""
    return sum(1 if o.grouped else layout.linears(o) for o in ops
               if o.kind == OpKind.GEMM and o.has_weights
               and not (routed_experts(o) and layout.experts_3d)
               and o.name not in WEIGHTLESS_GEMMS + PLAIN_LINEARS)


def routed_experts(op: Op) -> bool:
    """A routed experts' GEMM of the op graph (``workload.moe_ops``: ``experts_fc1`` /
    ``experts_fc2``, grouped or not: with one local expert it is a plain GEMM)."""
    return op.name in ("experts_fc1", "experts_fc2")


def _by_share(boundary: float, accumulating: float, share: float) -> float:
    """Mean cost of a backward when ``share`` of them sit on the accumulation boundary
    (``accumulating`` < 0: no difference)."""
    return boundary if accumulating < 0 else accumulating + share * (boundary - accumulating)


def mechanisms_host(names: tuple[str, ...], layers: int, tensors: int, prof: Profile,
                    calls: int = 0, mode: str = "eager", recompute_calls: int = 0,
                    recompute_layers: int = 0, edge_units: int = 0,
                    boundary_share: float = 1.0, recompute_tensors: int = 0,
                    modules: tuple[int, int] | None = None,
                    regather_modules: int = 0, weights: int | None = None,
                    extra_buckets: int = 0) -> tuple[HostCost, HostCost]:
    """(forward, backward) host time the framework's mechanisms add to one chunk pass of
    ``layers`` layers holding ``tensors`` parameter tensors and making ``calls`` Linear-module
    calls (``linear_calls``), ``recompute_calls`` of them and ``recompute_layers`` of the
    layers run again in backward (full recompute: a re-run call costs its forward extra).
    Module code (per-call overhead, a layer module's Python glue, a checkpoint wrapper's
    work per recomputed layer:
    ``recompute_layer_fwd_eager_ops`` in the forward, ``_bwd_`` in the backward) scales with
    the launch ``mode`` like any per-op cost (``op_scale``: a compiled region trims it, a
    CUDA graph replays without it); hooks and loops run outside either and do not.
    ``edge_units``: FSDP units beside the layers' (the root, torchtitan's embedding and
    [norm, output] units), each with a layer unit's hooks (``layer_*_eager_ops``, assumed).
    Hooks per parameter tensor (``param_tensor_fwd_eager_ops`` / ``_bwd_``) are charged for
    the ``tensors`` once per pass (``nonweight_tensor_bwd_eager_ops`` for those that are no
    GEMM's weight: ``tensors`` less ``weights``, ``linear_weights``; default ``calls``), and
    hooks that fire again in the re-run forward (``recompute_param_tensor_bwd_eager_ops``)
    for the ``recompute_tensors`` of the recomputed layers in the backward (a mechanism
    whose hooks are per module,
    ``hooks_per_module``, counts ``modules`` instead: the chunk's and the recomputed layers'
    weight tensors, biases left out; ``regather_modules`` of them are released after forward
    and gathered again in backward, ``regather_param_tensor_*_eager_ops`` more each); where
    a mechanism costs less
    off the gradient-accumulation boundary (``*_accumulating``), a backward pays that plus
    ``boundary_share`` (one over the step's micro-batches) of the difference, and the
    per-bucket work of the step's first forward / last backward (``bucket_*_eager_ops``
    times ``extra_buckets``, the chunk's gradient buckets beyond one) that share of it."""
    scale = host_mode(mode).op_scale
    fwd = bwd = 0.0
    for name in names:
        m = HOST.mechanisms[name]
        t, rt = modules if m.hooks_per_module and modules is not None \
            else (tensors, recompute_tensors)
        call_f = (m.linear_call_extra_eager_ops + m.linear_call_fwd_eager_ops) * scale
        call_b = (m.linear_call_extra_eager_ops + m.linear_call_bwd_eager_ops) * scale
        glue = m.layer_module_fwd_eager_ops * scale
        wrap_f, wrap_b = (m.recompute_layer_fwd_eager_ops * scale,
                          m.recompute_layer_bwd_eager_ops * scale)
        fwd += layers * (m.layer_fwd_eager_ops + glue) + calls * call_f \
            + recompute_layers * wrap_f + edge_units * m.layer_fwd_eager_ops \
            + t * m.param_tensor_fwd_eager_ops \
            + regather_modules * m.regather_param_tensor_fwd_eager_ops \
            + extra_buckets * boundary_share * m.bucket_fwd_eager_ops
        bwd += (layers + edge_units) * m.layer_bwd_eager_ops \
            + t * _by_share(m.param_tensor_bwd_eager_ops,
                                  m.param_tensor_bwd_eager_ops_accumulating, boundary_share) \
            + calls * call_b + recompute_calls * call_f + recompute_layers * (glue + wrap_b) \
            + rt * m.recompute_param_tensor_bwd_eager_ops \
            + regather_modules * m.regather_param_tensor_bwd_eager_ops \
            + max(0, tensors - (calls if weights is None else weights)) \
            * m.nonweight_tensor_bwd_eager_ops + extra_buckets * boundary_share \
            * m.bucket_bwd_eager_ops
    return mechanism_host(fwd, prof), mechanism_host(bwd, prof)


def bucket_copy_ops(names: tuple[str, ...], params: float, tensors: int, grad_bytes: float,
                    passes: int) -> list[Op]:
    """DDP-style bucket copies over ``params`` gradients of ``grad_bytes`` bytes in
    ``tensors`` tensors, per backward pass: ``bucket_grad_copies_bwd`` copies, each reading
    and writing the gradient; 1/``passes`` of them per pass when they happen only in the
    backward that synchronises (``bucket_copies_on_sync_only``, accumulation under
    ``no_sync`` over ``passes`` micro-batches)."""
    ops = []
    for name in names:
        m = HOST.mechanisms[name]
        share = 1.0 / max(1, passes) if m.bucket_copies_on_sync_only else 1.0
        ops += _copy_op(f"{name}_bucket_copies", params * share,
                        m.bucket_grad_copies_bwd * 2.0 * grad_bytes,
                        m.bucket_grad_copies_bwd * tensors)
    return ops


def model_host(names: tuple[str, ...], prof: Profile, mode: str, first: bool = True,
               last: bool = True, boundary_share: float = 1.0,
               tp: int = 1) -> tuple[HostCost, HostCost]:
    """(forward, backward) host time of the model's Python outside its layers, per
    micro-batch pass of a chunk: on every chunk ``model_every_fwd_eager_ops`` (the batch
    code), on the ``first`` (embedding's) chunk ``model_first_*``, on the ``last`` (output
    layer's) chunk ``model_fwd_eager_ops`` / ``model_bwd_eager_ops``; module code, scaled by
    the launch ``mode`` as the ops outside the layers are (``eager_host``: per-layer CUDA
    graphs leave it eager). A pipeline engine's instructions (``pipe_*_mb_eager_ops``, with
    ``tp`` > 1 the partitioned hand-offs' too) are the engine's Python, not scaled."""
    m = host_mode(mode)
    scale = m.op_scale if m.graph_launch_us <= 0 else 1.0
    fwd = bwd = 0.0
    for name in names:
        h = HOST.mechanisms[name]
        fwd += h.model_every_fwd_eager_ops + (h.model_first_fwd_eager_ops if first else 0.0) \
            + (h.model_fwd_eager_ops if last else 0.0)
        bwd += (h.model_first_bwd_eager_ops if first else 0.0) \
            + (_by_share(h.model_bwd_eager_ops, h.model_bwd_eager_ops_accumulating,
                         boundary_share) if last else 0.0)
    fwd, bwd = fwd * scale, bwd * scale
    for name in names:                     # the pipeline engine's Python: not scaled
        pf, pb = _pipe_mb_eager_ops(HOST.mechanisms[name], first, last, tp)
        fwd, bwd = fwd + pf, bwd + pb
    return mechanism_host(fwd, prof), mechanism_host(bwd, prof)


def _pipe_mb_eager_ops(h, first: bool, last: bool, tp: int) -> tuple[float, float]:
    """(forward, backward) eager ops of a pipeline engine's instructions per micro-batch on
    this chunk's stage: the first's where it holds the embedding, the last's where it holds
    the output layer, else a middle stage's; half in each pass, the partitioned TP
    hand-offs' extra by ``pipe_tp_fwd_share``."""
    k = 0 if first else 2 if last else 1
    ops = (h.pipe_first_mb_eager_ops, h.pipe_middle_mb_eager_ops, h.pipe_last_mb_eager_ops)[k]
    fwd = bwd = ops / 2
    if tp > 1:
        extra = (h.pipe_tp_first_mb_eager_ops, h.pipe_tp_middle_mb_eager_ops,
                 h.pipe_tp_last_mb_eager_ops)[k]
        fwd += extra * h.pipe_tp_fwd_share[k]
        bwd += extra * (1.0 - h.pipe_tp_fwd_share[k])
    return fwd, bwd


@dataclass(frozen=True)
class DeviceCopies:
    """Device copies the mechanisms add to one chunk pass: ``fwd``; in backward ``first``
    (what the input-gradient pass needs before it can start: B of a split backward) and
    ``rest`` (after the gradients exist: W's side)."""

    fwd: list[Op]
    first: list[Op]
    rest: list[Op]


def _copy_op(name: str, params: float, nb: float, kernels: float) -> list[Op]:
    if nb <= 0:
        return []
    return [Op(name, OpKind.MEMORY, bytes_moved=params * nb, kernels=max(1, round(kernels)),
               mem_kind="copy")]


def device_copy_ops(names: tuple[str, ...], params: float, layers: int, tensors: int,
                    accumulate_over: int = 0) -> DeviceCopies:
    """Device copies the mechanisms add to one chunk pass of ``layers`` layers holding
    ``params`` parameters in ``tensors`` tensors: one bandwidth-bound op per mechanism and
    part, ``device_bytes_per_param_*`` x ``params`` bytes in its kernels (per layer where the
    mechanism states per-layer kernels, else per tensor).

    ``accumulate_over`` = m > 0: FSDP gathers once and reduces once per step over m
    micro-batches (``engine.fsdp_comm.fsdp_once_per_step``): the gather's copies cost 1/m per
    pass, nothing is re-gathered in backward, every backward accumulates the unsharded
    gradients (``device_bytes_per_param_accumulate_first`` on the first micro-batch,
    ``device_bytes_per_param_accumulate`` on the others, per tensor) and the reduce's copy
    reads the accumulated ones (``device_bytes_per_param_bwd_accumulated``), 1/m per pass."""
    out = DeviceCopies([], [], [])
    m_steps = max(1, accumulate_over)
    share = 1.0 / m_steps
    def k(per_layer: float, fallback: float) -> float:
        return per_layer * layers if per_layer > 0 else fallback

    for name in names:
        m = HOST.mechanisms[name]
        per_tensor = m.device_kernels_per_tensor_bwd * tensors
        first_k = k(m.device_kernels_per_layer_bwd_first, 0.0)
        rest_k = k(m.device_kernels_per_layer_bwd, per_tensor) - first_k
        rest_b = m.device_bytes_per_param_bwd - m.device_bytes_per_param_bwd_first
        out.fwd.extend(_copy_op(f"{name}_fwd_copies", params * share,
                                m.device_bytes_per_param_fwd,
                                k(m.device_kernels_per_layer_fwd, tensors)))
        if accumulate_over <= 0:
            out.first.extend(_copy_op(f"{name}_bwd_first_copies", params,
                                      m.device_bytes_per_param_bwd_first, first_k))
            out.rest.extend(_copy_op(f"{name}_bwd_copies", params, rest_b, rest_k))
            continue
        acc = (m.device_bytes_per_param_accumulate_first
               + m.device_bytes_per_param_accumulate * (m_steps - 1)) / m_steps
        out.rest.extend(_copy_op(f"{name}_grad_accumulate", params, acc, tensors))
        out.rest.extend(_copy_op(f"{name}_bwd_copies", params * share,
                                 m.device_bytes_per_param_bwd_accumulated or rest_b, rest_k))
    return out


# The op graph's MoE-block ops besides the experts (``workload.ops.moe_ops``): a framework's
# measured MoE-layer host cost (``moe_layer_*_eager_ops``) includes them; the first two are
# issued before the token dispatcher's device-to-host sync. The flex (DeepEP) path's
# unpermute stands where the all-to-all path's combine does; the measured cost was taken on
# the all-to-all dispatcher and is applied to flex unchanged (assumed: DeepEP's fused
# kernels remove the probability all-to-all and chunk sort, a few eager ops of ~46).
MOE_BLOCK_OPS = ("router", "moe_router_topk", "moe_permute", "moe_combine", "moe_unpermute")
MOE_PRE_SYNC_OPS = ("router", "moe_router_topk")
_BWD_SUFFIXES = ("_dgrad", "_wgrad", "_bwd")


def block_op_count(ops: list[Op], names: tuple[str, ...], backward: bool) -> float:
    """Host ops among ``ops`` that stand for the op-graph ops ``names`` (their backward
    counterparts, ``_dgrad`` / ``_wgrad`` / ``_bwd``, when ``backward``)."""
    n = 0.0
    for o in ops:
        base = o.name
        if backward:
            base = next((base[: -len(x)] for x in _BWD_SUFFIXES if base.endswith(x)), "")
        if base in names:
            n += op_count(o)
    return n


@dataclass(frozen=True)
class MoEHost:
    """Host work the framework adds to one MoE layer beyond the op graph's ops, in eager
    ops: forward (``pre_sync_fwd`` of it before the dispatcher's sync) and backward, and
    whether the forward syncs (``sync``)."""

    fwd: float = 0.0
    pre_sync_fwd: float = 0.0
    bwd: float = 0.0
    sync: bool = False


def moe_layer_host(names: tuple[str, ...], fwd: list[Op], bwd: list[Op],
                   charged: float = 1.0) -> MoEHost:
    """The framework mechanisms' MoE-layer host work (``moe_layer_*_eager_ops``) for the MoE
    layer whose forward / backward ops are ``fwd`` / ``bwd``, minus the op graph's own
    MoE-block ops (``MOE_BLOCK_OPS``) at ``charged`` eager ops each: what the per-op host
    cost already charged them (the launch mode's ``op_scale``: 1 eager, 0 where a CUDA
    graph replays the layer and charged them as graph nodes only)."""
    mechs = [HOST.mechanisms[n] for n in names]
    f = sum(m.moe_layer_fwd_eager_ops for m in mechs)
    pre = sum(m.moe_pre_sync_fwd_eager_ops for m in mechs)
    b = sum(m.moe_layer_bwd_eager_ops for m in mechs)
    sync = any(m.moe_sync_fwd for m in mechs)
    if f <= 0 and b <= 0 and not sync:
        return MoEHost()
    plain_bwd = [o for o in bwd if not o.name.endswith("_recompute")]

    def net(total: float, ops: list[Op], block: tuple[str, ...], backward: bool) -> float:
        return max(0.0, total - charged * block_op_count(ops, block, backward)) if total > 0 else 0.0
    return MoEHost(net(f, fwd, MOE_BLOCK_OPS, False), net(pre, fwd, MOE_PRE_SYNC_OPS, False),
                   net(b, plain_bwd, MOE_BLOCK_OPS, True), sync)


def code_mechanisms(names: tuple[str, ...], model: TransformerSpec) -> tuple[str, ...]:
    """``names`` with each mechanism measured on another code style replaced by its variant
    for the model's (``HostMechanism.replaces`` / ``for_code``, ``TransformerSpec.code_style``):
    GPT-2-style code pays GPT-2's layer Python, not Llama's."""
    style = model.code_style
    subs = {m.replaces: n for n, m in HOST.mechanisms.items()
            if m.replaces and m.for_code == style}
    return tuple(subs.get(n, n) for n in names)


def lead_layers(names: tuple[str, ...]) -> int:
    """How many layers the host may run ahead of the device (-1: unbounded)."""
    leads = [HOST.mechanisms[n].lead_layers for n in names if HOST.mechanisms[n].lead_layers >= 0]
    return min(leads) if leads else -1


def lead_release_frac(lead: int, layers: int) -> float:
    """Share of the previous pass (``layers`` layers) the device must have run before a
    host allowed ``lead`` layers ahead (``lead_layers``, >= 0) may issue the next one."""
    return max(0.0, 1.0 - lead / max(1, layers))


def pass_first_share(host_s: float, host_ops: float, lead_s: float = 0.0) -> float:
    """Share of a pass's host time ``host_s`` after which the device may start it: the work
    issued before its first op (``lead_s``, a training loop's per-micro-batch Python) and
    then the first of its ``host_ops`` ops."""
    if host_s <= 0.0:
        return first_op_share(host_ops)
    lead = min(lead_s, host_s)
    return min(1.0, (lead + (host_s - lead) * first_op_share(host_ops)) / host_s)


def loop_lead_host(names: tuple[str, ...], prof: Profile, layers: int) -> HostCost:
    """Host time a training loop spends per micro-batch before the forward's first op
    (``mb_lead_fwd_eager_ops`` + ``mb_lead_layer_fwd_eager_ops`` per layer of the model:
    HF's Trainer walks every module in ``model.train()`` and ``floating_point_ops``); the
    loop's Python, not scaled by the launch mode."""
    ops = sum(HOST.mechanisms[n].mb_lead_fwd_eager_ops
              + layers * HOST.mechanisms[n].mb_lead_layer_fwd_eager_ops for n in names)
    return mechanism_host(ops, prof)


def first_op_share(host_ops: float) -> float:
    """Share of a pass's issue time after which the device may start the pass: the first
    of the ``host_ops`` ops it issues."""
    return min(1.0, 1.0 / max(1.0, host_ops))


def sync_at_p2p(names: tuple[str, ...]) -> bool:
    return any(HOST.mechanisms[n].sync_at_p2p for n in names)


def load_syncs(names: tuple[str, ...]) -> bool:
    """Whether the pipeline engine's batch load waits for the device on the first and last
    stages (``HostMechanism.sync_load_edge_stages``)."""
    return any(HOST.mechanisms[n].sync_load_edge_stages for n in names)


def pass_syncs(names: tuple[str, ...]) -> tuple[bool, bool]:
    """(``sync_before_fwd``, ``sync_after_loss``) of the mechanisms ``names``."""
    mechs = [HOST.mechanisms[n] for n in names]
    return any(m.sync_before_fwd for m in mechs), any(m.sync_after_loss for m in mechs)


def host_waits(syncs: tuple[bool, bool], prev_was_loss: bool, next_fwd: bool) -> bool:
    """Whether the host waits for the device to finish the previous pass before issuing the
    next (``pass_syncs``): before every forward, or after a forward that ended in the loss."""
    before_fwd, after_loss = syncs
    return (before_fwd and next_fwd) or (after_loss and prev_was_loss)


def launch_blocking(names: tuple[str, ...]) -> bool:
    return any(HOST.mechanisms[n].launch_blocking for n in names)


def fsdp_lane_ops(names: tuple[str, ...], params: float, layers: int, compute_bytes: int,
                  reduce_bytes: int, ranks: int) -> tuple[list[Op], list[Op]]:
    """Bandwidth-bound passes the mechanisms run over ``params`` unsharded gradients on
    FSDP's communication streams, in series with its collectives (FSDP1), one kernel per
    layer (unit) each: (on the all-gather's stream, every backward: the gradient cat, read
    and write in the ``compute_bytes``-byte compute dtype; on the reduce-scatter's stream,
    every reduction: the cast to the ``reduce_bytes``-byte reduce dtype where they differ,
    read one and write the other, and the in-place pre-division when ``ranks`` > 1, read and
    write the reduce dtype)."""
    gather, reduce = [], []
    for name in names:
        m = HOST.mechanisms[name]
        if m.grad_cat_on_unshard_stream:
            gather += _copy_op(f"{name}_grad_cat", params, 2.0 * compute_bytes, layers)
        if m.reduce_stream_cast and compute_bytes != reduce_bytes:
            reduce += _copy_op(f"{name}_reduce_cast", params, compute_bytes + reduce_bytes,
                               layers)
        if m.reduce_stream_predivide and ranks > 1:
            reduce += _copy_op(f"{name}_reduce_predivide", params, 2.0 * reduce_bytes, layers)
    return gather, reduce


def optimizer_host(names: tuple[str, ...], tensors: int, units: int,
                   prof: Profile, local_tensors: int | None = None) -> tuple[HostCost, bool]:
    """(host work of one rank's optimizer step with its gradient clipping, whether the host
    waits for the device per tensor) under the mechanisms ``names``: their fixed eager ops
    plus their per-tensor eager ops times the tensors the optimizer steps, ``tensors``
    parameter tensors (local shards), or ``units`` flat parameters where a mechanism says
    the optimizer steps one per FSDP unit (``optimizer_flat_units``), or ``local_tensors``
    where it steps only those overlapping this rank's slice of the gradient buffer
    (``optimizer_local_shards``; default ``tensors``), plus the per-model-tensor work
    (``optimizer_model_tensor_eager_ops``) over ``tensors``."""
    mechs = [HOST.mechanisms[n] for n in names]
    flat = units if any(m.optimizer_flat_units for m in mechs) else tensors
    local = tensors if local_tensors is None else local_tensors
    ops = sum(m.optimizer_fixed_eager_ops + m.optimizer_model_tensor_eager_ops * tensors
              + m.optimizer_tensor_eager_ops * (local if m.optimizer_local_shards else flat)
              for m in mechs)
    sync = any(m.optimizer_sync_per_tensor for m in mechs)
    return mechanism_host(ops, prof), sync and ops > 0
