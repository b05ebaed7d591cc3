"""The MoE block as Megatron-Core's all-to-all token dispatcher runs it (``moe_ops``), and
the busiest rank's load (``moe_load_factor``), from the building blocks of
``simulator.workload.op_types``; ``simulator.workload.ops.layer_ops`` places it."""
from __future__ import annotations

from dataclasses import replace

from ..frameworks.moe import ROUTING
from .moe_load import expected_max_load_ratio, flex_destinations
from .op_types import (
    Collective,
    FlexRouting,
    LayerShape,
    Op,
    _comm,
    _enter_tp,
    _gemm,
    _leave_tp,
    _mem,
    _tokens,
    mlp_ops,
)
from .spec import TransformerSpec


def moe_load_factor(m: TransformerSpec, sh: LayerShape, routed: float) -> float:
    """Rows the busiest EP rank processes, over the balanced mean: the capacity factor when
    experts are padded to capacity, else the expected dropless imbalance
    (``workload.moe_load``; the routing spread by expert count and balancing method,
    ``frameworks/moe.json``)."""
    moe = m.moe
    if moe.capacity_factor > 0:
        return moe.capacity_factor
    cv = ROUTING.expert_load_cv(moe.experts, loss_free=moe.router_expert_bias)
    return expected_max_load_ratio(sh.ep, moe.experts // sh.ep, moe.experts, routed, cv)


def _copy_both_ways(name: str, elems: float, sh: LayerShape) -> Op:
    """A chunk reorder (``torch.split`` + ``torch.cat``): one copy forward, and its backward
    (split's gradient is a cat) is one copy of the same bytes, not twice."""
    return _mem(name, elems, elems, sh, kind="copy", bwd_same=True)


# The dispatcher's own TP gather and reduce-scatter are plain NCCL calls on the compute
# stream (dispatch_postprocess / combine_preprocess: gather_from_sequence_parallel_region,
# reduce_scatter_to_sequence_parallel_region, token_dispatcher.py @ d98e8a64 l.741-751,
# 829-834); TE's grouped linear has its TP comm switched off ("The comms between TP and EP
# group is explicitly handled by MoE token dispatcher", extensions/transformer_engine.py
# l.2447), so --tp-comm-overlap hides neither: their ops carry no overlaps_with
_DISPATCHER_TP_COLLECTIVES = ("ep_tp_allgather", "ep_tp_allgather_probs", "ep_tp_reducescatter")


def moe_ops(m: TransformerSpec, sh: LayerShape) -> list[Op]:
    """Router, token dispatch, local experts, combine, as Megatron-Core's all-to-all token
    dispatcher runs them (``MoEAlltoAllTokenDispatcher``, dropless unless the spec gives a
    capacity factor).

    Each rank routes its own tokens (the SP shard, 1/tp of them, when TP > 1): router GEMM
    (16-bit even in FP8 runs: a plain linear outside Transformer Engine), fp32 softmax and
    top-k, then a permutation copy grouping its token-expert pairs by destination. The
    all-to-all sends them over the EP group; the receiving rank all-gathers them over TP
    (expert weights are TP-sharded), sorts the chunks by local expert when it holds more
    than one (``sort_chunks_by_idxs``), runs the experts as one grouped GEMM (``batch`` =
    local experts, ``grouped``), then undoes each step; the router probabilities travel in
    a second (fp32) all-to-all and scale the experts' activation (weighted SwiGLU), and the
    unpermute sums the top-k copies. The busiest rank sets every step after the
    router (``moe_load_factor``). The all-to-all is exposed (Megatron overlaps it only with
    its opt-in EP-overlap schedule). Shared experts run on every token, TP-sharded with their
    own gather/reduce. ``sh.moe_dispatcher == "flex"``: ``_flex_ops``."""
    moe = m.moe
    assert moe is not None
    T, _ = _tokens(m, sh)
    h, ab = m.hidden, sh.act_bytes
    t_loc = T // sh.tp if sh.tp > 1 else T       # tokens this rank routes
    routed = t_loc * moe.top_k                   # token-expert pairs this rank sends
    local = moe.experts // sh.ep
    recv = routed * moe_load_factor(m, sh, routed)   # pairs the busiest rank receives
    sh16 = replace(sh, dtype="bf16") if sh.dtype == "fp8" else sh
    ops = [_gemm("router", t_loc, moe.experts, h, sh16, saved=t_loc * h * ab),
           _mem("moe_router_topk", t_loc * moe.experts, t_loc * moe.experts, sh,
                elem_bytes=4, kind="softmax")]    # fp32 softmax + top-k over router logits
    if sh.moe_dispatcher == "flex" and sh.ep > 1:
        return ops + _flex_ops(m, sh, t_loc, recv / routed) + _shared_expert_ops(m, sh, t_loc)
    ops.append(_mem("moe_permute", t_loc * h, routed * h, sh, kind="copy"))
    if sh.ep > 1:
        ops.append(_comm("ep_dispatch", Collective.ALL_TO_ALL, "ep", recv * h * ab))
        # the router probabilities travel with the tokens in a second all-to-all (in the
        # router's dtype: bf16 unless --moe-router-dtype; token_dispatcher.py @ d98e8a64
        # l.718) and are applied inside the experts' activation
        ops.append(_comm("ep_dispatch_probs", Collective.ALL_TO_ALL, "ep", recv * ab))
    group_rows = recv * sh.tp                    # gathered over TP (expert TP = TP)
    # synchronous on the compute stream, hidden by nothing (_DISPATCHER_TP_COLLECTIVES)
    if sh.tp > 1:                                # tokens and probabilities, l.741-751
        ops.append(_comm("ep_tp_allgather", Collective.ALL_GATHER, "tp", group_rows * h * ab))
        ops.append(_comm("ep_tp_allgather_probs", Collective.ALL_GATHER, "tp",
                         group_rows * ab))
    ops += _local_expert_ops(m, sh, group_rows, local)
    if sh.tp > 1:
        ops.append(_comm("ep_tp_reducescatter", Collective.REDUCE_SCATTER, "tp",
                         group_rows * h * ab))
    if sh.ep > 1:
        ops.append(_comm("ep_combine", Collective.ALL_TO_ALL, "ep", recv * h * ab))
    # the combine scatter-adds the top-k expert outputs of each token; its backward is the
    # matching gather, the same bytes. Kept for backward: where the combine weights the
    # outputs by their probabilities (eager MoE code, calibrate/memcheck_model.py; Megatron
    # before its weighted activation), the outputs and the fp32 probabilities; where the
    # probabilities scale the experts' activation instead (LayerShape.
    # moe_weighted_activation: Megatron-Core @ d98e8a64, token_dispatcher.py l.891,
    # experts.py l.943-977), only the probabilities
    kept = routed * 4 + (0.0 if sh.moe_weighted_activation else routed * h * ab)
    ops.append(_mem("moe_combine", routed * h, t_loc * h, sh, saved=kept, bwd_same=True))
    return ops + _shared_expert_ops(m, sh, t_loc)


def _flex_ops(m: TransformerSpec, sh: LayerShape, t_loc: int, load: float) -> list[Op]:
    """Dispatch to combine as Megatron-Core's flex dispatcher runs them on DeepEP (tp = 1;
    ``token_dispatcher.py`` @ d98e8a64 ``_DeepepManager``): one fused kernel sends each token
    once per destination rank, with its fp32 top-k probabilities, once per destination node
    over RDMA and on over NVLink (priced on the placed group, ``cost.moe_comm``); the
    receiver expands its tokens to (token, local expert) rows (``permute`` with the multihot
    map), the experts run, the rows are summed back per token (``unpermute``), and the fused
    combine returns them, reducing per node before RDMA. No separate source-side permute,
    probability all-to-all or chunk sort. ``load``: the busiest rank's rows over the mean."""
    moe, h, ab = m.moe, m.hidden, sh.act_bytes
    ranks_hit, _ = flex_destinations(moe.top_k, moe.experts, moe.router_groups,
                                     moe.router_group_topk, sh.ep, 1)
    rows = t_loc * moe.top_k * load                # (token, local expert) rows, busiest rank
    recv = t_loc * ranks_hit * load                # tokens it receives (one per rank hit)
    route = FlexRouting(t_loc * load, h * ab, moe.top_k, moe.experts, moe.router_groups,
                        moe.router_group_topk)
    ops = [replace(_comm("ep_dispatch", Collective.ALL_TO_ALL, "ep", recv * h * ab),
                   routing=route),
           _mem("moe_permute", recv * h, rows * h, sh, kind="copy", bwd_same=True)]
    ops += _local_expert_ops(m, replace(sh, tp=1, ep=1), rows, moe.experts // sh.ep)
    kept = rows * 4 + (0.0 if sh.moe_weighted_activation else rows * h * ab)
    ops.append(_mem("moe_unpermute", rows * h, recv * h, sh, saved=kept, bwd_same=True))
    ops.append(replace(_comm("ep_combine", Collective.ALL_TO_ALL, "ep", recv * h * ab),
                       routing=route))
    return ops


def _local_expert_ops(m: TransformerSpec, sh: LayerShape, group_rows: float,
                      local: int) -> list[Op]:
    """The gathered rows through this rank's experts: regrouped by local expert, padded
    for FP8, one grouped GEMM, and back."""
    h, ops = m.hidden, []
    # rows from several ranks are regrouped by local expert after the gather
    # (sort_chunks_by_idxs in dispatch_postprocess), and back before the reduce-scatter
    sort = local > 1 and (sh.ep > 1 or sh.tp > 1)
    if sort:
        ops.append(_copy_both_ways("moe_sort_chunks", group_rows * h, sh))
    # FP8 grouped GEMMs need each expert's rows padded to the recipe's alignment: the
    # all-to-all dispatcher's tokens are copied into padded segments before fc1 and copied
    # back out after fc2 (TEGroupedMLP quantization_padding / _unpadding, experts.py @
    # d98e8a64 l.896-905, l.1041-1043); each backward is the opposite copy, same bytes
    fp8_pad = sh.dtype == "fp8"
    if fp8_pad:
        ops.append(_copy_both_ways("moe_fp8_pad", group_rows * h, sh))
    ops += mlp_ops(m, sh, ffn=m.moe.expert_ffn_hidden, name="experts", tokens=int(group_rows),
                   groups=local)
    if fp8_pad:
        ops.append(_copy_both_ways("moe_fp8_unpad", group_rows * h, sh))
    if sort:
        ops.append(_copy_both_ways("moe_unsort_chunks", group_rows * h, sh))
    return ops


def _shared_expert_ops(m: TransformerSpec, sh: LayerShape, t_loc: int) -> list[Op]:
    """Shared experts: a dense FFN on every token, TP-sharded with its own gather/reduce."""
    moe = m.moe
    if not moe.shared_experts:
        return []
    return (_enter_tp("shared_allgather", m, sh, "shared_fc1")
            + mlp_ops(m, sh, ffn=moe.expert_ffn_hidden * moe.shared_experts, name="shared",
                      tokens=t_loc * sh.tp)
            + _leave_tp("shared_reduce", m, sh, "shared_fc2"))
