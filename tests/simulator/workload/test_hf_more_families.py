"""OLMo 2, Granite, Phi-3 and StarCoder2 configs read as transformers 5.24 builds them:
gated MLPs with RMSNorm for the first three, a plain GELU MLP with LayerNorm, biases and tied
embeddings for StarCoder2 (its config class's defaults), and OLMo 2's Q/K norms over the
whole projections (``Olmo2Attention.q_norm``: heads x head_dim weights)."""
from __future__ import annotations

import pytest

from simulator.workload.hf import SUPPORTED_MODEL_TYPES, from_hf_config
from simulator.workload.spec import MLP, Norm

BASE = dict(hidden_size=1024, num_hidden_layers=4, intermediate_size=2816,
            num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
            max_position_embeddings=4096)


@pytest.mark.parametrize("mt, mlp, norm, tied", [
    ("olmo2", MLP.SWIGLU, Norm.RMSNORM, False), ("granite", MLP.SWIGLU, Norm.RMSNORM, False),
    ("phi3", MLP.SWIGLU, Norm.RMSNORM, False),
    ("starcoder2", MLP.GELU, Norm.LAYERNORM, True)])
def test_family_readings(mt, mlp, norm, tied):
    assert mt in SUPPORTED_MODEL_TYPES
    extra = {"hidden_act": "gelu_pytorch_tanh"} if mt == "starcoder2" else {"hidden_act": "silu"}
    s = from_hf_config({"model_type": mt, **BASE, **extra})
    assert (s.mlp, s.norm, s.tied_embeddings) == (mlp, norm, tied)
    assert s.linear_bias == (mt == "starcoder2")


def test_olmo2_norms_the_whole_q_and_k_projections():
    s = from_hf_config({"model_type": "olmo2", **BASE})
    head_dim = BASE["hidden_size"] // BASE["num_attention_heads"]
    assert s.qk_norm and s.extra_norm_params == (16 + 4) * head_dim
    plain = from_hf_config({"model_type": "llama", **BASE})
    assert s.total_params() - plain.total_params() == 4 * (16 + 4) * head_dim
