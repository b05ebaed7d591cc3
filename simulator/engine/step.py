"""Play one training step on the event engine (one representative rank per stage).

Tasks per stage: forward/backward passes on the compute stream in schedule order;
pipeline sends on the sender's link (processor-shared with DP traffic when both leave the
node); data-parallel gradient buckets released while the last micro-batch's backward
runs (``dp_overlap``) or after it; the optimizer step; the ZeRO parameter all-gather.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..cost.host import (host_waits, launch_blocking, lead_layers, lead_release_frac,
                         load_syncs, optimizer_host, pass_syncs, sync_at_p2p)
from ..cost.kernels import memory_time_s
from ..cost.layer import group_collective, interference_s
from ..frameworks import CONVENTIONS
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec, Dtype
from ..memory.accounting import grad_reduce_bytes
from ..network.collectives import Collective
from ..network.price import CollectiveCost
from ..parallel.placement import GroupPlacement, place_group, stage_boundary
from ..parallel.plan import Plan
from ..parallel.deepspeed_pipe import SEND_ACT, SEND_GRAD
from ..parallel.schedule import Part, Unit, is_loss_pass, sends_downstream, upstream
from ..workload.spec import TransformerSpec
from .ds_pipe import Rendezvous, pass_unit, stage_commands, transfer_times_s, uses_rendezvous
from .events import Engine
from .pair_overlap import PassTime, played_passes
from .stage_work import ChunkWork


def optimizer_bytes_per_param(plan: Plan) -> float:
    """Bytes the optimizer step moves per local parameter for the plan's precision
    (``CONVENTIONS``: counted from the update's reads and writes, a fused step). An unfused
    step (torch's foreach AdamW, Composer's DecoupledAdamW loop) passes over whole tensors of
    a moment's size ``optimizer_step_passes`` times (frameworks.json memory)."""
    if plan.memory.optimizer_step_pass_bytes_per_param > 0:
        return plan.memory.optimizer_step_pass_bytes_per_param
    if plan.precision.value == "fp32":
        return CONVENTIONS.optimizer_traffic_fp32_bytes_per_param
    return CONVENTIONS.optimizer_traffic_mixed_bytes_per_param


@dataclass
class StageTasks:
    units: dict[Unit, int]       # the device task of each pass
    sends: dict[Unit, int]       # blocking pipeline sends on the compute stream, by producer
    compute: str
    last_unit: int
    optimizer: int
    dp_tasks: list[int]
    tail: int                    # last task of the stage
    ends: dict[Unit, int] = field(default_factory=dict)    # last compute-stream task of a pass
                                                           # (of its pair, for a paired unit)
    hosts: dict[Unit, int] = field(default_factory=dict)   # the host task issuing a pass


def optimizer_time_s(chunks: list[ChunkWork], plan: Plan, cluster: ClusterSpec,
                     prof: Profile) -> float:
    """The optimizer step of one stage after its last backward and gradient reduction: its
    device passes over the local parameters, or the host's issuing of it where that is
    longer (``optimizer_host``: the frameworks' optimizer and clipping code, per step and
    per parameter tensor), or both in series where the host waits for the device per tensor
    or runs the kernels itself (a synchronous host: a CPU, ``CUDA_LAUNCH_BLOCKING``); then
    DeepSpeed ZeRO-3's all-gathers of its persistent parameters, which its step issues last
    (``ChunkWork.persistent_gather_s``). The host is taken to start issuing when the
    device's work before it is done (so it is where
    the step reads the gradient norm back, Megatron-Core's ``clip_grads`` ``.item()``); a
    host that ran ahead may have started earlier (not followed: an upper bound where the
    host is the longer)."""
    dense = sum(c.dense_params for c in chunks)
    expert = sum(c.params - c.dense_params for c in chunks)
    shard = plan.shard_ranks if plan.zero_stage >= 1 else 1
    eshard = max(1, plan.shard_ranks // plan.ep) if plan.zero_stage >= 1 else 1
    local = dense / shard + expert / eshard
    device = memory_time_s(local * optimizer_bytes_per_param(plan), cluster.gpu, prof,
                           kernels=4, kind="optimizer") \
        + grad_check_time_s(chunks, plan, cluster, prof)
    host, sync = optimizer_host(plan.host_mechanisms, sum(c.param_tensors for c in chunks),
                                sum(c.units for c in chunks), prof,
                                sum(local_shard_tensors(c, plan, shard) for c in chunks))
    serial = sync or launch_blocking(plan.host_mechanisms) or \
        (prof.host is not None and prof.host.synchronous)
    gathers = sum(c.persistent_gather_s for c in chunks)   # issued after the rest (_post_step)
    return (device + host.seconds if serial else max(device, host.seconds)) + gathers


def local_shard_tensors(ch: ChunkWork, plan: Plan, shard: int) -> int:
    """Parameter tensors of chunk ``ch`` a distributed optimizer steps on one rank: those
    overlapping the rank's 1/``shard`` slice of each gradient bucket, on average the
    tensors / ``shard`` plus one straddling a slice edge per bucket (Megatron-Core
    ``_build_model_gbuf_param_range_map``, core_r0.8.0 distrib_optimizer.py L64-173; the
    expert tensors' own shard group is not told apart)."""
    if shard <= 1:
        return ch.param_tensors
    return min(ch.param_tensors,
               math.ceil(ch.param_tensors / shard) + grad_buffer_buckets(ch, plan))


def grad_check_time_s(chunks: list[ChunkWork], plan: Plan, cluster: ClusterSpec,
                      prof: Profile) -> float:
    """``Plan.grad_nan_check``: a norm of every gradient bucket before it is reduced, i.e.
    one read of the stage's whole gradient buffer (``Plan.grad_bytes`` per local parameter)
    and a norm kernel per bucket. It runs on the compute stream during the last backward;
    priced with the optimizer step, which the buckets' reductions already wait for."""
    if not plan.grad_nan_check or plan.zero_stage >= 3:
        return 0.0
    params = sum(c.params for c in chunks)
    buckets = sum(grad_buffer_buckets(c, plan) for c in chunks)
    return memory_time_s(params * plan.grad_bytes, cluster.gpu, prof, kernels=buckets)


def grad_buffer_buckets(ch: ChunkWork, plan: Plan) -> int:
    """Buckets of chunk ``ch``'s gradient buffer (``Plan.gradient_buckets``)."""
    return plan.gradient_buckets(ch.params, ch.stage, ch.chunk)


# Engine links a stage's communication tasks occupy: a task sits on the one its collective
# is bound by, so gradient buckets over NVLink no longer share a link with pipeline sends
# over the NICs (tasks on the same link share it equally: processor sharing).
LINKS = ("scale-up", "network")


def link_of(costs: list[CollectiveCost]) -> str:
    """``"scale-up"`` if the slowest of ``costs`` is bound by the scale-up port, else
    ``"network"`` (PCIe hop, NIC, leaf or spine)."""
    worst = max(costs, key=lambda c: c.time_s, default=None)
    return "scale-up" if worst is None or worst.bottleneck in ("scale-up", "-") else "network"


def dp_reduce_costs(dense_params: float, expert_params: float, plan: Plan,
                    groups: dict[str, GroupPlacement], prof: Profile) -> list[CollectiveCost]:
    """Gradient reduction: dense parameters over the DP group, expert parameters over the
    expert-data-parallel group (ranks holding the same experts); all-reduce, or
    reduce-scatter under ZeRO-1/2 unless ``zero1_allreduce`` (the parameter all-gather is
    timed separately)."""
    nb = grad_reduce_bytes(plan)
    sharded = plan.zero_stage in (1, 2) and not plan.zero1_allreduce
    coll = Collective.REDUCE_SCATTER if sharded else Collective.ALL_REDUCE
    return [group_collective(coll, dense_params * nb, groups["dp"], prof),
            group_collective(coll, expert_params * nb, groups["edp"], prof)]


def dp_reduce_time_s(dense_params: float, expert_params: float, plan: Plan,
                     groups: dict[str, GroupPlacement], prof: Profile) -> float:
    return sum(c.time_s for c in dp_reduce_costs(dense_params, expert_params, plan, groups, prof))


def param_gather_bytes(chunks: list[ChunkWork], plan: Plan) -> tuple[float, float]:
    """(dense, expert) bytes one rank's ZeRO-1/2 parameter all-gather moves: the updated
    16-bit (or fp32) parameters, except linear weights kept as FP8 primary weights under
    fp8 (``MemoryConventions.fp8_primary_weights``: Megatron's --fp8-param-gather "performs
    the param all-gather in fp8", arguments.py L2016-2018 @ d98e8a64), 1 B each; the expert
    parameters are all linear weights."""
    dense, expert = chunk_params(chunks)
    wb = 4 if plan.precision.value == "fp32" else 2
    if not (plan.precision == Dtype.FP8 and plan.memory.fp8_primary_weights):
        return dense * wb, expert * wb
    linear = sum(c.memory.linear_params for c in chunks)
    fp8_dense = min(dense, max(0.0, linear - expert))
    return (dense - fp8_dense) * wb + fp8_dense, expert * 1.0


def param_gather_costs(chunks: list[ChunkWork], plan: Plan, groups: dict[str, GroupPlacement],
                       prof: Profile) -> list[CollectiveCost]:
    """ZeRO-1/2: all-gather of the updated parameters (``param_gather_bytes``)."""
    if plan.zero_stage not in (1, 2):
        return []
    dense_b, expert_b = param_gather_bytes(chunks, plan)
    return [group_collective(Collective.ALL_GATHER, dense_b, groups["dp"], prof),
            group_collective(Collective.ALL_GATHER, expert_b, groups["edp"], prof)]


def param_gather_time_s(chunks: list[ChunkWork], plan: Plan, groups: dict[str, GroupPlacement],
                        prof: Profile) -> float:
    return sum(c.time_s for c in param_gather_costs(chunks, plan, groups, prof))


def chunk_params(chunks) -> tuple[float, float]:
    """(dense, expert) parameters held by one rank over ``chunks``."""
    dense = sum(c.dense_params for c in chunks)
    return dense, sum(c.params for c in chunks) - dense


def build_tasks(eng: Engine, stages: list[list[ChunkWork]], model: TransformerSpec,
                plan: Plan, cluster: ClusterSpec, prof: Profile,
                groups: dict[str, GroupPlacement]) -> list[StageTasks]:
    m = plan.num_microbatches
    sends = pipeline_send_costs(model, plan, cluster, prof, groups)
    out = stage_passes(eng, stages, plan, m, transfer_times_s(sends), prof, link_of(sends[:1]))
    for s in range(plan.pp):
        _dp_and_optimizer(eng, out[s], stages[s], plan, cluster, prof, groups, m)
    return out


def stage_passes(eng: Engine, stages: list[list], plan: Plan, m: int,
                 times: tuple[float, float], prof: Profile | None,
                 link: str) -> list[StageTasks]:
    """Every stage's passes and their pipeline hand-offs on ``eng``: DeepSpeed's instruction
    stream with blocking send / receive pairs (``times``: send, receive seconds) where the
    plan runs its engine, else the schedule's order with each hand-off of ``times[1]`` s
    (the send and whatever follows it on arrival) on ``link``."""
    if uses_rendezvous(plan):
        rdv = Rendezvous()
        out = [ds_stage_units(eng, s, stages[s], plan, m, times, prof, rdv)
               for s in range(plan.pp)]
        rdv.wire(eng)
        return out
    out = [stage_units(eng, s, stages[s], plan, m, times[1], prof) for s in range(plan.pp)]
    pipeline_sends(eng, out, times[1], plan, link)
    return out


def host_stream(eng: Engine, s: int, prof: Profile | None) -> str | None:
    """Where stage ``s`` issues its ops: its own host stream (a GPU: the host runs ahead),
    the compute stream itself (``HostModel.synchronous``: the host runs the kernels), or
    nowhere (a profile without a host model, or none)."""
    if prof is None or prof.host is None:
        return None
    if prof.host.synchronous:
        return f"stage{s}.compute"
    eng.stream(f"stage{s}.host")
    return f"stage{s}.host"


UNIT_KIND = {Part.WHOLE: "bwd", Part.INPUT: "bwd_input", Part.WEIGHT: "bwd_weight"}


def unit_kind(u: Unit) -> str:
    """Engine task kind of a pass: ``fwd``, ``bwd`` (whole backward), ``bwd_input`` (B),
    ``bwd_weight`` (W)."""
    return "fwd" if u.fwd else UNIT_KIND[u.part]


def _new_stage(eng: Engine, s: int, prof: Profile | None) -> tuple[StageTasks, str | None]:
    """Stage ``s``'s compute stream, links and host stream on ``eng``: its empty task lists
    and where its host issues (``host_stream``)."""
    comp = f"stage{s}.compute"
    eng.stream(comp)
    for link in LINKS:
        eng.link(f"stage{s}.{link}")
    return StageTasks({}, {}, comp, -1, -1, [], -1), host_stream(eng, s, prof)


def stage_units(eng: Engine, s: int, chunks: list[ChunkWork], plan: Plan, m: int,
                t_send: float, prof: Profile | None) -> StageTasks:
    """The stage's passes in schedule order (``chunks[c].pass_cost(unit)`` each); with
    ``pp_blocking_p2p`` each pass that feeds another stage is followed by its send on the
    same stream (Megatron's and DeepSpeed's synchronous p2p: the sender waits for the
    hand-off to complete). Each pass is first issued by the host (``_issue``). A paired
    unit (DualPipe's forward&backward pair) hands off when its pair ends."""
    st, host = _new_stage(eng, s, prof)
    comp = st.compute
    prev: Unit | None = None
    held: list[Unit] = []                    # a paired unit, waiting for its pair to end
    for u, pc, pt in played_passes(chunks, plan, s, m, prof):
        prev_layers = len(chunks[prev.chunk].layers) if prev is not None else 0
        tid = _issue(eng, st, host, f"{u.label} mb{u.mb} c{u.chunk}", pc, pt, prev_layers,
                     u, prev, plan, s)
        sending, held = held + ([] if u.paired else [u]), ([u] if u.paired else [])
        for v in sending:
            if plan.pp_blocking_p2p and sends_downstream(v, s, plan.pp, plan.vpp, plan.schedule):
                tid = eng.add(f"send {'act' if v.fwd else 'grad'} mb{v.mb} c{v.chunk}", comp,
                              t_send, stage=s, kind="pp_send")
                st.sends[v] = tid
        for v in sending:
            st.ends[v] = tid
        prev = u
    st.last_unit = st.tail = tid
    return st


def _issue(eng: Engine, st: StageTasks, host: str | None, name: str, pc, pt: PassTime,
           prev_layers: int, u: Unit, prev: Unit | None, plan: Plan, s: int) -> int:
    """The host task issuing one pass and the device task running it; returns the last
    task of the pass on the compute stream.

    Asynchronous host: the device may start once the first op is issued (``1/host_ops``
    of the host task) and the pass is not over before the host has issued its last op
    (a zero-length "issued" marker waits for the host task). The host runs ahead of the
    device except where the framework stops it: ``lead_layers`` (at most that many layers
    ahead: FSDP's rate limiter), ``sync_at_p2p`` (waits for the device after each
    pipeline hand-off) or ``host_waits`` (before a forward, after the loss)."""
    comp, kind = st.compute, unit_kind(u)
    meta = {"stage": s, "kind": kind, "mb": u.mb, "chunk": u.chunk}
    if pt.hidden_s or pt.interference_s:               # half of a DualPipe pair
        meta.update(hidden_s=pt.hidden_s, pair_interference_s=pt.interference_s)
    if host is None or pc.host_s <= 0:
        st.units[u] = eng.add(name, comp, pt.duration_s, **meta)
        return st.units[u]
    h = eng.add(f"host {name}", host, pc.host_s, _host_deps(st, prev_layers, prev, plan, u, s),
                stage=s, kind="host", mb=u.mb, chunk=u.chunk)
    st.hosts[u] = h
    if host == comp:                                   # synchronous: host, then kernels
        st.units[u] = eng.add(name, comp, pt.duration_s, **meta)
        return st.units[u]
    first = pc.first_share
    st.units[u] = eng.add(name, comp, pt.duration_s, [(h, first)], **meta)
    return eng.add(f"issued {name}", comp, 0.0, [(h, 1.0)], stage=s, kind="host_wait")


def _host_deps(st: StageTasks, prev_layers: int, prev: Unit | None, plan: Plan, u: Unit,
               s: int) -> list[tuple[int, float]]:
    """The host may issue the next pass ``u`` only once the device is within ``lead_layers``
    of the end of the previous pass, or (``sync_at_p2p``, ``host_waits``) has finished it."""
    if prev is None:
        return []
    loss = is_loss_pass(prev, s, plan.pp, plan.vpp, plan.schedule)
    if (plan.pp > 1 and sync_at_p2p(plan.host_mechanisms)) or \
            host_waits(pass_syncs(plan.host_mechanisms), loss, u.fwd):
        return [(st.ends.get(prev, st.units[prev]), 1.0)]
    lead = lead_layers(plan.host_mechanisms)
    if lead >= 0:
        return [(st.units[prev], lead_release_frac(lead, prev_layers))]
    return []


def ds_stage_units(eng: Engine, s: int, chunks: list[ChunkWork], plan: Plan, m: int,
                   times: tuple[float, float], prof: Profile | None, rdv: Rendezvous
                   ) -> StageTasks:
    """``stage_units`` for DeepSpeed's pipeline engine (``engine.ds_pipe``): the stage's
    ``TrainSchedule`` instructions in order on its compute stream, each hand-off a blocking
    send (``times[0]`` s) or receive (``times[1]`` s) that ``rdv`` pairs with its partner."""
    st, host = _new_stage(eng, s, prof)
    comp = st.compute
    passes = {u: (pc, pt) for u, pc, pt in played_passes(chunks, plan, s, m, prof)}
    prev: Unit | None = None
    tid = recv = -1
    synced = sync_at_p2p(plan.host_mechanisms)
    # LoadMicroBatch's blocking copy to the device on the first and last stages
    loads = load_syncs(plan.host_mechanisms) and s in (0, plan.pp - 1)
    for kind, mb in stage_commands(s, plan, m):
        u = pass_unit(kind, mb)
        if u is None:
            sending = kind in (SEND_ACT, SEND_GRAD)
            tid = rdv.add(eng, s, comp, kind, mb, times[0] if sending else times[1])
            if sending:
                st.sends[Unit(kind == SEND_ACT, mb, 0)] = tid
            else:
                recv = tid
            continue
        pc, pt = passes[u]
        prev_layers = len(chunks[0].layers) if prev is not None else 0
        queued = tid                                   # the stream's last task so far
        tid = _issue(eng, st, host, f"{u.label} mb{u.mb} c0", pc, pt, prev_layers, u, prev,
                     plan, s)
        if synced and recv >= 0 and u in st.hosts:    # the host waits for the data too
            eng.depend(st.hosts[u], recv)
        if loads and u.fwd and queued >= 0 and u in st.hosts:   # and for the stream
            eng.depend(st.hosts[u], queued)
        st.ends[u] = tid
        prev, recv = u, -1
    st.last_unit = st.tail = tid
    return st


def pipeline_send_time_s(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                         prof: Profile, groups: dict[str, GroupPlacement]) -> float:
    return sum(c.time_s for c in pipeline_send_costs(model, plan, cluster, prof, groups))


def pipeline_send_costs(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                        prof: Profile, groups: dict[str, GroupPlacement]) -> list[CollectiveCost]:
    """One activation (or gradient) hand-off between adjacent stages, per micro-batch.

    With TP and ``pp_scatter_gather``, each rank sends only its 1/tp slice and the receiving
    TP group all-gathers it over the scale-up fabric (Megatron's scatter/gather
    optimisation, Narayanan et al. 2021 sec. 4.1); with sequence parallelism the
    activations are already sliced; otherwise every TP rank sends the whole tensor.
    """
    if plan.pp == 1:
        return []
    pair = stage_boundary(cluster, plan, groups["pp"].fabric)
    tokens = plan.micro_batch * model.seq_len // plan.cp
    full = tokens * model.hidden * (4 if plan.precision.value == "fp32" else 2)
    sliced = plan.sequence_parallel or plan.pp_scatter_gather
    out = [group_collective(Collective.SEND_RECV, full / plan.tp if sliced else full, pair, prof)]
    if plan.tp > 1 and plan.pp_scatter_gather and not plan.sequence_parallel:
        out.append(group_collective(Collective.ALL_GATHER, full, groups["tp"], prof))
    return out


def _producer(stage: StageTasks, u: Unit) -> Unit:
    """``u`` as ``stage`` runs it: a backward named whole may run as its B half."""
    return u if u in stage.units else Unit(u.fwd, u.mb, u.chunk, Part.INPUT)


def pipeline_sends(eng: Engine, st: list[StageTasks], t_send: float, plan: Plan,
                   link: str) -> None:
    """Wire each pass to the pass it consumes: through the producer's blocking send on its
    stream, or through an overlapped send on the producer's link. A host that synchronises
    at every hand-off (``sync_at_p2p``) also waits for the data before issuing the pass."""
    sync = sync_at_p2p(plan.host_mechanisms)
    for s, stage in enumerate(st):
        for u, tid in stage.units.items():
            up = upstream(u, s, plan.pp, plan.vpp, plan.schedule)
            if up is None:
                continue
            src_stage = up[0]
            src_unit = _producer(st[src_stage], up[1])
            src = st[src_stage].ends.get(src_unit, st[src_stage].units[src_unit])
            if src_stage == s:
                eng.depend(tid, src)
                continue
            if src_unit in st[src_stage].sends:
                x = st[src_stage].sends[src_unit]
            else:
                x = eng.add(f"send {'act' if u.fwd else 'grad'} mb{u.mb} c{u.chunk} "
                            f"{src_stage}->{s}", f"stage{src_stage}.{link}", t_send,
                            [(src, 1.0)], stage=src_stage, kind="pp_send")
            eng.depend(tid, x)
            if sync and u in stage.hosts:
                eng.depend(stage.hosts[u], x)


def _last_backwards(stage: StageTasks) -> dict[int, int]:
    """Chunk -> the task of its last backward pass on the stage (the highest task id)."""
    last: dict[int, int] = {}
    for u, tid in stage.units.items():
        if not u.fwd and tid > last.get(u.chunk, -1):
            last[u.chunk] = tid
    return last


def _dp_and_optimizer(eng: Engine, stage: StageTasks, chunks: list[ChunkWork], plan: Plan,
                      cluster: ClusterSpec, prof: Profile, groups: dict[str, GroupPlacement],
                      m: int) -> None:
    s = chunks[0].stage
    dense, expert = chunk_params(chunks)
    link = f"stage{s}.{link_of(dp_reduce_costs(dense, expert, plan, groups, prof))}"
    prev = -1
    last_b = _last_backwards(stage)
    if plan.zero_stage < 3 and (groups["dp"].size > 1 or groups["edp"].size > 1):
        # each chunk's reduction is launched as its last backward ends (Megatron-Core's
        # grad_sync_func after a chunk's last micro-batch): the earliest-finishing first
        for ch in sorted(chunks, key=lambda c: last_b[c.chunk]):
            prev = _chunk_buckets(eng, stage, ch, plan, prof, groups, link, prev,
                                  last_b[ch.chunk])
    t_int = dp_interference_s({c: eng.tasks[tid].work_s for c, tid in last_b.items()}, chunks,
                              plan, prof, groups)
    if t_int > 0:
        stage.last_unit = eng.add("interference (dp overlap)", stage.compute, t_int,
                                  [(stage.last_unit, 1.0)], stage=s, kind="interference")
    tied = tied_grad_costs(chunks, plan, cluster, prof, groups)
    if tied:                            # after the whole backward (finalize_model_grads)
        prev = eng.add("tied embedding all-reduce", f"stage{s}.{link_of(tied)}", tied[0].time_s,
                       [(stage.last_unit, 1.0)] + ([(prev, 1.0)] if prev >= 0 else []),
                       stage=s, kind="dp_comm")
        stage.dp_tasks.append(prev)
    deps = [(stage.last_unit, 1.0)] + ([(prev, 1.0)] if prev >= 0 else [])
    t_opt = optimizer_time_s(chunks, plan, cluster, prof)
    stage.optimizer = eng.add("optimizer", stage.compute, t_opt, deps, stage=s, kind="optimizer")
    stage.tail = stage.optimizer
    t_ag = param_gather_time_s(chunks, plan, groups, prof)
    if t_ag > 0 and not plan.dp_overlap:
        stage.tail = eng.add("param all-gather", link, t_ag, [(stage.optimizer, 1.0)],
                             stage=s, kind="dp_comm")
        stage.dp_tasks.append(stage.tail)


def tied_grad_costs(chunks: list[ChunkWork], plan: Plan, cluster: ClusterSpec,
                    prof: Profile, groups: dict[str, GroupPlacement]) -> list[CollectiveCost]:
    """The tied embedding's gradient all-reduce between the first and the last pipeline
    stage, after the backward passes and before the optimizer step (Megatron's
    finalize_model_grads -> _allreduce_word_embedding_grads over its embedding group;
    DeepSpeed's pipeline engine's ReduceTiedGrads), in the gradients' dtype, over the pair
    of ranks ``pp - 1`` stages apart."""
    params = sum(c.tied_params for c in chunks)
    if params <= 0:
        return []
    pair = place_group(cluster, "pp", 2, (plan.pp - 1) * plan.tp * plan.cp * plan.dp,
                       groups["pp"].fabric)
    return [group_collective(Collective.ALL_REDUCE, params * plan.grad_bytes, pair, prof)]


def dp_overlap_s(last_backward_s: dict[int, float], chunks: list[ChunkWork], plan: Plan,
                 prof: Profile, groups: dict[str, GroupPlacement]) -> tuple[float, float]:
    """(the stage's whole gradient reduction, the backward compute that can run beside it),
    seconds. Chunk ``c``'s first bucket is released at ``1 / n`` of its last backward pass
    (``last_backward_s``: seconds of that pass, by chunk; ``_chunk_buckets`` releases bucket
    ``j`` at ``(j + 1) / n``), and the last backward passes of the chunks that finish after
    it (lower chunk indices, in the interleaved schedule) follow, so its window is
    ``(n - 1) / n`` of its own pass plus theirs; a stage's windows nest, so their union is
    the largest. A one-bucket buffer of a stage's only chunk has none: its reduction starts
    as the backward ends."""
    reduction = window = 0.0
    for ch in chunks:
        times = bucket_times_s(ch, plan, groups, prof)
        later = sum(s for c, s in last_backward_s.items() if c < ch.chunk)
        reduction += sum(times)
        window = max(window, last_backward_s[ch.chunk] * (len(times) - 1) / len(times) + later)
    return reduction, window


def dp_interference_s(last_backward_s: dict[int, float], chunks: list[ChunkWork], plan: Plan,
                      prof: Profile, groups: dict[str, GroupPlacement]) -> float:
    """Backward compute slowed while gradient buckets reduce beside it (``dp_overlap``): the
    overlap is the shorter of the stage's whole reduction and the backward compute that runs
    after the first bucket of any chunk is released (``dp_overlap_s``)."""
    if not _reduces_beside_backward(plan, groups):
        return 0.0
    return overlap_interference_s(*dp_overlap_s(last_backward_s, chunks, plan, prof, groups),
                                  plan, prof, groups)


def overlap_interference_s(reduction_s: float, window_s: float, plan: Plan, prof: Profile,
                           groups: dict[str, GroupPlacement]) -> float:
    """``dp_interference_s`` from a stage's ``dp_overlap_s`` already at hand."""
    if not _reduces_beside_backward(plan, groups):
        return 0.0
    return interference_s(min(reduction_s, window_s), prof)


def _reduces_beside_backward(plan: Plan, groups: dict[str, GroupPlacement]) -> bool:
    """Whether gradient buckets reduce over a DP group beside the backward (not under FSDP,
    whose reduce-scatters are priced per unit)."""
    return plan.dp_overlap and plan.zero_stage < 3 and groups["dp"].size > 1


def bucket_times_s(ch: ChunkWork, plan: Plan, groups: dict[str, GroupPlacement],
                   prof: Profile) -> list[float]:
    """Duration of each gradient bucket's reduction for one chunk (one bucket when the
    reduction is not overlapped: it then runs as one coalesced collective)."""
    dense, expert = chunk_params([ch])
    n = grad_buffer_buckets(ch, plan)
    return [dp_reduce_time_s(dense / n, expert / n, plan, groups, prof)] * n


def _chunk_buckets(eng: Engine, stage: StageTasks, ch: ChunkWork, plan: Plan, prof: Profile,
                   groups: dict[str, GroupPlacement], link: str, prev: int,
                   last_b: int) -> int:
    """Gradient buckets of one chunk, released as its last backward pass (``last_b``)
    progresses."""
    times = bucket_times_s(ch, plan, groups, prof)
    for j, t in enumerate(times):
        frac = (j + 1) / len(times) if plan.dp_overlap else 1.0
        deps = [(last_b, frac)] + ([(prev, 1.0)] if prev >= 0 else [])
        if not plan.dp_overlap:
            deps.append((stage.last_unit, 1.0))
        prev = eng.add(f"dp reduce c{ch.chunk} b{j}", link, t, deps, stage=ch.stage,
                       kind="dp_comm")
        stage.dp_tasks.append(prev)
    return prev
