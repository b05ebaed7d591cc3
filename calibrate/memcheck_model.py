"""The decoder ``complexity validate-memory`` measures: a plain-PyTorch model built from a
``TransformerSpec``, written the way the simulator's op graph describes it (torch imported
lazily, inside the builders).

Per layer (pre-LN): LayerNorm -> one fused QKV Linear -> attention -> output Linear (+
hidden dropout) -> residual -> LayerNorm -> MLP (dense, or a mixture of experts) (+ hidden
dropout) -> residual. Attention is either ``scaled_dot_product_attention`` (a fused kernel
that keeps its output and log-sum-exp, "flash") or Megatron's unfused core attention
written out ("materialized": scaled Q K^T, causal mask, softmax, attention dropout, times
V). SwiGLU is eager ``silu(a) * b``. The experts use static, evenly balanced routing
(``N * top_k / experts`` tokens each, the simulator's expected load; data-dependent shapes
cannot run under ``FakeTensorMode``). The loss (eager ``cross_entropy`` on fp32 logits)
runs inside the root module so the tracker attributes it to the model. Norms have a weight
only and linears no bias, so parameter counts equal ``TransformerSpec.total_params()``.
"""
from __future__ import annotations

from typing import Any

from simulator.workload.spec import MLP, TransformerSpec


def dropout_fn(p: float) -> Any:
    """Dropout as GPUs run it: ``native_dropout`` keeps a 1-byte mask (what ``F.dropout``
    dispatches to on CUDA); on CPU ``F.dropout`` falls back to a composite that keeps a
    16-bit noise tensor and its input, which no GPU run does."""
    import torch

    def drop(x):
        return torch.native_dropout(x, p, True)[0] if p else x
    return drop


def _attention(spec: TransformerSpec, flash: bool, dropout: float) -> Any:
    """``f(q, k, v) -> out`` over ``[batch, heads, seq, head_dim]`` tensors."""
    import torch
    import torch.nn.functional as F
    gqa = spec.n_kv_heads != spec.n_heads
    drop = dropout_fn(dropout)

    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def unfused(q, k, v):
        _, a, s, d = q.shape
        if gqa:
            k = k.repeat_interleave(a // k.shape[1], dim=1)
            v = v.repeat_interleave(a // v.shape[1], dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (d ** -0.5)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return torch.matmul(drop(probs), v)
    return fused if flash else unfused


def _mlp_class(spec: TransformerSpec, ffn: int) -> Any:
    import torch.nn as nn
    import torch.nn.functional as F

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            up = 2 * ffn if spec.mlp == MLP.SWIGLU else ffn
            self.fc1 = nn.Linear(spec.hidden, up, bias=False)
            self.fc2 = nn.Linear(ffn, spec.hidden, bias=False)

        def forward(self, x):
            y = self.fc1(x)
            if spec.mlp == MLP.SWIGLU:
                a, g = y.chunk(2, dim=-1)
                return self.fc2(F.silu(a) * g)
            return self.fc2(F.relu(y).square() if spec.mlp == MLP.RELU2 else F.gelu(y))
    return Mlp


def _moe_class(spec: TransformerSpec) -> Any:
    """Router, top-k, evenly balanced dispatch to ``experts`` grouped GEMMs, weighted combine."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    moe = spec.moe
    f = moe.expert_ffn_hidden

    class Moe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            up = 2 * f if spec.mlp == MLP.SWIGLU else f
            self.router = nn.Linear(spec.hidden, moe.experts, bias=False)
            self.w1 = nn.Parameter(torch.empty(moe.experts, spec.hidden, up))
            self.w2 = nn.Parameter(torch.empty(moe.experts, f, spec.hidden))

        def forward(self, x):
            shape, h = x.shape, x.shape[-1]
            x = x.reshape(-1, h)
            n, k, e = x.shape[0], moe.top_k, moe.experts
            weight, idx = self.router(x).softmax(-1).topk(k, dim=-1)
            order = idx.flatten().argsort()
            tok = order // k
            xs = x[tok].view(e, n * k // e, h)
            y = torch.bmm(xs, self.w1)
            if spec.mlp == MLP.SWIGLU:
                a, g = y.chunk(2, dim=-1)
                y = F.silu(a) * g
            else:
                y = F.gelu(y)
            ys = torch.bmm(y, self.w2).view(n * k, h) * weight.flatten()[order].unsqueeze(-1)
            return torch.zeros_like(x).index_add(0, tok, ys).view(shape)
    return Moe


def _block_class(spec: TransformerSpec, layer: int, flash: bool, dropout: float) -> Any:
    import torch.nn as nn
    attend = _attention(spec, flash, dropout)
    drop = dropout_fn(dropout)
    mlp = _moe_class(spec) if spec.is_moe_layer(layer) else _mlp_class(spec, spec.ffn_hidden)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, q, kv = spec.hidden, spec.q_dim, spec.kv_dim
            self.ln1 = nn.LayerNorm(h, bias=False)
            self.qkv = nn.Linear(h, q + 2 * kv, bias=False)
            self.attn_out = nn.Linear(q, h, bias=False)
            self.ln2 = nn.LayerNorm(h, bias=False)
            self.mlp = mlp()

        def forward(self, x):
            B, S, _ = x.shape
            d, q, kv = spec.head_dim, spec.q_dim, spec.kv_dim
            qh, kh, vh = self.qkv(self.ln1(x)).split((q, kv, kv), dim=-1)
            qh = qh.view(B, S, spec.n_heads, d).transpose(1, 2)
            kh = kh.view(B, S, spec.n_kv_heads, d).transpose(1, 2)
            vh = vh.view(B, S, spec.n_kv_heads, d).transpose(1, 2)
            o = attend(qh, kh, vh).transpose(1, 2).reshape(B, S, q)
            x = x + drop(self.attn_out(o))
            return x + drop(self.mlp(self.ln2(x)))
    return Block


def build_decoder(spec: TransformerSpec, flash: bool = True, dropout: float = 0.0,
                  checkpoint: bool = False) -> Any:
    """An ``nn.Module`` ``forward(tokens, targets) -> loss``; ``checkpoint`` wraps every
    block in ``torch.utils.checkpoint`` (non-reentrant): full recompute. Build it under the
    dtype and device (meta / fake) the measurement needs."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint as ckpt

    blocks = [_block_class(spec, i, flash, dropout)() for i in range(spec.n_layers)]

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(spec.vocab, spec.hidden)
            self.layers = nn.ModuleList(blocks)
            self.final_ln = nn.LayerNorm(spec.hidden, bias=False)
            self.logits = nn.Linear(spec.hidden, spec.vocab, bias=False)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for blk in self.layers:
                x = ckpt(blk, x, use_reentrant=False) if checkpoint else blk(x)
            logits = self.logits(self.final_ln(x))
            return F.cross_entropy(logits.float().view(-1, spec.vocab), targets.view(-1))
    return Decoder()
