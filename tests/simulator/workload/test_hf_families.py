"""HF import of current families: Gemma 2/3, DeepSeek MLA, MoE every k layers, Qwen3 MoE.

The config files under data/hf are the models' public config.json (see data/hf/SOURCES.md);
the published parameter counts are the model reports' / cards' (cited per row).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import InvalidInputError, UnsupportedError
from simulator.workload import from_hf_config, get_preset
from simulator.workload.spec import Norm, Position

HF_DIR = Path(__file__).parent / "data" / "hf"

# (config file, published total, published non-embedding or None, where)
PUBLISHED = [
    ("gemma-2-9b.json", 9_241_705_984, 8_324_201_984,
     "Gemma 2 report (arXiv:2408.00118) Table 2: 917,504,000 embedding + 8,324,201,984"),
    ("gemma-3-1b.json", 1_000e6, 698e6, "Gemma 3 report (arXiv:2503.19786) Table 1: 302M + 698M"),
    ("deepseek-v3.json", 671e9, None, "DeepSeek-V3 report (arXiv:2412.19437): 671B, MTP excluded"),
    ("qwen3-30b-a3b.json", 30.5e9, 29.9e9, "Qwen/Qwen3-30B-A3B model card: 30.5B, 29.9B non-emb."),
]


@pytest.mark.parametrize("fname,total,non_emb,where", PUBLISHED, ids=[r[0] for r in PUBLISHED])
def test_real_configs_match_published_counts_within_half_a_percent(fname, total, non_emb, where):
    spec = from_hf_config(HF_DIR / fname)
    assert abs(spec.total_params() / total - 1) <= 0.005, f"{spec.total_params():,} vs {where}"
    if non_emb is not None:
        got = spec.total_params() - spec.embedding_params()
        assert abs(got / non_emb - 1) <= 0.005, f"{got:,} non-embedding vs {where}"


def test_active_params_of_moe_configs():
    # DeepSeek-V3 report: 37B activated; Qwen3-30B-A3B card: 3.3B activated (both rounded)
    assert abs(from_hf_config(HF_DIR / "deepseek-v3.json").active_params() / 37e9 - 1) < 0.02
    assert abs(from_hf_config(HF_DIR / "qwen3-30b-a3b.json").active_params() / 3.3e9 - 1) < 0.02


def test_deepseek_v3_mla_projection_shapes():
    spec = from_hf_config(HF_DIR / "deepseek-v3.json")
    a = spec.mla
    assert (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim,
            a.v_head_dim) == (1536, 512, 128, 64, 128)
    # HF DeepseekV3Attention weights: q_a_proj 7168x1536, q_a_layernorm 1536,
    # q_b_proj 1536x(128*192), kv_a_proj_with_mqa 7168x576, kv_a_layernorm 512,
    # kv_b_proj 512x(128*256), o_proj (128*128)x7168
    expect = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512
              + 512 * 128 * 256 + 128 * 128 * 7168)
    assert spec.attention_params() == expect == 187_107_328
    assert spec.mla == get_preset("deepseek-v3").mla


def test_deepseek_v2_lite_style_direct_query_projection():
    cfg = json.loads((HF_DIR / "deepseek-v3.json").read_text())
    spec = from_hf_config({**cfg, "q_lora_rank": None})
    assert spec.mla.q_lora_rank == 0
    assert spec.attention_params() == (7168 * 128 * 192 + 7168 * 576 + 512
                                       + 512 * 128 * 256 + 128 * 128 * 7168)
    del cfg["kv_lora_rank"]
    with pytest.raises(InvalidInputError, match="kv_lora_rank"):
        from_hf_config(cfg)


def test_deepseek_moe_layer_freq():
    cfg = json.loads((HF_DIR / "deepseek-v3.json").read_text())
    spec = from_hf_config({**cfg, "moe_layer_freq": 2, "first_k_dense_replace": 1})
    # DeepseekV3DecoderLayer: MoE iff layer >= first_k_dense_replace and layer % freq == 0
    assert [spec.is_moe_layer(i) for i in range(6)] == [False, False, True, False, True, False]
    assert spec.first_layer(True) == 2 and spec.first_layer(False) == 0


def test_gemma2_alternates_local_and_global_layers():
    spec = from_hf_config(HF_DIR / "gemma-2-9b.json")
    assert spec.window == 4096 and spec.tied_embeddings
    # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2) -> even layers local
    assert [spec.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    assert (spec.attn_logit_softcap, spec.final_logit_softcap) == (50.0, 30.0)
    assert spec.norm == Norm.RMSNORM and spec.position == Position.ROPE and not spec.linear_bias
    ref = get_preset("gemma2-9b")
    assert spec.total_params() == ref.total_params() and spec.window_of(0) == ref.window_of(0)
    # a context no longer than the window makes every layer global
    assert not from_hf_config(HF_DIR / "gemma-2-9b.json", seq_len=4096).is_local_layer(0)


def test_gemma3_every_sixth_layer_global_and_text_config():
    spec = from_hf_config(HF_DIR / "gemma-3-1b.json")
    # Gemma3 (transformers): sliding iff (layer_idx + 1) % sliding_window_pattern
    assert [i for i in range(spec.n_layers) if not spec.is_local_layer(i)] == [5, 11, 17, 23]
    assert spec.extra_norm_params == 2 * 1152 + 2 * 256     # sandwich norms + QK-norm
    inner = json.loads((HF_DIR / "gemma-3-1b.json").read_text())
    wrapped = {"model_type": "gemma3", "text_config": {**inner, "model_type": "gemma3_text"},
               "vision_config": {"hidden_size": 1152}}
    w = from_hf_config(wrapped)
    assert w.total_params() == spec.total_params() and "vision tower" in w.source


def test_layer_types_list_and_unsupported_patterns():
    cfg = json.loads((HF_DIR / "gemma-3-1b.json").read_text())
    types = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(26)]
    spec = from_hf_config({**cfg, "layer_types": types})
    assert spec.global_every == 3
    with pytest.raises(UnsupportedError, match="periodic"):
        from_hf_config({**cfg, "layer_types": ["full_attention"] + ["sliding_attention"] * 25})


def test_qwen3_moe_every_k_and_qk_norm():
    cfg = json.loads((HF_DIR / "qwen3-30b-a3b.json").read_text())
    spec = from_hf_config(cfg)
    assert spec.extra_norm_params == 2 * 128 and spec.moe.experts == 128
    assert spec.n_moe_layers() == 48
    half = from_hf_config({**cfg, "decoder_sparse_step": 2})
    assert half.n_moe_layers() == 24 and not half.is_moe_layer(0) and half.is_moe_layer(1)
    dense_one_layer = half.layer_params(0)
    assert dense_one_layer == (2048 * 4096 * 2 + 2 * 2048 * 512 + 3 * 2048 * 6144
                               + 2 * 2048 + 2 * 128)
