"""Import a HuggingFace ``config.json`` into a :class:`TransformerSpec`.

Only the numbers that size the model are read; nothing from ``transformers`` is imported.

* Default ``seq_len``: ``rope_scaling.original_max_position_embeddings`` when present (the
  length the model was pre-trained at), else ``max_position_embeddings`` / ``n_positions``,
  **capped at 8192** (``DEFAULT_SEQ_LEN_CAP``) because released checkpoints often advertise
  128k+ contexts that no pre-training step uses. Pass ``seq_len`` to override.
* Gated families (llama, mistral, mixtral, qwen*, deepseek, gpt_oss, gemma2/3, olmo,
  olmo2, olmoe, granite, phi3, cohere, dbrx, stablelm) map to ``MLP.SWIGLU`` (three GEMMs;
  Gemma's GeGLU has the same shapes) whatever their ``hidden_act``; plain ones (gpt2,
  gpt_neox, gpt_bigcode, gptj, falcon, bloom, mpt, opt, phi, nemotron, starcoder2) map
  ``gelu*``/``relu`` to ``MLP.GELU`` (two GEMMs) and ``relu2`` to ``MLP.RELU2``.
* Families that name their sizes otherwise (MPT / DBRX ``d_model``, ``n_heads``,
  ``n_layers``, ``max_seq_len``, nested ``attn_config`` / ``ffn_config``; BLOOM ``n_embed``;
  OPT ``ffn_dim``; GPT-J / GPTBigCode ``n_inner``, ``multi_query``) are first mapped to the
  common keys by ``hf_families.canonical`` as their HF config classes map them; the
  modeling rule each follows is in ``hf_families``' docstring.
* DeepSeek-V2/V3 attention is MLA with its real projection shapes (``MLASpec``); Gemma 2/3
  local/global layers, MoE every k layers and the family facts (norm, RoPE, biases,
  soft caps) are read by ``hf_families``. Gemma 3's multimodal config is read from its
  ``text_config`` (the vision tower is not modelled).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..boundary.files import read_json
from ..errors import InvalidInputError, UnsupportedError
from . import hf_families as fam
from .hf_schema import check_config
from .spec import MLP, MoESpec, TransformerSpec

DEFAULT_SEQ_LEN_CAP = 8192

_GATED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
          "deepseek_v2", "deepseek_v3", "gpt_oss", "olmo", "olmo2", "olmoe", "granite", "phi3",
          "cohere", "dbrx", "stablelm") + fam.GEMMA
_PLAIN = ("gpt2", "gpt_neox", "falcon", "nemotron", "starcoder2", "mpt", "bloom", "gpt_bigcode",
          "opt", "gptj", "phi")
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_GATED + _PLAIN))
_ALIASES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
# Model types whose HF config class keeps PretrainedConfig's tie_word_embeddings=True.
_TIED_BY_DEFAULT = ("gpt2", "falcon", "starcoder2", "mpt", "bloom", "gpt_bigcode", "opt",
                    "cohere") + fam.GEMMA



def _req(cfg: Mapping[str, Any], what: str) -> Any:
    keys = fam.KEYS[what]
    v = fam.opt(cfg, keys)
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
        raise InvalidInputError(f"config.{fam.KEYS[what][0]}", v, "a positive integer")
    return v


def _load(path_or_dict: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The config as a dict plus a short origin string for ``source``."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "dict"
    if not isinstance(path_or_dict, (str, Path)):
        raise InvalidInputError("config", type(path_or_dict).__name__,
                                "a path to a config.json, a directory holding one, or a dict")
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InvalidInputError("config_path", str(path),
                                "an existing config.json or a directory containing one")
    cfg = read_json("config_path", path, "HuggingFace config.json")
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
        key = next((k for k in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
                    if cfg.get(k) is not None), "")
        native = cfg.get(key)
    if native is None:
        if mt not in fam.TRAIN_SEQ_LEN:
            raise InvalidInputError("config.max_position_embeddings", None,
                                    f"required for model_type {mt!r} unless seq_len is given")
        # no position limit in the config (ALiBi / rotary): the pre-training length
        native, key = fam.TRAIN_SEQ_LEN[mt]
        return native, f"seq_len {native} from {key}"
    if isinstance(native, bool) or not isinstance(native, int) or native < 1:
        raise InvalidInputError(f"config.{key}", native, "a positive integer")
    if native > DEFAULT_SEQ_LEN_CAP:
        return DEFAULT_SEQ_LEN_CAP, f"seq_len {DEFAULT_SEQ_LEN_CAP} (capped from {key}={native})"
    return int(native), f"seq_len {native} from {key}"


def _mlp_kind(cfg: Mapping[str, Any], mt: str) -> MLP:
    if mt in _GATED:
        return MLP.SWIGLU
    act = str(fam.opt(cfg, fam.KEYS["act"]) or "gelu").lower()
    if act == "relu2":
        return MLP.RELU2
    if act.startswith("gelu") or act == "relu":
        return MLP.GELU
    raise InvalidInputError(f"config.{fam.KEYS['act'][0]}", act, "gelu*, relu or relu2 "
                            f"for model_type {mt!r}")


def _attention(cfg: Mapping[str, Any], mt: str, heads: int) -> tuple[int, int, str]:
    """(n_kv_heads, head_dim, note); head_dim 0 means hidden // heads. MLA: every head has
    its own K/V (expanded from the latent), head_dim is the value head width."""
    if mt in fam.DEEPSEEK:
        return heads, int(cfg.get("v_head_dim") or 128), ""
    hd = int(cfg.get("head_dim") or 0)
    if mt == "falcon":
        if cfg.get("new_decoder_architecture"):
            return int(cfg.get("num_kv_heads") or heads), hd, ""
        return (1 if cfg.get("multi_query", True) else heads), hd, ""
    return int(fam.opt(cfg, ("num_key_value_heads",)) or heads), hd, ""


def _shared_experts(cfg: Mapping[str, Any], expert_ffn: int) -> int:
    if cfg.get("n_shared_experts") is not None:
        return int(cfg["n_shared_experts"])
    width = int(cfg.get("shared_expert_intermediate_size") or 0)
    if width % expert_ffn:
        raise UnsupportedError(f"shared_expert_intermediate_size={width} is not a multiple of "
                               f"the expert width {expert_ffn}")
    return width // expert_ffn


def _moe(cfg: Mapping[str, Any], mt: str, ffn: int, n_layers: int) -> MoESpec | None:
    experts = fam.opt(cfg, fam.KEYS["experts"])
    if not experts:
        return None
    expert_ffn = int(cfg.get("moe_intermediate_size") or ffn)
    return MoESpec(experts=int(experts), top_k=_int(cfg, "top_k"),
                   expert_ffn_hidden=expert_ffn,
                   shared_experts=_shared_experts(cfg, expert_ffn),
                   **fam.moe_layout(cfg, mt, n_layers), **fam.router_fields(cfg, mt))


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
    raw, origin = _load(path_or_dict)
    check_config(raw)
    mt = _model_type(raw)
    cfg = fam.canonical(fam.text_config(raw), mt)
    n_layers, hidden, heads = _int(cfg, "layers"), _int(cfg, "hidden"), _int(cfg, "heads")
    if fam.opt(cfg, fam.KEYS["ffn"]) is None and mt in ("gpt2", "falcon"):
        ffn = 4 * hidden  # GPT2Config n_inner=None and FalconConfig ffn_hidden_size default
    else:
        ffn = _int(cfg, "ffn")
    kv_heads, head_dim, attn_note = _attention(cfg, mt, heads)
    if seq_len is None:
        seq_len, seq_note = _default_seq_len(cfg, mt)
    else:
        seq_note = f"seq_len {seq_len} given"
    tied = raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", mt in _TIED_BY_DEFAULT))
    window, global_every = fam.local_attention(cfg, mt, n_layers)
    extra = fam.family_fields(cfg, mt, head_dim or hidden // heads, hidden)
    mlp = _mlp_kind(cfg, mt)
    if mlp != MLP.SWIGLU:
        extra["split_gate_up"] = None                # no gate: nothing to split
    if "text_config" in raw and raw.get("vision_config"):
        attn_note = "language model only (vision tower not modelled)"
    notes = "; ".join(n for n in (seq_note, attn_note) if n)
    return TransformerSpec(
        name=name or _default_name(raw, origin, mt), n_layers=n_layers, hidden=hidden,
        ffn_hidden=ffn, n_heads=heads, n_kv_heads=kv_heads, vocab=_int(cfg, "vocab"),
        seq_len=seq_len, mlp=mlp, tied_embeddings=bool(tied),
        head_dim=head_dim, moe=_moe(cfg, mt, ffn, n_layers),
        mla=fam.mla_spec(cfg) if mt in fam.DEEPSEEK else None,
        window=window, global_every=global_every, **extra,
        source=f"HuggingFace config.json ({origin}), model_type {mt}; {notes}")
