"""torchtitan's op-level selective activation checkpointing on the op graph.

torchtitan's ``selective_ac_option = "op"`` (its Llama configs' default "selective" mode;
``torchtitan/parallelisms/parallelize_llama.py`` @ 004b3148, ``_apply_ac_to_transformer_block``)
wraps each block in ``checkpoint_wrapper`` with a policy that saves the outputs of
``aten.mm`` except every second one, of the SDPA kernels and of the TP reduce-scatter, and
recomputes everything else in backward: the norms, RoPE, activations, residual adds, the
sequence-parallel all-gathers and the even-numbered matmuls. In a Llama block the matmuls
run wq, wk, wv, wo, w1, w3, w2, so wk, wo and w3 are recomputed.

``plan_for`` maps that rule onto a layer's forward ops: for each op, the fraction of its
forward that backward runs again, and the bytes of the outputs it keeps. A merged op stands
for several matmuls (``qkv``: wq, wk, wv; a SwiGLU ``mlp_fc1``: w1, w3), counted in that
order. Assumed where the 2024 list is silent: grouped expert GEMMs and batched attention
GEMMs (not ``aten.mm``) are recomputed and not counted, the EP all-to-alls are re-run, a
context-parallel ring's exchanges belong to the saved SDPA (not re-run), and the kept
attention output is the query width (``k``) of the fused call (of ``core_attn`` only: a
context-parallel ring's per-step outputs are not counted).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..network.collectives import Collective
from .op_types import LayerShape, Op, OpKind
from .spec import MLP, TransformerSpec


@dataclass(frozen=True)
class SacOp:
    """What op-level SAC does with one forward op."""

    recompute_fraction: float        # share of its forward work run again in backward
    recompute_n: int                 # GEMM: the output width of the part run again
    kept_bytes: float                # outputs it keeps from forward to backward


def _mm_parts(op: Op, m: TransformerSpec, sh: LayerShape) -> list[int]:
    """Output widths of the ``aten.mm`` calls a weight GEMM stands for, in issue order."""
    if op.name == "qkv" and m.mla is None:
        q, kv = m.q_dim // sh.tp, m.kv_dim // sh.tp
        if q + 2 * kv == op.n:
            return [q, kv, kv]
    if op.name == "mlp_fc1" and m.mlp == MLP.SWIGLU and op.n % 2 == 0:
        return [op.n // 2, op.n // 2]
    return [op.n]


def _gemm(op: Op, parts: list[int], count: int, act_bytes: int) -> tuple[SacOp, int]:
    again = kept = 0
    for width in parts:
        count += 1
        if count % 2 == 0:
            again += width
        else:
            kept += width
    return SacOp(again / op.n, again, op.batch * op.m * kept * act_bytes), count


def plan_for(fwd: list[Op], m: TransformerSpec, sh: LayerShape) -> dict[str, SacOp]:
    """Per forward op (by name): what torchtitan's op SAC recomputes and keeps."""
    out: dict[str, SacOp] = {}
    count, ab = 0, sh.act_bytes
    for op in fwd:
        if op.kind == OpKind.GEMM and op.has_weights and not op.grouped:
            out[op.name], count = _gemm(op, _mm_parts(op, m, sh), count, ab)
        elif op.kind == OpKind.ATTENTION:            # saved: output and logsumexp
            rows = op.batch * op.m
            out[op.name] = SacOp(0.0, 0, rows * (op.k * ab + 4) if op.name == "core_attn"
                                 else 0.0)
        elif op.kind == OpKind.COMM and op.collective == Collective.REDUCE_SCATTER:
            out[op.name] = SacOp(0.0, 0, op.comm_bytes / max(sh.tp, 1))
        elif op.kind == OpKind.COMM and op.group == "cp":   # the ring inside the saved SDPA
            out[op.name] = SacOp(0.0, 0, 0.0)
        else:
            out[op.name] = SacOp(1.0, op.n, 0.0)
    return out


def kept_bytes(fwd: list[Op], m: TransformerSpec, sh: LayerShape, input_bytes: float) -> float:
    """Bytes one layer keeps from forward to backward under op SAC: its input and the
    outputs the policy saves."""
    return input_bytes + sum(s.kept_bytes for s in plan_for(fwd, m, sh).values())
