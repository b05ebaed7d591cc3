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
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import InvalidInputError, UnsupportedError
from .spec import MLASpec, Norm, Position

GEMMA = ("gemma2", "gemma3", "gemma3_text")
DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_QK_NORM = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")   # q_norm, k_norm of head_dim


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


def family_fields(cfg: Mapping[str, Any], mt: str, head_dim: int, hidden: int) -> dict[str, Any]:
    """Norm, position embedding, biases, extra norm weights and soft caps."""
    plain = mt in ("gpt2", "gpt_neox", "falcon", "starcoder2")
    out: dict[str, Any] = {
        "norm": Norm.LAYERNORM if plain or mt == "nemotron" else Norm.RMSNORM,
        "position": Position.LEARNED if mt == "gpt2" else Position.ROPE,
        "linear_bias": mt in ("gpt2", "gpt_neox") or (mt == "falcon" and bool(cfg.get("bias")))
        or (mt == "starcoder2" and bool(cfg.get("use_bias", True))),
        "qkv_bias": bool(cfg.get("attention_bias")) or mt in ("qwen2", "qwen2_moe"),
        "extra_norm_params": 0,
        "qk_norm": False,
        "attn_logit_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_logit_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
    }
    if mt == "falcon" and cfg.get("alibi"):
        out["position"] = Position.ALIBI
    if mt in _QK_NORM:
        out["extra_norm_params"] += 2 * head_dim
        out["qk_norm"] = True
    if mt == "olmo2":            # q_norm / k_norm over the whole projections (Olmo2Attention)
        heads = int(cfg.get("num_attention_heads") or 1)
        kv = int(cfg.get("num_key_value_heads") or heads)
        out["extra_norm_params"] += (heads + kv) * head_dim
        out["qk_norm"] = True
    if mt in DEEPSEEK:                           # q_a / kv_a latent RMSNorms (counted by MLASpec)
        out["qk_norm"] = True
        # DeepSeek-V3's multi-token-prediction modules (config num_nextn_predict_layers)
        out["mtp_layers"] = int(cfg.get("num_nextn_predict_layers") or 0)
    if mt in GEMMA:                              # pre/post feed-forward (sandwich) norms
        out["extra_norm_params"] += 2 * hidden
    return out
