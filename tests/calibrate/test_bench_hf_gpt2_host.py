"""``calibrate.bench_hf_host``'s GPT-2 comparison: the aten ops a transformers GPT-2 block and
a Llama decoder layer issue per layer (5 vs 1 layers, as the timing sees them) against a hand
count from the model source (transformers 5.24 modeling_gpt2.py / modeling_llama.py), the op
graph's ops for each, and the arithmetic of the rows, the quiet-host check and the line fit."""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate import bench_hf_host as hf  # noqa: E402

# non-view aten ops of one GPT2Block forward, GPT2Config's defaults but no dropout, sdpa:
GPT2_FWD = Counter({
    "native_layer_norm.default": 2,                     # ln_1, ln_2 (nn.LayerNorm: one op)
    "addmm.default": 4,                                 # Conv1D c_attn, c_proj, c_fc, c_proj
    "_scaled_dot_product_flash_attention_for_cpu.default": 1,
    "cat.default": 2,                                   # DynamicLayer.update: keys, values
    # NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    "pow.Tensor_Scalar": 1, "mul.Tensor": 4, "tanh.default": 1,
    "add.Tensor": 2 + 2,                                # GELU's two adds, the two residuals
})
# one LlamaDecoderLayer forward: RMSNorm x2 (pow, mean, add eps, rsqrt, mul, weight mul),
# q, k, v, o, gate, up, down (mm), rotary on Q and K (rotate_half's neg and cat, q * cos,
# rotate_half(q) * sin, add), sdpa, cache cat x2, two residual adds, silu(gate) * up
LLAMA_FWD = Counter({
    "pow.Tensor_Scalar": 2, "mean.dim": 2, "rsqrt.default": 2, "mm.default": 7,
    "add.Tensor": 2 + 2 + 2, "mul.Tensor": 4 + 4 + 1, "neg.default": 2, "cat.default": 2 + 2,
    "_scaled_dot_product_flash_attention_for_cpu.default": 1, "silu.default": 1,
})


def _non_view(counts: dict) -> Counter:
    from calibrate.bench_eager import _FREE
    return Counter({k: v for k, v in counts.items() if k.split(".")[0] not in _FREE})


@pytest.fixture(scope="module")
def counts():
    return {v: hf.layer_aten_ops(v) for v in hf.VARIANTS}


def test_forward_aten_ops_match_the_hand_count_from_the_source(counts):
    assert _non_view(counts["gpt2_nodrop"]["fwd"]) == GPT2_FWD
    assert hf.non_view(counts["gpt2_nodrop"]["fwd"]) == 19
    assert _non_view(counts["llama"]["fwd"]) == LLAMA_FWD
    assert hf.non_view(counts["llama"]["fwd"]) == 36


def test_gpt2_backward_has_the_sources_gradients(counts):
    b = counts["gpt2_nodrop"]["bwd"]
    assert b["mm.default"] == 8                      # input and weight gradient per Conv1D
    assert b["sum.dim_IntList"] == 4                 # their bias gradients
    assert b["native_layer_norm_backward.default"] == 2
    assert b["_scaled_dot_product_flash_attention_for_cpu_backward.default"] == 1
    assert b["tanh_backward.default"] == 1
    assert b["cat.default"] == 1                     # the q, k, v split's backward
    assert hf.non_view(b) == 31
    assert hf.non_view(counts["llama"]["bwd"]) == 69


def test_hidden_dropout_is_cpu_dropouts_four_ops_each(counts):
    """nn.Dropout in training on a CPU: empty_like, bernoulli_, div_, mul (at::dropout's
    unfused path), twice per block (attention and MLP resid_dropout); backward one mul each.
    embd_pdrop's dropout is outside the layers and cancels."""
    extra = Counter(counts["gpt2_residdrop"]["fwd"])
    extra.subtract(counts["gpt2_nodrop"]["fwd"])
    assert +extra == Counter({"empty_like.default": 2, "bernoulli_.float": 2,
                              "div_.Scalar": 2, "mul.Tensor": 2})
    extra = Counter(counts["gpt2_residdrop"]["bwd"])
    extra.subtract(counts["gpt2_nodrop"]["bwd"])
    assert +extra == Counter({"mul.Tensor": 2})


def test_attention_dropout_leaves_the_fused_sdpa_kernel_on_a_cpu(counts):
    f = counts["gpt2"]["fwd"]
    assert "_scaled_dot_product_flash_attention_for_cpu.default" not in f
    assert f["_safe_softmax.default"] == 1 and f["bmm.default"] == 2
    assert f["bernoulli_.float"] == 3                # two resid dropouts and the attention's
    assert hf.non_view(f) > hf.non_view(counts["gpt2_residdrop"]["fwd"])


def test_op_graph_ops_of_each_layer():
    from calibrate.bench_framework import llama_graph_ops
    assert hf.graph_ops("llama") == llama_graph_ops(hf.HIDDEN, hf.FFN, hf.HEADS, hf.KV_HEADS,
                                                    hf.TOKENS) == (11, 15)
    assert hf.graph_ops("gpt2_nodrop") == (10, 14)
    assert hf.graph_ops("gpt2") == hf.graph_ops("gpt2_residdrop") == (12, 16)  # + 2 dropouts


def test_models_are_the_stated_configs():
    m = hf.variant_model("gpt2", 1)
    c = m.config
    assert (c.n_embd, c.n_head, c.n_positions, c.vocab_size, c.n_inner) == (32, 4, 64, 128, None)
    assert m.transformer.h[0].mlp.c_fc.nf == 128            # n_inner's default 4 x n_embd
    assert (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop) == (0.1, 0.1, 0.1)
    assert c.activation_function == "gelu_new" and c._attn_implementation == "sdpa"
    assert m.training
    c = hf.variant_model("gpt2_nodrop", 5).config
    assert (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop, c.n_layer) == (0.0, 0.0, 0.0, 5)


def _res(op_fwd: float = 20.0, op_bwd: float = 22.0) -> dict:
    """A quiet_run result: per layer (5 vs 1) fwd 30 / bwd 40 eager ops for Llama, 20 / 25
    for every GPT-2 variant; the model outside the layers 100 / 50 us."""
    per = {"llama": (30, 40), **{v: (20, 25) for v in hf.GPT2_VARIANTS}}
    t = {(v, n): (100 + n * f * op_fwd, 50 + n * b * op_fwd)
         for v, (f, b) in per.items() for n in hf.LAYERS}
    return {"t": t, "op": {"fwd": op_fwd, "bwd": op_bwd}, "pressure": 0.01, "foreign": 0.02}


def test_rows_are_per_layer_differences_and_glue_beyond_the_op_graph():
    res = _res()
    per = hf.per_layer_ops(res)
    assert per[("llama", "fwd")] == pytest.approx(30) and per[("gpt2", "bwd")] == pytest.approx(25)
    counts = {v: {"fwd": Counter({"mm.default": 3}), "bwd": Counter({"t.default": 2})}
              for v in hf.VARIANTS}
    rows = hf.run_rows(res, counts, {"host": "h", "torch": "t", "date": "d"})
    got = {(r["mechanism"], r["metric"]): r for r in rows}
    assert len(rows) == 4 * len(hf.VARIANTS)
    g = got[("hf_gpt2_layer", "gpt2_nodrop: per layer, fwd, glue")]
    assert g["value_us"] == pytest.approx(20 * 20 - 10 * 20)
    assert g["eager_ops"] == pytest.approx(10)
    g = got[("hf_gpt2_layer", "gpt2: per layer, bwd, glue")]
    assert g["value_us"] == pytest.approx(25 * 20 - 16 * 22)
    g = got[("hf_gpt2_layer", "llama: per layer, bwd, glue")]
    assert g["value_us"] == pytest.approx(40 * 20 - 15 * 22)    # bwd ops at the bwd cost
    assert "fwd 3 aten ops, 3 not views; bwd 2 aten ops, 0 not views" in g["method"]
    assert set(rows[0]) == {"mechanism", "metric", "value_us", "op_fwd_us_same_run",
                            "eager_ops", "host", "torch", "date", "method"}


def test_noisy_runs_are_named():
    assert hf.noise(0.01, 0.02, 20.0, 18.0) == ""
    assert hf.noise(0.01, 0.02, 20.0, None) == ""
    assert "CPU pressure" in hf.noise(0.3, 0.0, 20.0, None)
    assert "foreign load 50%" in hf.noise(0.0, 0.5, 20.0, None)
    assert "probe 30.0 us" in hf.noise(0.0, 0.0, 30.0, 18.0)


def test_line_fit_and_summary():
    a, b, res = hf.line_fit([0, 1, 2], [6, 4, 8])
    assert (a, b) == pytest.approx((5, 1)) and res == pytest.approx([1, -2, 1])
    counts = {"llama": {"fwd": Counter({"mm.default": 30}), "bwd": Counter({"mm.default": 40})},
              **{v: {"fwd": Counter({"mm.default": 20}), "bwd": Counter({"mm.default": 25})}
                 for v in hf.GPT2_VARIANTS}}
    per = hf.per_layer_ops(_res())
    text = hf.summary([per, per], counts)
    assert "gpt2_nodrop     fwd   20.00 eager ops [20.00-20.00]" in text
    assert "/ llama 0.667" in text                               # 20 / 30
    assert "+ 1.000 x non-view aten ops (rms 0.00)" in text        # every point on y = x
    assert "carried to GPT-2: gpt2 20.00 (measured 20.00)" in text
