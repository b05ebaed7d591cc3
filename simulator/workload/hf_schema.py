"""The types and ranges of the ``config.json`` keys ``hf`` reads, checked before any is
used: each bad key is one ``InvalidInputError`` naming ``config.<key>``, its value and
what would be valid. ``null`` means "not given" for every key (HF writes it so).

Sizes have upper bounds from ``simulator.boundary.limits`` (far above any released
model), so a typo cannot make the simulator build a million layers.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..boundary import limits as L
from ..boundary.values import check_bool, check_float, check_int, check_str
from ..errors import InvalidInputError

_W = L.MAX_HIDDEN
# key: (lowest, highest) for integers
INT_KEYS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), (1, L.MAX_LAYERS)),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "n_embed", "word_embed_proj_dim",
                     "rotary_dim"), (1, _W)),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_key_value_heads",
                     "num_kv_heads", "kv_n_heads"), (1, L.MAX_HEADS)),
    "vocab_size": (1, L.MAX_VOCAB),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_hidden_size", "moe_intermediate_size",
                     "ffn_dim"), (1, L.MAX_FFN)),
    "shared_expert_intermediate_size": (0, L.MAX_FFN),
    **dict.fromkeys(("head_dim", "v_head_dim", "qk_nope_head_dim", "qk_rope_head_dim",
                     "kv_lora_rank"), (1, _W)),
    "q_lora_rank": (0, _W),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
                    (0, L.MAX_EXPERTS)),
    **dict.fromkeys(("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_top_k"),
                    (1, L.MAX_EXPERTS)),
    **dict.fromkeys(("n_shared_experts", "n_group", "topk_group"), (0, L.MAX_EXPERTS)),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                     "original_max_position_embeddings"), (1, L.MAX_POSITIONS)),
    "sliding_window": (0, L.MAX_POSITIONS),
    **dict.fromkeys(("sliding_window_pattern", "moe_layer_freq", "decoder_sparse_step"),
                    (1, L.MAX_LAYERS)),
    "first_k_dense_replace": (0, L.MAX_LAYERS),
}
BOOL_KEYS = ("tie_word_embeddings", "new_decoder_architecture", "multi_query", "bias",
             "attention_bias", "alibi", "use_sliding_window", "parallel_attn", "no_bias",
             "use_bias", "enable_bias", "use_qkv_bias", "use_qk_norm", "qk_layernorm", "qk_ln")
FLOAT_KEYS = ("attn_logit_softcapping", "final_logit_softcapping", "routed_scaling_factor",
              "router_aux_loss_coef", "aux_loss_alpha", "expansion_ratio", "moe_loss_weight")
STR_KEYS = ("model_type", "hidden_act", "activation_function", "hidden_activation",
            "scoring_func", "topk_method", "_name_or_path", "attn_type")
# Nested configs checked with the same table (MPT / DBRX ``attn_config``, DBRX ``ffn_config``)
_NESTED = ("text_config", "rope_scaling", "attn_config", "ffn_config")


def check_config(cfg: Mapping[str, Any], prefix: str = "config.") -> None:
    """Raise ``InvalidInputError`` for the first key of ``cfg`` with a wrong type or an
    out-of-range value (and recurse into the nested configs of ``_NESTED``)."""
    for key, value in cfg.items():
        if value is None:
            continue
        field = prefix + key
        if key in INT_KEYS:
            check_int(field, value, *INT_KEYS[key])
        elif key in BOOL_KEYS:
            check_bool(field, value)
        elif key in FLOAT_KEYS:
            check_float(field, value, 0.0)
        elif key in STR_KEYS:
            # a nested config's model_type and _name_or_path are "" (PreTrainedConfig.to_dict)
            check_str(field, value, nonempty=prefix == "config." and key != "_name_or_path",
                      max_len=512)
        elif key == "mlp_only_layers":
            _int_list(field, value, L.MAX_LAYERS)
        elif key == "layer_types":
            _str_list(field, value)
        elif key in _NESTED:
            if not isinstance(value, Mapping):
                raise InvalidInputError(field, value, "a JSON object or null")
            check_config(value, field + ".")


def _int_list(field: str, value: Any, hi: int) -> None:
    if not isinstance(value, list) or len(value) > hi:
        raise InvalidInputError(field, value, f"a list of at most {hi:,} layer indices")
    for i, v in enumerate(value):
        check_int(f"{field}[{i}]", v, 0, hi)


def _str_list(field: str, value: Any) -> None:
    if not isinstance(value, list) or len(value) > L.MAX_LAYERS:
        raise InvalidInputError(field, value, f"a list of at most {L.MAX_LAYERS:,} strings")
    for i, v in enumerate(value):
        check_str(f"{field}[{i}]", v, max_len=64)
