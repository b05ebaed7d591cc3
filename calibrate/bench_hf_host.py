"""Host cost of a HuggingFace transformers decoder layer, measured on this CPU
(``calibrate.bench_framework --only hf_decoder_layer``).

The layer is the real ``transformers`` ``LlamaDecoderLayer`` inside a ``LlamaForCausalLM`` of 1
and 5 layers (with labels: the loss is computed) at tiny shapes (hidden 32, 4 query and 2 key/value heads, MLP 64, 32 tokens), in
training mode, with the ``sdpa`` attention implementation (what a GPU run uses unless it
asks for flash-attention-2): RMSNorm written out in eager ops, rotary embeddings applied per
layer (``rotate_half``), grouped-query key/value repeat, SwiGLU as ``act(gate) * up``. Kernels
are nearly free at these shapes, so what is left is host work: the layer's ops and its
module Python. The per-model work (embedding, rotary table, causal mask, final norm, LM head,
loss) is the same for 1 and 5 layers and cancels in the per-layer numbers; what the 1-layer
model costs beyond its layer and the op graph's embedding, head and loss ops is that work's
Python, per forward and backward pass. Also timed: the same models with transformers'
gradient checkpointing, whose extra over the plain model beyond the re-run forward is the
checkpoint wrapper's host work. ``transformers`` is not a dependency of this project:
``pip install transformers`` to run it; without it the case is skipped with a message.
"""
from __future__ import annotations

LAYERS = (1, 5)
HIDDEN, FFN, HEADS, KV_HEADS, TOKENS, VOCAB = 32, 64, 4, 2, 32, 128


def available() -> str:
    """'' when ``transformers`` imports, else why not."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"transformers not importable ({type(exc).__name__}: {exc})"
    return ""


def version() -> str:
    import transformers
    return transformers.__version__


def _model(layers: int, recompute: bool):
    """A ``LlamaForCausalLM`` of ``layers`` layers with the config's defaults, so training
    without checkpointing keeps ``use_cache`` on (as a Trainer run does: a key/value cache
    is built every forward); ``recompute``: transformers' gradient checkpointing of every
    layer (``gradient_checkpointing_enable()``, torch's non-reentrant checkpoint by
    default), which turns the cache off."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, num_hidden_layers=layers,
                      vocab_size=VOCAB, max_position_embeddings=2 * TOKENS)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).train()
    if recompute:
        model.gradient_checkpointing_enable()
    return model


def dense_cases() -> dict:
    """Timing cases for ``bench_host.time_interleaved``: (``block`` | ``recompute``, n)
    for 1 and 5 layers, without and with gradient checkpointing -> (forward, backward of
    its output)."""
    import torch

    from .bench_host import loss_backward
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    out = {}
    for kind in ("block", "recompute"):
        for n in LAYERS:
            model = _model(n, kind == "recompute")

            def fwd(model=model):
                return model(input_ids=ids, labels=ids).loss
            out[(kind, n)] = (fwd, loss_backward(model))
    return out
