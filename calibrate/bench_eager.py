"""Device traffic of eager model code's elementwise ops, counted on this CPU.

``python -m calibrate.bench_eager [--out CSV]`` runs HuggingFace ``transformers``' own Llama
pieces forward and backward in bf16 under a ``TorchDispatchMode`` that records every aten
op with the bytes of its tensor inputs and outputs (view ops, which move nothing, and
allocations are left out):

* ``rmsnorm``: ``LlamaRMSNorm`` (cast to fp32, pow, mean, rsqrt, multiply, cast back,
  weight): per element of the (tokens x hidden) input;
* ``rope``: ``apply_rotary_pos_emb`` with ``rotate_half`` (slices, neg, cat, mul, add) on
  Q and K: per element of Q and K together;
* ``swiglu``: ``LlamaMLP``'s ``act_fn(gate) * up`` (SiLU, then the product): per element
  of the product;
* ``gelu_new``: transformers' ``NewGELUActivation`` (GPT-2's ``activation_function``: the tanh
  approximation written out, ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``):
  per element of its input;
* ``bloom_gelu``: transformers' ``BloomGelu`` (BLOOM's MLP activation: an autograd Function
  saving its input, the same tanh formula forward and a written-out derivative backward):
  per element of its input;
* ``dropout``: ``nn.Dropout`` in training as a GPU runs it, ``aten.native_dropout`` (at::dropout
  takes that fused op only for CUDA-like inputs, ``is_fused_kernel_acceptable`` in
  aten/src/ATen/native/Dropout.cpp; on a CPU it would take the unfused bernoulli path, so
  the op is called directly): per element of its input.

Bytes and kernels per element are what an op-graph op of that kind moves and launches on a
GPU when the model code runs eagerly (the aten ops are the same on any device: the Python
writes them out); ``saved`` is what autograd keeps for backward (distinct tensors, from
``saved_tensors_hooks``). A broadcast view counts the storage it reads; a composite op
the dispatch mode sees as one (``slice_backward``: zero-fill, then copy) counts what it
runs. The fused kernels of Megatron-Core / Transformer Engine move 4 B
(norm, RoPE: read and write one 16-bit tensor) and 6 B (SwiGLU: read two, write one) per
element forward. Needs ``pip install transformers`` (skipped with a message otherwise).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "hardware_db" / "data" / "measurements" / "eager_elementwise.csv"
FIELDS = ("module", "metric", "value", "per", "transformers", "torch", "date", "method")
# composite ops the dispatch mode sees as one: (extra kernels, extra reads of the first
# input). slice_backward zero-fills the full gradient and copies the slice in
# (aten/src/ATen/native/TensorShape.cpp slice_backward: zeros + copy_): counted as its input
# plus its output, it moves one slice more (the copy's write)
_COMPOSITE = {"slice_backward": (1, 1)}
# aten ops that allocate or alias without moving data
_FREE = ("view", "_unsafe_view", "expand", "slice", "t", "transpose", "unsqueeze", "squeeze",
         "as_strided", "detach", "alias", "permute", "select", "split", "split_with_sizes",
         "unbind", "_reshape_alias", "reshape", "empty", "empty_like", "empty_strided",
         "new_empty", "new_empty_strided", "zeros_like", "ones_like", "lift_fresh",
         "view_as_complex", "view_as_real", "_conj")     # complex views (torchtitan's RoPE)


def tensor_bytes(x, storage_bound: bool = False) -> int:
    """Bytes of the tensors in ``x`` (a tensor, or lists / tuples of them; others: 0). With
    ``storage_bound`` a broadcast (stride-0) view counts the storage it reads, not its
    logical size."""
    import torch
    if isinstance(x, torch.Tensor):
        n = x.numel() * x.element_size()
        if storage_bound and n and 0 in x.stride():
            n = min(n, x.untyped_storage().nbytes())
        return n
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(y, storage_bound) for y in x)
    return 0


def _spy():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.kernels = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name not in _FREE:
                self.bytes += tensor_bytes(list(args) + list((kwargs or {}).values()), True) \
                    + tensor_bytes(out, True)
                extra_k, extra_reads = _COMPOSITE.get(name, (0, 0))
                self.kernels += 1 + extra_k
                self.bytes += extra_reads * tensor_bytes(args[0] if args else None, True)
            return out
    return Spy()


def traffic(fn, inputs, elements: int) -> dict[str, float]:
    """Forward and backward bytes and kernels per element of ``fn`` on ``inputs`` (made
    leaves that need gradients), and the bytes autograd saves."""
    import torch
    for x in inputs:
        x.requires_grad_(True)
    fwd = _spy()
    with fwd:
        out = fn(*inputs)
    saved: dict[tuple, int] = {}

    def pack(t):
        saved[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    bwd = _spy()
    with bwd:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return {"fwd_bytes": fwd.bytes / elements, "bwd_bytes": bwd.bytes / elements,
            "fwd_kernels": float(fwd.kernels), "bwd_kernels": float(bwd.kernels),
            "saved_bytes": sum(saved.values()) / elements}


def measure(tokens: int = 512, hidden: int = 1024, heads: int = 8, ffn: int = 2816
            ) -> dict[str, dict[str, float]]:
    """The three modules' traffic per element (``module -> metric -> value``)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )
    torch.manual_seed(0)
    bf = torch.bfloat16
    head_dim = hidden // heads
    norm = LlamaRMSNorm(hidden).to(bf)
    cfg = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim,
                      max_position_embeddings=4 * tokens)
    q = torch.randn(1, heads, tokens, head_dim, dtype=bf)
    k = torch.randn(1, heads, tokens, head_dim, dtype=bf)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, torch.arange(tokens).unsqueeze(0))
    act = torch.nn.SiLU()
    return {**_gpt2_ops(tokens, hidden, ffn),
        "rmsnorm": traffic(lambda x: norm(x), [torch.randn(tokens, hidden, dtype=bf)],
                           tokens * hidden),
        "rope": traffic(lambda a, b: apply_rotary_pos_emb(a, b, cos, sin), [q, k],
                        2 * tokens * hidden),
        "swiglu": traffic(lambda g, u: act(g) * u, [torch.randn(tokens, ffn, dtype=bf),
                                                    torch.randn(tokens, ffn, dtype=bf)],
                          tokens * ffn),
    }


def _gpt2_ops(tokens: int, hidden: int, ffn: int) -> dict[str, dict[str, float]]:
    """GPT-2's and BLOOM's eager pieces: their GELUs (per element of the ``tokens x ffn``
    input) and the fused dropout op (per element of a ``tokens x hidden`` input, p = 0.1,
    GPT2Config's resid_pdrop)."""
    import torch
    from transformers.activations import NewGELUActivation
    from transformers.models.bloom.modeling_bloom import BloomGelu
    bf = torch.bfloat16
    gelu, bloom = NewGELUActivation(), BloomGelu().train()
    return {
        "gelu_new": traffic(lambda x: gelu(x), [torch.randn(tokens, ffn, dtype=bf)],
                            tokens * ffn),
        "bloom_gelu": traffic(lambda x: bloom(x), [torch.randn(tokens, ffn, dtype=bf)],
                              tokens * ffn),
        "dropout": traffic(lambda x: torch.native_dropout(x, 0.1, True)[0],
                           [torch.randn(tokens, hidden, dtype=bf)], tokens * hidden),
    }


def measure_torchtitan(tokens: int = 512, hidden: int = 1024, heads: int = 8,
                       with_norm: bool = False) -> dict[str, dict[str, float]]:
    """torchtitan's Llama code where it differs from transformers' (``torchtitan:`` keys):
    ``rope``, its ``apply_rotary_emb`` (models/llama3/model/model.py @ 6404b932): Q and K
    cast to fp32, viewed as complex, multiplied by the complex64 ``freqs_cis`` (broadcast
    over batch and heads), viewed back as real, cast back with ``type_as``. Its SwiGLU,
    ``w2(silu(w1(x)) * w3(x))``, is transformers' ``act(gate) * up``; its 2024 eager
    RMSNorm (``norm_type = "rmsnorm"``: ``(x.float() * rsqrt(mean(x.float()^2) + eps))
    .type_as(x) * weight``) runs transformers' ops too, so both use transformers' rows
    (``with_norm`` also counts the norm, a trainable weight included, to show it).

    The ops are written out here from that source (torchtitan is not a dependency)."""
    import torch
    torch.manual_seed(0)
    bf, hd = torch.bfloat16, hidden // heads
    w = torch.nn.Parameter(torch.ones(hidden, dtype=bf))
    freqs = torch.polar(torch.ones(tokens, hd // 2), torch.randn(tokens, hd // 2))

    def norm(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w

    def rope_one(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs.view(1, tokens, 1, hd // 2)).flatten(3).type_as(x)

    q = torch.randn(1, tokens, heads, hd, dtype=bf)           # (batch, seq, heads, head_dim)
    k = torch.randn(1, tokens, heads, hd, dtype=bf)
    out = {"torchtitan:rope": traffic(lambda a, b: (rope_one(a), rope_one(b)), [q, k],
                                      2 * tokens * hidden)}
    if with_norm:
        out["torchtitan:rmsnorm"] = traffic(norm, [torch.randn(tokens, hidden, dtype=bf)],
                                            tokens * hidden)
    return out


PER = {"rmsnorm": "element of the (tokens x hidden) input",
       "rope": "element of Q and K together",
       "swiglu": "element of act(gate) * up",
       "gelu_new": "element of the activation's (tokens x ffn) input",
       "bloom_gelu": "element of the activation's (tokens x ffn) input",
       "dropout": "element of the (tokens x hidden) input"}


def rows(result: dict[str, dict[str, float]]) -> list[dict[str, str]]:
    import torch
    import transformers
    today = dt.date.today().isoformat()
    how = ("in bf16 on CPU, 512 tokens, hidden 1024, 8 heads, ffn 2816; aten ops under "
           "TorchDispatchMode, bytes of tensor inputs + outputs (broadcast views at their "
           "storage), views and allocations excluded, slice_backward's zero-fill and copy added")
    code = {"": "transformers' Llama, GPT-2 and BLOOM modules", "torchtitan": "torchtitan's Llama code "
            "(apply_rotary_emb @ 6404b932), ops written out in measure_torchtitan"}
    return [{"module": m, "metric": k, "value": f"{v:.4f}", "per": PER[m.split(":")[-1]],
             "transformers": transformers.__version__, "torch": torch.__version__,
             "date": today,
             "method": f"calibrate.bench_eager: {code[m.rpartition(':')[0]]} {how}"}
            for m, metrics in result.items() for k, v in metrics.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help=f"CSV to write (e.g. {CSV})")
    a = ap.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("calibrate.bench_eager: needs `pip install transformers`; skipped",
              file=sys.stderr)
        return 0
    out = rows({**measure(), **measure_torchtitan()})
    for r in out:
        print(f"{r['module']:8s} {r['metric']:12s} {r['value']:>9s}  per {r['per']}")
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
