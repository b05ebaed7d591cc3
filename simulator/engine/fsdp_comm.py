"""ZeRO-3 / FSDP communication of one pipeline chunk (``engine.stage_work`` builds the chunk):
the parameters' all-gathers before forward and backward, the gradients' reduce-scatters
(and HSDP's all-reduces), how many collectives a pass takes (one per FSDP unit, or
DeepSpeed's bucketed ones: ``cost.persistence``), and the pieces nothing hides."""
from __future__ import annotations

from ..cost.host import ParamLayout, fsdp_lane_ops, routed_experts
from ..cost.layer import PassCost, Segment, group_collective, group_links, interference_s, pass_cost
from ..cost.persistence import (
    gather_calls, persistent_count, persistent_tensors, reduce_calls, tensor_sizes)
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..memory.accounting import grad_reduce_bytes
from ..network.collectives import Collective
from ..parallel.placement import GroupPlacement
from ..parallel.plan import Plan
from ..parallel.schedule import chunk_share
from ..workload.op_types import Op
from ..workload.spec import TransformerSpec


def fsdp_once_per_step(plan: Plan) -> bool:
    """FSDP gathers once and reduces once per step: pipeline parallelism under a framework
    that keeps parameters gathered across micro-batches (``MemoryConventions.
    fsdp_pp_once_per_step``: torchtitan sets ``reshard_after_forward = not pp_enabled``;
    torch pipelining turns ``set_reshard_after_backward`` and gradient sync off for every
    micro-batch and reduces in ``perform_reduce_grad`` after the last backward,
    torch/distributed/pipelining/stage.py)."""
    return plan.zero_stage >= 3 and plan.pp > 1 and plan.memory.fsdp_pp_once_per_step


def chunk_passes(plan: Plan) -> int:
    """Micro-batch passes each chunk runs per step (DualPipe: half of them per copy)."""
    return max(1, round(plan.num_microbatches * chunk_share(plan.schedule)))


def fsdp_per_step(plan: Plan) -> float:
    """Share of a chunk's pass that FSDP's once-per-step gather costs: one over the chunk's
    passes per step under ``fsdp_once_per_step`` (spread evenly), else 1."""
    return 1.0 / chunk_passes(plan) if fsdp_once_per_step(plan) else 1.0


def fsdp_edge_params(model: TransformerSpec, plan: Plan, first: bool, last: bool) -> float:
    """Parameters of the FSDP unit that opens the step (gathered first) and closes it
    (reduced in the final callback), on the chunk holding the embedding: the embedding unit
    (torchtitan: ``fsdp_embedding_unit``), else the root, which also holds the output layer
    when the chunk has it and it is not tied (the final norm is left out)."""
    if not first:
        return 0.0
    emb = model.vocab * model.hidden / plan.tp
    own_head = last and not model.tied_embeddings and not plan.memory.fsdp_embedding_unit
    return emb * (2.0 if own_head else 1.0)


def _fsdp_leads(params: float, edge: float, n_layers: int, dtype_bytes: tuple[int, int],
                plan: Plan, groups: dict[str, GroupPlacement], g: GroupPlacement,
                prof: Profile) -> tuple[float, float, float]:
    """One micro-batch's unhidden FSDP pieces: a layer's gather, the edge unit's gather and
    its reduce-scatter (with HSDP's all-reduce of its shard)."""
    c_bytes, r = dtype_bytes
    layer_w = (params - edge) * c_bytes / max(1, n_layers)
    first_layer = group_collective(Collective.ALL_GATHER, layer_w, g, prof).time_s
    if not edge:
        return first_layer, 0.0, 0.0
    edge_ag = group_collective(Collective.ALL_GATHER, edge * c_bytes, g, prof).time_s
    edge_rs = group_collective(Collective.REDUCE_SCATTER, edge * r, g, prof).time_s
    if plan.replicas > 1:
        edge_rs += _hsdp_all_reduce(edge * r, plan.shard_ranks, groups, prof).time_s
    return first_layer, edge_ag, edge_rs


def _hsdp_all_reduce(grad_bytes: float, shard_ranks: int, groups: dict[str, GroupPlacement],
                     prof: Profile):
    """HSDP: the reduced gradient shards (``grad_bytes`` / ``shard_ranks``) all-reduced
    across the replica groups."""
    return group_collective(Collective.ALL_REDUCE, grad_bytes / shard_ranks,
                            groups["dp_rep"], prof)


def fsdp_groups(plan: Plan, groups: dict[str, GroupPlacement]
                 ) -> tuple[GroupPlacement, GroupPlacement]:
    """(dense, expert) FSDP shard groups: HSDP's shard group, or all of dp (x cp), and the
    ranks sharing an expert shard (that group thinned by EP)."""
    if plan.dp_shard:
        return groups["dp_shard"], groups["edp_shard"]
    return groups["dp"], groups["edp"]


def zero3_tensors(model: TransformerSpec, plan: Plan, layout: ParamLayout,
                  runs: list[tuple[list[Op], int]], units: int
                  ) -> tuple[int, tuple[tuple[int, int], tuple[int, int]]]:
    """(persistent parameter tensors, ((all-gathers, reduce-scatters) of one pass over the
    dense parameters, the same over the routed experts')) of a chunk under ZeRO-3 whose ops
    are ``runs`` (each run's ops and how many times they repeat: the layers in order, the
    embedding and head ops last): the tensors of at most the persistence threshold
    (``cost.persistence``; none below ZeRO-3); DeepSpeed's bucketed collectives over each
    part's tensors (``gather_calls`` / ``reduce_calls``; where both share one group DeepSpeed
    coalesces across the parts, so their sum may be high by up to about one a layer);
    or one of each per FSDP unit (``units``: layers and edge units) and per MoE layer for
    the experts (torchtitan shards them as a unit of their own under EP)."""
    mem, h2 = plan.memory, model.hidden ** 2
    threshold = mem.zero3_persistence_threshold_hidden * model.hidden \
        if plan.zero_stage >= 3 else 0.0
    if mem.zero3_prefetch_bucket_hidden2 <= 0:
        persistent = sum(n * persistent_tensors(ops, layout, threshold, model) for ops, n in runs)
        moe = sum(n for ops, n in runs if any(routed_experts(o) for o in ops))
        return persistent, ((max(1, units),) * 2, (max(1, moe),) * 2)
    # each part's tensors over the chunk, every run's sizes taken once
    parts = [[x for ops, n in runs for x in tensor_sizes(ops, layout, model, experts) * n]
             for experts in (False, True)]

    def calls(sizes: list[float]) -> tuple[int, int]:
        return (max(1, gather_calls(sizes, threshold, mem.zero3_prefetch_bucket_hidden2 * h2)),
                max(1, reduce_calls(sizes[::-1], mem.zero3_reduce_bucket_hidden2 * h2)))
    return sum(persistent_count(p, threshold) for p in parts), (calls(parts[0]), calls(parts[1]))


def _fsdp_collectives(params: float, dense: float, plan: Plan,
                      groups: dict[str, GroupPlacement], prof: Profile,
                      dtype_bytes: tuple[int, int], calls=((1, 1), (1, 1))
                      ) -> tuple[list, list, list]:
    """(gathers, reduce-scatters, HSDP all-reduces) of the chunk's parameters once, each
    (one collective, how many of it): dense ones over the shard group, expert ones over the
    ranks sharing an expert shard (the shard group thinned by EP: torchtitan's
    dp_shard_mod_ep, edp without HSDP), each part in its ``calls`` (all-gathers,
    reduce-scatters) equal pieces (``zero3_tensors``); under HSDP each reduced shard is
    all-reduced across the replicas."""
    c_bytes, r = dtype_bytes
    g, ge = fsdp_groups(plan, groups)
    parts = [(p, grp, n, k) for p, grp, n, k in (
        (dense, g, plan.shard_ranks, calls[0]),
        (params - dense, ge, max(1, plan.shard_ranks // plan.ep), calls[1])) if p > 0]
    ag = [(group_collective(Collective.ALL_GATHER, p * c_bytes / k[0], grp, prof), k[0])
          for p, grp, _, k in parts]
    rs = [(group_collective(Collective.REDUCE_SCATTER, p * r / k[1], grp, prof), k[1])
          for p, grp, _, k in parts]
    ar = [(_hsdp_all_reduce(p * r / k[1], n, groups, prof), k[1]) for p, _, n, k in parts] \
        if plan.replicas > 1 else []
    return ag, rs, ar


def add_fsdp_comm(fwd: PassCost, bwd: PassCost, params: float, n_layers: int, plan: Plan,
                  groups: dict[str, GroupPlacement], prof: Profile,
                  cluster: ClusterSpec, edge_params: float = 0.0, dense: float | None = None,
                  kept_layers: int = 0, calls=((1, 1), (1, 1))) -> None:
    """ZeRO-3 / FSDP: gather weights before fwd and bwd, reduce-scatter grads after bwd,
    each prefetched one layer ahead: exposed = lead + max(0, comm - lead - compute), the
    lead being what nothing can hide. In forward that is the first layer's gather and, on
    the chunk holding the embedding (``edge_params``), the embedding unit's gather before
    it: the first collective of the step (FSDP2: the root's or the embedding unit's
    pre-forward unshard, _fsdp_state.py _pre_forward). In backward, a layer's re-gather
    leads, and the embedding's reduce-scatter trails: its input (token ids) needs no
    gradient, so it gets no post-backward hook and is reduced in the final callback, which
    makes the step wait for it (_fsdp_state.py _root_post_backward_final_callback).
    HSDP (``Plan.dp_shard``): gathers and reduce-scatters within the shard group; each
    reduced shard is all-reduced across the replicas on a stream of its own, concurrent
    with the next units' reduce-scatters (FSDP2 _fsdp_param_group.py: "Run the HSDP
    all-reduces concurrently with all-gather/reduce-scatter"; ``foreach_reduce`` on
    ``all_reduce_stream``; FSDP1 ``_all_reduce_stream``): the backward lane is the longer
    of the two chains; the last unit's all-reduce follows its reduce-scatter.
    Once per step under ``fsdp_once_per_step``: the gather spread over the micro-batches'
    forwards, no re-gather in backward, and the reduce-scatter exposed (the final
    post-backward callback makes the compute stream wait for it), spread likewise. The
    mechanisms' passes on FSDP's streams (``cost.host.fsdp_lane_ops``: FSDP1's gradient cat
    beside the gathers, its cast and pre-division before each reduce-scatter) run in series
    with them. ``kept_layers`` (``ChunkMemory.zero3_kept_layers``): not gathered again.
    ``calls``: dense and experts' (all-gathers, reduce-scatters) a pass (``zero3_tensors``)."""
    g = fsdp_groups(plan, groups)[0]
    once, f = fsdp_once_per_step(plan), fsdp_per_step(plan)
    regather = 0.0 if once else 1.0 - kept_layers / max(n_layers, 1)   # kept: no re-gather
    c_bytes, r = (4 if plan.precision.value == "fp32" else 2), grad_reduce_bytes(plan)
    w_bytes, r_bytes = params * c_bytes, params * r
    ag_c, rs_c, ar_c = _fsdp_collectives(params, params if dense is None else dense, plan,
                                         groups, prof, (c_bytes, r), calls)
    lanes = fsdp_lane_ops(plan.host_mechanisms, params, n_layers, c_bytes, r, g.size)
    cat, prep = (pass_cost(ops, cluster.gpu, prof, groups, False).compute_s if ops else 0.0
                 for ops in lanes)
    ag, rs = sum(c.time_s * k for c, k in ag_c), sum(c.time_s * k for c, k in rs_c) + prep
    ar = sum(c.time_s * k for c, k in ar_c)
    for pc, costs, times in ((fwd, ag_c, f), (bwd, ag_c, regather), (bwd, rs_c + ar_c, f)):
        for c, k in costs:
            pc.add_link_busy(c, times * k)
    edge = 0.0 if once else min(edge_params, params)
    first_layer, edge_ag, edge_rs = (f * t for t in _fsdp_leads(
        params, edge, n_layers, (c_bytes, r), plan, groups, g, prof))
    what_bwd = "fsdp reduce-scatter (once per step)" if once else \
        "fsdp all-gather + reduce-scatter" + (" + hsdp all-reduce" if ar_c else "")
    links = group_links(g) + (group_links(groups["dp_rep"]) if ar_c else ())
    for pc, comm, what, nbytes, lead in (
            (fwd, f * ag, "fsdp all-gather", f * w_bytes, edge_ag + first_layer),
            (bwd, max(regather * ag + cat + f * rs, f * ar), what_bwd,
             regather * w_bytes + f * r_bytes, (0.0 if kept_layers else regather) * first_layer
             + edge_rs)):
        busy = pc.total_s
        lead = min(lead, comm)        # priced one unit at a time, never more than the lane
        exposed = f * (rs + ar) + lead if pc is bwd and once else \
            lead + max(0.0, comm - lead - busy)
        slowed = interference_s(min(comm, busy), prof)
        pc.interference_s += slowed
        pc.comm_s["dp"] = pc.comm_s.get("dp", 0.0) + exposed
        pc.segments.insert(0, Segment(what, "dp", exposed, comm, links, nbytes, slowed))
