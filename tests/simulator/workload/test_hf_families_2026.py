"""MPT, BLOOM, GPTBigCode, OPT, GPT-J, OLMo, OLMoE, Cohere, DBRX, Phi and StableLM configs
read as transformers 5.24 builds them (see ``hf_families``' docstring for the rule each
follows).

Two checks per family. (1) Against the real module: the transformers model class is built
on the meta device (no weights, no download) for a small config and for the released
config, and its parameters are summed. The spec counts no biases and no learned position
table, counts two norms a layer (a parallel block has one; OLMo's LayerNorm has no weights)
and not BLOOM's word-embedding LayerNorm: ``_NORM_DELTA`` says by how much, so the
comparison is exact. (2) Against the published total (and active) count, within the
tolerance given per row (rounded figures get 2 %).

``RELEASED`` holds the sizing fields of the public config.json of each checkpoint named
in its comment, transcribed by hand (the Hub is not reachable from this machine).
"""
from __future__ import annotations

import pytest

from simulator.errors import InvalidInputError, UnsupportedError
from simulator.workload.hf import SUPPORTED_MODEL_TYPES, from_hf_config
from simulator.workload.spec import MLP, Norm, Position

NEW = ("mpt", "bloom", "gpt_bigcode", "opt", "gptj", "olmo", "olmoe", "cohere", "dbrx", "phi",
       "stablelm")

RELEASED = {
    # mosaicml/mpt-7b
    "mpt-7b": {"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
               "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True,
               "attn_config": {"alibi": True, "attn_type": "multihead_attention",
                               "clip_qkv": None, "qk_ln": False}},
    # bigscience/bloom (176B)
    "bloom": {"model_type": "bloom", "hidden_size": 14336, "n_layer": 70, "n_head": 112,
              "vocab_size": 250880, "n_inner": None},
    # bigcode/starcoder
    "starcoder": {"model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40, "n_head": 48,
                  "n_inner": 24576, "n_positions": 8192, "vocab_size": 49152,
                  "multi_query": True, "activation_function": "gelu_pytorch_tanh",
                  "bos_token_id": 0, "eos_token_id": 0},
    # facebook/opt-6.7b
    "opt-6.7b": {"model_type": "opt", "hidden_size": 4096, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "ffn_dim": 16384, "max_position_embeddings": 2048,
                 "vocab_size": 50272, "word_embed_proj_dim": 4096, "do_layer_norm_before": True,
                 "activation_function": "relu", "enable_bias": True},
    # EleutherAI/gpt-j-6b
    "gpt-j-6b": {"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16,
                 "rotary_dim": 64, "n_positions": 2048, "vocab_size": 50400, "n_inner": None,
                 "activation_function": "gelu_new", "tie_word_embeddings": False},
    # allenai/OLMo-7B-hf
    "olmo-7b": {"model_type": "olmo", "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                "vocab_size": 50304, "max_position_embeddings": 2048, "clip_qkv": None,
                "hidden_act": "silu", "tie_word_embeddings": False},
    # allenai/OLMoE-1B-7B-0924
    "olmoe-1b-7b": {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
                    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "num_experts": 64, "num_experts_per_tok": 8, "vocab_size": 50304,
                    "max_position_embeddings": 4096, "hidden_act": "silu",
                    "tie_word_embeddings": False},
    # databricks/dbrx-base
    "dbrx": {"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
             "max_seq_len": 32768, "vocab_size": 100352, "tie_word_embeddings": False,
             "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
             "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4,
                            "moe_loss_weight": 0.05, "ffn_act_fn": {"name": "silu"}}},
    # CohereForAI/c4ai-command-r-v01
    "command-r": {"model_type": "cohere", "hidden_size": 8192, "intermediate_size": 22528,
                  "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 64,
                  "vocab_size": 256000, "max_position_embeddings": 8192, "logit_scale": 0.0625,
                  "use_qk_norm": False, "hidden_act": "silu", "tie_word_embeddings": True},
    # microsoft/phi-2
    "phi-2": {"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "vocab_size": 51200, "max_position_embeddings": 2048,
              "partial_rotary_factor": 0.4, "qk_layernorm": False, "hidden_act": "gelu_new",
              "tie_word_embeddings": False},
    # stabilityai/stablelm-2-1_6b
    "stablelm-2-1.6b": {"model_type": "stablelm", "hidden_size": 2048,
                        "intermediate_size": 5632, "num_hidden_layers": 24,
                        "num_attention_heads": 32, "num_key_value_heads": 32,
                        "vocab_size": 100352, "max_position_embeddings": 4096,
                        "partial_rotary_factor": 0.25, "use_qkv_bias": True,
                        "qk_layernorm": False, "use_parallel_residual": False,
                        "hidden_act": "silu", "tie_word_embeddings": False},
}

# (released config, published total, published active or None, tolerance, where)
PUBLISHED = [
    ("mpt-7b", 6.7e9, None, 0.01, "MosaicML MPT-7B card: 6.7B"),
    ("bloom", 176_247_271_424, None, 0.005, "bigscience/bloom card: 176,247,271,424"),
    ("starcoder", 15.5e9, None, 0.01, "StarCoder paper (arXiv:2305.06161): 15.5B"),
    ("opt-6.7b", 6.7e9, None, 0.01, "OPT paper (arXiv:2205.01068) Table 1: 6.7B"),
    ("gpt-j-6b", 6_053_381_344, None, 0.005, "EleutherAI/gpt-j-6b card: 6,053,381,344"),
    ("olmo-7b", 7e9, None, 0.02, "OLMo paper (arXiv:2402.00838): 7B"),
    ("olmoe-1b-7b", 6.9e9, 1.3e9, 0.02, "OLMoE paper (arXiv:2409.02060): 6.9B, 1.3B active"),
    ("dbrx", 132e9, 36e9, 0.02, "Databricks DBRX card: 132B total, 36B active"),
    ("command-r", 35e9, None, 0.01, "c4ai-command-r-v01 card: 35B"),
    ("phi-2", 2.78e9, None, 0.01, "microsoft/phi-2 Hub count 2.78B (the card rounds to 2.7B)"),
    ("stablelm-2-1.6b", 1_644_417_024, None, 0.01,
     "StableLM 2 1.6B report (arXiv:2402.17834): 1,644,417,024"),
]


def _norm_delta(cfg: dict, spec) -> int:
    """Spec norm weights minus the module's: one norm a layer in a parallel block (GPT-J,
    Phi, Cohere, StableLM ``use_parallel_residual``), no norm weights at all (OLMo's
    ``OlmoLayerNorm``), BLOOM's word-embedding LayerNorm (not in the spec)."""
    mt, h, n = cfg["model_type"], spec.hidden, spec.n_layers
    if mt in ("gptj", "phi", "cohere") or (mt == "stablelm" and cfg.get("use_parallel_residual")):
        return n * h
    return {"olmo": (2 * n + 1) * h, "bloom": -h}.get(mt, 0)


def _module_params(cfg: dict) -> int:
    """Parameters of the transformers causal-LM module of ``cfg`` (built on the meta device)
    that the spec counts: all but biases and learned position tables."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    conf = transformers.AutoConfig.for_model(cfg["model_type"], **kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf)
    return sum(p.numel() for name, p in model.named_parameters()
               if not name.endswith(".bias")
               and not name.endswith(("wpe.weight", "embed_positions.weight")))


def _small(mt: str, **over) -> dict:
    """A small config of the family as its HF config class writes it (``to_diff_dict``,
    what ``save_pretrained`` stores), with nested configs as plain dicts."""
    transformers = pytest.importorskip("transformers")
    common = {"vocab_size": 512}
    sizes = {
        "mpt": dict(d_model=128, n_heads=4, n_layers=3, max_seq_len=256),
        "dbrx": dict(d_model=128, n_heads=4, n_layers=3, max_seq_len=256,
                     attn_config={"kv_n_heads": 2, "rope_theta": 10000},  # DbrxAttention reads it
                     ffn_config={"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2}),
        "bloom": dict(hidden_size=128, n_layer=3, n_head=4),
        "gpt_bigcode": dict(n_embd=128, n_layer=3, n_head=4, n_positions=256, bos_token_id=0,
                            eos_token_id=0),
        "gptj": dict(n_embd=128, n_layer=3, n_head=4, rotary_dim=16, n_positions=256,
                     bos_token_id=0, eos_token_id=0),
        "opt": dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, ffn_dim=320,
                    max_position_embeddings=256),
    }.get(mt, dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=192, max_position_embeddings=256))
    if mt == "olmoe":
        sizes.update(num_experts=4, num_experts_per_tok=2)
    if mt in ("phi", "stablelm"):
        sizes.update(bos_token_id=0, eos_token_id=0)
    conf = transformers.AutoConfig.for_model(mt, **{**common, **sizes, **over})
    return {**conf.to_diff_dict(), "model_type": mt}


SMALL_CASES = [(mt, {}) for mt in NEW] + [
    ("gpt_bigcode", {"multi_query": False}), ("gpt_bigcode", {"n_inner": 200}),
    ("gptj", {"n_inner": 200, "tie_word_embeddings": True}),
    ("cohere", {"use_qk_norm": True}), ("cohere", {"tie_word_embeddings": False}),
    ("phi", {"qk_layernorm": True}), ("stablelm", {"qk_layernorm": True}),
    ("stablelm", {"use_parallel_residual": True, "use_qkv_bias": True}),
    ("opt", {"enable_bias": False}), ("olmo", {"tie_word_embeddings": True}),
]


@pytest.mark.parametrize("mt, over", SMALL_CASES,
                         ids=[f"{mt}-{'-'.join(o) or 'default'}" for mt, o in SMALL_CASES])
def test_small_config_counts_the_real_modules_parameters(mt, over):
    cfg = _small(mt, **over)
    spec = from_hf_config(cfg)
    assert spec.total_params() == _module_params(cfg) + _norm_delta(cfg, spec)


@pytest.mark.parametrize("name", list(RELEASED))
def test_released_config_counts_the_real_modules_parameters(name):
    cfg = RELEASED[name]
    spec = from_hf_config(cfg)
    assert spec.total_params() == _module_params(cfg) + _norm_delta(cfg, spec)


@pytest.mark.parametrize("name, total, active, tol, where", PUBLISHED,
                         ids=[r[0] for r in PUBLISHED])
def test_released_config_matches_published_count(name, total, active, tol, where):
    spec = from_hf_config(RELEASED[name])
    assert abs(spec.total_params() / total - 1) <= tol, f"{spec.total_params():,} vs {where}"
    if active is not None:
        assert abs(spec.active_params() / active - 1) <= tol, \
            f"{spec.active_params():,} active vs {where}"


# (config, MLP, norm, position, linear biases, tied, KV heads)
READINGS = [
    ("mpt-7b", MLP.GELU, Norm.LAYERNORM, Position.ALIBI, False, True, 32),
    ("bloom", MLP.GELU, Norm.LAYERNORM, Position.ALIBI, True, True, 112),
    ("starcoder", MLP.GELU, Norm.LAYERNORM, Position.LEARNED, True, True, 1),
    ("opt-6.7b", MLP.GELU, Norm.LAYERNORM, Position.LEARNED, True, True, 32),
    ("gpt-j-6b", MLP.GELU, Norm.LAYERNORM, Position.ROPE, True, False, 16),
    ("olmo-7b", MLP.SWIGLU, Norm.LAYERNORM, Position.ROPE, False, False, 32),
    ("olmoe-1b-7b", MLP.SWIGLU, Norm.RMSNORM, Position.ROPE, False, False, 16),
    ("dbrx", MLP.SWIGLU, Norm.LAYERNORM, Position.ROPE, False, False, 8),
    ("command-r", MLP.SWIGLU, Norm.LAYERNORM, Position.ROPE, False, True, 64),
    ("phi-2", MLP.GELU, Norm.LAYERNORM, Position.ROPE, True, False, 32),
    ("stablelm-2-1.6b", MLP.SWIGLU, Norm.LAYERNORM, Position.ROPE, False, False, 32),
]


@pytest.mark.parametrize("name, mlp, norm, pos, bias, tied, kv", READINGS,
                         ids=[r[0] for r in READINGS])
def test_family_readings(name, mlp, norm, pos, bias, tied, kv):
    s = from_hf_config(RELEASED[name])
    assert RELEASED[name]["model_type"] in SUPPORTED_MODEL_TYPES
    assert (s.mlp, s.norm, s.position, s.linear_bias, s.tied_embeddings, s.n_kv_heads) == \
        (mlp, norm, pos, bias, tied, kv)


def test_moe_layouts_and_sequence_lengths():
    dbrx, olmoe = from_hf_config(RELEASED["dbrx"]), from_hf_config(RELEASED["olmoe-1b-7b"])
    assert (dbrx.moe.experts, dbrx.moe.top_k, dbrx.moe.expert_ffn_hidden) == (16, 4, 10752)
    assert dbrx.n_moe_layers() == 40 and dbrx.moe.aux_loss_coeff == 0.05
    assert dbrx.seq_len == 8192 and "max_seq_len=32768" in dbrx.source   # capped
    assert (olmoe.moe.experts, olmoe.moe.top_k, olmoe.n_moe_layers()) == (64, 8, 16)
    assert olmoe.qk_norm and olmoe.extra_norm_params == (16 + 16) * 128
    assert from_hf_config(RELEASED["mpt-7b"]).seq_len == 2048
    bloom = from_hf_config(RELEASED["bloom"])     # BloomConfig has no position limit (ALiBi)
    assert bloom.seq_len == 2048 and "BLOOM's training" in bloom.source
    assert bloom.ffn_hidden == 4 * 14336


def test_alias_keys_and_defaults():
    # BloomConfig: n_embed overrides hidden_size; num_hidden_layers is n_layer's alias
    b = from_hf_config({"model_type": "bloom", "n_embed": 1024, "hidden_size": 64,
                        "num_hidden_layers": 24, "num_attention_heads": 16, "vocab_size": 250880})
    assert (b.hidden, b.n_layers, b.n_heads, b.ffn_hidden) == (1024, 24, 16, 4096)
    mpt = {**RELEASED["mpt-7b"], "attn_config": {"alibi": False}, "expansion_ratio": 2}
    s = from_hf_config(mpt)
    assert s.position == Position.LEARNED and s.ffn_hidden == 2 * 4096
    mq = {**RELEASED["mpt-7b"], "attn_config": {"attn_type": "multiquery_attention"}}
    assert from_hf_config(mq).n_kv_heads == 1
    sc = {k: v for k, v in RELEASED["starcoder"].items() if k not in ("multi_query", "n_inner")}
    s = from_hf_config(sc)                          # GPTBigCodeConfig defaults: MQA, 4h
    assert s.n_kv_heads == 1 and s.ffn_hidden == 4 * 6144
    assert from_hf_config({**sc, "multi_query": False}).n_kv_heads == 48
    gj = from_hf_config(RELEASED["gpt-j-6b"])
    assert gj.ffn_hidden == 4 * 4096 and not gj.qkv_bias
    assert from_hf_config(RELEASED["stablelm-2-1.6b"]).qkv_bias


def test_opt_with_a_narrower_word_embedding_is_refused():
    # facebook/opt-350m: hidden 1024, word_embed_proj_dim 512 (project_in / project_out)
    cfg = {**RELEASED["opt-6.7b"], "hidden_size": 1024, "num_attention_heads": 16,
           "num_hidden_layers": 24, "ffn_dim": 4096, "word_embed_proj_dim": 512}
    with pytest.raises(UnsupportedError, match="word_embed_proj_dim"):
        from_hf_config(cfg)


def test_bad_nested_values_and_unknown_types_name_the_key():
    with pytest.raises(InvalidInputError, match="ffn_config.moe_top_k"):
        from_hf_config({**RELEASED["dbrx"], "ffn_config": {"moe_top_k": "four"}})
    with pytest.raises(InvalidInputError, match="attn_config.kv_n_heads"):
        from_hf_config({**RELEASED["dbrx"], "attn_config": {"kv_n_heads": 0}})
    with pytest.raises(InvalidInputError) as e:
        from_hf_config({**RELEASED["phi-2"], "model_type": "t5"})
    for mt in SUPPORTED_MODEL_TYPES:
        assert mt in str(e.value)
    assert set(NEW) <= set(SUPPORTED_MODEL_TYPES)
