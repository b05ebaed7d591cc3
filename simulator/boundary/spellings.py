"""Other spellings of the enumerated values a user types (a flag, a CSV cell, a JSON key).

Published runs and launch scripts name the same thing many ways: Lightning's
``bf16-mixed``, Transformer Engine's ``fp8-hybrid`` recipe, HuggingFace's
``hidden_act: silu`` for a gated MLP, Megatron's ``--recompute-method uniform``. Each
table maps a lower-cased, ``_``/space-to-``-`` spelling to the canonical value; a value
that is neither canonical nor listed still raises ``InvalidInputError`` in the caller
(naming the field). A spelling that could mean two things (``amp``: fp16 or bf16?;
Lightning's ``bf16-true``, which keeps no fp32 master weights; an activation's name for an
MLP) is left out on purpose, so it fails instead of guessing.
"""
from __future__ import annotations

from typing import Any

# numeric format of the GEMMs (simulator.hardware.specs.Dtype)
PRECISION = {
    "bfloat16": "bf16", "bf16-mixed": "bf16", "bf16-amp": "bf16", "amp-bf16": "bf16",
    "mixed-bf16": "bf16",
    "float16": "fp16", "half": "fp16", "16-mixed": "fp16", "fp16-mixed": "fp16",
    "fp16-amp": "fp16", "amp-fp16": "fp16", "mixed-fp16": "fp16",
    "float32": "fp32", "32": "fp32", "32-true": "fp32",
    # FP8 GEMMs whatever the scaling recipe: Transformer Engine's formats (hybrid = E4M3
    # forward, E5M2 backward) and scalings (delayed, current / tensorwise, blockwise, MX);
    # all run at the GPU's FP8 tensor-core rate, which is what the plan's precision sets
    "fp8-hybrid": "fp8", "fp8-e4m3": "fp8", "e4m3": "fp8", "fp8-delayed": "fp8",
    "fp8-current": "fp8", "fp8-tensorwise": "fp8", "fp8-blockwise": "fp8", "mxfp8": "fp8",
    "float8": "fp8",
}

# activation recomputation (simulator.parallel.plan.Recompute)
RECOMPUTE = {
    "no": "none", "off": "none", "false": "none", "0": "none",
    # Megatron's --recompute-granularity full takes --recompute-method uniform or block;
    # both re-run whole layers
    "uniform": "full", "block": "full", "full-uniform": "full", "full-block": "full",
    # a boolean activation-checkpointing switch (HF gradient_checkpointing, llm-foundry
    # activation_checkpointing, DeepSpeed's checkpoint wrapper) wraps whole layers
    "true": "full", "yes": "full", "on": "full", "1": "full",
    "sel": "selective", "core-attn": "selective",
}

# MLP form (simulator.workload.spec.MLP): what matters is the GEMM count and shapes, so
# only names of a form are read. An activation's name (HuggingFace's hidden_act: silu,
# gelu_pytorch_tanh, gelu_new) does not say whether the MLP is gated (Gemma gates
# gelu_pytorch_tanh, GPT-2 does not gate gelu_new): refused, not guessed.
MLP = {
    # gated MLPs: three GEMMs
    "silu-glu": "swiglu", "swish-glu": "swiglu", "geglu": "swiglu", "gated-gelu": "swiglu",
    "glu": "swiglu", "gated": "swiglu",
    "squared-relu": "relu2", "relu-squared": "relu2", "sqrelu": "relu2",
}


def normalize(text: Any) -> str:
    """``text`` as names are compared: stripped, lower-cased, ``_`` and spaces as ``-``."""
    return str(text).strip().lower().replace("_", "-").replace(" ", "-")


def canonical(value: Any, table: dict[str, str]) -> Any:
    """``value`` in its canonical spelling when it is text (``normalize``, then looked up
    in ``table``); anything else unchanged."""
    if not isinstance(value, str):
        return value
    key = normalize(value)
    return table.get(key, key)
