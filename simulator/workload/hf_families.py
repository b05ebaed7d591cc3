"""Family-specific readings of a HuggingFace ``config.json`` (used by ``hf``).

Each function reads the keys one family uses for one aspect of the architecture and
returns spec fields; the HF modelling code each rule follows is named in its docstring.

* attention: GQA heads, or DeepSeek MLA with its real projection shapes (``MLASpec``);
* local attention: Gemma 2 alternates sliding-window and global layers
  (``Gemma2DecoderLayer``: even layers slide), Gemma 3 makes every
  ``sliding_window_pattern``-th layer global, newer configs list ``layer_types``;
* MoE layout: DeepSeek ``first_k_dense_replace`` + ``moe_layer_freq`` (``layer >= k and
  layer % freq == 0``), Qwen ``decoder_sparse_step`` + ``mlp_only_layers`` (``(layer + 1) %
  step == 0 and layer not in mlp_only_layers``);
* family facts that change no FLOPs but a launch configuration needs: norm, position
  embedding, linear biases, QK-norm / sandwich-norm weights, logit soft caps. OLMo 2 norms
  the whole Q and K projections (``Olmo2Attention.q_norm`` over heads x head_dim) and its
  residual branches after the sublayer; Granite is Llama with scaling multipliers; Phi-3
  fuses QKV and gate/up (same shapes); StarCoder2 is a plain GELU MLP with LayerNorm and
  biases (``use_bias``, tied embeddings by default); transformers 5.24 modeling files.
* older and other families (``canonical`` maps their keys as each HF config class's
  ``attribute_map`` / ``__post_init__`` does; ``family_fields`` reads their facts):
  MPT (``MptBlock``: ``d_model``/``n_heads``/``n_layers``, plain GELU MLP of
  ``expansion_ratio * d_model`` -- ``MptMLP`` hard-codes 4, every release has 4 --,
  bias-free LayerNorm, ALiBi unless ``attn_config.alibi`` is false, tied embeddings);
  BLOOM (``BloomBlock``: ``n_layer``/``n_head``, ``n_embed`` wins over ``hidden_size``,
  ``BloomMLP`` is 4h whatever ``n_inner`` says, ALiBi, biases; the word-embedding
  LayerNorm's h weights are not counted); GPTBigCode (StarCoder 1 / SantaCoder:
  ``multi_query`` (default true) is one KV head, ``n_inner`` or 4h, learned positions);
  OPT (``ffn_dim``, ReLU MLP, learned positions, ``enable_bias``; a ``word_embed_proj_dim``
  other than ``hidden_size`` -- OPT-350m's project_in/out -- is refused); GPT-J
  (``GPTJBlock``: one LayerNorm, attention and MLP in parallel, partial ``rotary_dim``,
  bias-free attention, biased MLP); Phi-1/2 (``PhiDecoderLayer``: the same parallel block,
  ``partial_rotary_factor``, biases, optional ``qk_layernorm`` of head_dim weights);
  OLMo 1 (Llama with non-parametric ``OlmoLayerNorm``: 2h+h norm weights counted that the
  model has not, ``clip_qkv``); OLMoE (``OlmoeAttention``: RMSNorm over the whole Q and K
  projections, every layer MoE); Cohere / Command-R (``CohereDecoderLayer``: one bias-free
  LayerNorm, parallel block, gated MLP, ``use_qk_norm`` of (heads + kv) x head_dim weights,
  tied embeddings, ``logit_scale`` no FLOPs); DBRX (``DbrxBlock``: ``attn_config.kv_n_heads``,
  ``ffn_config.moe_num_experts`` / ``moe_top_k`` / ``ffn_hidden_size`` gated experts in
  every layer, bias-free LayerNorm); StableLM (``StableLmDecoderLayer``: gated MLP,
  LayerNorm, ``partial_rotary_factor``, ``use_qkv_bias``, per-head ``qk_layernorm``).
  A parallel attention+MLP block (GPT-J, Phi, Cohere, as Falcon and GPT-NeoX before them)
  has the FLOPs of a sequential one; its single norm is counted as two (h weights a layer).
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import InvalidInputError, UnsupportedError
from .spec import MLASpec, Norm, Position

GEMMA = ("gemma2", "gemma3", "gemma3_text")
DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_QK_NORM = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")   # q_norm, k_norm of head_dim
# Families whose config carries no position limit (ALiBi or rotary only): their
# pre-training sequence length (FalconConfig's default; BLOOM paper, arXiv:2211.05100).
TRAIN_SEQ_LEN = {"falcon": (2048, "FalconConfig default"), "bloom": (2048, "BLOOM's training")}
_LAYERNORM = ("gpt2", "gpt_neox", "falcon", "starcoder2", "nemotron", "mpt", "bloom",
              "gpt_bigcode", "opt", "gptj", "olmo", "cohere", "dbrx", "phi", "stablelm")
_LEARNED = ("gpt2", "gpt_bigcode", "opt")
_ALL_BIASED = ("gpt2", "gpt_neox", "bloom", "gpt_bigcode", "gptj", "phi")
# transformers 5.24 modeling code with one Linear for q, k and v together (GPT2Attention
# c_attn, BloomAttention / GPTNeoXAttention / FalconAttention query_key_value, MptAttention
# Wqkv, GPTBigCodeAttention c_attn, Phi3Attention qkv_proj, DbrxAttention Wqkv) and for a
# SwiGLU's gate and up together (Phi3MLP gate_up_proj); every other family has one each
_FUSED_QKV = ("gpt2", "gpt_bigcode", "gpt_neox", "bloom", "falcon", "mpt", "phi3", "dbrx")
_FUSED_GATE_UP = ("phi3",)
# (key, default) of a config switch for every linear bias; MPT's ``no_bias`` is inverted
_BIAS_SWITCH = {"falcon": ("bias", False), "starcoder2": ("use_bias", True),
                "opt": ("enable_bias", True)}


# (config key, its config class's default) of the dropout transformers 5.24's code applies
# to the attention and MLP outputs before each residual add (two per layer; counted on its
# modules, with the key at 0.5 and every other dropout 0, in
# tests/simulator/workload/test_gpt2_eager.py); families not listed have none or are not
# read (Falcon, StableLM: one per layer; MPT: none)
HIDDEN_DROPOUT = {"gpt2": ("resid_pdrop", 0.1), "gpt_bigcode": ("resid_pdrop", 0.1),
                  "gptj": ("resid_pdrop", 0.0), "phi": ("resid_pdrop", 0.0),
                  "phi3": ("resid_pdrop", 0.0), "opt": ("dropout", 0.1),
                  "bloom": ("hidden_dropout", 0.0), "gpt_neox": ("hidden_dropout", 0.0),
                  "starcoder2": ("residual_dropout", 0.0)}


# the common config keys ``hf`` reads, each with the other names families give it
KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model", "n_embed"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "vocab": ("vocab_size",),
    "ffn": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim"),
    "act": ("hidden_act", "activation_function", "hidden_activation"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token", "moe_topk"),
}


def opt(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """First non-null value among ``keys``; None when all are absent."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal wrappers (``gemma3``) keep the language model under ``text_config``;
    its keys win, the wrapper's ``model_type`` and embedding tying are kept. The vision
    tower is not part of the spec."""
    inner = cfg.get("text_config")
    if not isinstance(inner, Mapping):
        return dict(cfg)
    out = {**cfg, **inner, "model_type": cfg.get("model_type")}
    out.pop("text_config", None)
    return out


def _pos_int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidInputError(f"config.{key}", v, "a non-negative integer")
    return v


def mla_spec(cfg: Mapping[str, Any]) -> MLASpec:
    """DeepSeek-V2/V3 ``q_lora_rank`` (null: direct query projection, V2-Lite),
    ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``."""
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if cfg.get(key) is None:
            raise InvalidInputError(f"config.{key}", None,
                                    f"required for model_type {cfg.get('model_type')!r} (MLA)")
    return MLASpec(kv_lora_rank=_pos_int(cfg, "kv_lora_rank"),
                   qk_nope_head_dim=_pos_int(cfg, "qk_nope_head_dim"),
                   qk_rope_head_dim=_pos_int(cfg, "qk_rope_head_dim"),
                   v_head_dim=_pos_int(cfg, "v_head_dim"),
                   q_lora_rank=int(cfg.get("q_lora_rank") or 0))


def _period_of(full: list[bool]) -> int:
    """``global_every`` of a per-layer full/sliding list (full at ``(i+1) % p == 0``)."""
    if not any(full):
        return 0
    p = full.index(True) + 1
    if full != [(i + 1) % p == 0 for i in range(len(full))]:
        raise UnsupportedError("layer_types: only a periodic pattern (every p-th layer "
                               "global) is modelled")
    return p


def local_attention(cfg: Mapping[str, Any], mt: str, n_layers: int) -> tuple[int, int]:
    """(window, global_every) of the spec; (0, 1) when every layer is global."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = [t != "sliding_attention" for t in types[:n_layers]]
        return (_pos_int(cfg, "sliding_window"), _period_of(full)) if not all(full) else (0, 1)
    if mt == "gemma2":
        return _pos_int(cfg, "sliding_window", 4096), 2
    if mt in ("gemma3", "gemma3_text"):
        return _pos_int(cfg, "sliding_window", 4096), _pos_int(cfg, "sliding_window_pattern", 6)
    if mt == "mistral" and window:                         # Mistral-7B-v0.1: every layer
        return _pos_int(cfg, "sliding_window"), 0
    if window and cfg.get("use_sliding_window"):
        raise UnsupportedError(f"use_sliding_window for model_type {mt!r} "
                               "(max_window_layers layout) is not modelled")
    return 0, 1


def moe_layout(cfg: Mapping[str, Any], mt: str, n_layers: int) -> dict[str, Any]:
    """``MoESpec`` layout fields: dense prefix, period, phase, other dense layers."""
    if mt in DEEPSEEK:
        every = _pos_int(cfg, "moe_layer_freq", 1) or 1
        dense = min(_pos_int(cfg, "first_k_dense_replace", 0), n_layers)
        return {"dense_layers": dense, "every": every, "phase": 0, "dense_set": ()}
    step = _pos_int(cfg, "decoder_sparse_step", 1) or 1
    only = sorted({int(i) for i in (cfg.get("mlp_only_layers") or []) if 0 <= int(i) < n_layers})
    prefix = 0
    while prefix < len(only) and only[prefix] == prefix:
        prefix += 1
    return {"dense_layers": prefix, "every": step, "phase": step - 1,
            "dense_set": tuple(only[prefix:])}


def router_fields(cfg: Mapping[str, Any], mt: str) -> dict[str, Any]:
    """``MoESpec`` router fields: DeepSeek ``scoring_func``, ``topk_method`` (``noaux_tc``:
    expert bias), ``routed_scaling_factor``, ``n_group`` / ``topk_group``, ``aux_loss_alpha``;
    Mixtral / Qwen ``router_aux_loss_coef`` with a softmax router."""
    out: dict[str, Any] = {"aux_loss_coeff": float(cfg.get("router_aux_loss_coef")
                                                    or cfg.get("aux_loss_alpha") or 0.0)}
    if mt in DEEPSEEK:
        score = str(cfg.get("scoring_func") or "softmax")
        if score not in ("softmax", "sigmoid"):
            raise UnsupportedError(f"scoring_func={score!r}: softmax or sigmoid routers only")
        out.update(router_score=score,
                   router_expert_bias=cfg.get("topk_method") == "noaux_tc",
                   router_topk_scale=float(cfg.get("routed_scaling_factor") or 1.0),
                   router_groups=int(cfg.get("n_group") or 0),
                   router_group_topk=int(cfg.get("topk_group") or 0))
    return out


def _sub(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested config (MPT / DBRX ``attn_config``, DBRX ``ffn_config``); {} when absent."""
    v = cfg.get(key)
    return v if isinstance(v, Mapping) else {}


def _fill(out: dict[str, Any], key: str, value: Any) -> None:
    if out.get(key) is None and value is not None:
        out[key] = value


def _mpt_kv_heads(attn: Mapping[str, Any], heads: Any) -> Any:
    """MPT ``attn_config.attn_type``: multi-query is one KV head, llm-foundry's
    grouped-query ``kv_n_heads`` (HF ``MptAttention`` builds multi-head only)."""
    kind = attn.get("attn_type") or "multihead_attention"
    if kind == "multiquery_attention":
        return 1
    if kind == "grouped_query_attention":
        return attn.get("kv_n_heads") or heads
    return heads


def canonical(cfg: Mapping[str, Any], mt: str) -> dict[str, Any]:
    """The config with the keys ``hf`` reads filled from the family's own names, as its HF
    config class maps them (``attribute_map`` and ``__post_init__``); keys already given win,
    except where the HF module ignores them (BLOOM's ``n_inner``)."""
    out = dict(cfg)
    if mt == "bloom" and cfg.get("n_embed") is not None:    # BloomConfig: n_embed overrides
        out["hidden_size"] = cfg["n_embed"]
    h, heads = opt(out, KEYS["hidden"]), opt(cfg, KEYS["heads"])
    four_h = 4 * h if isinstance(h, int) else None
    if mt == "mpt":
        ratio = cfg.get("expansion_ratio", 4)
        _fill(out, "intermediate_size", int(ratio * h) if isinstance(h, int) else None)
        _fill(out, "num_key_value_heads", _mpt_kv_heads(_sub(cfg, "attn_config"), heads))
    elif mt == "dbrx":                               # DbrxAttentionConfig / DbrxFFNConfig
        ffn = _sub(cfg, "ffn_config")
        _fill(out, "num_key_value_heads", _sub(cfg, "attn_config").get("kv_n_heads", 1))
        _fill(out, "intermediate_size", ffn.get("ffn_hidden_size", 3584))
        _fill(out, "num_experts", ffn.get("moe_num_experts", 4))
        _fill(out, "num_experts_per_tok", ffn.get("moe_top_k", 1))
        _fill(out, "router_aux_loss_coef", ffn.get("moe_loss_weight", 0.01))
    elif mt == "bloom" and four_h:                   # BloomMLP: dense_h_to_4h
        out["intermediate_size"] = four_h
    elif mt in ("gpt_bigcode", "gptj"):              # n_inner None: 4 * hidden
        _fill(out, "intermediate_size", cfg.get("n_inner") or four_h)
        if mt == "gpt_bigcode":
            _fill(out, "num_key_value_heads", 1 if cfg.get("multi_query", True) else heads)
    elif mt == "opt":
        proj = cfg.get("word_embed_proj_dim")
        if proj is not None and proj != h:
            raise UnsupportedError(f"OPT word_embed_proj_dim={proj} != hidden_size={h} "
                                   "(project_in/project_out around a narrower embedding and "
                                   "LM head, OPT-350m) is not modelled")
    return out


def _position(cfg: Mapping[str, Any], mt: str) -> Position:
    """Learned table (GPT-2, GPTBigCode, OPT), ALiBi (BLOOM; Falcon ``alibi``; MPT unless
    ``attn_config.alibi`` is false, then llm-foundry's ``rope`` or learned), else RoPE."""
    if mt in _LEARNED:
        return Position.LEARNED
    if mt == "bloom" or (mt == "falcon" and cfg.get("alibi")):
        return Position.ALIBI
    if mt == "mpt":
        attn = _sub(cfg, "attn_config")
        if attn.get("alibi", True):
            return Position.ALIBI
        return Position.ROPE if attn.get("rope") else Position.LEARNED
    return Position.ROPE


def _linear_bias(cfg: Mapping[str, Any], mt: str) -> bool:
    """Biases on the linear layers (GPT-J: on its MLP only; StableLM: QKV only, below)."""
    if mt in _BIAS_SWITCH:
        key, default = _BIAS_SWITCH[mt]
        return bool(cfg.get(key, default))
    if mt == "mpt":
        return not cfg.get("no_bias", True)
    return mt in _ALL_BIASED


def _qk_norm_params(cfg: Mapping[str, Any], mt: str, head_dim: int) -> int:
    """Weights of the norms on queries and keys; 0 when there are none. Per head shared
    (Qwen3, Gemma 3, Phi ``qk_layernorm``): 2 x head_dim; over the whole projections (OLMo 2,
    OLMoE, Cohere ``use_qk_norm``, StableLM ``qk_layernorm``, MPT ``qk_ln``): (heads + kv)
    x head_dim."""
    if mt in _QK_NORM or (mt == "phi" and cfg.get("qk_layernorm")):
        return 2 * head_dim
    whole = mt in ("olmo2", "olmoe") or (mt == "cohere" and cfg.get("use_qk_norm")) \
        or (mt == "stablelm" and cfg.get("qk_layernorm")) \
        or (mt == "mpt" and _sub(cfg, "attn_config").get("qk_ln"))
    if not whole:
        return 0
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    return (heads + kv) * head_dim


def _hidden_dropout(cfg: Mapping[str, Any], mt: str) -> float:
    """``HIDDEN_DROPOUT``'s probability: the config's, else its class default."""
    if mt not in HIDDEN_DROPOUT:
        return 0.0
    key, default = HIDDEN_DROPOUT[mt]
    v = cfg.get(key)
    return float(default if v is None else v)


def family_fields(cfg: Mapping[str, Any], mt: str, head_dim: int, hidden: int) -> dict[str, Any]:
    """Norm, position embedding, biases, extra norm weights and soft caps (``cfg`` as
    ``canonical`` returns it)."""
    qk = _qk_norm_params(cfg, mt, head_dim)
    out: dict[str, Any] = {
        "norm": Norm.LAYERNORM if mt in _LAYERNORM else Norm.RMSNORM,
        "position": _position(cfg, mt),
        "linear_bias": _linear_bias(cfg, mt),
        "qkv_bias": bool(cfg.get("attention_bias") or cfg.get("use_qkv_bias"))
        or mt in ("qwen2", "qwen2_moe"),
        "extra_norm_params": qk,
        "qk_norm": qk > 0,
        "attn_logit_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_logit_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
        "split_qkv": mt not in _FUSED_QKV,
        "split_gate_up": mt not in _FUSED_GATE_UP,     # gated MLPs only (hf.from_hf_config)
        # Gemma2/3DecoderLayer post_feedforward_layernorm, Olmo2DecoderLayer
        # post_feedforward_layernorm (transformers 5.24)
        "post_mlp_norm": mt in GEMMA or mt == "olmo2",
        # Gemma2/3DecoderLayer: input_layernorm, post_attention_layernorm,
        # pre_feedforward_layernorm, post_feedforward_layernorm (transformers 5.24)
        "sandwich_norms": mt in GEMMA,
        # transformers' NewGELUActivation / BloomMLP's BloomGelu (eager tanh
        # approximations), priced apart
        "act_fn": "bloom_gelu" if mt == "bloom" else "gelu_new"
        if str(opt(cfg, KEYS["act"]) or "").lower() == "gelu_new" else "",
        "hidden_dropout": _hidden_dropout(cfg, mt),
    }
    if mt in DEEPSEEK:                           # q_a / kv_a latent RMSNorms (counted by MLASpec)
        out["qk_norm"] = True
        # DeepSeek-V3's multi-token-prediction modules (config num_nextn_predict_layers)
        out["mtp_layers"] = int(cfg.get("num_nextn_predict_layers") or 0)
    if mt in GEMMA:                              # pre/post feed-forward (sandwich) norms
        out["extra_norm_params"] += 2 * hidden
    return out
