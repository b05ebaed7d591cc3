"""Import a HuggingFace ``config.json`` into a :class:`TransformerSpec`.

Only the numbers that size the model are read; nothing from ``transformers`` is imported.

* Default ``seq_len``: ``rope_scaling.original_max_position_embeddings`` when present (the
  length the model was pre-trained at), else ``max_position_embeddings`` / ``n_positions``,
  **capped at 8192** (``DEFAULT_SEQ_LEN_CAP``) because released checkpoints often advertise
  128k+ contexts that no pre-training step uses. Pass ``seq_len`` to override.
* Gated families (llama, mistral, mixtral, qwen*, deepseek, gpt_oss) map to ``MLP.SWIGLU``
  (three GEMMs) whatever their ``hidden_act``; plain ones (gpt2, gpt_neox, falcon,
  nemotron) map ``gelu*``/``relu`` to ``MLP.GELU`` (two GEMMs) and ``relu2`` to ``MLP.RELU2``.
* DeepSeek MLA has no field in the spec. It is approximated as ``n_heads`` query heads of
  ``v_head_dim`` with as many KV heads as MLA's latent KV path has parameters for (see
  :func:`mla_kv_heads`); the built-in ``deepseek-v3`` preset uses the same rule.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidInputError, UnsupportedError
from .spec import MLP, MoESpec, TransformerSpec

DEFAULT_SEQ_LEN_CAP = 8192

_GATED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
          "deepseek_v2", "deepseek_v3", "gpt_oss")
_PLAIN = ("gpt2", "gpt_neox", "falcon", "nemotron")
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_GATED + _PLAIN))
_ALIASES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
# Model types whose HF config class keeps PretrainedConfig's tie_word_embeddings=True.
_TIED_BY_DEFAULT = ("gpt2", "falcon")

_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
    "ffn": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "act": ("hidden_act", "activation_function", "hidden_activation"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token", "moe_topk"),
}


def _opt(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """First non-null value among ``keys``; None when all are absent."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _req(cfg: Mapping[str, Any], what: str) -> Any:
    keys = _KEYS[what]
    v = _opt(cfg, keys)
    if v is None:
        also = f" (also accepted: {', '.join(keys[1:])})" if len(keys) > 1 else ""
        raise InvalidInputError(
            f"config.{keys[0]}", None,
            f"required for model_type {cfg.get('model_type')!r}{also}",
            "supported model types: " + ", ".join(SUPPORTED_MODEL_TYPES))
    return v


def _int(cfg: Mapping[str, Any], what: str) -> int:
    """A required positive integer field, with a typed error naming the key."""
    v = _req(cfg, what)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidInputError(f"config.{_KEYS[what][0]}", v, "a positive integer")
    return v


def _load(path_or_dict: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The config as a dict plus a short origin string for ``source``."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "dict"
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InvalidInputError("config_path", str(path),
                                "an existing config.json or a directory containing one")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError("config_path", str(path),
                                "a HuggingFace config.json (a JSON object)", str(exc)) from None
    if not isinstance(cfg, dict):
        raise InvalidInputError("config_path", str(path),
                                "a HuggingFace config.json (a JSON object)",
                                f"top level is {type(cfg).__name__}")
    return cfg, str(path)


def _model_type(cfg: Mapping[str, Any]) -> str:
    mt = cfg.get("model_type")
    mt = _ALIASES.get(mt, mt) if isinstance(mt, str) else mt
    if mt not in SUPPORTED_MODEL_TYPES:
        raise InvalidInputError("config.model_type", cfg.get("model_type"),
                                "one of: " + ", ".join(SUPPORTED_MODEL_TYPES))
    return mt


def _default_seq_len(cfg: Mapping[str, Any], mt: str) -> tuple[int, str]:
    rope = cfg.get("rope_scaling") or {}
    native = rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None
    key = "rope_scaling.original_max_position_embeddings"
    if native is None:
        key = next((k for k in ("max_position_embeddings", "n_positions", "n_ctx")
                    if cfg.get(k) is not None), "")
        native = cfg.get(key)
    if native is None:
        if mt != "falcon":
            raise InvalidInputError("config.max_position_embeddings", None,
                                    f"required for model_type {mt!r} unless seq_len is given")
        native = 2048  # FalconConfig has no position limit (ALiBi/rotary); 2048 = its train seq
    if isinstance(native, bool) or not isinstance(native, int) or native < 1:
        raise InvalidInputError(f"config.{key}", native, "a positive integer")
    if native > DEFAULT_SEQ_LEN_CAP:
        return DEFAULT_SEQ_LEN_CAP, f"seq_len {DEFAULT_SEQ_LEN_CAP} (capped from {key}={native})"
    return int(native), f"seq_len {native} from {key or 'FalconConfig default'}"


def _mlp_kind(cfg: Mapping[str, Any], mt: str) -> MLP:
    if mt in _GATED:
        return MLP.SWIGLU
    act = str(_opt(cfg, _KEYS["act"]) or "gelu").lower()
    if act == "relu2":
        return MLP.RELU2
    if act.startswith("gelu") or act == "relu":
        return MLP.GELU
    raise InvalidInputError(f"config.{_KEYS['act'][0]}", act, "gelu*, relu or relu2 "
                            f"for model_type {mt!r}")


def mla_kv_heads(cfg: Mapping[str, Any], hidden: int, heads: int, head_dim: int) -> int:
    """KV heads for the MHA stand-in of DeepSeek MLA.

    The largest divisor of ``heads`` whose K+V projections (``2*hidden*head_dim`` each)
    hold no more parameters than MLA's latent KV path (down- plus up-projection).
    DeepSeek-V3: 20.9M latent-path params / 1.84M per KV head -> 8.
    """
    lora = int(cfg.get("kv_lora_rank") or 0)
    rope = int(cfg.get("qk_rope_head_dim") or 0)
    nope = int(cfg.get("qk_nope_head_dim") or head_dim)
    latent = hidden * (lora + rope) + lora * heads * (nope + head_dim)
    fits = [d for d in range(1, heads + 1) if heads % d == 0
            and 2 * hidden * head_dim * d <= latent]
    return max(fits, default=1)


def _attention(cfg: Mapping[str, Any], mt: str, hidden: int, heads: int) -> tuple[int, int, str]:
    """(n_kv_heads, head_dim, note); head_dim 0 means hidden // heads."""
    if mt in ("deepseek_v2", "deepseek_v3"):
        hd = int(cfg.get("v_head_dim") or 128)
        kv = mla_kv_heads(cfg, hidden, heads, hd)
        return kv, hd, (f"MLA approximated as {heads} heads x head_dim {hd} with {kv} KV heads "
                        "(spec has no MLA)")
    hd = int(cfg.get("head_dim") or 0)
    if mt == "falcon":
        if cfg.get("new_decoder_architecture"):
            return int(cfg.get("num_kv_heads") or heads), hd, ""
        return (1 if cfg.get("multi_query", True) else heads), hd, ""
    return int(_opt(cfg, ("num_key_value_heads",)) or heads), hd, ""


def _dense_layer_prefix(cfg: Mapping[str, Any], n_layers: int) -> int:
    """Leading dense layers; anything but 'first k dense, rest MoE' is unsupported."""
    step = int(_opt(cfg, ("decoder_sparse_step", "moe_layer_freq")) or 1)
    if step != 1:
        raise UnsupportedError(f"MoE every {step} layers (decoder_sparse_step/moe_layer_freq): "
                               "the spec models only 'first k layers dense, rest MoE'")
    dense = int(cfg.get("first_k_dense_replace") or 0)
    only = sorted(set(cfg.get("mlp_only_layers") or []))
    if only:
        if only != list(range(len(only))):
            raise UnsupportedError(f"mlp_only_layers={only}: the spec models only a prefix "
                                   "of dense layers")
        dense = max(dense, len(only))
    return min(dense, n_layers)


def _shared_experts(cfg: Mapping[str, Any], expert_ffn: int) -> int:
    if cfg.get("n_shared_experts") is not None:
        return int(cfg["n_shared_experts"])
    width = int(cfg.get("shared_expert_intermediate_size") or 0)
    if width % expert_ffn:
        raise UnsupportedError(f"shared_expert_intermediate_size={width} is not a multiple of "
                               f"the expert width {expert_ffn}")
    return width // expert_ffn


def _moe(cfg: Mapping[str, Any], ffn: int, n_layers: int) -> MoESpec | None:
    experts = _opt(cfg, _KEYS["experts"])
    if not experts:
        return None
    expert_ffn = int(cfg.get("moe_intermediate_size") or ffn)
    return MoESpec(experts=int(experts), top_k=_int(cfg, "top_k"),
                   expert_ffn_hidden=expert_ffn,
                   shared_experts=_shared_experts(cfg, expert_ffn),
                   dense_layers=_dense_layer_prefix(cfg, n_layers))


def _default_name(cfg: Mapping[str, Any], origin: str, mt: str) -> str:
    if cfg.get("_name_or_path"):
        return str(cfg["_name_or_path"])
    if origin == "dict":
        return mt
    p = Path(origin)
    return p.parent.name if p.stem == "config" and p.parent.name else p.stem


def from_hf_config(path_or_dict: str | Path | Mapping[str, Any], seq_len: int | None = None,
                   name: str | None = None) -> TransformerSpec:
    """A spec from a HuggingFace ``config.json`` (path, directory holding it, or dict)."""
    cfg, origin = _load(path_or_dict)
    mt = _model_type(cfg)
    n_layers, hidden, heads = _int(cfg, "layers"), _int(cfg, "hidden"), _int(cfg, "heads")
    if _opt(cfg, _KEYS["ffn"]) is None and mt in ("gpt2", "falcon"):
        ffn = 4 * hidden  # GPT2Config n_inner=None and FalconConfig ffn_hidden_size default
    else:
        ffn = _int(cfg, "ffn")
    kv_heads, head_dim, attn_note = _attention(cfg, mt, hidden, heads)
    if seq_len is None:
        seq_len, seq_note = _default_seq_len(cfg, mt)
    else:
        seq_note = f"seq_len {seq_len} given"
    tied = cfg.get("tie_word_embeddings", mt in _TIED_BY_DEFAULT)
    notes = "; ".join(n for n in (seq_note, attn_note) if n)
    return TransformerSpec(
        name=name or _default_name(cfg, origin, mt), n_layers=n_layers, hidden=hidden,
        ffn_hidden=ffn, n_heads=heads, n_kv_heads=kv_heads, vocab=_int(cfg, "vocab"),
        seq_len=seq_len, mlp=_mlp_kind(cfg, mt), tied_embeddings=bool(tied),
        head_dim=head_dim, moe=_moe(cfg, ffn, n_layers),
        source=f"HuggingFace config.json ({origin}), model_type {mt}; {notes}")
