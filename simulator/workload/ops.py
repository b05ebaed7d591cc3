"""Operator graph of a transformer layer as one rank executes it.

``layer_ops`` returns the forward ops of one decoder layer for one micro-batch on one
rank, already sharded by tensor (TP), sequence (SP) and context (CP) parallelism; each op
knows its executed FLOPs, bytes moved, GEMM shape, the activation bytes autograd keeps
for backward, and the collective it needs. ``backward_ops`` derives the backward pass.

FLOP conventions: ``flops`` is what the kernel executes (causal flash attention skips the
masked half; it prices the kernel); ``model_flops`` is what MFU counts (PaLM/Megatron
convention: full, non-causal attention, no recompute); ``recompute_flops`` is set only on
a forward op re-run in backward (activation recompute): its FLOPs in the same convention
as ``model_flops``, which hardware FLOPs (HFU) add to the model FLOPs.
"""
from __future__ import annotations

from dataclasses import replace

from ..frameworks import CONVENTIONS, LOSS_BYTES
from ..network.collectives import Collective
from .moe_ops import moe_ops
from .op_types import (  # noqa: F401  (Op, OpKind, LayerShape, ... are this module's API)
    LayerShape,
    Op,
    OpKind,
    _comm,
    _enter_tp,
    _gemm,
    _leave_tp,
    _mem,
    _tokens,
    eager,
    eager_op,
    hidden_dropout_ops,
    mlp_ops,
    norm_op,
    with_fp8_casts,
)
from .spec import Position, TransformerSpec


def attention_ops(m: TransformerSpec, sh: LayerShape, layer: int = 0) -> list[Op]:
    """LayerNorm, Q/K/V projections, attention core, output projection, residual (one
    layer, forward). ``layer`` decides local (sliding-window) vs global attention."""
    T, Ts = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    ops = [norm_op("ln1", m, sh, Ts * h)]
    ops += _enter_tp("ln1_allgather", m, sh, "qkv")
    if m.mla is not None:
        ops += mla_projection_ops(m, sh)
    else:
        q_local, kv_local = m.q_dim // sh.tp, max(m.kv_dim // sh.tp, m.head_dim)
        # with SP the GEMM input is saved sharded and re-gathered in backward (Korthikanti 2022)
        qkv_out = T * (q_local + 2 * kv_local) * ab      # Q, K, V: kept for the attention core
        qkv = _gemm("qkv", T, q_local + 2 * kv_local, h, sh, saved=Ts * h * ab,
                    saved_out=qkv_out)
        if sh.split_qkv:                                  # q, k, v as three GEMMs
            qkv = replace(qkv, split=tuple((T, n, h) for n in (q_local, kv_local, kv_local)))
        ops.append(qkv)
        if m.qk_norm:
            # RMSNorm on the queries and keys before the rotation (Qwen3, Gemma 3: per head;
            # OLMo 2: over the projection); MLA's latent norms are in mla_projection_ops
            ops.append(norm_op("qk_norm", m, sh, T * (q_local + kv_local)))
        if m.position == Position.ROPE:
            ops.append(_rope(T * (q_local + kv_local), sh))
    ops += core_attention_ops(m, sh, m.window_of(layer))
    out_in = m.q_dim // sh.tp
    ops.append(_gemm("attn_out", T, h, out_in, sh, saved=T * out_in * ab))
    ops += _leave_tp("attn_out_reduce", m, sh, "attn_out")
    if m.sandwich_norms:                     # Gemma's post_attention_layernorm
        ops.append(norm_op("post_attn_norm", m, sh, Ts * h))
    ops += hidden_dropout_ops("attn_out_dropout", m, sh, Ts * h)
    mask = Ts * h if sh.dropout else 0
    ops.append(_mem("attn_residual", 2 * Ts * h, Ts * h, sh, saved=mask, elem_bytes=ab))
    return ops


def mla_projection_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """DeepSeek MLA projections on one rank, Megatron-Core's layout: the down-projections
    (``q_a``, ``kv_a``) are replicated over TP, the up-projections (``q_b``, ``kv_b``) are
    column-parallel over heads. Shapes as in HF ``DeepseekV3Attention``."""
    a = m.mla
    T, Ts = _tokens(m, sh)
    h, ab, heads = m.hidden, sh.act_bytes, m.n_heads // sh.tp
    qk, kv_a = a.qk_head_dim, a.kv_lora_rank + a.qk_rope_head_dim
    ops: list[Op] = []
    if a.q_lora_rank:
        r = a.q_lora_rank
        ops += [_gemm("q_down", T, r, h, sh, saved=Ts * h * ab),
                _mem("q_norm", T * r, T * r, sh, saved=T * r * ab, kind="norm"),
                _gemm("q_up", T, heads * qk, r, sh, saved=T * r * ab)]
    else:
        ops.append(_gemm("q_proj", T, heads * qk, h, sh, saved=Ts * h * ab))
    # Q, K (nope + shared rope part broadcast per head) and V are kept for the core
    qkv_out = T * heads * (2 * qk + a.v_head_dim) * ab
    ops += [_gemm("kv_down", T, kv_a, h, sh),             # same input as q_down: saved once
            _mem("kv_norm", T * a.kv_lora_rank, T * a.kv_lora_rank, sh,
                 saved=T * a.kv_lora_rank * ab, kind="norm"),
            _gemm("kv_up", T, heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, sh,
                  saved=T * a.kv_lora_rank * ab, saved_out=qkv_out)]
    # RoPE on the decoupled parts and Q and K assembled per head (nope + rope parts, the
    # shared rope key expanded over heads): Megatron-Core's default fused kernels
    # (fused_apply_mla_rope_for_q / _kv, multi_latent_attention.py @ d98e8a64 l.887-911)
    # write both, ~704 elements per head per token against the 2 x 2 x 192 counted here
    # (the unfused path, l.944-975, moves ~1152)
    return ops + [_rope(T * heads * 2 * qk, sh, "mla_rope_qk_assemble")]


def _rope(elems: float, sh: LayerShape, name: str = "rope") -> Op:
    """Rotary embedding applied to Q and K (``elems`` = their elements): Megatron's fused
    RoPE (``--no-rope-fusion`` off by default, arguments.py l.2902) or TE's kernel reads
    and writes them once; its backward rotates the gradients back, the same bytes. Nothing
    extra is saved (the rotated Q and K are what the attention core keeps). Eager model
    code (``LayerShape.eager_elementwise``): transformers' rotate_half passes."""
    fused = _mem(name, elems, elems, sh, bwd_same=True)
    if eager(sh) and name == "rope":
        return eager_op(name, "rope", elems, sh, "elementwise", live=fused.bytes_moved,
                        saved=0.0)
    return fused


def causal_window_pairs(s: int, window: int) -> int:
    """(query, key) pairs a causal attention over ``s`` positions scores when each query
    sees the last ``window`` positions including itself (``window`` 0 or >= s: all
    earlier ones): ``s(s+1)/2``, or ``W(W+1)/2 + (s-W)W``."""
    if window <= 0 or window >= s:
        return s * (s + 1) // 2
    return window * (window + 1) // 2 + (s - window) * window


def _executed_keys_per_query(s_k: int, window: int, causal: bool, tile: int = 128) -> float:
    """Keys per query a tiled flash kernel computes, in the convention the attention
    efficiency curves are fitted in (``calibrate.reference_attention``): a causal call
    executes half the square, the diagonal's partial tiles are carried by the causal
    efficiency. A sliding window adds a second ragged edge (the window's far end): half a
    ``tile`` per query on top of the exact pair count (assumed, not measured)."""
    if not causal:
        return float(min(s_k, window) if window > 0 else s_k)
    if window <= 0 or window >= s_k:
        return 0.5 * s_k
    return min(causal_window_pairs(s_k, window) / s_k + tile / 2, float(s_k))


def executed_attention_flops(full_flops: float, s_k: int, causal: bool, window: int = 0) -> float:
    """FLOPs a fused attention call executes given its non-causal count ``full_flops`` (every
    query against ``s_k`` keys, or a full ``window``), in the convention the efficiency
    curves are fitted in (``_executed_keys_per_query``). Calibration counts measured kernels
    with this same function."""
    keys = min(s_k, window) if window > 0 else s_k
    return full_flops * _executed_keys_per_query(s_k, window, causal) / keys


def _attn_widths(m: TransformerSpec, sh: LayerShape) -> tuple[int, int, int, int]:
    """(local query heads, q/k head width, v head width, K+V width per token, local)."""
    heads = m.n_heads // sh.tp
    if m.mla is not None:
        qk, v = m.mla.qk_head_dim, m.mla.v_head_dim
        return heads, qk, v, heads * (qk + v)
    d = m.head_dim
    return heads, d, d, 2 * max(m.kv_dim // sh.tp, d)


def core_attention_ops(m: TransformerSpec, sh: LayerShape, window: int = 0) -> list[Op]:
    """softmax(QK^T)V per rank; s_q = local queries, s_k = keys attended (CP gathers KV).

    ``model_flops`` (MFU convention) counts every query against all ``s_k`` keys, or
    against a full ``window`` in a local layer; ``flops`` is what a causal flash kernel
    executes (see ``_executed_keys_per_query``)."""
    heads, d_qk, d_v, kv_w = _attn_widths(m, sh)
    b, ab = sh.micro_batch, sh.act_bytes
    s_q, s_k = m.seq_len // sh.cp, m.seq_len
    per_pair = 2.0 * b * heads * (d_qk + d_v)                # QK^T + AV per (query, key)
    full = per_pair * s_q * (min(s_k, window) if window > 0 else s_k)
    qkv_saved = b * s_q * (heads * d_qk + kv_w) * ab
    if sh.flash:
        out_bytes, lse_bytes = b * s_q * heads * d_v * ab, b * heads * s_q * 4
        out_io = out_bytes + lse_bytes                   # the kernel writes output + logsumexp
        # It keeps both; the output is the same tensor the output projection saves as its
        # input (charged there), unless that GEMM keeps an FP8 copy instead (Transformer
        # Engine), when both exist.
        out_saved = lse_bytes + (out_bytes if sh.dtype == "fp8" else 0.0)
        if sh.cp > 1:
            fn = allgather_attention_ops if sh.cp_comm == "all_gather" else ring_attention_ops
            return fn(m, sh, full, qkv_saved + out_io, out_saved)
        # selective recompute (Megatron --recompute-granularity selective) re-runs the core
        # attention forward in backward even with a fused kernel
        executed = per_pair * s_q * _executed_keys_per_query(s_k, window, sh.causal)
        return [Op("core_attn", OpKind.ATTENTION, flops=executed, model_flops=full,
                   bytes_moved=qkv_saved + out_io, m=s_q, n=s_k, k=d_qk, batch=b * heads,
                   dtype=sh.dtype, saved_bytes=out_saved, kernel=sh.attention_kernel,
                   recomputed=True, causal=sh.causal)]
    ops: list[Op] = []
    if sh.cp > 1:
        kv_bytes = b * m.seq_len * kv_w * ab
        ops.append(_comm("cp_kv_allgather", Collective.ALL_GATHER, "cp", kv_bytes, "core_attn"))
    batch, scores = b * heads, b * heads * s_q * s_k
    dt = "fp16" if sh.dtype in ("fp8", "bf16", "fp16") else sh.dtype
    sh16 = replace(sh, dtype=dt)
    # Q, K, V (the inputs of the recomputable core) are charged to the qkv GEMM's output.
    # Materialized attention forms every score, local layers too (the window is a mask).
    ops.append(replace(_gemm("qk", s_q, s_k, d_qk, sh16, batch=batch, recomputed=True),
                       has_weights=False))
    # softmax keeps its output; with dropout, the dropout keeps its 1-byte mask and AV
    # keeps the dropped-out probabilities (without dropout AV reuses the softmax output)
    ops.append(_mem("softmax", scores, scores, sh, saved=scores * ab, recomputed=True,
                    kind="softmax"))
    if sh.dropout:
        ops.append(_mem("attn_dropout", scores, scores * 1.5, sh, saved=scores * 1.0,
                        recomputed=True))
    av = replace(_gemm("av", s_q, d_v, s_k, sh16, batch=batch, recomputed=True),
                 has_weights=False)
    ops.append(replace(av, saved_bytes=scores * ab) if sh.dropout else av)
    return ops


def _attn_call(name: str, sh: LayerShape, b: int, widths: tuple[int, int, int], s_q: int,
               s_k: int, causal: bool, model_flops: float, bytes_moved: float,
               saved: float) -> Op:
    """One fused attention kernel call; ``widths`` = (heads, q/k head width, v head width);
    causal: half the square executed."""
    heads, d_qk, d_v = widths
    f = 2.0 * b * heads * s_q * s_k * (d_qk + d_v) * (0.5 if causal else 1.0)
    return Op(name, OpKind.ATTENTION, flops=f, model_flops=model_flops, bytes_moved=bytes_moved,
              m=s_q, n=s_k, k=d_qk, batch=b * heads, dtype=sh.dtype, saved_bytes=saved,
              kernel=sh.attention_kernel, recomputed=True, causal=causal)


def ring_forward_transient_bytes(m: TransformerSpec, sh: LayerShape) -> float:
    """What Transformer Engine's P2P ring holds until one layer's attention forward ends:
    every KV block it receives (``p2p_comm_buffers``, one ``torch.empty_like`` per step, none
    released inside the loop) and every step's output (``out_per_step``), i.e. the whole
    sequence's K, V and attention output for this rank's heads, independent of the CP
    degree (TE context_parallel.py, AttnFuncWithCPAndKVP2P.forward). 0 without the ring."""
    if sh.cp <= 1 or sh.cp_comm == "all_gather" or not sh.flash:
        return 0.0
    heads, _, d_v, kv_w = _attn_widths(m, sh)
    return float(sh.micro_batch * m.seq_len * (kv_w + heads * d_v) * sh.act_bytes)


def ring_attention_ops(m: TransformerSpec, sh: LayerShape, full: float, io_bytes: float,
                       out_saved: float) -> list[Op]:
    """Context parallelism as Transformer Engine's P2P ring (``AttnFuncWithCPAndKVP2P``,
    Megatron's default ``--cp-comm-type p2p``), step by step.

    ``cp`` steps; during step i each rank sends its current KV block to the next rank and
    receives the next one (double-buffered), so only the transfer that outlasts step i's
    kernel is exposed (``overlaps_with``). Causal runs are load balanced: the sequence is cut
    into 2*cp chunks and rank r holds chunks r and 2cp-1-r. Step 0 is a causal call over the
    local 2 chunks; every later step is non-causal, either the local 2 chunks of Q against
    the first half of the received KV or the second half of Q against all of it. Both halves
    occur on some rank at every step, and the ring advances at the slower one: 2c queries
    against c keys (c = s/(2cp)). After every step a memory-bound pass rescales and adds the
    step's output into the fp32 accumulator (out and log-sum-exp corrections). Backward runs
    the ring again carrying KV and the accumulated dKV (twice the bytes).
    """
    heads, d_qk, d_v, kv_w = _attn_widths(m, sh)
    w, b, ab = (heads, d_qk, d_v), sh.micro_batch, sh.act_bytes
    s_loc = m.seq_len // sh.cp
    kv_block = float(b * s_loc * kv_w * ab)
    step_model = full / sh.cp
    io = io_bytes / sh.cp
    ops: list[Op] = []
    for i in range(sh.cp):
        if sh.causal and i == 0:
            call = _attn_call("core_attn_cp0", sh, b, w, s_loc, s_loc, True, step_model, io,
                              out_saved)
        elif sh.causal:
            call = replace(_attn_call(f"core_attn_cp{i}", sh, b, w, s_loc, s_loc // 2, False,
                                      step_model, io, 0.0), grid_rows=s_loc // 2)
        else:
            call = _attn_call(f"core_attn_cp{i}", sh, b, w, s_loc, s_loc, False,
                              step_model, io, out_saved if i == 0 else 0.0)
        if i + 1 < sh.cp:
            ops.append(replace(_comm(f"cp_kv_p2p{i}", Collective.SEND_RECV, "cp", kv_block,
                                     call.name), bwd_bytes=2 * kv_block, recomputed=True))
        ops.append(call)
        if i > 0:
            # read the step's 16-bit output, read + write the fp32 accumulator; backward adds
            # the step's dQ and dKV into the running ones (TE dq.add_, dkv.add_: read both,
            # write one, in the activation dtype). Causal steps touch half of one of them:
            # ranks that used half the KV add half of dKV, those that used half the queries
            # half of dQ; the ring waits for the larger of the two
            q_w = heads * d_qk
            q_kv = b * s_loc * ((q_w + kv_w - min(q_w, kv_w) / 2) if sh.causal
                                else (q_w + kv_w))
            ops.append(replace(_mem(f"core_attn_cp{i}_correction",
                                    b * s_loc * heads * d_v * (2 + 4), b * s_loc * heads * d_v * 4,
                                    sh, recomputed=True, elem_bytes=1),
                               bwd_bytes=3.0 * ab * q_kv))
    return ops


def allgather_attention_ops(m: TransformerSpec, sh: LayerShape, full: float, io_bytes: float,
                            out_saved: float) -> list[Op]:
    """Context parallelism by all-gathering K and V first (``--cp-comm-type all_gather``,
    TE ``AttnFuncWithCPAndKVAllGather``; Llama 3's context parallelism): the gather is
    exposed (attention needs its result), then each of the two local query chunks attends
    causally to the key prefix it sees. Averaged over ranks a chunk sees half the sequence
    plus half a chunk. Backward reduce-scatters dK and dV."""
    heads, d_qk, d_v, kv_w = _attn_widths(m, sh)
    b, ab = sh.micro_batch, sh.act_bytes
    s_loc = m.seq_len // sh.cp
    c = s_loc // 2 if sh.causal else s_loc
    kv_bytes = float(b * m.seq_len * kv_w * ab)
    ops = [replace(_comm("cp_kv_allgather", Collective.ALL_GATHER, "cp", kv_bytes),
                   recomputed=True)]
    calls = 2 if sh.causal else 1
    s_k = (m.seq_len + c) // 2 if sh.causal else m.seq_len
    for j in range(calls):
        # a causal chunk against its prefix: c queries x s_k keys minus half a chunk's
        # square; the mask trims only the last chunk, so each query tile walks nearly the
        # whole prefix and the kernel runs at the non-causal efficiency of s_k
        f = 2.0 * b * heads * (d_qk + d_v) * (c * s_k - 0.5 * c * c if sh.causal else c * s_k)
        ops.append(Op(f"core_attn_ag{j}", OpKind.ATTENTION, flops=f, model_flops=full / calls,
                      bytes_moved=io_bytes / calls, m=c, n=s_k, k=d_qk,
                      batch=b * heads, dtype=sh.dtype, saved_bytes=out_saved / calls,
                      kernel=sh.attention_kernel, recomputed=True))
    return ops


def layer_ops(m: TransformerSpec, sh: LayerShape, layer: int = 0) -> list[Op]:
    """All forward ops of decoder layer ``layer`` for one micro-batch on one rank."""
    T, Ts = _tokens(m, sh)
    h = m.hidden
    ops = attention_ops(m, sh, layer)
    ops.append(norm_op("ln2", m, sh, Ts * h))
    if m.is_moe_layer(layer):
        ops += moe_ops(m, sh)                    # the token dispatcher does its own TP comm
    else:
        ops += _enter_tp("ln2_allgather", m, sh, "mlp_fc1")
        ops += mlp_ops(m, sh)
        ops += _leave_tp("mlp_reduce", m, sh, "mlp_fc2")
    if m.sandwich_norms:                     # Gemma's post_feedforward_layernorm
        ops.append(norm_op("post_ffn_norm", m, sh, Ts * h))
    ops += hidden_dropout_ops("mlp_out_dropout", m, sh, Ts * h)
    mask = Ts * h if sh.dropout else 0
    ops.append(_mem("mlp_residual", 2 * Ts * h, Ts * h, sh, saved=mask))
    return with_fp8_casts(ops) if sh.dtype == "fp8" else ops


def embedding_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Token embedding lookup (vocab-parallel over TP: partial sums all-reduced); backward
    also zero-fills the TP-local table's gradient (``embedding_dense_backward`` starts from
    ``at::zeros({num_weights, dim})``)."""
    rows, table = _tokens(m, sh)[0] * m.hidden, -(-m.vocab // sh.tp) * m.hidden
    ops = [replace(_mem("embedding", rows, rows, sh, kind="copy"),
                   bwd_bytes=(4 * rows + table) * sh.act_bytes)]
    ops += _leave_tp("embedding_reduce", m, sh, "")
    return ops


def head_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Final norm, vocab-parallel logits GEMM and fp32 cross-entropy."""
    T, Ts = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    v = -(-m.vocab // sh.tp)
    ops = [norm_op("final_ln", m, sh, Ts * h)]
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
    return ops + mtp_ops(m, sh, ops[1:])


def mtp_ops(m: TransformerSpec, sh: LayerShape, head: list[Op]) -> list[Op]:
    """DeepSeek-V3's multi-token-prediction modules (``TransformerSpec.mtp_layers``), each
    after the main head on the last stage: RMSNorm of the hidden state and of the next
    token's embedding (a lookup in the shared table), the 2h -> h projection of their
    concatenation, one decoder layer of the last layer's kind, the shared final norm, output
    layer and loss again (``head``: the main head's ops after its final norm). Megatron-Core
    ``multi_token_prediction.py``; names prefixed ``mtp<i>_``."""
    T, Ts = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    out: list[Op] = []
    for d in range(m.mtp_layers):
        pre = f"mtp{d}_"
        block = [replace(_mem("embedding", Ts * h, Ts * h, sh, kind="copy"),
                         bwd_bytes=2 * Ts * h * ab),
                 _mem("norms", 2 * Ts * h, 2 * Ts * h, sh, saved=2 * Ts * h * ab, kind="norm"),
                 # column-parallel over TP (Megatron's eh_proj), the gather not priced
                 _gemm("proj", T, h // sh.tp, 2 * h, sh, saved=2 * Ts * h * ab)]
        block += layer_ops(m, sh, m.n_layers - 1)
        block.append(norm_op("final_ln", m, sh, Ts * h))
        block += head
        out += [replace(o, name=pre + o.name,
                        overlaps_with=pre + o.overlaps_with if o.overlaps_with else "")
                for o in block]
    return out


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
            dgrad = replace(op, name=op.name + "_dgrad", m=op.m, n=op.k, k=op.n, saved_bytes=0,
                            split=tuple((m, k, n) for m, n, k in op.split))
            wgrad = replace(op, name=op.name + WEIGHT_GRAD_SUFFIX, m=op.k, n=op.n, k=op.m,
                            saved_bytes=0, split=tuple((k, n, m) for m, n, k in op.split))
            out += [dgrad] + _split_grad_sum(op) + [wgrad]
        elif op.kind == OpKind.ATTENTION:
            out.append(replace(op, name=op.name + "_bwd", flops=2.5 * op.flops,
                               model_flops=2.0 * op.model_flops, bytes_moved=2 * op.bytes_moved,
                               saved_bytes=0))
        elif op.kind == OpKind.MEMORY:
            moved = 2 * op.bytes_moved if op.bwd_bytes < 0 else op.bwd_bytes
            out.append(replace(op, name=op.name + "_bwd", bytes_moved=moved, saved_bytes=0,
                               launches=op.bwd_launches or op.launches))
        else:
            out.append(_conjugate(op))
    return [o for o in out if o is not None]


def _split_grad_sum(op: Op) -> list[Op]:
    """Autograd summing a split GEMM's input gradients (one per part): parts - 1 adds over
    the input, each reading two and writing one, in the activations' dtype. Its dispatch is
    autograd's, not the model code's (no host op: the measured model-code glue holds it)."""
    if len(op.split) < 2:
        return []
    adds, elem = len(op.split) - 1, 4 if op.dtype == "fp32" else 2
    return [Op(op.name + "_dgrad_sum", OpKind.MEMORY, dtype=op.dtype, kernels=0, launches=adds,
               bytes_moved=3.0 * adds * op.batch * op.m * op.k * elem, mem_kind="elementwise")]


WEIGHT_GRAD_SUFFIX = "_wgrad"


def weight_grad_ops(bwd: list[Op]) -> list[Op]:
    """The weight-gradient GEMMs of a backward op list (``backward_ops``): what a
    zero-bubble schedule's W pass runs; the rest of the backward is its B pass."""
    return [op for op in bwd if op.kind == OpKind.GEMM and op.has_weights
            and op.name.endswith(WEIGHT_GRAD_SUFFIX)]


_CONJ = {Collective.ALL_GATHER: Collective.REDUCE_SCATTER,
         Collective.REDUCE_SCATTER: Collective.ALL_GATHER,
         Collective.ALL_REDUCE: Collective.ALL_REDUCE,
         Collective.ALL_TO_ALL: Collective.ALL_TO_ALL,
         Collective.SEND_RECV: Collective.SEND_RECV}


def _conjugate(op: Op) -> Op:
    size = op.comm_bytes if op.bwd_bytes < 0 else op.bwd_bytes
    return replace(op, name=op.name + "_bwd", collective=_CONJ[op.collective], saved_bytes=0,
                   comm_bytes=size)
