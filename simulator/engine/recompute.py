"""Which forward ops a layer runs again in backward under activation recompute: Megatron's
selective recompute (the core attention), full recompute (the whole layer, or up to its last
saved tensor under torch's non-reentrant checkpoint: ``early_stopped``) and torchtitan's
op-level SAC (``workload.sac``), each op renamed as re-run (``as_rerun``)."""
from __future__ import annotations

from dataclasses import replace

from ..hardware.specs import Dtype
from ..parallel.plan import Plan, Recompute
from ..workload import sac
from ..workload.ops import LayerShape, Op, OpKind
from ..workload.spec import TransformerSpec


def sac_op(plan: Plan) -> bool:
    """Whether the plan's selective recompute is torchtitan's op-level SAC."""
    return plan.recompute == Recompute.SELECTIVE and plan.memory.selective_recompute == "op"


def as_rerun(op: Op, rerun: set[str]) -> Op:
    """``op`` run again in backward: hardware, not model, FLOPs (``recompute_flops``, in the
    same attention convention as ``model_flops``); a re-run communication hides behind the
    re-run kernel it overlapped in the forward (TE's CP ring re-posts each KV block before
    the recomputed attention step)."""
    return replace(op, name=op.name + "_recompute", model_flops=0.0,
                   recompute_flops=op.model_flops,
                   overlaps_with=(op.overlaps_with + "_recompute"
                                  if op.overlaps_with in rerun else op.overlaps_with))


def sac_recompute_ops(fwd: list[Op], model: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Op-level SAC (``workload.sac``): each op's re-run part; a GEMM re-runs its
    even-numbered matmuls (the output width ``recompute_n``: the whole input is read
    again, the weight and output of that part only)."""
    out, plan = [], sac.plan_for(fwd, model, sh)
    again = {n for n, s in plan.items() if s.recompute_fraction > 0.0}
    for op in fwd:
        f = plan[op.name].recompute_fraction
        if f <= 0.0:
            continue
        part = op
        if op.kind == OpKind.GEMM and f < 1:
            n2, full = plan[op.name].recompute_n, op.m * op.k + op.k * op.n + op.m * op.n
            elem = op.bytes_moved / (op.batch * full) if full else 0.0
            # the re-run matmuls are one of the op's parts (wk of q, k, v; w3 of w1, w3)
            part = replace(op, n=n2, split=(), flops=op.flops * f,
                           model_flops=op.model_flops * f,
                           bytes_moved=op.batch * elem * (op.m * op.k + op.k * n2 + op.m * n2))
        out.append(as_rerun(part, again))
    return out


def early_stopped(fwd: list[Op], gemm_saves_first: bool = True) -> list[Op]:
    """The part of a layer's forward torch's non-reentrant checkpoint re-runs (early stop:
    it ends once the last tensor the forward saved is saved again): the ops up to the last
    one that saves a tensor, that one too unless it is a GEMM whose inputs are saved before
    its kernel runs (``gemm_saves_first``: an aten matmul, whose autograd code saves them
    first; not a custom autograd Function, which saves after its forward ran). A block
    ending in its down projection and residual add re-runs neither; one whose dropout mask
    or post-norm follows them re-runs all of it."""
    last = max((i for i, op in enumerate(fwd) if op.saved_bytes > 0), default=-1)
    if last >= 0 and fwd[last].kind == OpKind.GEMM and gemm_saves_first:
        return fwd[:last]
    return fwd[:last + 1]


def _early_stop(fwd: list[Op], plan: Plan, model: TransformerSpec | None) -> list[Op]:
    """``early_stopped`` for the plan's framework and the model: the last GEMM re-runs when
    a norm the op graph leaves out saves its output (``TransformerSpec.post_mlp_norm``
    without ``sandwich_norms``: OLMo 2's post-norm, which ``ln2`` stands for; Gemma's
    ``post_ffn_norm`` is in the op graph and ends the re-run itself), or
    when the Linears are autograd Functions (``zero3_linear_function`` at ZeRO stage 3:
    DeepSpeed's memory-efficient linear; FP8 Linears: torchao's Float8Linear, TE's
    modules)."""
    if model is not None and model.post_mlp_norm and not model.sandwich_norms:
        return fwd
    functions = plan.precision == Dtype.FP8 or (plan.memory.zero3_linear_function
                                                and plan.zero_stage >= 3)
    return early_stopped(fwd, gemm_saves_first=not functions)


def recompute_ops(fwd: list[Op], plan: Plan, model: TransformerSpec | None = None,
                   sh: LayerShape | None = None, recompute: Recompute | None = None
                   ) -> list[Op]:
    """Forward ops re-run in backward (``as_rerun``) under ``recompute`` (default: the
    plan's; a layer past a partial recompute's count has none: ``Plan.recompute_of``)."""
    rc = plan.recompute if recompute is None else recompute
    if sac_op(plan):
        if model is None or sh is None:
            raise ValueError("op-level SAC needs the model and layer shape to pick its ops")
        return sac_recompute_ops(fwd, model, sh)
    if rc == Recompute.FULL:
        chosen = _early_stop(fwd, plan, model) if plan.memory.recompute_early_stop else fwd
    elif rc == Recompute.SELECTIVE:
        chosen = [op for op in fwd if op.recomputed]
    else:
        chosen = []
    names = {op.name for op in chosen}
    return [as_rerun(op, names) for op in chosen]
