"""The op graph's building blocks: ``Op`` (one kernel or collective on one rank), the
execution context ``LayerShape``, the per-kind op constructors and the dense FFN
(``mlp_ops``). ``simulator.workload.ops`` composes them into layers; the MoE block
(``simulator.workload.moe_ops``) builds on them too. Conventions: see ``ops``."""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from ..frameworks.defaults import EAGER
from ..network.collectives import Collective
from .spec import MLP, Norm, TransformerSpec


class OpKind(str, Enum):
    GEMM = "gemm"
    ATTENTION = "attention"       # fused (flash) attention core
    MEMORY = "memory"             # bandwidth-bound elementwise / norm / softmax
    COMM = "comm"                 # collective inside the layer (TP / CP / EP)


@dataclass(frozen=True)
class Op:
    """One kernel (or collective) on one rank. Sizes are per rank, bytes are SI bytes.

    For GEMMs ``m, n, k`` is the shape and ``batch`` the number of groups; for fused
    attention ``m, n, k`` are the query length, key length and head dimension of one call
    and ``batch`` is micro-batch x heads. ``bwd_bytes`` (memory ops and collectives) is the
    backward size where it is not the default.
    """

    name: str
    kind: OpKind
    flops: float = 0.0
    model_flops: float = 0.0
    recompute_flops: float = 0.0             # model-convention FLOPs of a recomputed forward op
    bytes_moved: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    dtype: str = "bf16"
    saved_bytes: float = 0.0                 # activations kept for backward
    recomputed: bool = False                 # part of selective recompute
    collective: Collective | None = None
    group: str = ""                          # "tp", "cp", "ep"
    comm_bytes: float = 0.0                  # full collective buffer size
    overlaps_with: str = ""                  # name of a GEMM this comm can hide behind
    kernels: int = 1
    bwd_bytes: float = -1.0                  # backward bytes if not the default 2x forward
    kernel: str = ""                         # attention kernel family ("flash", "flash1", "flash3")
    mem_kind: str = ""                       # bandwidth-bound family: norm, softmax, elementwise, copy
    causal: bool = False                     # attention: causal mask (m, n, k = s_q, s_k, head_dim)
    # attention standing for two shapes of the same FLOPs (a causal ring step: 2c queries
    # x c keys on some ranks, c x 2c on the others): rows the slower one's grid is cut
    # along in both directions (cost.kernels.attention_grid_fill); 0: m forward, n backward
    grid_rows: int = 0
    grouped: bool = False                    # GEMM: a grouped kernel (per-group weights, MoE)
    has_weights: bool = True                 # GEMM: one operand is a weight (False: attention's QK, AV)
    routing: FlexRouting | None = None       # COMM: a flex (DeepEP) dispatch / combine
    # device kernel launches of a memory op where they differ from the ops the host
    # counts (``kernels``): an eager norm is one op-graph op but eight kernels; backward's
    bwd_launches: int = 0
    launches: int = 0
    # tensors alive while the op runs backward where they differ from ``bytes_moved`` (an
    # eager op's traffic is several kernels', not its live tensors): -1 = bytes_moved
    live_bytes: float = -1.0
    # GEMM: the (m, n, k) of each kernel where the model code runs one GEMM of the op graph
    # as several sharing the input (transformers' q, k, v and gate, up projections; their
    # backward: a data-gradient GEMM per part, summed, and a weight-gradient GEMM per part);
    # () = one kernel of (m, n, k)
    split: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class FlexRouting:
    """What pricing needs to cost a DeepEP-style (flex) dispatch or combine on a placed EP
    group: each of ``tokens`` tokens (this rank's, already scaled to the busiest rank's
    share) goes once to each distinct destination rank (NVLink) and once to each distinct
    destination node, its own included (RDMA), ``token_bytes`` each (the hidden state; the
    fp32 top-k probabilities and indices, ~12 B per expert, are left out)
    (``workload.moe_load.flex_destinations``)."""

    tokens: float
    token_bytes: float
    top_k: int
    experts: int
    groups: int = 0
    group_topk: int = 0


@dataclass(frozen=True)
class LayerShape:
    """Everything about the execution context that changes a layer's ops."""

    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    dtype: str = "bf16"                      # GEMM dtype
    flash: bool = True
    attention_kernel: str = "flash"          # "flash" (FA2), "flash1" (FA1), "flash3" (FA3 / cuDNN)
    causal: bool = True
    dropout: bool = True
    cp_comm: str = "p2p"                     # context parallelism: "p2p" ring or "all_gather"
    # memory accounting only (no effect on time): the cross-entropy implementation
    # (``frameworks.LOSS_BYTES``) and whether SwiGLU is one function saving its input
    loss: str = "megatron"
    fused_swiglu: bool = True
    # the model code's RMSNorm, RoPE and SwiGLU as eager PyTorch ops (time and memory:
    # ``frameworks.EAGER``); else one fused kernel each
    eager_elementwise: bool = False
    eager_code: str = ""                     # whose model code ("" transformers'; EAGER keys)
    sac_op: bool = False                     # selective recompute is torchtitan's op SAC
    # the model code runs q, k and v / a SwiGLU's gate and up as separate GEMMs (Op.split;
    # frameworks.json memory param_layout, cost.host.ParamLayout)
    split_qkv: bool = False
    split_gate_up: bool = False
    moe_weighted_activation: bool = False    # MoE probabilities applied in the activation
    moe_dispatcher: str = "alltoall"         # "flex": DeepEP dispatch/combine (Plan)

    @property
    def act_bytes(self) -> int:
        return 4 if self.dtype == "fp32" else 2   # activations stay 16-bit under fp8


def _gemm(name: str, m: int, n: int, k: int, sh: LayerShape, saved: float = 0.0,
          batch: int = 1, recomputed: bool = False, saved_out: float = 0.0) -> Op:
    """``saved``: the input kept for backward (16-bit bytes); ``saved_out``: output bytes
    kept for a later op (stays 16-bit)."""
    f = 2.0 * batch * m * n * k
    el = 1 if sh.dtype == "fp8" else sh.act_bytes
    moved = batch * el * (m * k + k * n + m * n)
    if sh.dtype == "fp8":
        saved *= 0.5          # Transformer Engine keeps the FP8 copy of a GEMM input for backward
    return Op(name, OpKind.GEMM, flops=f, model_flops=f, bytes_moved=moved, m=m, n=n, k=k,
              batch=batch, dtype=sh.dtype, saved_bytes=saved + saved_out, recomputed=recomputed)


def with_fp8_casts(ops: list[Op]) -> list[Op]:
    """Insert the FP8 quantisation passes an FP8 GEMM needs (Transformer Engine style).

    Forward: the 16-bit input is read once and written as FP8 plus an FP8 transpose (kept
    for the weight-gradient GEMM): ``m*k*(2 + 1 + 1)`` bytes. Backward: the output gradient
    gets the same cast-transpose, ``m*n*4`` bytes. Weights are cast once per step
    (negligible) and are not charged.
    """
    out: list[Op] = []
    for op in ops:
        if op.kind == OpKind.GEMM and op.dtype == "fp8":
            rows = op.batch * op.m * max(1, len(op.split))   # a split GEMM's parts each cast
            out.append(Op(op.name + "_fp8cast", OpKind.MEMORY, bytes_moved=4.0 * rows * op.k,
                          dtype="bf16", bwd_bytes=4.0 * rows * op.n, recomputed=op.recomputed,
                          mem_kind="elementwise"))
        out.append(op)
    return out


def _mem(name: str, elems_read: float, elems_written: float, sh: LayerShape,
         saved: float = 0.0, recomputed: bool = False, kernels: int = 1,
         elem_bytes: float | None = None, kind: str = "elementwise",
         bwd_same: bool = False) -> Op:
    """A bandwidth-bound op; its backward moves twice its bytes unless ``bwd_same`` (a
    data movement whose gradient is the opposite movement: reorders, gathers, rotations)."""
    eb = sh.act_bytes if elem_bytes is None else elem_bytes
    moved = (elems_read + elems_written) * eb
    return Op(name, OpKind.MEMORY, bytes_moved=moved, dtype=sh.dtype, saved_bytes=saved,
              recomputed=recomputed, kernels=kernels, mem_kind=kind,
              bwd_bytes=moved if bwd_same else -1.0)


def eager_op(name: str, key: str, elems: float, sh: LayerShape, kind: str,
             live: float, saved: float | None = None) -> Op:
    """An elementwise op as eager model code runs it (``frameworks.EAGER[key]``, measured per
    element with 16-bit activations): its bytes and kernel launches forward and backward,
    and what autograd keeps (``saved`` overrides). ``live``: the tensors its backward holds
    at once, taken as its fused twin's (the eager temporaries are not counted). A framework
    with its own model code (``LayerShape.eager_code``) uses its ``<code>:<key>`` row where
    one is measured."""
    t = EAGER.get(f"{sh.eager_code}:{key}", EAGER[key])
    return Op(name, OpKind.MEMORY, bytes_moved=t.fwd_bytes * elems, dtype=sh.dtype,
              saved_bytes=t.saved_bytes * elems if saved is None else saved,
              bwd_bytes=t.bwd_bytes * elems, mem_kind=kind, launches=t.fwd_kernels,
              bwd_launches=t.bwd_kernels, live_bytes=live)


def eager(sh: LayerShape) -> bool:
    """Whether ``sh`` prices eager model code: the measured 16-bit traffic (an fp32 model's
    casts are no-ops, unmeasured: fused pricing stays)."""
    return sh.eager_elementwise and sh.act_bytes == 2


def hidden_dropout_ops(name: str, m: TransformerSpec, sh: LayerShape,
                       elems: float) -> list[Op]:
    """transformers' own dropout on a sublayer's output before its residual add
    (``TransformerSpec.hidden_dropout`` > 0, the model's code run eagerly): one
    native_dropout kernel each way, reading the activation and writing it and a 1-byte mask,
    the backward reading the gradient and the mask (``frameworks.EAGER["dropout"]``, counted
    at 16 bits, is this at 2 B: 5 B per element), in any activation dtype. Not in
    torchtitan's code (``LayerShape.eager_code``), fused into its neighbours under
    torch.compile (no eager_elementwise there); Megatron's fused bias-dropout-add is the
    framework's (``LayerShape.dropout``), not this."""
    if m.hidden_dropout <= 0.0 or not sh.eager_elementwise or sh.eager_code:
        return []
    moved = (2.0 * sh.act_bytes + 1.0) * elems
    return [Op(name, OpKind.MEMORY, bytes_moved=moved, dtype=sh.dtype, saved_bytes=elems,
               bwd_bytes=moved, mem_kind="elementwise", launches=1, bwd_launches=1,
               live_bytes=2.0 * elems * sh.act_bytes)]


def norm_op(name: str, m: TransformerSpec, sh: LayerShape, elems: float) -> Op:
    """A norm over ``elems`` activations (one fused kernel, or eager RMSNorm code)."""
    fused = _mem(name, elems, elems, sh, saved=elems * sh.act_bytes, kind="norm")
    if eager(sh) and m.norm == Norm.RMSNORM:
        return eager_op(name, "rmsnorm", elems, sh, "norm", live=fused.bytes_moved)
    return fused


def _comm(name: str, coll: Collective, group: str, size: float, overlaps: str = "") -> Op:
    return Op(name, OpKind.COMM, collective=coll, group=group, comm_bytes=size,
              overlaps_with=overlaps)


def _tokens(m: TransformerSpec, sh: LayerShape) -> tuple[int, int]:
    """(tokens this rank computes on, tokens per rank in SP-sharded regions)."""
    t = sh.micro_batch * m.seq_len // sh.cp
    return t, (t // sh.tp if sh.sequence_parallel else t)


def _enter_tp(name: str, m: TransformerSpec, sh: LayerShape, next_gemm: str) -> list[Op]:
    """Comm entering a column-parallel region (forward): SP all-gather, else nothing."""
    if sh.tp == 1 or not sh.sequence_parallel:
        return []
    tokens, _ = _tokens(m, sh)
    return [_comm(name, Collective.ALL_GATHER, "tp", tokens * m.hidden * sh.act_bytes, next_gemm)]


def _leave_tp(name: str, m: TransformerSpec, sh: LayerShape, prev_gemm: str) -> list[Op]:
    """Comm leaving a row-parallel region: all-reduce, or reduce-scatter with SP."""
    if sh.tp == 1:
        return []
    tokens, _ = _tokens(m, sh)
    coll = Collective.REDUCE_SCATTER if sh.sequence_parallel else Collective.ALL_REDUCE
    return [_comm(name, coll, "tp", tokens * m.hidden * sh.act_bytes, prev_gemm)]


def mlp_ops(m: TransformerSpec, sh: LayerShape, ffn: int | None = None,
            name: str = "mlp", tokens: int | None = None, groups: int = 1) -> list[Op]:
    """Dense FFN (GELU / SwiGLU / ReLU^2), column- then row-parallel over TP.

    ``groups`` > 1 runs it as a grouped GEMM (MoE experts): ``tokens`` split evenly over
    ``groups`` independent weight matrices.
    """
    T, Ts = _tokens(m, sh)
    saved_in = Ts if tokens is None else tokens          # SP: input saved sharded
    T = T if tokens is None else tokens
    h, ab = m.hidden, sh.act_bytes
    f = (ffn or m.ffn_hidden) // sh.tp
    up_n = 2 * f if m.mlp == MLP.SWIGLU else f
    rows = -(-T // groups)
    fc1 = _gemm(f"{name}_fc1", rows, up_n, h, sh, saved=saved_in * h * ab, batch=groups)
    # gate, up apart (not routed experts: transformers 5 fuses them into gate_up_proj)
    if sh.split_gate_up and m.mlp == MLP.SWIGLU and groups == 1 and name != "experts":
        fc1 = replace(fc1, split=((rows, f, h), (rows, f, h)))
    ops = [fc1]
    act_in, act_out = T * up_n, T * f
    # a fused SwiGLU (Megatron's SwiGLUFunction, TE) saves its input only; eager
    # silu(a) * b also keeps silu(a) for the product's backward
    eager_glu = m.mlp == MLP.SWIGLU and not sh.fused_swiglu
    act_saved = (act_in + (act_out if eager_glu else 0)) * ab
    act = _mem(f"{name}_act", act_in, act_out, sh, saved=act_saved)
    if eager_glu and eager(sh):
        act = eager_op(act.name, "swiglu", act_out, sh, "elementwise", live=act.bytes_moved,
                       saved=act_saved)
    elif m.mlp == MLP.GELU and m.act_fn and eager(sh) and not sh.eager_code:
        # GPT-2's / BLOOM's GELU written out (transformers' NewGELUActivation, BloomGelu):
        # per element of its input
        act = eager_op(act.name, m.act_fn, act_in, sh, "elementwise", live=act.bytes_moved)
    ops.append(act)
    ops.append(_gemm(f"{name}_fc2", rows, h, f, sh, saved=act_out * ab, batch=groups))
    if groups > 1:
        ops = [replace(o, grouped=True) if o.kind == OpKind.GEMM else o for o in ops]
    return ops
