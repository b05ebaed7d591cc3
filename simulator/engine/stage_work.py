"""Per-stage work: which layers each pipeline chunk holds and what one pass through it costs.

This is the bridge between the op graph (``workload.ops``), the cost models and the event
engine: for every (stage, chunk) it prices one forward and one backward pass (recompute
included) for one micro-batch, plus the parameters the chunk owns.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import groupby

from ..cost.host import (
    MOE_PRE_SYNC_OPS, HostCost, MoEHost, ParamLayout, bucket_copy_ops, code_mechanisms,
    device_copy_ops, eager_host, host_mode, layer_host, linear_calls,
    linear_weights, loop_lead_host, mechanisms_host, model_host, moe_layer_host,
    param_tensors)
from ..cost.layer import PassCost, Segment, pass_cost
from ..cost.persistence import persistent_gather_s
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..memory.accounting import ChunkMemory
from ..memory.chunk import chunk_memory
from ..network.fabric import fabric_of
from ..parallel.placement import GroupPlacement, group_strides, place_group
from ..parallel.plan import AttentionImpl, Plan, Recompute
from ..parallel.schedule import Part, Unit, chunk_parts
from ..workload.ops import (
    LayerShape,
    Op,
    OpKind,
    backward_ops,
    embedding_ops,
    head_ops,
    layer_ops,
    weight_grad_ops,
)
from ..workload.spec import TransformerSpec
from .fsdp_comm import (
    add_fsdp_comm, chunk_passes, fsdp_edge_params, fsdp_groups, fsdp_once_per_step, zero3_tensors)
from .recompute import recompute_ops, sac_op


@dataclass
class ChunkWork:
    """One model chunk on one stage, for one micro-batch."""

    stage: int
    chunk: int
    layers: list[int]
    fwd: PassCost
    bwd: PassCost
    params: float                 # parameters held by one rank (after TP/EP split)
    dense_params: float           # of which replicated over the full DP group
    memory: ChunkMemory           # what it keeps in memory (simulator.memory.chunk)
    fwd_ops: list[Op] = field(default_factory=list, repr=False)
    wgrad: PassCost = field(default_factory=PassCost)   # of bwd: the weight-gradient half (W)
    # tied input/output embedding under pipeline parallelism: the parameters of it this
    # chunk holds (the first chunk's embedding, the last chunk's copy for the head), whose
    # gradients are all-reduced between the two stages before the optimizer step
    tied_params: float = 0.0
    # parameter tensors the rank's optimizer steps for this chunk (local shards), the FSDP
    # units (layers and edge units) where it steps one flat parameter per unit, and of the
    # tensors those ZeRO-3 keeps whole (``cost.persistence``; 0 below ZeRO-3)
    param_tensors: int = 0
    units: int = 0
    persistent_tensors: int = 0
    # the optimizer step's all-gathers of those tensors (``persistent_gather_s``)
    persistent_gather_s: float = 0.0

    def pass_cost(self, u: Unit) -> PassCost:
        """What running ``u`` costs: the forward, the whole backward, or its B or W half
        (W: the weight-gradient GEMMs and the per-parameter work after them; B: the rest)."""
        if u.fwd:
            return self.fwd
        if u.part == Part.WEIGHT:
            return self.wgrad
        return self.bwd if u.part == Part.WHOLE else _without(self.bwd, self.wgrad)


def pass_numbers(pc: PassCost, ch: ChunkWork) -> tuple[float, float, float, int]:
    """What the host/device recursions read of one pass of ``ch``: (device seconds, host
    seconds, ``PassCost.first_share`` of the host time, layers)."""
    return pc.total_s, pc.host_s, pc.first_share, len(ch.layers)


def _without(whole: PassCost, part: PassCost) -> PassCost:
    """``whole`` less ``part``'s compute and host time (``part`` has no communication);
    communication and interference stay with the remainder, its compute segments shrink
    in proportion."""
    left = max(0.0, whole.compute_s - part.compute_s)
    scale = left / whole.compute_s if whole.compute_s > 0 else 0.0
    segs = [seg if seg.group else replace(seg, exposed_s=seg.exposed_s * scale)
            for seg in whole.segments]
    out = PassCost(compute_s=left,
                   comm_s=dict(whole.comm_s), interference_s=whole.interference_s,
                   flops=whole.flops - part.flops, model_flops=whole.model_flops - part.model_flops,
                   hardware_flops=whole.hardware_flops - part.hardware_flops,
                   host_s=max(0.0, whole.host_s - part.host_s),
                   host_ops=max(0.0, whole.host_ops - part.host_ops),
                   link_busy_s=dict(whole.link_busy_s), _segments=segs)
    out.op_times = {k: v for k, v in whole.op_times.items() if k not in part.op_times}
    return out


def partition_layers(n_layers: int, chunks: int) -> list[list[int]]:
    """Contiguous layer ranges per global chunk; a remainder deficit goes to the first and
    last chunks, which also carry the embedding and the output head."""
    base, extra = divmod(n_layers, chunks)
    sizes = [base] * chunks
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 2 else list(range(chunks))
    for i in order[:extra]:
        sizes[i] += 1
    out, start = [], 0
    for s in sizes:
        out.append(list(range(start, start + s)))
        start += s
    return out


def chunk_layers(model: TransformerSpec, plan: Plan) -> list[list[int]]:
    """The layers of each global model chunk, in order (``partition_layers`` over the
    schedule's chunks, ``schedule.chunk_parts``)."""
    return partition_layers(model.n_layers, chunk_parts(plan.schedule, plan.pp, plan.vpp)[0])


def layer_shape(model: TransformerSpec, plan: Plan) -> LayerShape:
    layout = ParamLayout.of(model, plan.memory.param_layout)
    return LayerShape(micro_batch=plan.micro_batch, seq_len=model.seq_len, tp=plan.tp,
                      cp=plan.cp, ep=plan.ep, sequence_parallel=plan.sequence_parallel,
                      dtype=plan.precision.value,
                      flash=plan.attention != AttentionImpl.MATERIALIZED,
                      attention_kernel=plan.attention.value,
                      dropout=plan.memory.dropout, loss=plan.memory.loss.value,
                      fused_swiglu=plan.memory.fused_swiglu,
                      # torch.compile fuses the model code's pointwise ops (Inductor):
                      # their traffic is the fused kernels' under the compiled host mode
                      eager_elementwise=plan.memory.eager_elementwise
                      and plan.host_mode != "compiled",
                      eager_code=plan.memory.eager_code, sac_op=sac_op(plan),
                      moe_weighted_activation=plan.memory.moe_weighted_activation,
                      moe_dispatcher=plan.moe_dispatcher, split_qkv=layout.split_qkv,
                      split_gate_up=layout.split_gate_up)


def place_groups(cluster: ClusterSpec, plan: Plan) -> dict[str, GroupPlacement]:
    fab = fabric_of(cluster)
    return {name: place_group(cluster, name, size, stride, fab)
            for name, (size, stride) in group_strides(plan).items()}


class _LayerCache:
    """Prices each distinct layer kind once (dense/MoE, global/local attention differ)."""

    def __init__(self, model, plan, cluster, prof, groups):
        self.m, self.p, self.c, self.prof, self.g = model, plan, cluster, prof, groups
        self.sh = layer_shape(model, plan)
        self._cache: dict[tuple[tuple[bool, bool], Recompute],
                          tuple[list[Op], PassCost, PassCost, PassCost]] = {}

    def get(self, layer: int, recompute: Recompute | None = None
            ) -> tuple[list[Op], PassCost, PassCost, PassCost]:
        """(forward ops, forward cost, backward cost, of which the weight-gradient GEMMs) of
        ``layer`` under ``recompute`` (default: the plan's)."""
        rc = self.p.recompute if recompute is None else recompute
        key = (self.m.layer_kind(layer), rc)
        if key not in self._cache:
            fwd = layer_ops(self.m, self.sh, layer)
            bwd = recompute_ops(fwd, self.p, self.m, self.sh, rc) + backward_ops(fwd)
            cf = pass_cost(fwd, self.c.gpu, self.prof, self.g, self.p.tp_overlap)
            cb = pass_cost(bwd, self.c.gpu, self.prof, self.g, self.p.tp_overlap)
            _set_host(cf, layer_host(fwd, self.prof, False, self.p.host_mode))
            _set_host(cb, layer_host(bwd, self.prof, True, self.p.host_mode))
            wops = weight_grad_ops(bwd)
            cw = _set_host(pass_cost(wops, self.c.gpu, self.prof, self.g, self.p.tp_overlap),
                           layer_host(wops, self.prof, True, self.p.host_mode))
            if key[0][0]:                                # a MoE layer
                self._add_moe_host(fwd, bwd, cf, cb)
            self._cache[key] = (fwd, cf, cb, cw)
        return self._cache[key]

    def _add_moe_host(self, fwd: list[Op], bwd: list[Op], cf: PassCost, cb: PassCost) -> None:
        """The framework's MoE-layer host work (``cost.host.moe_layer_host``) and the wait at
        the dispatcher's sync (``moe_sync_wait_s``, on the device stream as host time): in
        the forward, and in the backward's input-gradient side (B of a split backward: the
        router, permute and combine gradients are on the input-gradient path) with the
        forward's again where recompute re-runs the MoE block, sync included."""
        scale = host_mode(self.p.host_mode).op_scale
        mh = moe_layer_host(self.p.host_mechanisms, fwd, bwd, charged=scale)
        if self.prof.host is None or mh == MoEHost():
            return
        if self.m.moe is not None and self.m.moe.capacity_factor > 0:
            # drop-and-pad: every expert gets capacity rows, so the dispatcher moves no token
            # counts to the host and never syncs (_maybe_dtoh_and_synchronize does nothing
            # when drop_and_pad, token_dispatcher.py @ d98e8a64 l.927)
            mh = replace(mh, sync=False)
        us = self.prof.host.op_fwd_us.value * 1e-6
        # a layer-scoped CUDA graph captures up to the dispatcher's preprocess (Megatron-Core
        # --cuda-graph-scope attn moe_router moe_preprocess): the router's share replays
        # at the launch mode's per-op scale; the rest stays eager
        post = mh.fwd - mh.pre_sync_fwd
        mh = replace(mh, fwd=mh.pre_sync_fwd * scale + post, pre_sync_fwd=mh.pre_sync_fwd * scale)
        wait = moe_sync_wait_s(fwd, mh, self.prof, self.p.host_mode,
                               lambda ops: pass_cost(ops, self.c.gpu, self.prof, self.g,
                                                     self.p.tp_overlap).total_s)
        again = any(o.name == "moe_permute_recompute" for o in bwd)
        for pc, ops, waits in ((cf, mh.fwd, True), (cb, mh.bwd + (mh.fwd if again else 0.0),
                                                    again)):
            pc.host_s, pc.host_ops = pc.host_s + ops * us, pc.host_ops + ops
            if waits and wait > 0:
                pc.comm_s["host"] = pc.comm_s.get("host", 0.0) + wait
                pc.append(Segment("moe_dispatch_sync", "host", wait))


def moe_sync_wait_s(fwd: list[Op], mh: MoEHost, prof: Profile, mode: str,
                    device_s: Callable[[list[Op]], float]) -> float:
    """Device idle in one MoE layer's forward at the token dispatcher's sync (``mh.sync``):
    the host waits there until the device has run everything issued, so from then on the
    device runs the rest of the layer (after the router: ``cost.host.MOE_PRE_SYNC_OPS``) only
    as fast as the host issues it: it waits ``max(one op's issue, H_post - G_post)``, with
    ``H_post`` the host time of those ops (issued one by one: a layer-scoped CUDA graph
    ends before them) plus the mechanism's host work after the sync and ``G_post`` their
    device time (``device_s``). 0 without a sync or a host model."""
    if not mh.sync or prof.host is None:
        return 0.0
    cut = max((i for i, o in enumerate(fwd) if o.name in MOE_PRE_SYNC_OPS), default=-1)
    post = fwd[cut + 1:]
    us = prof.host.op_fwd_us.value * 1e-6
    h_post = eager_host(post, prof, False, mode).seconds + (mh.fwd - mh.pre_sync_fwd) * us
    return max(us, h_post - device_s(post))


def _set_host(pc: PassCost, h: HostCost) -> PassCost:
    pc.host_s, pc.host_ops = h.seconds, h.ops
    return pc


def build_chunks(model: TransformerSpec, plan: Plan, cluster: ClusterSpec, prof: Profile,
                 groups: dict[str, GroupPlacement]) -> list[list[ChunkWork]]:
    """``result[stage][chunk]`` for every stage and virtual chunk (layers placed as the
    schedule places them: ``schedule.chunk_parts``)."""
    # the layer Python of the model's own code style (GPT-2's blocks, Llama's layers)
    plan = replace(plan, host_mechanisms=code_mechanisms(plan.host_mechanisms, model))
    C, placed = chunk_parts(plan.schedule, plan.pp, plan.vpp)
    parts = partition_layers(model.n_layers, C)
    cache = _LayerCache(model, plan, cluster, prof, groups)
    sh = cache.sh
    stages: list[list[ChunkWork]] = [[] for _ in range(plan.pp)]
    alike: dict[tuple, ChunkWork] = {}      # chunks of the same layer-kind runs cost the same
    for c in range(plan.vpp):
        for s in range(plan.pp):
            g = placed[s][c]
            key = (tuple((k, len(list(r))) for k, r in groupby(parts[g], key=model.layer_kind)),
                   g == 0, g == C - 1)
            if key in alike:                # its passes are shared, read-only from here on
                stages[s].append(replace(alike[key], stage=s, chunk=c, layers=list(parts[g])))
                continue
            alike[key] = _chunk(model, plan, cluster, prof, groups, cache, sh, s, c, parts[g],
                                first=(g == 0), last=(g == C - 1))
            stages[s].append(alike[key])
    return _mark_tied(stages, model, plan, placed, C)


def _mark_tied(stages: list[list[ChunkWork]], model: TransformerSpec, plan: Plan,
               placed: tuple[tuple[int, ...], ...], parts: int) -> list[list[ChunkWork]]:
    """``ChunkWork.tied_params`` on the chunks holding the embedding (part 0) and the head
    (the last part) of a tied model, when no stage holds both (a V-shaped or DualPipe
    placement keeps them on one rank: nothing to exchange)."""
    ends = [{g for g in placed[s] if g in (0, parts - 1)} for s in range(plan.pp)]
    if not model.tied_embeddings or any(len(e) == 2 or (parts == 1 and e) for e in ends):
        return stages
    size = model.vocab * model.hidden / plan.tp
    return [[replace(ch, tied_params=size) if placed[s][ch.chunk] in (0, parts - 1) else ch
             for ch in chunks] for s, chunks in enumerate(stages)]


def _chunk(model, plan, cluster, prof, groups, cache, sh, s, c, layers, first, last) -> ChunkWork:
    fwd, bwd, wgrad = PassCost(), PassCost(), PassCost()
    mem = chunk_memory(model, plan, sh, layers, first, last)
    params, dense = mem.params, mem.dense_params
    extra: list[Op] = (embedding_ops(model, sh) if first else []) + \
        (head_ops(model, sh) if last else [])
    layout = ParamLayout.of(model, plan.memory.param_layout)
    modules = layout.weights_only()                  # one tensor per module (ZeRO-3's hooks)
    runs: list[tuple[list[Op], int]] = []           # each run's layer ops, its layers
    counts = _Counts(len(layers), edge_units=_fsdp_edge_units(plan, first, last),
                     regather_layers=len(layers) - mem.zero3_kept_layers,
                     extra_buckets=plan.gradient_buckets(params, s, c) - 1)
    # runs of one layer kind and recompute (a partial recompute's first layers, then the rest)
    for (_, rc), run in groupby(enumerate(layers), key=lambda il: (
            model.layer_kind(il[1]), plan.recompute_of(il[0]))):
        run = [layer for _, layer in run]
        n = len(run)
        lf, cf, cb, cw = cache.get(run[0], rc)
        fwd.add_each(cf, n)
        bwd.add_each(cb, n)
        wgrad.add_each(cw, n)
        runs.append((lf, n))
        counts = counts.add_layers(n, (param_tensors(lf, layout), param_tensors(lf, modules),
                                       linear_weights(lf, layout)),
                                   linear_calls(lf, layout), rc == Recompute.FULL or sac_op(plan))
    if extra:
        eb = backward_ops(extra)
        for pc, ops, back in ((fwd, extra, False), (bwd, eb, True),
                              (wgrad, weight_grad_ops(eb), True)):
            pc.add(_set_host(pass_cost(ops, cluster.gpu, prof, groups, plan.tp_overlap),
                             eager_host(ops, prof, back, plan.host_mode)))
        shared = _shared_head_tensors(extra, model)
        counts = replace(counts, edge_tensors=param_tensors(extra, layout) - shared,
                         weights=counts.weights + linear_weights(extra, layout) - shared,
                         edge_modules=param_tensors(extra, modules),
                         calls=counts.calls + linear_calls(extra, layout))
    _add_per_param_work(fwd, (bwd, wgrad), params, counts, plan, cluster, prof, groups)
    # the model's own Python: batch code on every chunk, embedding's on the first, head's
    # and loss's on the last (their backward is B's: the loss's starts it)
    mf, mb = model_host(plan.host_mechanisms, prof, plan.host_mode, first, last,
                        1.0 / plan.num_microbatches, plan.tp)
    fwd.add(_set_host(PassCost(), mf))
    bwd.add(_set_host(PassCost(), mb))
    if first:                    # the training loop's Python before the forward's first op
        lead = _set_host(PassCost(), loop_lead_host(plan.host_mechanisms, prof, model.n_layers))
        lead.host_lead_s = lead.host_s
        fwd.add(lead)
    persistent, calls = zero3_tensors(model, plan, layout, runs + [(extra, 1)],
                                      counts.layers + counts.edge_units) \
        if plan.zero_stage >= 3 else (0, ((1, 1), (1, 1)))
    if plan.zero_stage >= 3:
        add_fsdp_comm(fwd, bwd, params, len(layers), plan, groups, prof, cluster,
                      fsdp_edge_params(model, plan, first, last), dense,
                      mem.zero3_kept_layers, calls)
    last_fwd = runs[-1][0] if runs else []          # the last layer kind's forward ops
    return ChunkWork(s, c, list(layers), fwd, bwd, params, dense, mem, last_fwd + extra, wgrad,
                     param_tensors=counts.layer_tensors + counts.edge_tensors,
                     units=counts.layers + counts.edge_units, persistent_tensors=persistent,
                     persistent_gather_s=persistent_gather_s(
                         persistent, model, plan, fsdp_groups(plan, groups)[0], prof))


@dataclass(frozen=True)
class _Counts:
    """What a chunk's per-parameter host work counts: its layers, the parameter tensors in
    them and beside them (embedding, head), Linear calls (layers' and head's), FSDP units
    beside the layers' (``_fsdp_edge_units``), and of the layers those whose module code runs
    again in backward (full recompute, op SAC): their count, Linear calls and tensors; each
    tensor count also as modules (weights only, ``ParamLayout.weights_only``)."""

    layers: int
    layer_tensors: int = 0
    edge_tensors: int = 0
    weights: int = 0                 # of the tensors, GEMM weights (``linear_weights``)
    calls: int = 0
    edge_units: int = 0
    rc_layers: int = 0
    rc_calls: int = 0
    rc_tensors: int = 0
    layer_modules: int = 0
    edge_modules: int = 0
    rc_modules: int = 0
    regather_layers: int = 0         # ZeRO-3 layers gathered again in backward (not kept)
    extra_buckets: int = 0           # gradient buckets beyond the first

    def add_layers(self, n: int, tensors: tuple[int, int, int], calls: int,
                   rerun: bool) -> "_Counts":
        """With ``n`` more layers of ``tensors`` (tensors, modules, GEMM weights) and
        ``calls`` Linear calls each, ``rerun`` in backward or not."""
        k = n if rerun else 0
        t, mod, w = tensors
        return replace(self, layer_tensors=self.layer_tensors + n * t, weights=self.weights + n * w,
                       layer_modules=self.layer_modules + n * mod,
                       calls=self.calls + n * calls, rc_layers=self.rc_layers + k,
                       rc_calls=self.rc_calls + k * calls, rc_tensors=self.rc_tensors + k * t,
                       rc_modules=self.rc_modules + k * mod)


def _add_per_param_work(fwd: PassCost, bwds: tuple[PassCost, ...], params: float,
                        counts: _Counts, plan: Plan, cluster: ClusterSpec,
                        prof: Profile, groups: dict[str, GroupPlacement]) -> None:
    """Per-micro-batch work over the chunk's parameters: gradient accumulation outside the
    GEMM, and the framework's host mechanisms (hooks, loops, module overheads) with their
    device copies; added to each of ``bwds`` (the backward, and its W half, which runs it
    when split), except the copies the input-gradient pass needs first, which go to the
    whole backward only (so B carries them). ``counts``: ``_Counts``."""
    layers, calls, edge_units = counts.layers, counts.calls, counts.edge_units
    tensors = counts.layer_tensors + counts.edge_tensors
    ops = []
    if plan.grad_accum_bytes_per_param > 0:
        ops.append(_grad_accumulation_op(params, plan))
    once = chunk_passes(plan) if fsdp_once_per_step(plan) else 0
    copies = device_copy_ops(plan.host_mechanisms, params, layers, tensors, once)
    ops += copies.rest + bucket_copy_ops(plan.host_mechanisms, params, tensors,
                                         plan.grad_bytes, chunk_passes(plan))
    hf, hb = mechanisms_host(plan.host_mechanisms, layers, tensors, prof, calls, plan.host_mode,
                             edge_units=edge_units, boundary_share=1.0 / plan.num_microbatches,
                             modules=(counts.layer_modules + counts.edge_modules, 0),
                             regather_modules=round(counts.layer_modules * counts.regather_layers
                                                    / max(layers, 1)), weights=counts.weights,
                             extra_buckets=counts.extra_buckets)
    # module code that full recompute runs again (no other unit counted) precedes the
    # input-gradient pass: B's
    hrf, hr = mechanisms_host(plan.host_mechanisms, 0, 0, prof, 0, plan.host_mode,
                              counts.rc_calls, counts.rc_layers,
                              recompute_tensors=counts.rc_tensors,
                              modules=(0, counts.rc_modules))
    if copies.fwd:
        fwd.add(pass_cost(copies.fwd, cluster.gpu, prof, groups, plan.tp_overlap))
    fwd.add(_set_host(PassCost(), hf))
    if hrf.ops > 0:                          # the checkpoint wrapper's forward work
        fwd.add(_set_host(PassCost(), hrf))
    if hr.ops > 0:
        bwds[0].add(_set_host(PassCost(), hr))
    if copies.first:           # the whole backward only: B (= backward - W) then has it
        bwds[0].add(pass_cost(copies.first, cluster.gpu, prof, groups, plan.tp_overlap))
    for bwd in bwds:
        if ops:
            bwd.add(pass_cost(ops, cluster.gpu, prof, groups, plan.tp_overlap))
        bwd.add(_set_host(PassCost(), hb))


def _grad_accumulation_op(params: float, plan: Plan) -> Op:
    """Per-micro-batch gradient accumulation outside the weight-gradient GEMM (bandwidth
    bound, over every local parameter): ``Plan.grad_accum_bytes_per_param``."""
    return Op("grad_accumulation", OpKind.MEMORY,
              bytes_moved=params * plan.grad_accum_bytes_per_param, kernels=2,
              mem_kind="elementwise")


def _shared_head_tensors(extra: list[Op], model: TransformerSpec) -> int:
    """Output-layer GEMMs among the chunk's edge ops whose weight another one already holds:
    the multi-token-prediction heads share the main output layer (``mtp<i>_logits``), and a
    tied output layer is the embedding's table when the chunk holds both (the optimizer and
    the hooks see one tensor)."""
    heads = sum(1 for o in extra if o.kind == OpKind.GEMM and o.name.endswith("logits"))
    tied = heads > 0 and model.tied_embeddings and any(o.name == "embedding" for o in extra)
    return max(0, heads - 1) + int(tied)


def _fsdp_edge_units(plan: Plan, first: bool, last: bool) -> int:
    """FSDP units of the chunk beside its layers': the root (on the first chunk) and, where
    the embedding is a unit of its own (torchtitan's apply_fsdp), it and [norm, output]."""
    if plan.zero_stage < 3:
        return 0
    own = plan.memory.fsdp_embedding_unit
    return int(first) * (2 if own else 1) + int(last and own)

