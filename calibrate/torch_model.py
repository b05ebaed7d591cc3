"""A real PyTorch decoder transformer built from a ``TransformerSpec``, op for op what
``simulator.workload.ops`` prices (torch is imported lazily, inside the builder).

Per layer (pre-LN): ``ln1`` (LayerNorm) -> ``qkv`` (one fused Linear to q + 2 kv) ->
``core_attn`` (``scaled_dot_product_attention``, causal; GQA through ``enable_gqa``) ->
``attn_out`` (Linear) -> residual add -> ``ln2`` -> ``mlp_fc1`` (Linear; 2 x ffn for SwiGLU)
-> activation (GELU / SiLU-gate / squared ReLU) -> ``mlp_fc2`` -> residual add. Around the
layers: token embedding, final LayerNorm, logits Linear (tied to the embedding when the
spec says so) and fp32 cross-entropy. No biases (the spec does not count them); norms have a
weight only, so ``sum(p.numel())`` equals ``TransformerSpec.total_params()``.
MoE specs are refused (the dense path is what ``validate-run`` checks).
"""
from __future__ import annotations

from typing import Any

from simulator.errors import UnsupportedError
from simulator.workload.spec import MLP, TransformerSpec


def build_model(spec: TransformerSpec, seed: int = 0, split: bool = False) -> Any:
    """An ``nn.Module`` whose ``forward(tokens, targets)`` returns the mean cross-entropy.
    ``split``: one Linear per projection (q, k, v; a SwiGLU's gate and up), as Llama's
    reference code and torchtitan write the block (9 parameter tensors), instead of the
    fused qkv and up projections (6)."""
    import torch

    if spec.moe is not None:
        raise UnsupportedError(f"validate-run builds dense decoders only; {spec.name!r} is MoE")
    torch.manual_seed(seed)
    model = _decoder_class(spec, _split_block_class(spec) if split else _block_class(spec))()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return model


def _block_class(spec: TransformerSpec) -> Any:
    """One pre-LN decoder layer of ``spec`` (class, built lazily with torch)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    gqa = spec.n_kv_heads != spec.n_heads

    def attend(q, k, v):
        if not gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, q, kv = spec.hidden, spec.q_dim, spec.kv_dim
            self.ln1 = nn.LayerNorm(h, bias=False)
            self.qkv = nn.Linear(h, q + 2 * kv, bias=False)
            self.attn_out = nn.Linear(q, h, bias=False)
            self.ln2 = nn.LayerNorm(h, bias=False)
            up = 2 * spec.ffn_hidden if spec.mlp == MLP.SWIGLU else spec.ffn_hidden
            self.fc1 = nn.Linear(h, up, bias=False)
            self.fc2 = nn.Linear(spec.ffn_hidden, h, bias=False)

        def act(self, x):
            if spec.mlp == MLP.SWIGLU:
                a, b = x.chunk(2, dim=-1)
                return F.silu(a) * b
            if spec.mlp == MLP.RELU2:
                return torch.square(F.relu(x))
            return F.gelu(x)

        def forward(self, x):
            B, S, _ = x.shape
            d, q, kv = spec.head_dim, spec.q_dim, spec.kv_dim
            qkv = self.qkv(self.ln1(x))
            qh, kh, vh = qkv.split((q, kv, kv), dim=-1)
            qh = qh.view(B, S, spec.n_heads, d).transpose(1, 2)
            kh = kh.view(B, S, spec.n_kv_heads, d).transpose(1, 2)
            vh = vh.view(B, S, spec.n_kv_heads, d).transpose(1, 2)
            o = attend(qh, kh, vh).transpose(1, 2).reshape(B, S, q)
            x = x + self.attn_out(o)
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))
    return Block


def _split_block_class(spec: TransformerSpec) -> Any:
    """``_block_class`` with one Linear per projection (``build_model(split=True)``)."""
    import torch.nn as nn
    import torch.nn.functional as F

    class SplitBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, q, kv = spec.hidden, spec.q_dim, spec.kv_dim
            self.ln1 = nn.LayerNorm(h, bias=False)
            self.wq = nn.Linear(h, q, bias=False)
            self.wk = nn.Linear(h, kv, bias=False)
            self.wv = nn.Linear(h, kv, bias=False)
            self.attn_out = nn.Linear(q, h, bias=False)
            self.ln2 = nn.LayerNorm(h, bias=False)
            self.gate = nn.Linear(h, spec.ffn_hidden, bias=False)
            self.up = nn.Linear(h, spec.ffn_hidden, bias=False)
            self.fc2 = nn.Linear(spec.ffn_hidden, h, bias=False)

        def forward(self, x):
            B, S, _ = x.shape
            d, q = spec.head_dim, spec.q_dim
            y = self.ln1(x)
            qh = self.wq(y).view(B, S, spec.n_heads, d).transpose(1, 2)
            kh = self.wk(y).view(B, S, spec.n_kv_heads, d).transpose(1, 2)
            vh = self.wv(y).view(B, S, spec.n_kv_heads, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                               enable_gqa=spec.n_kv_heads != spec.n_heads)
            x = x + self.attn_out(o.transpose(1, 2).reshape(B, S, q))
            y = self.ln2(x)
            return x + self.fc2(F.silu(self.gate(y)) * self.up(y))
    return SplitBlock


def _decoder_class(spec: TransformerSpec, block: Any) -> Any:
    """Embedding, ``spec.n_layers`` blocks, final norm, logits and fp32 cross-entropy."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(spec.vocab, spec.hidden)
            self.blocks = nn.ModuleList(block() for _ in range(spec.n_layers))
            self.final_ln = nn.LayerNorm(spec.hidden, bias=False)
            self.logits = nn.Linear(spec.hidden, spec.vocab, bias=False)
            if spec.tied_embeddings:
                self.logits.weight = self.embed.weight

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for blk in self.blocks:
                x = blk(x)
            logits = self.logits(self.final_ln(x))
            return F.cross_entropy(logits.view(-1, spec.vocab), targets.view(-1))
    return Decoder


def synthetic_batch(spec: TransformerSpec, micro_batch: int, seed: int = 0) -> tuple[Any, Any]:
    """Random token ids and next-token targets, ``(micro_batch, seq_len)`` int64 each."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.vocab, (micro_batch, spec.seq_len + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def make_optimizer(params: Any, lr: float = 1e-4) -> tuple[Any, str]:
    """The training runs' optimizer (validate-run, the host probe): AdamW with the fused
    kernel where this torch has one; (optimizer, its name)."""
    import torch
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True), "AdamW(fused=True)"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr), "AdamW(default)"


def param_count(model: Any) -> int:
    """Distinct parameters (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())
