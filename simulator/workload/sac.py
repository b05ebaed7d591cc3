"""torchtitan's op-level selective activation checkpointing on the op graph.

torchtitan's ``selective_ac_option = "op"`` (its Llama configs' default "selective" mode;
``torchtitan/parallelisms/parallelize_llama.py`` @ 004b3148, ``_apply_ac_to_transformer_block``)
wraps each block in ``checkpoint_wrapper`` with a policy that saves the outputs of
``aten.mm`` except every second one, of the SDPA kernels and of the TP reduce-scatter, and
recomputes everything else in backward: the norms, RoPE, activations, residual adds, the
sequence-parallel all-gathers and the even-numbered matmuls. In a Llama block the matmuls
run wq, wk, wv, wo, w1, w3, w2, so wk, wo and w3 are recomputed. Its MoE models
(``models/deepseek_v3/infra/parallelize.py`` @ 018740b7, ``_op_sac_save_list``) also save
the EP all-to-alls' outputs, and force the router's gate matmul to recompute outside the
count (``per_op_sac_force_recompute_mm_shapes_by_fqns`` = ["moe.router.gate"]).

``plan_for`` maps that rule onto a layer's forward ops: for each op, the fraction of its
forward that backward runs again, and the bytes of the outputs it keeps. A merged op stands
for several matmuls (``qkv``: wq, wk, wv; a SwiGLU ``*_fc1``: w1, w3), counted in that
order. Grouped expert GEMMs (``_grouped_mm``, not in the default save list: torchtitan's
graph_trainer adds it only "for fair baseline comparison") and batched attention GEMMs are
recomputed and not counted. Under context parallelism the SDPA's output and logsumexp are
kept once per layer and the ring's exchanges and rescales belong to it (not re-run: how
the SAC mode sees a ring depends on the torch version, assumed). Not modelled: torch's
early stop (the last residual add is not re-run: negligible).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..network.collectives import Collective
from .op_types import LayerShape, Op, OpKind
from .spec import MLP, TransformerSpec

_NOT_COUNTED = ("router",)           # gate matmuls forced to recompute outside the count


@dataclass(frozen=True)
class SacOp:
    """What op-level SAC does with one forward op."""

    recompute_fraction: float        # share of its forward work run again in backward
    recompute_n: int                 # GEMM: the output width of the part run again
    kept_bytes: float                # outputs it keeps from forward to backward


def _mm_parts(op: Op, m: TransformerSpec, sh: LayerShape) -> list[int]:
    """Output widths of the ``aten.mm`` calls a weight GEMM stands for, in issue order."""
    if op.name == "qkv" and m.mla is None:
        q = m.q_dim // sh.tp
        kv = (op.n - q) // 2                 # local KV width (replicated when tp > kv heads)
        if 0 < kv and q + 2 * kv == op.n:
            return [q, kv, kv]
    if op.name.endswith("fc1") and m.mlp == MLP.SWIGLU and op.n % 2 == 0:
        return [op.n // 2, op.n // 2]        # w1, then w3
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


def _attention_kept(m: TransformerSpec, sh: LayerShape) -> float:
    """SDPA's output and logsumexp for one micro-batch on one rank."""
    heads = max(1, m.n_heads // sh.tp)
    d_v = m.mla.v_head_dim if m.mla is not None else m.head_dim
    return sh.micro_batch * heads * (m.seq_len // sh.cp) * (d_v * sh.act_bytes + 4)


def _other(op: Op, m: TransformerSpec, sh: LayerShape, first_attention: bool) -> SacOp:
    """A forward op that is not a counted matmul."""
    if op.kind == OpKind.ATTENTION:                       # saved: output and logsumexp
        return SacOp(0.0, 0, _attention_kept(m, sh) if first_attention else 0.0)
    if op.kind == OpKind.COMM and op.collective == Collective.REDUCE_SCATTER:
        return SacOp(0.0, 0, op.comm_bytes / max(sh.tp, 1))
    if op.kind == OpKind.COMM and op.group == "ep":       # all_to_all_single: saved
        return SacOp(0.0, 0, op.comm_bytes)
    if (op.kind == OpKind.COMM and op.group == "cp") or op.name.endswith("_correction"):
        return SacOp(0.0, 0, 0.0)                         # the ring inside the saved SDPA
    return SacOp(1.0, op.n, 0.0)


def plan_for(fwd: list[Op], m: TransformerSpec, sh: LayerShape) -> dict[str, SacOp]:
    """Per forward op (by name): what torchtitan's op SAC recomputes and keeps."""
    out: dict[str, SacOp] = {}
    count, seen_attention = 0, False
    for op in fwd:
        counted = op.kind == OpKind.GEMM and op.has_weights and not op.grouped
        if counted and op.name not in _NOT_COUNTED:
            out[op.name], count = _gemm(op, _mm_parts(op, m, sh), count, sh.act_bytes)
            continue
        out[op.name] = _other(op, m, sh, op.kind == OpKind.ATTENTION and not seen_attention)
        seen_attention |= op.kind == OpKind.ATTENTION
    return out


def kept_bytes(fwd: list[Op], m: TransformerSpec, sh: LayerShape, input_bytes: float) -> float:
    """Bytes one layer keeps from forward to backward under op SAC: its input and the
    outputs the policy saves."""
    return input_bytes + sum(s.kept_bytes for s in plan_for(fwd, m, sh).values())
