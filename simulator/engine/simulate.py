"""``simulate(model, plan, cluster, profile) -> Result``: the one entry point.

``engine="event"`` plays the step on the discrete-event engine; ``engine="analytic"``
uses the closed form (fast ranking in searches). Both price the same per-stage work.
"""
from __future__ import annotations

import time
from dataclasses import replace

from ..boundary.limits import check_event_slots
from ..cost.host import launch_blocking
from ..errors import InvalidInputError
from ..frameworks.defaults import schedule_note
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..memory.accounting import StageMemory
from ..memory.accounting import stage_memory as _stage_memory
from ..parallel.plan import Plan, Schedule, validate
from ..parallel.schedule import chunk_share, closed_form_bubble_s, splits_backward
from ..workload.spec import TransformerSpec
from .balance import describe, imbalance
from .breakdown import event_breakdown
from .ds_pipe import transfer_times_s
from .events import Engine
from .handoff import fill_drain_handoff_s, stream_handoff_s
from .host_span import stage_span
from .memory_fit import memory_verdict
from .network_use import with_link_use
from .pair_overlap import (
    overlapped_ep_s,
    pair_saving_s,
    played_passes,
    stage_pair_totals,
)
from .periodic import long_enough, periodic_event_step
from .result import Breakdown, Result, StageReport
from .stage_work import ChunkWork, build_chunks, place_groups
from .step import (
    build_tasks,
    dp_overlap_s,
    optimizer_time_s,
    overlap_interference_s,
    param_gather_time_s,
    pipeline_send_costs,
    tied_grad_costs,
)
from .sweep import sweep_step, tail_costs
from .timeline import build_timeline


def simulate(model: TransformerSpec, plan: Plan, cluster: ClusterSpec, profile: Profile,
             engine: str = "event", keep_timeline: bool = False,
             periodic: bool = True) -> Result:
    """Predict one optimizer step. Raises ``InvalidInputError`` for an invalid plan.

    ``periodic`` (event engine, no timeline): the event engine's answer the fast way: by
    the sweep where no link is shared (``engine.sweep``), and for long plans from a few
    rounds of the steady state extended when the schedule repeats (``engine.periodic``);
    ``False`` plays every task on the event engine (the reference path)."""
    t0 = time.perf_counter()
    if engine not in ("event", "analytic"):
        raise InvalidInputError("engine", engine, "event or analytic")
    validate(plan, model, cluster)
    profile = _host_for(plan, profile)
    if engine == "event":
        check_event_slots(plan.num_microbatches * plan.pp * plan.vpp,
                          f"{plan.global_batch} (micro-batch {plan.micro_batch}, dp {plan.dp}, "
                          f"pp {plan.pp}, vpp {plan.vpp})")
    groups = place_groups(cluster, plan)
    stages = build_chunks(model, plan, cluster, profile, groups)
    memory = [stage_memory(s, chunks, plan, model) for s, chunks in enumerate(stages)]
    fast = None
    if engine == "event" and periodic and not keep_timeline:
        fast = _periodic_step(stages, model, plan, cluster, profile, groups)
    if fast is not None:
        step, crit, bd, busy = fast
        timeline = []
    elif engine == "event":
        step, crit, bd, busy, timeline = _event_step(stages, model, plan, cluster, profile, groups,
                                                     memory if keep_timeline else None)
    else:
        step, crit, bd, busy, timeline = _analytic_step(stages, plan, cluster, profile, groups,
                                                        model)
    step += profile.step_overhead_s.value
    res = _result(model, plan, cluster, stages, memory, step, crit, bd, busy, engine,
                  time.perf_counter() - t0, timeline if keep_timeline else [])
    note = schedule_note(plan.memory.framework, plan.schedule.value)
    if note:
        res.notes.append(note)
    load = imbalance(stages, plan, crit)
    if load is not None:
        res = replace(res, slowest_stage=load, notes=[*res.notes, describe(load)])
    return with_link_use(res, stages[crit], model, plan, cluster, profile, groups)


# ---- memory ---------------------------------------------------------------------------------
def stage_memory(s: int, chunks: list[ChunkWork], plan: Plan, model: TransformerSpec) -> StageMemory:
    """Peak memory of one rank of stage ``s`` (``simulator.memory.accounting``)."""
    return _stage_memory(s, [c.memory for c in chunks], plan)


SWEEP_ROUNDS = 16   # below this many rounds of pp micro-batches the sweep plays the whole
                    # plan: the periodic plays cost ~9 rounds and three replays of the
                    # critical stage (benchmarks/engine_speed.py measures both)


# ---- event engine ---------------------------------------------------------------------------
def _periodic_step(stages, model, plan, cluster, prof, groups):
    """The event engine's numbers without playing every task on it, or ``None``: the sweep
    (``engine.sweep``) where no link is shared, over the whole plan or, for a long one,
    over the short plays ``engine.periodic`` extends; the event engine plays what the
    sweep declines."""
    tails = tail_costs(stages, plan, cluster, prof, groups)

    def play(p: Plan):
        work: dict[str, float] = {}
        swept = sweep_step(stages, model, p, cluster, prof, groups, work, tails)
        if swept is not None:
            return swept + (work,)
        return _event_step(stages, model, p, cluster, prof, groups, work=work)[:4] + (work,)
    if plan.num_microbatches < SWEEP_ROUNDS * plan.pp or not long_enough(plan):
        return sweep_step(stages, model, plan, cluster, prof, groups, tails=tails)
    return periodic_event_step(plan, model, cluster, play)


def _event_step(stages, model, plan, cluster, prof, groups, memory=None, work=None):
    """``memory`` given: also record the timeline (``engine.timeline``); ``work`` given:
    fill it with the seconds of work on each engine resource."""
    eng = Engine()
    st = build_tasks(eng, stages, model, plan, cluster, prof, groups)
    eng.run()
    if work is not None:
        for t in eng.tasks:
            work[t.resource] = work.get(t.resource, 0.0) + t.work_s
    ends = [eng.tasks[s.tail].end_s for s in st]
    crit = max(range(len(st)), key=lambda i: (ends[i], -i))
    bd, busy = event_breakdown(eng.tasks, st[crit], stages[crit], ends[crit])
    timeline = build_timeline(eng, stages, memory, plan, cluster, groups) if memory else []
    return ends[crit], crit, bd, busy, timeline


# ---- closed form ----------------------------------------------------------------------------
def _analytic_step(stages, plan, cluster, prof, groups, model):
    """Closed form of the step: 1F1B / GPipe ``sum_s (F_s + B_s) + (m - 1) t_slowest``,
    interleaved ``(m + (pp-1)/vpp) t_slowest``, ZB-H1 the 1F1B form less its deferred W
    passes, the other split schedules their published bubbles; then the hand-offs on the
    fill and drain and the tail of the stage that ends last (``_stage_ends``). ``t`` per
    micro-batch includes the wait for the host (``host_span``) and the stream's pipeline
    hand-offs (``engine.handoff``); with one stage the host/device recursion is the whole
    pipeline."""
    m = plan.num_microbatches
    share = chunk_share(plan.schedule)
    spans = [stage_span(chunks, plan, prof, s) for s, chunks in enumerate(stages)]
    times = transfer_times_s(pipeline_send_costs(model, plan, cluster, prof, groups))
    held = [share * m * stream_handoff_s(plan, s, times) for s in range(len(stages))]
    crit = max(range(len(spans)), key=lambda i: (spans[i].span_s + held[i], -i))
    sp = spans[crit]
    if plan.schedule == Schedule.ZB_H1 and plan.pp > 1:
        # ZB-H1 as 1F1B below, its W passes filling (pp - 1) W of the drain (Qi et al.:
        # (pp - 1)(F + B - W) at equal stages), as many as there are later micro-batches
        fbw = [_fbw(ch, share) for ch in stages]
        w = fbw[crit][2]
        pipe = max(sp.span_s + held[crit],
                   sum(f + b for f, b, _ in fbw) + w + (m - 1) * (sp.span_s + held[crit]) / m
                   - min(plan.pp - 1, m - 1) * w)
    elif splits_backward(plan.schedule):
        pipe = sp.span_s + held[crit] + closed_form_bubble_s(
            plan.schedule, plan.pp, *_fbw(stages[crit], share),
            pair_saving_s=_pair_saving(stages[crit], share, prof))
    elif plan.pp > 1 and plan.vpp == 1:
        # 1F1B / GPipe: the first micro-batch's forward runs through every stage and the
        # last one's backward back, each stage at its own pace; between them the slowest
        # stage (with its stream's hand-offs) sets the rate: sum_s (F_s + B_s) + (m - 1) t
        # (equal stages: (m + pp - 1) t, Narayanan et al. 2021), plus one hand-off per hop
        pipe = sum(x.span_s for x in spans) / m + (m - 1) * (sp.span_s + held[crit]) / m
    elif plan.pp > 1:
        pipe = sp.span_s + held[crit] + (plan.pp - 1) / plan.vpp * sp.span_s / m
    else:
        pipe = sp.span_s
    if not splits_backward(plan.schedule):
        pipe += fill_drain_handoff_s(plan, times)
    # each stage's tail after its last backward: exposed reduction, interference, optimizer
    ends = _stage_ends(stages, plan, cluster, prof, groups, crit)
    end = max(ends, key=lambda i: (sum(ends[i][1:]) - ends[i][0], -i))
    lead, dp_exposed, dp_int, opt = ends[end]
    sp = spans[end]
    parts = {"compute": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0, "dp": dp_exposed,
             "pp": held[end], "bubble": pipe - lead - sp.span_s - held[end],
             "optimizer": opt, "interference": dp_int, "host": sp.span_s - sp.device_s}
    for c in stages[end]:
        for pc in (c.fwd, c.bwd):
            parts["compute"] += share * m * pc.compute_s
            parts["interference"] += share * m * pc.interference_s
            for g, v in pc.comm_s.items():
                parts[g] = parts.get(g, 0.0) + share * m * v
    _pairs_in_parts(parts, stages[end], plan, end, prof)
    return (pipe - lead + dp_exposed + dp_int + opt, end, parts,
            sp.device_s + sp.host_on_stream_s + held[end] + opt + dp_int, [])


def _stage_ends(stages, plan, cluster, prof, groups, crit
                ) -> dict[int, tuple[float, float, float, float]]:
    """Stage -> (how long before the pipeline's end its last backward ends, then its exposed
    gradient reduction, the interference, the optimizer step). In plain 1F1B / GPipe stage
    ``s``'s last backward ends the backward passes of the stages before it earlier than
    stage 0's, and the stage that ends last is the critical one, as in the event engine.
    With virtual or split stages the slowest stage stands for all, its reduction credited
    with the drain of ``crit`` backward passes (their drains hide a chunk's reduction
    behind the other chunk's passes, which this form does not follow)."""
    if plan.vpp > 1 or splits_backward(plan.schedule):
        # ZB-H1 defers every stage's W passes into its drain: no stage ends early
        last_b = 0.0 if plan.schedule == Schedule.ZB_H1 else \
            min((c.bwd.total_s for c in stages[crit]), default=0.0)
        return {crit: (0.0, *_stage_tail(crit, stages, plan, cluster, prof, groups,
                                         crit * last_b))}
    out, lead = {}, 0.0
    for s in range(len(stages)):
        out[s] = (lead, *_stage_tail(s, stages, plan, cluster, prof, groups, 0.0))
        lead += min((c.bwd.total_s for c in stages[s]), default=0.0)
    return out


def _stage_tail(s, stages, plan, cluster, prof, groups, drain: float
                ) -> tuple[float, float, float]:
    """(exposed gradient reduction, its interference, optimizer step) of stage ``s`` after
    its last backward. The reduction hides beside the backward passes after the first
    bucket's release, which it slows (dp_overlap_s / dp_interference_s, as the event engine
    plays them), beside the interference itself and beside ``drain`` seconds of other
    stages' passes."""
    chunks = stages[s]
    last_b = {c.chunk: c.bwd.total_s for c in chunks}
    dp, window = dp_overlap_s(last_b, chunks, plan, prof, groups) \
        if plan.zero_stage < 3 else (0.0, 0.0)
    dp_int = overlap_interference_s(dp, window, plan, prof, groups)
    dp_exposed = max(0.0, dp - window - dp_int - drain) if plan.dp_overlap else dp
    if plan.zero_stage in (1, 2) and not plan.dp_overlap:
        dp_exposed += param_gather_time_s(chunks, plan, groups, prof)
    dp_exposed += sum(c.time_s for c in tied_grad_costs(chunks, plan, cluster, prof, groups))
    return dp_exposed, dp_int, optimizer_time_s(chunks, plan, cluster, prof)


def _pairs_in_parts(parts: dict[str, float], chunks: list[ChunkWork], plan: Plan, s: int,
                    prof: Profile) -> None:
    """DualPipe's pairs (``engine.pair_overlap``): communication hidden beside the pair's
    other pass leaves the exposed parts, the slowdown it causes joins interference."""
    if plan.schedule != Schedule.DUALPIPE:
        return
    played = played_passes(chunks, plan, s, plan.num_microbatches, prof)
    hidden, interf = stage_pair_totals([pt for _, _, pt in played])
    for g, v in hidden.items():
        parts[g] -= v
    parts["interference"] += interf


def _pair_saving(chunks: list[ChunkWork], share: float, prof: Profile) -> float:
    """What one forward&backward pair saves on this stage, on average (DualPipe's ``F&B``):
    a pair is the forward of one chunk with the backward of the other (``share`` of each
    kind; one chunk: with itself)."""
    rev = chunks[::-1]
    return share * sum(pair_saving_s(f.fwd.compute_s, overlapped_ep_s(f.fwd), b.bwd.compute_s,
                                     overlapped_ep_s(b.bwd), prof) for f, b in zip(chunks, rev))


def _fbw(chunks: list[ChunkWork], share: float) -> tuple[float, float, float]:
    """(F, B, W) seconds of one micro-batch through the stage (B: input gradients only)."""
    f = share * sum(c.fwd.total_s for c in chunks)
    w = share * sum(c.wgrad.total_s for c in chunks)
    return f, share * sum(c.bwd.total_s for c in chunks) - w, w


def _host_for(plan: Plan, prof: Profile) -> Profile:
    """The profile whose host model the plan's mechanisms imply: ``CUDA_LAUNCH_BLOCKING``
    (``frameworks.json`` "cuda_launch_blocking") makes the host synchronous, as on a CPU
    device: every pass costs its host time plus its device time, in both engines."""
    if prof.host is None or prof.host.synchronous or not launch_blocking(plan.host_mechanisms):
        return prof
    return replace(prof, host=replace(prof.host, synchronous=True))


# ---- result ---------------------------------------------------------------------------------
def _result(model, plan, cluster, stages, memory, step, crit, parts, busy, engine, wall,
            timeline) -> Result:
    n = cluster.n_gpus
    mbs_total = plan.num_microbatches * plan.dp
    scale = plan.tp * plan.cp * mbs_total * chunk_share(plan.schedule)   # DualPipe: 2 copies
    model_flops = scale * sum(c.fwd.model_flops + c.bwd.model_flops for ch in stages for c in ch)
    hw_flops = scale * sum(c.fwd.hardware_flops + c.bwd.hardware_flops for ch in stages for c in ch)
    peak = cluster.gpu.peak(plan.precision) * 1e12
    tokens = plan.global_batch * model.seq_len
    cap = cluster.gpu.mem_bytes
    reports = [StageReport(m.stage, sum(len(c.layers) for c in stages[m.stage]), m.total_bytes,
                           m.weights_bytes, m.grads_bytes, m.optimizer_bytes,
                           m.activations_bytes, m.workspace_bytes,
                           busy if m.stage == crit else 0.0, m.optimizer_step_bytes,
                           m.fp8_weight_copy_bytes, m.workspace_source) for m in memory]
    bd = Breakdown(compute_s=parts["compute"], tp_comm_s=parts["tp"], cp_comm_s=parts["cp"],
                   ep_comm_s=parts["ep"], dp_comm_s=parts["dp"], pp_comm_s=parts["pp"],
                   bubble_s=parts["bubble"], optimizer_s=parts["optimizer"],
                   interference_s=parts["interference"], overhead_s=step - sum(parts.values()),
                   host_s=parts.get("host", 0.0))
    peaks = [m.total_bytes for m in memory]
    return Result(step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / n,
                  model_tflops_per_gpu=model_flops / step / n / 1e12,
                  hardware_tflops_per_gpu=hw_flops / step / n / 1e12,
                  mfu=model_flops / step / n / peak, hfu=hw_flops / step / n / peak,
                  peak_memory_bytes=peaks, memory_capacity_bytes=cap,
                  fits_in_memory=max(peaks) <= cap, breakdown=bd, stages=reports,
                  critical_stage=crit, num_microbatches=plan.num_microbatches, n_gpus=n,
                  engine=engine, sim_wall_s=wall, timeline=timeline,
                  memory_verdict=memory_verdict(model, plan, cluster, memory))
