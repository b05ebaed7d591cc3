"""Operator graph: FLOPs, bytes and saved activations against published formulas."""
from __future__ import annotations

import pytest

from simulator.workload import TransformerSpec, get_preset
from simulator.workload.ops import LayerShape, backward_ops, head_ops, layer_ops

GPT = TransformerSpec("gpt175", 96, 12288, 49152, 96, 96, 51200, 2048)


@pytest.mark.parametrize("tp, sp", [(1, False), (8, False), (8, True)])
def test_activation_memory_matches_korthikanti_2022(tp, sp):
    """Korthikanti et al. 2022, eq. (1)-(4): bytes per layer for GPT with dropout and
    materialized attention: sbh(10 + 24/t + 5as/(ht)) without SP, sbh/t (34 + 5as/h) with."""
    s, b, h, a = 2048, 1, 12288, 96
    ops = layer_ops(GPT, LayerShape(b, s, tp=tp, sequence_parallel=sp, flash=False, dropout=True))
    got = sum(o.saved_bytes for o in ops)
    want = s * b * h / tp * (34 + 5 * a * s / h) if sp else s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert got == pytest.approx(want, rel=1e-12)


def test_selective_recompute_keeps_34sbh_over_t():
    s, b, h, t = 2048, 1, 12288, 8
    ops = layer_ops(GPT, LayerShape(b, s, tp=t, sequence_parallel=True, flash=False, dropout=True))
    kept = sum(o.saved_bytes for o in ops if not o.recomputed)
    assert kept == pytest.approx(34 * s * b * h / t, rel=1e-12)


def test_dense_layer_flops_are_24bsh2_plus_attention():
    """Forward GEMM FLOPs of a GELU layer: 24 b s h^2 (Narayanan et al. 2021); attention
    adds 4 b s^2 h (non-causal, counted in model FLOPs)."""
    b, s, h = 1, 2048, 12288
    ops = layer_ops(GPT, LayerShape(b, s, flash=True))
    gemm = sum(o.flops for o in ops if o.kind.value == "gemm")
    model = sum(o.model_flops for o in ops)
    assert gemm == pytest.approx(24 * b * s * h * h)
    assert model == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h)


def test_backward_is_twice_forward_for_gemms():
    ops = layer_ops(GPT, LayerShape(1, 2048, flash=True))
    fwd = sum(o.flops for o in ops if o.kind.value == "gemm")
    bwd = sum(o.flops for o in backward_ops(ops) if o.kind.value == "gemm")
    assert bwd == pytest.approx(2 * fwd)


def test_tensor_parallel_splits_flops_evenly():
    one = sum(o.flops for o in layer_ops(GPT, LayerShape(1, 2048, tp=1)))
    eight = sum(o.flops for o in layer_ops(GPT, LayerShape(1, 2048, tp=8)))
    assert eight == pytest.approx(one / 8)


def test_causal_flash_attention_counts_half_the_scores():
    """FlashAttention papers' convention: a causal call is half the square; the diagonal
    tiles it computes in full are in the kernel's measured efficiency, not in its FLOPs."""
    ops = {o.name: o for o in layer_ops(GPT, LayerShape(1, 2048, flash=True, causal=True))}
    core = ops["core_attn"]
    assert core.flops / core.model_flops == 0.5
    assert (core.m, core.n, core.k, core.batch, core.causal) == (2048, 2048, 128, 96, True)


def test_swiglu_model_flops_per_token_close_to_6n():
    """Llama-2-7B: forward+backward model FLOPs per token ~ 6N + attention (PaLM)."""
    m = get_preset("llama2-7b")
    sh = LayerShape(1, m.seq_len, flash=True)
    per_layer = sum(o.model_flops for o in layer_ops(m, sh))
    per_layer += sum(o.model_flops for o in backward_ops(layer_ops(m, sh)))
    head = head_ops(m, sh)
    total = m.n_layers * per_layer + sum(o.model_flops for o in head + backward_ops(head))
    per_token = total / m.seq_len
    n_nonembed = m.total_params() - m.vocab * m.hidden          # input embedding does no GEMM
    expected = 6 * n_nonembed + 12 * m.n_layers * m.hidden * m.seq_len
    assert per_token == pytest.approx(expected, rel=0.01)


def test_fp8_adds_cast_passes_and_halves_saved_gemm_inputs():
    bf = layer_ops(GPT, LayerShape(1, 2048, dtype="bf16"))
    f8 = layer_ops(GPT, LayerShape(1, 2048, dtype="fp8"))
    assert any(o.name.endswith("_fp8cast") for o in f8)
    assert not any(o.name.endswith("_fp8cast") for o in bf)
    # inputs of the MLP and projection GEMMs are kept as FP8; the QKV output (Q, K, V for the
    # 16-bit attention core) stays 16-bit
    names = ("attn_out", "mlp_fc1", "mlp_fc2")
    saved = lambda ops: sum(o.saved_bytes for o in ops if o.name in names)
    assert saved(f8) == pytest.approx(saved(bf) / 2)
    qkv = lambda ops: next(o.saved_bytes for o in ops if o.name == "qkv")
    assert qkv(bf) > qkv(f8) > qkv(bf) / 2


def test_fp8_keeps_the_output_layer_gemm_16bit():
    """FP8 frameworks quantise decoder linears only; the LM head runs in bf16."""
    from simulator.workload.ops import head_ops
    f8 = head_ops(GPT, LayerShape(1, 2048, dtype="fp8"))
    logits = next(o for o in f8 if o.name == "logits")
    assert logits.dtype == "bf16"
    assert next(o for o in layer_ops(GPT, LayerShape(1, 2048, dtype="fp8"))
                if o.name == "mlp_fc1").dtype == "fp8"
