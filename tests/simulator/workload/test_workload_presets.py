"""Presets, HuggingFace config import and model resolution (simulator.workload)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.errors import InvalidInputError, UnsupportedError
from simulator.workload import (
    MLP,
    PRESETS,
    MoESpec,
    TransformerSpec,
    from_hf_config,
    get_preset,
    list_presets,
    resolve_model,
)

HF_DIR = Path(__file__).parent / "data" / "hf"

REQUIRED_KEYS = [
    "gpt3-175b", "bloom-176b", "mt-nlg-530b", "llama2-7b", "llama2-13b", "llama2-70b",
    "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "qwen3-30b-a3b",
    "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "nemotron4-340b", "tiny-2l-128",
    "small-4l-256", "small-6l-512",
]

# (preset, published total params, relative tolerance, where the figure is published).
# The spec omits biases, position embeddings and LayerNorm biases (< 1%), hence 2-3%.
PUBLISHED_TOTAL = [
    ("gpt3-175b", 175e9, 0.02, "Brown et al. 2020 Table 2.1"),
    ("bloom-176b", 176.247e9, 0.02, "Le Scao et al. 2022: 176,247M"),
    ("mt-nlg-530b", 530e9, 0.02, "Smith et al. 2022"),
    ("llama2-7b", 6.738e9, 0.01, "HF model card / Touvron et al. 2023"),
    ("llama2-13b", 13.016e9, 0.01, "HF model card"),
    ("llama2-70b", 68.977e9, 0.01, "HF model card ('70B')"),
    ("llama3-8b", 8.03e9, 0.01, "Meta Llama 3 model card"),
    ("llama3-70b", 70.55e9, 0.01, "Meta Llama 3 model card"),
    ("llama3-405b", 405e9, 0.01, "Dubey et al. 2024"),
    ("mixtral-8x7b", 46.7e9, 0.02, "Mistral AI 2023 release / Jiang et al. 2024"),
    ("qwen3-30b-a3b", 30.5e9, 0.03, "Qwen3 Technical Report Table 2"),
    ("qwen3-235b-a22b", 235e9, 0.03, "Qwen3 Technical Report Table 2"),
    ("nemotron4-340b", 340e9, 0.02, "Nemotron-4 340B Technical Report"),
    ("gpt-oss-120b", 116.83e9, 0.02, "gpt-oss model card Table 1"),
    # MLA with its real projection shapes: within 0.5% (MTP module excluded, as published)
    ("deepseek-v3", 671e9, 0.005, "DeepSeek-V3 Technical Report (excl. 14B MTP module)"),
    ("deepseek-v2", 236e9, 0.005, "DeepSeek-V2 report (arXiv:2405.04434) Sec. 3.1.2"),
    ("gemma2-9b", 9_241_705_984, 1e-9, "Gemma 2 report Table 2: 8,324,201,984 + 917,504,000"),
]

# Active parameters per token for MoE presets.
PUBLISHED_ACTIVE = [
    ("mixtral-8x7b", 12.9e9, 0.02, "Mistral AI 2023 release"),
    ("qwen3-30b-a3b", 3.3e9, 0.03, "Qwen3 Technical Report Table 2"),
    ("qwen3-235b-a22b", 22e9, 0.03, "Qwen3 Technical Report Table 2"),
    # The published 37B / 21B are rounded; the spec counts 37.55B / 21.38B.
    ("deepseek-v3", 37e9, 0.02, "DeepSeek-V3 Technical Report"),
    ("deepseek-v2", 21e9, 0.02, "DeepSeek-V2 report Sec. 3.1.2"),
]


def test_registry_has_required_keys_and_sources():
    assert list_presets() == sorted(PRESETS)
    for key in REQUIRED_KEYS:
        spec = get_preset(key)
        assert isinstance(spec, TransformerSpec)
        assert spec.name == key
        assert spec.source, f"{key} has no source"


def test_unknown_preset_lists_valid_names():
    with pytest.raises(InvalidInputError) as ei:
        get_preset("gpt-5")
    assert ei.value.field == "model" and ei.value.value == "gpt-5"
    assert "llama3-8b" in str(ei.value) and "one of:" in str(ei.value)


@pytest.mark.parametrize("key,published,tol,where", PUBLISHED_TOTAL,
                         ids=[r[0] for r in PUBLISHED_TOTAL])
def test_total_params_match_published(key, published, tol, where):
    got = get_preset(key).total_params()
    assert abs(got / published - 1) <= tol, f"{key}: {got / 1e9:.2f}B vs {where}"


@pytest.mark.parametrize("key,published,tol,where", PUBLISHED_ACTIVE,
                         ids=[r[0] for r in PUBLISHED_ACTIVE])
def test_active_params_match_published(key, published, tol, where):
    got = get_preset(key).active_params()
    assert abs(got / published - 1) <= tol, f"{key}: {got / 1e9:.2f}B vs {where}"


def test_gpt_oss_active_params_excluding_input_embedding():
    # The model card's 5.13B active counts the unembedding but not the input embedding.
    spec = get_preset("gpt-oss-120b")
    got = spec.active_params() - spec.vocab * spec.hidden
    assert abs(got / 5.13e9 - 1) <= 0.02


def test_llama2_counts_are_exact():
    # No biases in Llama: the spec's count should be the released checkpoint's exactly.
    assert get_preset("llama2-7b").total_params() == 6_738_415_616
    assert get_preset("llama3-405b").total_params() == 405_853_388_800


def test_preset_shapes():
    q235 = get_preset("qwen3-235b-a22b")
    assert q235.head_dim == 128 and q235.q_dim == 8192 != q235.hidden
    assert q235.moe.shared_experts == 0 and q235.moe.top_k == 8
    ds = get_preset("deepseek-v3")
    assert ds.moe.dense_layers == 3 and ds.moe.shared_experts == 1
    assert not ds.is_moe_layer(2) and ds.is_moe_layer(3)
    assert ds.mla.q_lora_rank == 1536 and ds.mla.qk_head_dim == 192 and ds.n_kv_heads == 128
    assert get_preset("gemma2-9b").is_local_layer(0) and not get_preset("gemma2-9b").is_local_layer(1)
    assert get_preset("nemotron4-340b").mlp == MLP.RELU2
    assert get_preset("bloom-176b").tied_embeddings
    assert get_preset("gpt3-175b").vocab == 50257 and "51200" in get_preset("gpt3-175b").source


def test_small_presets_are_small():
    for key in ("tiny-2l-128", "small-4l-256", "small-6l-512"):
        assert get_preset(key).total_params() < 50e6
    assert get_preset("tiny-2l-128").seq_len == 128


# ---- HuggingFace config import -------------------------------------------------------------

def _same_model(a: TransformerSpec, b: TransformerSpec) -> bool:
    """Equal up to name, source and seq_len."""
    return replace(a, name="x", source="", seq_len=1) == replace(b, name="x", source="", seq_len=1)


@pytest.mark.parametrize("fname,preset", [
    ("llama3-8b.json", "llama3-8b"),
    ("mixtral-8x7b.json", "mixtral-8x7b"),
    ("qwen3-30b-a3b.json", "qwen3-30b-a3b"),
    ("gpt2.json", "gpt2-124m"),
    ("deepseek-v3.json", "deepseek-v3"),
])
def test_hf_import_matches_preset(fname, preset):
    spec = from_hf_config(HF_DIR / fname)
    ref = get_preset(preset)
    assert _same_model(spec, ref), f"{spec} != {ref}"
    assert spec.total_params() == ref.total_params()
    assert spec.active_params() == ref.active_params()
    assert spec.source.startswith("HuggingFace config.json")


def test_hf_seq_len_default_cap_and_override():
    assert from_hf_config(HF_DIR / "llama3-8b.json").seq_len == 8192
    mix = from_hf_config(HF_DIR / "mixtral-8x7b.json")
    assert mix.seq_len == 8192 and "capped from max_position_embeddings=32768" in mix.source
    # DeepSeek-V3's YaRN config keeps the pre-training length in rope_scaling.
    assert from_hf_config(HF_DIR / "deepseek-v3.json").seq_len == 4096
    assert from_hf_config(HF_DIR / "gpt2.json").seq_len == 1024
    assert from_hf_config(HF_DIR / "mixtral-8x7b.json", seq_len=2048).seq_len == 2048


def test_hf_names():
    assert from_hf_config(HF_DIR / "gpt2.json").name == "gpt2"
    assert from_hf_config(HF_DIR / "gpt2.json", name="mine").name == "mine"
    cfg = json.loads((HF_DIR / "gpt2.json").read_text())
    assert from_hf_config(cfg).name == "gpt2"
    assert from_hf_config({**cfg, "_name_or_path": "openai/gpt2"}).name == "openai/gpt2"


def test_hf_directory_holding_config(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text((HF_DIR / "llama3-8b.json").read_text())
    spec = from_hf_config(d)
    assert spec.name == "Meta-Llama-3-8B" and spec.total_params() == get_preset("llama3-8b").total_params()


def test_hf_qwen2_moe_shared_expert_width():
    spec = from_hf_config(HF_DIR / "qwen2-moe-a2.7b.json")
    assert spec.moe == MoESpec(experts=60, top_k=4, expert_ffn_hidden=1408, shared_experts=4)
    # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated.
    assert abs(spec.total_params() / 14.3e9 - 1) < 0.02
    assert abs(spec.active_params() / 2.7e9 - 1) < 0.03


def _llama_dict(**over):
    cfg = json.loads((HF_DIR / "llama3-8b.json").read_text())
    cfg.update(over)
    return cfg


def test_hf_mlp_mapping_and_tying():
    gpt2 = from_hf_config(HF_DIR / "gpt2.json")
    assert gpt2.mlp == MLP.GELU and gpt2.tied_embeddings and gpt2.ffn_hidden == 4 * 768
    assert from_hf_config(HF_DIR / "llama3-8b.json").mlp == MLP.SWIGLU
    nemo = _llama_dict(model_type="nemotron", hidden_act="relu2")
    assert from_hf_config(nemo).mlp == MLP.RELU2
    assert from_hf_config(_llama_dict(tie_word_embeddings=True)).tied_embeddings
    with pytest.raises(InvalidInputError, match="hidden_act"):
        from_hf_config(_llama_dict(model_type="gpt_neox", hidden_act="tanh"))


def test_hf_qwen3_dense_head_dim():
    cfg = _llama_dict(model_type="qwen3", hidden_size=2560, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128)
    spec = from_hf_config(cfg)
    assert spec.head_dim == 128 and spec.q_dim == 4096 and spec.moe is None


def test_hf_falcon_variants():
    base = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
            "num_hidden_layers": 32, "vocab_size": 65024}
    f7 = from_hf_config({**base, "multi_query": True})
    assert f7.n_kv_heads == 1 and f7.ffn_hidden == 4 * 4544 and f7.tied_embeddings
    assert f7.seq_len == 2048
    f40 = from_hf_config({**base, "hidden_size": 8192, "num_attention_heads": 128,
                          "num_kv_heads": 8, "new_decoder_architecture": True})
    assert f40.n_kv_heads == 8


def test_hf_moe_layer_layouts():
    moe = _llama_dict(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=1024, mlp_only_layers=[0, 1])
    assert from_hf_config(moe).moe.dense_layers == 2
    # Qwen2MoeDecoderLayer: sparse iff layer not in mlp_only_layers and (layer+1) % step == 0
    odd = from_hf_config({**moe, "mlp_only_layers": [5], "decoder_sparse_step": 2})
    want = [i not in (5,) and (i + 1) % 2 == 0 for i in range(odd.n_layers)]
    assert [odd.is_moe_layer(i) for i in range(odd.n_layers)] == want
    with pytest.raises(UnsupportedError):
        from_hf_config({**moe, "sliding_window": 4096, "use_sliding_window": True})


def test_hf_unknown_model_type_lists_supported():
    with pytest.raises(InvalidInputError) as ei:
        from_hf_config(_llama_dict(model_type="mamba"))
    assert ei.value.field == "config.model_type"
    for t in ("llama", "mixtral", "qwen3_moe", "gpt2", "deepseek_v3"):
        assert t in str(ei.value)


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                 "vocab_size", "intermediate_size"])
def test_hf_missing_required_key_is_named(key):
    cfg = _llama_dict()
    del cfg[key]
    with pytest.raises(InvalidInputError) as ei:
        from_hf_config(cfg)
    assert key in str(ei.value) and "supported model types" in str(ei.value)


def test_hf_missing_top_k_for_moe():
    cfg = json.loads((HF_DIR / "mixtral-8x7b.json").read_text())
    del cfg["num_experts_per_tok"]
    with pytest.raises(InvalidInputError, match="num_experts_per_tok"):
        from_hf_config(cfg)


def test_hf_bad_values_and_files(tmp_path):
    with pytest.raises(InvalidInputError, match="num_hidden_layers"):
        from_hf_config(_llama_dict(num_hidden_layers="32"))
    bad = tmp_path / "config.json"
    bad.write_text("not json {")
    with pytest.raises(InvalidInputError) as ei:
        from_hf_config(bad)
    assert str(bad) in str(ei.value)
    bad.write_text("[1, 2]")
    with pytest.raises(InvalidInputError, match="JSON object"):
        from_hf_config(bad)
    with pytest.raises(InvalidInputError, match="config_path"):
        from_hf_config(tmp_path / "missing.json")


# ---- resolve_model ------------------------------------------------------------------------

def test_resolve_model_preset_and_path():
    assert resolve_model("llama3-8b") is get_preset("llama3-8b")
    assert resolve_model("llama3-8b", seq_len=4096).seq_len == 4096
    assert get_preset("llama3-8b").seq_len == 8192  # registry untouched
    spec = resolve_model(str(HF_DIR / "mixtral-8x7b.json"), seq_len=1024)
    assert spec.seq_len == 1024 and spec.moe.experts == 8


def test_resolve_model_errors():
    with pytest.raises(InvalidInputError) as ei:
        resolve_model("nope")
    assert "llama3-8b" in str(ei.value) and ".json" in str(ei.value)
    with pytest.raises(InvalidInputError):
        resolve_model("llama3-8b", seq_len=0)


def test_workload_imports_stay_light():
    code = ("import sys, simulator.workload; "
            "bad = [m for m in ('torch', 'hardware_db', 'calibrate', 'transformers') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()))
    assert out.returncode == 0, out.stdout + out.stderr
