"""Gemma 2/3's sandwich norms (``TransformerSpec.sandwich_norms``): a norm after each
sublayer as well as before it, so a layer runs four hidden-size norms where a pre-norm
layer runs two. Checked against transformers' own Gemma2 / Gemma3 decoder layers (their
hidden-size norm modules, counted where transformers is installed) and by what the two
extra norms add: their bytes, their saved inputs, their parameter tensors."""
from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.workload.hf import from_hf_config
from simulator.workload.ops import LayerShape, backward_ops, layer_ops
from simulator.workload.presets import get_preset

BASE = dict(hidden_size=64, num_hidden_layers=1, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=64, head_dim=16, hidden_act="gelu_pytorch_tanh")
SH = LayerShape(micro_batch=2, seq_len=64)


def _hidden_norms(spec) -> list:
    return [o for o in layer_ops(spec, SH) if o.mem_kind == "norm" and o.name != "qk_norm"]


@pytest.mark.parametrize("mt,norms", [("gemma2", 4), ("gemma3_text", 4), ("llama", 2),
                                      ("olmo2", 2)])
def test_hidden_size_norms_per_layer(mt, norms):
    spec = from_hf_config({"model_type": mt, **BASE})
    assert spec.sandwich_norms == (mt in ("gemma2", "gemma3_text"))
    got = _hidden_norms(spec)
    assert len(got) == norms
    tokens = SH.micro_batch * SH.seq_len
    assert all(o.saved_bytes == tokens * spec.hidden * SH.act_bytes for o in got)


def test_the_extra_norms_sit_before_each_residual_add():
    names = [o.name for o in layer_ops(get_preset("gemma2-9b"), SH)]
    assert names.index("post_attn_norm") == names.index("attn_residual") - 1
    assert names.index("post_ffn_norm") == names.index("mlp_residual") - 1
    assert names.index("attn_out") < names.index("post_attn_norm")
    assert names.index("mlp_fc2") < names.index("post_ffn_norm")


def test_the_extra_norms_cost_two_norms_of_bytes_and_memory():
    on = get_preset("gemma2-9b")
    off = replace(on, sandwich_norms=False)
    f_on, f_off = layer_ops(on, SH), layer_ops(off, SH)
    norm = next(o for o in f_on if o.name == "ln1")
    extra_bytes = sum(o.bytes_moved for o in f_on) - sum(o.bytes_moved for o in f_off)
    extra_saved = sum(o.saved_bytes for o in f_on) - sum(o.saved_bytes for o in f_off)
    assert extra_bytes == pytest.approx(2 * norm.bytes_moved)
    assert extra_saved == pytest.approx(2 * norm.saved_bytes)
    # and backward runs a norm backward for each
    b_on = {o.name for o in backward_ops(f_on)}
    assert {"post_attn_norm_bwd", "post_ffn_norm_bwd"} <= b_on


@pytest.mark.torch
@pytest.mark.parametrize("mt", ["gemma2", "gemma3_text"])
def test_transformers_layer_has_four_hidden_size_norms(mt):
    """Re-count on transformers' Gemma decoder layer (skipped without transformers)."""
    pytest.importorskip("transformers")
    import transformers
    cfg = transformers.CONFIG_MAPPING[mt]()
    for k, v in BASE.items():
        if hasattr(cfg, k):
            setattr(cfg, k, v)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    layer = model.model.layers[0]
    hidden = [n for n, m in layer.named_modules() if "norm" in type(m).__name__.lower()
              and getattr(m, "weight", None) is not None
              and tuple(m.weight.shape) == (cfg.hidden_size,)]
    assert len(hidden) == len(_hidden_norms(from_hf_config(cfg.to_dict()))) == 4
