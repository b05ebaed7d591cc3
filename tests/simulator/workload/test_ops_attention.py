"""Attention op graph for MLA projections and sliding-window (local) layers, against
closed forms: projection GEMM FLOPs = 2 x weights x tokens; attention FLOPs counted from
the mask by enumeration."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.workload import get_preset
from simulator.workload.ops import (
    LayerShape,
    OpKind,
    attention_ops,
    causal_window_pairs,
    core_attention_ops,
    layer_ops,
)

DS = get_preset("deepseek-v3")
GEMMA = get_preset("gemma2-9b")


@given(s=st.integers(1, 80), w=st.integers(0, 100))
@settings(max_examples=200, deadline=None)
def test_causal_window_pairs_counts_the_mask(s, w):
    # query i sees key j when j <= i and (no window, or i - j < w)
    brute = sum(1 for i in range(s) for j in range(i + 1) if w <= 0 or i - j < w)
    assert causal_window_pairs(s, w) == brute


def _by_name(ops):
    return {o.name: o for o in ops}


def test_mla_projection_gemm_shapes_and_flops():
    sh = LayerShape(micro_batch=1, seq_len=4096)
    ops = _by_name(attention_ops(DS, sh))
    T = 4096
    assert (ops["q_down"].m, ops["q_down"].n, ops["q_down"].k) == (T, 1536, 7168)
    assert (ops["q_up"].n, ops["q_up"].k) == (128 * 192, 1536)
    assert (ops["kv_down"].n, ops["kv_down"].k) == (512 + 64, 7168)
    assert (ops["kv_up"].n, ops["kv_up"].k) == (128 * (128 + 128), 512)
    assert (ops["attn_out"].n, ops["attn_out"].k) == (7168, 128 * 128)
    # a linear layer's forward is 2 FLOPs per weight per token: projections = 2 T x weights
    gemm = sum(o.flops for o in ops.values() if o.kind == OpKind.GEMM)
    norms = 1536 + 512
    assert gemm == 2 * T * (DS.attention_params() - norms)


def test_mla_down_projections_replicated_up_projections_split_over_tp():
    one = _by_name(attention_ops(DS, LayerShape(micro_batch=1, seq_len=4096)))
    tp8 = _by_name(attention_ops(DS, LayerShape(micro_batch=1, seq_len=4096, tp=8)))
    assert tp8["q_down"].flops == one["q_down"].flops       # Megatron-Core: duplicated
    assert tp8["kv_down"].flops == one["kv_down"].flops
    assert tp8["q_up"].flops * 8 == one["q_up"].flops
    assert tp8["kv_up"].flops * 8 == one["kv_up"].flops


def test_mla_core_attention_uses_qk_192_and_v_128():
    b, s, h = 2, 4096, 128
    core = core_attention_ops(DS, LayerShape(micro_batch=b, seq_len=s))[0]
    assert core.model_flops == 2.0 * b * h * s * s * (192 + 128)


def test_global_layer_attention_flops_unchanged_closed_form():
    m = get_preset("llama3-8b")
    b, s = 1, 8192
    core = core_attention_ops(m, LayerShape(micro_batch=b, seq_len=s))[0]
    assert core.model_flops == 4.0 * b * m.n_heads * s * s * m.head_dim
    # FlashAttention convention of the fitted efficiency curves: a causal call executes half
    # the square (the diagonal tiles are carried by the causal efficiency)
    assert core.flops == core.model_flops * 0.5


def test_local_layer_attention_flops_follow_the_window():
    b, s, w = 1, 8192, 4096
    sh = LayerShape(micro_batch=b, seq_len=s)
    per_pair = 2.0 * b * GEMMA.n_heads * 2 * GEMMA.head_dim
    local = core_attention_ops(GEMMA, sh, window=w)[0]
    glob = core_attention_ops(GEMMA, sh, window=0)[0]
    assert local.model_flops == per_pair * s * w                 # each query: a full window
    exact = per_pair * causal_window_pairs(s, w)
    assert exact <= local.flops <= exact + per_pair * s * 64      # + the far edge's half tile
    assert local.flops < glob.flops
    # layer_ops picks the window from the layer index (Gemma 2: even layers local)
    core0 = next(o for o in layer_ops(GEMMA, sh, 0) if o.name == "core_attn")
    core1 = next(o for o in layer_ops(GEMMA, sh, 1) if o.name == "core_attn")
    assert core0.flops == local.flops and core1.flops == glob.flops


def test_window_at_least_the_sequence_is_global():
    short = replace(GEMMA, seq_len=2048)
    sh = LayerShape(micro_batch=1, seq_len=2048)
    a = next(o for o in layer_ops(short, sh, 0) if o.name == "core_attn")
    b = next(o for o in layer_ops(short, sh, 1) if o.name == "core_attn")
    assert a.flops == b.flops and not short.is_local_layer(0)
