"""Model descriptions: transformer specs, built-in presets and HuggingFace config import."""
from __future__ import annotations

from pathlib import Path

from ..errors import InvalidInputError
from .hf import SUPPORTED_MODEL_TYPES, from_hf_config
from .presets import PRESETS, find_preset, get_preset, list_presets
from .spec import MLP, MLASpec, MoESpec, Norm, Position, TransformerSpec

__all__ = ["MLP", "MLASpec", "MoESpec", "Norm", "Position", "TransformerSpec", "PRESETS",
           "SUPPORTED_MODEL_TYPES", "find_preset", "get_preset", "list_presets", "from_hf_config",
           "resolve_model"]


def resolve_model(name_or_path: str, seq_len: int | None = None) -> TransformerSpec:
    """A preset key, or a path to a HuggingFace ``config.json`` (ending in ``.json``).

    ``seq_len`` overrides the preset's / config's sequence length when given.
    """
    if str(name_or_path).endswith(".json"):
        return from_hf_config(Path(name_or_path), seq_len=seq_len)
    spec = find_preset(name_or_path)          # any spelling: Llama3-8B, meta-llama/...
    if spec is not None:
        return spec if seq_len is None else spec.with_seq_len(seq_len)
    raise InvalidInputError("model", name_or_path,
                            "a path ending in .json or one of: " + ", ".join(list_presets()))
