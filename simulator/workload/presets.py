"""Built-in model specs, each with the source of its numbers.

Conventions shared by every preset:

* ``seq_len`` is the *pre-training* sequence length reported by the source, not the
  longest context the released checkpoint accepts (that is what ``max_position_embeddings``
  in a ``config.json`` usually says).
* ``ffn_hidden`` is the dense FFN width (per gate for SwiGLU). For MoE models where every
  layer is sparse it is the ``intermediate_size`` of the config and does not enter the
  parameter count.
* Biases, learned position embeddings and attention sinks are not counted by
  ``TransformerSpec``; they are below 1% of any preset here. ``norm``, ``position`` and
  the bias flags are recorded (launch arguments need them).
"""
from __future__ import annotations

import re

from ..errors import InvalidInputError
from .spec import MLP, MLASpec, MoESpec, Norm, Position, TransformerSpec

_GPT2_BPE = "vocab 50257 = GPT-2 BPE (Radford et al. 2019); Megatron-LM runs pad it to 51200"

# Llama-family facts shared by the RoPE / RMSNorm / bias-free decoders below
# transformers' code of these families: one Linear each for q, k, v and for gate, up
_LLAMA_STYLE = {"norm": Norm.RMSNORM, "position": Position.ROPE, "linear_bias": False,
                "split_qkv": True, "split_gate_up": True}


def _dense_gpt() -> list[TransformerSpec]:
    return [
        TransformerSpec(
            "gpt3-175b", n_layers=96, hidden=12288, ffn_hidden=4 * 12288, n_heads=96,
            n_kv_heads=96, vocab=50257, seq_len=2048, mlp=MLP.GELU, tied_embeddings=True,
            source="Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 "
                   f"(96 layers, d_model 12288, 96 heads, n_ctx 2048); {_GPT2_BPE}; "
                   "input/output embeddings tied as in GPT-2"),
        TransformerSpec(
            "bloom-176b", n_layers=70, hidden=14336, ffn_hidden=4 * 14336, n_heads=112,
            n_kv_heads=112, vocab=250880, seq_len=2048, mlp=MLP.GELU, tied_embeddings=True,
            position=Position.ALIBI, split_qkv=False, act_fn="bloom_gelu",
            source="bigscience/bloom config.json (n_layer 70, hidden_size 14336, n_head 112, "
                   "vocab_size 250880); Le Scao et al. 2022 (BLOOM) Table 3, seq 2048; "
                   "transformers' BloomGelu under eager HF code"),
        TransformerSpec(
            "mt-nlg-530b", n_layers=105, hidden=20480, ffn_hidden=4 * 20480, n_heads=128,
            n_kv_heads=128, vocab=50257, seq_len=2048, mlp=MLP.GELU, tied_embeddings=True,
            source="Smith et al. 2022, 'Using DeepSpeed and Megatron to Train Megatron-Turing "
                   "NLG 530B' Sec. 3 (105 layers, hidden 20480, 128 heads, seq 2048); "
                   f"{_GPT2_BPE}"),
        TransformerSpec(
            "nemotron4-340b", n_layers=96, hidden=18432, ffn_hidden=73728, n_heads=96,
            n_kv_heads=8, vocab=256000, seq_len=4096, mlp=MLP.RELU2,
            position=Position.ROPE, linear_bias=False,
            source="NVIDIA 2024, 'Nemotron-4 340B Technical Report' Table 1 (96 layers, "
                   "hidden 18432, 96 heads, 8 KV heads, seq 4096, vocab 256000, squared ReLU, "
                   "untied embeddings); ffn 73728 = 4h per nvidia/Nemotron-4-340B-Base config"),
    ]


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, kv: int,
           vocab: int, seq: int, source: str) -> TransformerSpec:
    return TransformerSpec(name, n_layers=layers, hidden=hidden, ffn_hidden=ffn,
                           n_heads=heads, n_kv_heads=kv, vocab=vocab, seq_len=seq,
                           mlp=MLP.SWIGLU, tied_embeddings=False, source=source, **_LLAMA_STYLE)


def _dense_llama() -> list[TransformerSpec]:
    l2 = "Touvron et al. 2023 (Llama 2) Table 1: context 4096, GQA on 70B only"
    l3 = "Dubey et al. 2024 (Llama 3 Herd of Models) Table 3: GQA 8 KV heads, pretrain seq 8192"
    return [
        _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096,
               f"meta-llama/Llama-2-7b-hf config.json; {l2}"),
        _llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096,
               f"meta-llama/Llama-2-13b-hf config.json; {l2}"),
        _llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096,
               f"meta-llama/Llama-2-70b-hf config.json; {l2}"),
        _llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192,
               f"meta-llama/Meta-Llama-3-8B config.json; {l3}"),
        _llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192,
               f"meta-llama/Meta-Llama-3-70B config.json; {l3}"),
        _llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8192,
               f"meta-llama/Llama-3.1-405B config.json; {l3} (405B row: 126 layers, "
               "d_model 16384, ffn 53248, 128 heads)"),
    ]


def _moe_mixtral_qwen() -> list[TransformerSpec]:
    qwen = "Yang et al. 2025 (Qwen3 Technical Report) Table 2; no shared experts; head_dim " \
           "128 != hidden/heads; pretrain stage-1 seq 4096"
    return [
        TransformerSpec(
            "mixtral-8x7b", n_layers=32, hidden=4096, ffn_hidden=14336, n_heads=32,
            n_kv_heads=8, vocab=32000, seq_len=4096, mlp=MLP.SWIGLU,
            moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=14336, aux_loss_coeff=0.02),
            **_LLAMA_STYLE,
            source="mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024 (Mixtral of "
                   "Experts) Table 1; seq_len 4096 chosen here (config allows 32768)"),
        TransformerSpec(
            "qwen3-30b-a3b", n_layers=48, hidden=2048, ffn_hidden=6144, n_heads=32,
            n_kv_heads=4, head_dim=128, vocab=151936, seq_len=4096, mlp=MLP.SWIGLU,
            moe=MoESpec(experts=128, top_k=8, expert_ffn_hidden=768, aux_loss_coeff=0.001),
            **_LLAMA_STYLE,
            extra_norm_params=2 * 128, qk_norm=True,    # QK-norm: q_norm + k_norm (head_dim)
            source=f"Qwen/Qwen3-30B-A3B config.json; {qwen}"),
        TransformerSpec(
            "qwen3-235b-a22b", n_layers=94, hidden=4096, ffn_hidden=12288, n_heads=64,
            n_kv_heads=4, head_dim=128, vocab=151936, seq_len=4096, mlp=MLP.SWIGLU,
            moe=MoESpec(experts=128, top_k=8, expert_ffn_hidden=1536, aux_loss_coeff=0.001),
            **_LLAMA_STYLE,
            extra_norm_params=2 * 128, qk_norm=True,
            source=f"Qwen/Qwen3-235B-A22B config.json; {qwen}"),
    ]


def _moe_deepseek_oss() -> list[TransformerSpec]:
    return [
        TransformerSpec(
            "deepseek-v3", n_layers=61, hidden=7168, ffn_hidden=18432, n_heads=128,
            n_kv_heads=128, head_dim=128, vocab=129280, seq_len=4096, mlp=MLP.SWIGLU,
            moe=MoESpec(experts=256, top_k=8, expert_ffn_hidden=2048, shared_experts=1,
                        dense_layers=3, router_score="sigmoid", router_expert_bias=True,
                        router_topk_scale=2.5, router_groups=8, router_group_topk=4),
            mla=MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, q_lora_rank=1536), qk_norm=True, mtp_layers=1,
            **_LLAMA_STYLE,
            source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-AI 2024 (DeepSeek-V3 "
                   "Technical Report, arXiv:2412.19437) Sec. 4.2: MLA (q_lora 1536, kv_lora "
                   "512, qk 128+64, v 128), 256 routed + 1 shared experts, first 3 layers "
                   "dense, sigmoid router with expert bias (aux-loss-free), routed scaling 2.5, "
                   "8 groups / top-4; pretrain seq 4096; 671B total / 37B active, the MTP "
                   "module excluded from total_params as in the 671B figure (Sec. 2.2: one "
                   "MTP module, D = 1, trained with the model; its 14B include embedding "
                   "and head copies shared in training) and counted in memory and work"),
        TransformerSpec(
            "deepseek-v2", n_layers=60, hidden=5120, ffn_hidden=12288, n_heads=128,
            n_kv_heads=128, head_dim=128, vocab=102400, seq_len=4096, mlp=MLP.SWIGLU,
            moe=MoESpec(experts=160, top_k=6, expert_ffn_hidden=1536, shared_experts=2,
                        dense_layers=1, router_groups=8, router_group_topk=3,
                        aux_loss_coeff=0.003),
            mla=MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, q_lora_rank=1536), qk_norm=True, **_LLAMA_STYLE,
            source="deepseek-ai/DeepSeek-V2 config.json; DeepSeek-AI 2024 (DeepSeek-V2, "
                   "arXiv:2405.04434) Sec. 3.1.2: 60 layers, hidden 5120, 128 heads, MLA "
                   "(q_lora 1536, kv_lora 512, qk 128+64, v 128), 2 shared + 160 routed "
                   "experts (6 active), first layer dense, device-limited routing (3 of 8 groups), "
                   "expert-level balance factor 0.003; 236B total / 21B active"),
        TransformerSpec(
            "gpt-oss-120b", n_layers=36, hidden=2880, ffn_hidden=2880, n_heads=64,
            n_kv_heads=8, head_dim=64, vocab=201088, seq_len=4096, mlp=MLP.SWIGLU,
            moe=MoESpec(experts=128, top_k=4, expert_ffn_hidden=2880),
            norm=Norm.RMSNORM, position=Position.ROPE, linear_bias=True,
            source="openai/gpt-oss-120b config.json; OpenAI 2025 gpt-oss model card Table 1 "
                   "(116.8B total, 5.1B active excluding the input embedding); seq 4096 = "
                   "initial_context_length; alternating sliding-window attention, biases "
                   "and sinks not modelled"),
    ]


def _gemma() -> list[TransformerSpec]:
    return [
        TransformerSpec(
            "gemma2-9b", n_layers=42, hidden=3584, ffn_hidden=14336, n_heads=16,
            n_kv_heads=8, head_dim=256, vocab=256000, seq_len=8192, mlp=MLP.SWIGLU,
            tied_embeddings=True, window=4096, global_every=2, **_LLAMA_STYLE,
            extra_norm_params=2 * 3584, post_mlp_norm=True, sandwich_norms=True,
            attn_logit_softcap=50.0,
            final_logit_softcap=30.0,
            source="google/gemma-2-9b config.json; Gemma Team 2024 (Gemma 2, "
                   "arXiv:2408.00118) Tables 1-2: 42 layers, d_model 3584, 16 heads / 8 KV "
                   "heads of 256, GeGLU 14336 (3 GEMMs), local 4096-token sliding window "
                   "alternating with global layers, logit soft caps 50 / 30, pre+post norms, "
                   "seq 8192; 8,324,201,984 non-embedding + 917,504,000 embedding params"),
    ]


def _small() -> list[TransformerSpec]:
    src = "synthetic, for CPU tests"
    return [
        TransformerSpec("tiny-2l-128", n_layers=2, hidden=128, ffn_hidden=512, n_heads=4,
                        n_kv_heads=4, vocab=1024, seq_len=128, source=src),
        TransformerSpec("small-4l-256", n_layers=4, hidden=256, ffn_hidden=1024, n_heads=4,
                        n_kv_heads=4, vocab=4096, seq_len=256, source=src),
        TransformerSpec("small-6l-512", n_layers=6, hidden=512, ffn_hidden=2048, n_heads=8,
                        n_kv_heads=8, vocab=8192, seq_len=512, source=src),
        TransformerSpec("tiny-moe-2l-128", n_layers=2, hidden=128, ffn_hidden=512, n_heads=4,
                        n_kv_heads=2, vocab=1024, seq_len=128, mlp=MLP.SWIGLU,
                        moe=MoESpec(experts=4, top_k=2, expert_ffn_hidden=256,
                                    shared_experts=1, dense_layers=1), source=src),
        TransformerSpec("gpt2-124m", n_layers=12, hidden=768, ffn_hidden=3072, n_heads=12,
                        n_kv_heads=12, vocab=50257, seq_len=1024, mlp=MLP.GELU,
                        tied_embeddings=True,
                        split_qkv=False, act_fn="gelu_new", hidden_dropout=0.1,
                        source="openai-community/gpt2 config.json (activation_function "
                               "gelu_new, resid_pdrop 0.1); Radford et al. 2019"),
    ]


def _build() -> dict[str, TransformerSpec]:
    specs = _dense_gpt() + _dense_llama() + _moe_mixtral_qwen() + _moe_deepseek_oss() + \
        _gemma() + _small()
    return {s.name: s for s in specs}


PRESETS: dict[str, TransformerSpec] = _build()


def list_presets() -> list[str]:
    """Names of the built-in models, sorted."""
    return sorted(PRESETS)


# Other names of a preset's architecture (keys in ``preset_key`` form). Llama 3.1 8B and
# 70B have Llama 3's dimensions (their config.json files differ in rope_scaling and
# max_position_embeddings, which change no FLOPs); the 405B exists only as 3.1.
_ALIASES = {"llama318b": "llama3-8b", "llama3170b": "llama3-70b", "llama31405b": "llama3-405b",
            "gpt3": "gpt3-175b", "gpt2": "gpt2-124m",
            "gpt2small": "gpt2-124m", "bloom": "bloom-176b", "mtnlg": "mt-nlg-530b",
            "megatronturingnlg530b": "mt-nlg-530b"}
# words of a checkpoint's name that do not change the architecture
_DROPPED_WORDS = ("hf", "base", "instruct", "chat", "v0.1", "v01", "meta")


def preset_key(name: str) -> str:
    """``name`` reduced to compare model names: the part after a hub organisation
    (``meta-llama/``), lower case, without the words in ``_DROPPED_WORDS`` (``-hf``,
    ``-Instruct``, ``Meta-``) and without separators (``-``, ``_``, ``.``, spaces):
    ``meta-llama/Meta-Llama-3-8B`` and ``llama3-8b`` both give ``llama38b``."""
    words = re.split(r"[-_ ]+", str(name).strip().lower().rsplit("/", 1)[-1])
    kept = "".join(w for w in words if w and w not in _DROPPED_WORDS)
    return kept.replace(".", "")


def find_preset(name: str) -> TransformerSpec | None:
    """The built-in spec ``name`` stands for (exactly, or under ``preset_key`` and the
    aliases), else None."""
    if not isinstance(name, str):
        return None
    if name in PRESETS:
        return PRESETS[name]
    key = preset_key(name)
    if key in _ALIASES:
        return PRESETS[_ALIASES[key]]
    return _BY_KEY.get(key)


_BY_KEY = {preset_key(k): v for k, v in PRESETS.items()}


def get_preset(name: str) -> TransformerSpec:
    """The built-in spec called ``name`` (any spelling ``find_preset`` reads); raises
    InvalidInputError for unknown names."""
    spec = find_preset(name)
    if spec is None:
        raise InvalidInputError("model", name, "one of: " + ", ".join(list_presets()))
    return spec
