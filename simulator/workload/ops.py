"""Operator graph of a transformer layer as one rank executes it.

``layer_ops`` returns the forward ops of one decoder layer for one micro-batch on one
rank, already sharded by tensor (TP), sequence (SP) and context (CP) parallelism; each op
knows its executed FLOPs, bytes moved, GEMM shape, the activation bytes autograd keeps
for backward, and the collective it needs. ``backward_ops`` derives the backward pass.

FLOP conventions: ``flops`` is what the kernel executes (causal flash attention skips the
masked half); ``model_flops`` is what MFU counts (PaLM/Megatron convention: full,
non-causal attention, no recompute).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from ..frameworks import CONVENTIONS, LOSS_BYTES
from ..network.collectives import Collective
from .spec import MLP, TransformerSpec


class OpKind(str, Enum):
    GEMM = "gemm"
    ATTENTION = "attention"       # fused (flash) attention core
    MEMORY = "memory"             # bandwidth-bound elementwise / norm / softmax
    COMM = "comm"                 # collective inside the layer (TP / CP / EP)


@dataclass(frozen=True)
class Op:
    """One kernel (or collective) on one rank. Sizes are per rank, bytes are SI bytes."""

    name: str
    kind: OpKind
    flops: float = 0.0
    model_flops: float = 0.0
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
    kernel: str = ""                         # attention kernel family ("flash", "flash3")
    mem_kind: str = ""                       # bandwidth-bound family: norm, softmax, elementwise, copy


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
    attention_kernel: str = "flash"          # "flash" (FA2-class) or "flash3" (FA3 / cuDNN)
    causal: bool = True
    dropout: bool = True
    # memory accounting only (no effect on time): the cross-entropy implementation
    # (``frameworks.LOSS_BYTES``) and whether SwiGLU is one function saving its input
    loss: str = "megatron"
    fused_swiglu: bool = True

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
            rows = op.batch * op.m
            out.append(Op(op.name + "_fp8cast", OpKind.MEMORY, bytes_moved=4.0 * rows * op.k,
                          dtype="bf16", bwd_bytes=4.0 * rows * op.n, recomputed=op.recomputed,
                          mem_kind="elementwise"))
        out.append(op)
    return out


def _mem(name: str, elems_read: float, elems_written: float, sh: LayerShape,
         saved: float = 0.0, recomputed: bool = False, kernels: int = 1,
         elem_bytes: float | None = None, kind: str = "elementwise") -> Op:
    eb = sh.act_bytes if elem_bytes is None else elem_bytes
    return Op(name, OpKind.MEMORY, bytes_moved=(elems_read + elems_written) * eb,
              dtype=sh.dtype, saved_bytes=saved, recomputed=recomputed, kernels=kernels,
              mem_kind=kind)


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


def attention_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """LayerNorm, QKV, attention core, output projection, residual (one layer, forward)."""
    T, Ts = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    q_local, kv_local = m.q_dim // sh.tp, max(m.kv_dim // sh.tp, m.head_dim)
    ops = [_mem("ln1", Ts * h, Ts * h, sh, saved=Ts * h * ab, kind="norm")]
    ops += _enter_tp("ln1_allgather", m, sh, "qkv")
    # with SP the GEMM input is saved sharded and re-gathered in backward (Korthikanti 2022)
    qkv_out = T * (q_local + 2 * kv_local) * ab      # Q, K, V: kept for the attention core
    ops.append(_gemm("qkv", T, q_local + 2 * kv_local, h, sh, saved=Ts * h * ab,
                     saved_out=qkv_out))
    ops += core_attention_ops(m, sh)
    ops.append(_gemm("attn_out", T, h, q_local, sh, saved=T * q_local * ab))
    ops += _leave_tp("attn_out_reduce", m, sh, "attn_out")
    mask = Ts * h if sh.dropout else 0
    ops.append(_mem("attn_residual", 2 * Ts * h, Ts * h, sh, saved=mask, elem_bytes=ab))
    return ops


def core_attention_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """softmax(QK^T)V per rank; s_q = local queries, s_k = keys attended (CP gathers KV)."""
    heads = m.n_heads // sh.tp
    b, d, ab = sh.micro_batch, m.head_dim, sh.act_bytes
    s_q, s_k = m.seq_len // sh.cp, m.seq_len
    full = 4.0 * b * heads * s_q * s_k * d          # QK^T + AV, non-causal
    kv_local = max(m.kv_dim // sh.tp, d)
    ops: list[Op] = []
    if sh.cp > 1:
        kv_bytes = 2 * b * m.seq_len * kv_local * ab
        ops.append(_comm("cp_kv_allgather", Collective.ALL_GATHER, "cp", kv_bytes, "core_attn"))
    qkv_saved = b * s_q * (heads * d + 2 * kv_local) * ab
    if sh.flash:
        # selective recompute (Megatron --recompute-granularity selective) re-runs the core
        # attention forward in backward even with a fused kernel
        executed = full * (0.5 + 0.5 / max(1, s_k // 128)) if sh.causal else full
        out_bytes, lse_bytes = b * s_q * heads * d * ab, b * heads * s_q * 4
        # The kernel keeps its output and logsumexp; the output is the same tensor the
        # output projection saves as its input (charged there), unless that GEMM keeps an
        # FP8 copy instead (Transformer Engine), when both exist.
        saved = lse_bytes + (out_bytes if sh.dtype == "fp8" else 0.0)
        ops.append(Op("core_attn", OpKind.ATTENTION, flops=executed, model_flops=full,
                      bytes_moved=qkv_saved + out_bytes + lse_bytes, dtype=sh.dtype,
                      saved_bytes=saved, kernel=sh.attention_kernel, recomputed=True))
        return ops
    batch, scores = b * heads, b * heads * s_q * s_k
    dt = "fp16" if sh.dtype in ("fp8", "bf16", "fp16") else sh.dtype
    sh16 = replace(sh, dtype=dt)
    # Q, K, V (the inputs of the recomputable core) are charged to the qkv GEMM's output
    ops.append(_gemm("qk", s_q, s_k, d, sh16, batch=batch, recomputed=True))
    # softmax keeps its output; with dropout, the dropout keeps its 1-byte mask and AV
    # keeps the dropped-out probabilities (without dropout AV reuses the softmax output)
    ops.append(_mem("softmax", scores, scores, sh, saved=scores * ab, recomputed=True,
                    kind="softmax"))
    if sh.dropout:
        ops.append(_mem("attn_dropout", scores, scores * 1.5, sh, saved=scores * 1.0,
                        recomputed=True))
    av = _gemm("av", s_q, d, s_k, sh16, batch=batch, recomputed=True)
    ops.append(replace(av, saved_bytes=scores * ab) if sh.dropout else av)
    return ops


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
    ops = [_gemm(f"{name}_fc1", rows, up_n, h, sh, saved=saved_in * h * ab, batch=groups)]
    act_in, act_out = T * up_n, T * f
    # a fused SwiGLU (Megatron's SwiGLUFunction, TE) saves its input only; eager
    # silu(a) * b also keeps silu(a) for the product's backward
    eager_glu = m.mlp == MLP.SWIGLU and not sh.fused_swiglu
    ops.append(_mem(f"{name}_act", act_in, act_out, sh,
                    saved=(act_in + (act_out if eager_glu else 0)) * ab))
    ops.append(_gemm(f"{name}_fc2", rows, h, f, sh, saved=act_out * ab, batch=groups))
    return ops


def layer_ops(m: TransformerSpec, sh: LayerShape, layer: int = 0) -> list[Op]:
    """All forward ops of decoder layer ``layer`` for one micro-batch on one rank."""
    T, Ts = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    ops = attention_ops(m, sh)
    ops.append(_mem("ln2", Ts * h, Ts * h, sh, saved=Ts * h * ab, kind="norm"))
    if m.is_moe_layer(layer):
        ops += moe_ops(m, sh)                    # the token dispatcher does its own TP comm
    else:
        ops += _enter_tp("ln2_allgather", m, sh, "mlp_fc1")
        ops += mlp_ops(m, sh)
        ops += _leave_tp("mlp_reduce", m, sh, "mlp_fc2")
    mask = Ts * h if sh.dropout else 0
    ops.append(_mem("mlp_residual", 2 * Ts * h, Ts * h, sh, saved=mask))
    return with_fp8_casts(ops) if sh.dtype == "fp8" else ops


def moe_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Router, all-to-all dispatch, local experts (expected even load), combine.

    Megatron-style token dispatch: each rank routes its own tokens (the SP shard, i.e.
    1/tp of them, when TP > 1); the all-to-all runs over the EP group; with TP the received
    tokens are all-gathered across TP so each TP rank applies its 1/tp slice of every local
    expert, then reduce-scattered back before the combining all-to-all.
    """
    moe = m.moe
    assert moe is not None
    T, _ = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    t_loc = T // sh.tp if sh.tp > 1 else T       # tokens this rank routes
    routed = t_loc * moe.top_k                   # token-expert pairs this rank sends
    ops = [_gemm("router", t_loc, moe.experts, h, sh, saved=t_loc * h * ab),
           _mem("moe_router_topk", t_loc * moe.experts, t_loc * moe.experts, sh,
                elem_bytes=4, kind="softmax"),    # fp32 softmax + top-k over router logits
           _mem("moe_permute", t_loc * h, routed * h, sh, kind="copy")]
    if sh.ep > 1:
        ops.append(_comm("ep_dispatch", Collective.ALL_TO_ALL, "ep", routed * h * ab))
    group_rows = routed * sh.tp                  # balanced: received == sent, gathered over TP
    if sh.tp > 1:
        ops.append(_comm("ep_tp_allgather", Collective.ALL_GATHER, "tp", group_rows * h * ab,
                         "experts_fc1"))
    ops += mlp_ops(m, sh, ffn=moe.expert_ffn_hidden, name="experts", tokens=group_rows,
                   groups=moe.experts // sh.ep)
    if moe.shared_experts:
        ops += mlp_ops(m, sh, ffn=moe.expert_ffn_hidden * moe.shared_experts, name="shared",
                       tokens=t_loc * sh.tp)
    if sh.tp > 1:
        ops.append(_comm("ep_tp_reducescatter", Collective.REDUCE_SCATTER, "tp",
                         group_rows * h * ab, "experts_fc2"))
    if sh.ep > 1:
        ops.append(_comm("ep_combine", Collective.ALL_TO_ALL, "ep", routed * h * ab))
    # the combine weights each expert output by its routing probability, so it keeps the
    # expert outputs (and the probabilities) for the gradient of the probabilities
    ops.append(_mem("moe_combine", routed * h, t_loc * h, sh,
                    saved=routed * h * ab + routed * 4))
    return ops


def embedding_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Token embedding lookup (vocab-parallel over TP: partial sums all-reduced)."""
    T, Ts = _tokens(m, sh)
    ops = [_mem("embedding", T * m.hidden, T * m.hidden, sh, kind="copy")]
    ops += _leave_tp("embedding_reduce", m, sh, "")
    return ops


def head_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Final norm, vocab-parallel logits GEMM and fp32 cross-entropy."""
    T, Ts = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    v = -(-m.vocab // sh.tp)
    ops = [_mem("final_ln", Ts * h, Ts * h, sh, saved=Ts * h * ab, kind="norm")]
    ops += _enter_tp("final_ln_allgather", m, sh, "logits")
    # The output layer stays 16-bit in FP8 training: FP8 frameworks quantise only the
    # decoder layers' linears (Megatron-Core's output_layer is a plain
    # tensor_parallel.ColumnParallelLinear outside Transformer Engine's fp8_autocast;
    # llm-foundry's tied LM head is F.linear on the embedding; TE's guidance keeps the
    # first and last layers in higher precision).
    head_sh = replace(sh, dtype="bf16") if sh.dtype == "fp8" else sh
    ops.append(_gemm("logits", T, v, h, head_sh, saved=Ts * h * ab))
    # Time: vocab-parallel cross-entropy as Megatron writes it, unfused, in fp32 (bytes per
    # logit counted from its passes: CONVENTIONS.cross_entropy, frameworks.json). Memory:
    # what the run's loss implementation keeps (frameworks.LOSS_BYTES).
    elems, ce = T * v, CONVENTIONS.cross_entropy
    saved = LOSS_BYTES[sh.loss].saved(logit_bytes(sh)) * elems
    ops.append(Op("cross_entropy", OpKind.MEMORY, bytes_moved=ce.fwd_bytes_per_logit * elems,
                  dtype=sh.dtype, saved_bytes=saved,
                  kernels=ce.kernels, bwd_bytes=ce.bwd_bytes_per_logit * elems,
                  mem_kind="softmax"))
    return ops


def logit_bytes(sh: LayerShape) -> int:
    """Bytes per logit of the output layer's result (16-bit, also under FP8; fp32 models 4)."""
    return sh.act_bytes


def loss_transient_bytes(m: TransformerSpec, sh: LayerShape) -> float:
    """Bytes the loss holds beyond what it saves, at its own peak (one micro-batch)."""
    T, _ = _tokens(m, sh)
    return LOSS_BYTES[sh.loss].transient(logit_bytes(sh)) * T * -(-m.vocab // sh.tp)


def backward_ops(fwd: list[Op]) -> list[Op]:
    """Backward of a forward op list, in reverse order.

    GEMM: data-gradient (m x k from m x n) and weight-gradient (k x n from k x m) GEMMs;
    flash attention: 2.5x the forward FLOPs (recomputes the scores); bandwidth-bound ops:
    twice the bytes; a collective maps to its conjugate (AR<->identity pairs are counted
    as AR in backward at the column-parallel input; AG<->RS).
    """
    out: list[Op] = []
    for op in reversed(fwd):
        if op.kind == OpKind.GEMM:
            dgrad = replace(op, name=op.name + "_dgrad", m=op.m, n=op.k, k=op.n, saved_bytes=0)
            wgrad = replace(op, name=op.name + "_wgrad", m=op.k, n=op.n, k=op.m, saved_bytes=0)
            out += [dgrad, wgrad]
        elif op.kind == OpKind.ATTENTION:
            out.append(replace(op, name=op.name + "_bwd", flops=2.5 * op.flops,
                               model_flops=2.0 * op.model_flops, bytes_moved=2 * op.bytes_moved,
                               saved_bytes=0))
        elif op.kind == OpKind.MEMORY:
            moved = 2 * op.bytes_moved if op.bwd_bytes < 0 else op.bwd_bytes
            out.append(replace(op, name=op.name + "_bwd", bytes_moved=moved, saved_bytes=0))
        else:
            out.append(_conjugate(op))
    return [o for o in out if o is not None]


_CONJ = {Collective.ALL_GATHER: Collective.REDUCE_SCATTER,
         Collective.REDUCE_SCATTER: Collective.ALL_GATHER,
         Collective.ALL_REDUCE: Collective.ALL_REDUCE,
         Collective.ALL_TO_ALL: Collective.ALL_TO_ALL}


def _conjugate(op: Op) -> Op:
    return replace(op, name=op.name + "_bwd", collective=_CONJ[op.collective], saved_bytes=0)
