"""The event engine's answer by one sweep over the passes, where no link is shared.

When every resource a task waits for is a stream (its tasks one at a time, in the order
they were queued) and no link ever carries two flows at once, the event engine's timeline
is a recursion: a task starts when its stream is free and its last dependency has released
it, and ends its duration later. ``sweep_step`` runs that recursion over the plan's passes
directly, a few floats per pass, with no task objects and no event heap, for the schedules
without split backward (GPipe, 1F1B, interleaved 1F1B: ``schedule.pass_order``). It follows
``step`` task for task: the host issuing each pass (``step._issue``: asynchronous host,
synchronous host, none), the pipeline hand-offs (``step.pipeline_sends``: blocking sends on
the sender's stream or overlapped sends on its link), gradient buckets, the optimizer and
the parameter all-gather (``step._dp_and_optimizer``); the same additions in the same
order, so the times are the event engine's to the last bit.

It then checks its own premise: if any link carried two flows at the same time (processor
sharing would have slowed both), it returns ``None`` and the caller plays the event
engine. The critical stage is replayed once more with its tasks recorded, so its breakdown
is the event engine's own attribution (``breakdown.event_breakdown``). Tests compare every
quantity with the event engine (``tests/simulator/engine/test_sweep.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..cost.host import host_waits, lead_layers, lead_release_frac, pass_syncs, sync_at_p2p
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.placement import GroupPlacement
from ..parallel.plan import Plan
from ..parallel.schedule import Unit, pass_order, plain_loss_pass, sends_downstream, upstream
from ..workload.spec import TransformerSpec
from .breakdown import event_breakdown
from .ds_pipe import uses_rendezvous
from .events import Task
from .stage_work import ChunkWork, pass_numbers
from .step import (
    StageTasks,
    bucket_times_s,
    chunk_params,
    dp_interference_s,
    dp_reduce_costs,
    link_of,
    optimizer_time_s,
    param_gather_time_s,
    pipeline_send_costs,
    tied_grad_costs,
)

OVERLAP_REL = 1e-12        # two flows on one link overlapping by more than this share of
                           # the step: processor sharing matters, the sweep declines
NO_HOST, SYNC_HOST, ASYNC_HOST = 0, 1, 2

# (step end, critical stage, breakdown parts, busy seconds of the critical stage)
Swept = tuple[float, int, dict[str, float], float]


@dataclass
class _Plan:
    """What every stage's recursion reads: the plan's shape and its framework behaviour."""

    pp: int
    vpp: int
    m: int
    t_send_s: float
    blocking: bool                # pipeline sends hold the sender's stream
    p2p_sync: bool                # the host waits for each pipeline hand-off
    lead: int                     # layers the host may run ahead (-1: unbounded)
    host: int                     # NO_HOST, SYNC_HOST, ASYNC_HOST
    send_link: str
    reduces: bool                 # a gradient reduction runs (a DP or expert-DP group > 1)
    syncs: tuple[bool, bool] = (False, False)   # the host waits before forwards / after the loss
    stages: list[_Stage] = field(default_factory=list)
    flows: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


class _Wire(NamedTuple):
    """Where one pass kind's input comes from and whether its output leaves the stage."""

    stage: int                    # producer's stage (-1: no input)
    kind: int                     # producer's pass kind
    src: list[float] | None       # the producer stage's ``ends`` (same stage) or ``out``
    base: int                     # offset of the producer's kind in ``src``
    cross_in: bool                # the input comes from another stage
    sends: bool                   # the output goes to another stage


@dataclass
class _Stage:
    """One stage's recursion state. Keys of a pass: ``(c or vpp + c) * m + mb``."""

    s: int
    order: list[tuple[bool, int, int]]
    costs: list[tuple[float, float, float, int]]   # by (fwd: c, bwd: vpp + c): device s,
                                                   # host s, first-op share, layers
    ends: list[float]             # end of each pass's last compute-stream task (-1: not yet)
    out: list[float]              # when each pass releases its consumer on another stage
    i: int = 0
    h_free: float = 0.0
    c_free: float = 0.0
    prev: tuple[float, float, int, float] | None = None   # device start, seconds, layers, end
    prev_loss: bool = False       # the previous pass was a forward ending in the loss
    last_bwd: dict[int, tuple[int, float, float]] = field(default_factory=dict)
    wiring: list[_Wire] = field(default_factory=list)     # by pass kind (``_wire``)
    compute_work_s: float = 0.0   # seconds of work on the compute stream
    host_work_s: float = 0.0      # ... on the host stream (asynchronous host)
    link_work_s: dict[str, float] = field(default_factory=dict)
    end_s: float = 0.0


@dataclass(frozen=True)
class TailCosts:
    """What one stage runs after its last pass, in seconds (none depends on the number of
    micro-batches, so plays of a shortened plan share them): gradient buckets by chunk on
    ``link``, the tied embedding's all-reduce on ``tied_link``, interference, optimizer,
    parameter all-gather."""

    link: str
    buckets_s: dict[int, list[float]]
    interference_s: float
    optimizer_s: float
    gather_s: float
    tied_s: float = 0.0
    tied_link: str = ""


def tail_costs(stages: list[list[ChunkWork]], plan: Plan, cluster: ClusterSpec, prof: Profile,
               groups: dict[str, GroupPlacement]) -> list[TailCosts]:
    """Each stage's ``TailCosts``, priced as ``step._dp_and_optimizer`` prices them (the
    interference from each chunk's backward pass, which every micro-batch repeats)."""
    out: list[TailCosts] = []
    alike: dict[tuple, TailCosts] = {}       # stages whose chunks hold the same parameters
    for chunks in stages:                    # and backward time have the same tail
        key = tuple((ch.chunk, ch.params, ch.dense_params, ch.bwd.total_s, ch.tied_params)
                    for ch in chunks)
        if key not in alike:
            dense, expert = chunk_params(chunks)
            tied = tied_grad_costs(chunks, plan, cluster, prof, groups)
            alike[key] = TailCosts(
                link_of(dp_reduce_costs(dense, expert, plan, groups, prof)),
                {ch.chunk: bucket_times_s(ch, plan, groups, prof) for ch in chunks},
                dp_interference_s({ch.chunk: ch.bwd.total_s for ch in chunks}, chunks, plan,
                                  prof, groups),
                optimizer_time_s(chunks, plan, cluster, prof),
                param_gather_time_s(chunks, plan, groups, prof),
                sum(c.time_s for c in tied), link_of(tied) if tied else "")
        out.append(alike[key])
    return out


def sweep_step(stages: list[list[ChunkWork]], model: TransformerSpec, plan: Plan,
               cluster: ClusterSpec, prof: Profile, groups: dict[str, GroupPlacement],
               work: dict[str, float] | None = None,
               tails: list[TailCosts] | None = None) -> Swept | None:
    """The event engine's (step end, critical stage, parts, busy) for ``plan``, or ``None``
    where the sweep does not apply (a split-backward schedule, a link carrying two flows at
    once, a dependency it cannot order). ``work`` given: filled with each resource's
    seconds of work, as the event engine's ``work``; ``tails``: ``tail_costs`` of these
    stages, if already priced."""
    tails = tails if tails is not None else tail_costs(stages, plan, cluster, prof, groups)
    x = _context(stages, model, plan, cluster, prof, groups)
    if x is None:
        return None
    left = sum(len(st.order) for st in x.stages)
    while left:
        played = sum(_advance(st, x) for st in x.stages)
        if not played:
            return None                  # nothing could move: let the event engine say why
        left -= played
    for st in x.stages:
        _tail(st, tails[st.s], x, plan)
    if _contended(x.flows):
        return None
    crit = max(range(plan.pp), key=lambda i: (x.stages[i].end_s, -i))
    parts, busy = _explain(crit, stages, x, plan, tails[crit])
    if work is not None:
        for st in x.stages:
            work[f"stage{st.s}.compute"] = st.compute_work_s
            if st.host_work_s:
                work[f"stage{st.s}.host"] = st.host_work_s
            work.update(st.link_work_s)
    return x.stages[crit].end_s, crit, parts, busy


def _context(stages, model, plan: Plan, cluster, prof, groups) -> _Plan | None:
    m, vpp = plan.num_microbatches, plan.vpp
    if uses_rendezvous(plan):
        return None                      # DeepSpeed's instruction stream: the event engine
    orders = [pass_order(plan.schedule, s, plan.pp, m, vpp) for s in range(plan.pp)]
    if any(o is None for o in orders):
        return None
    sends = pipeline_send_costs(model, plan, cluster, prof, groups)
    host = NO_HOST if prof.host is None else SYNC_HOST if prof.host.synchronous else ASYNC_HOST
    x = _Plan(plan.pp, vpp, m, sum(c.time_s for c in sends), plan.pp_blocking_p2p,
              plan.pp > 1 and sync_at_p2p(plan.host_mechanisms), lead_layers(plan.host_mechanisms),
              host, link_of(sends[:1]), groups["dp"].size > 1 or groups["edp"].size > 1,
              pass_syncs(plan.host_mechanisms))
    for s, chunks in enumerate(stages):
        costs = [pass_numbers(ch.fwd, ch) for ch in chunks] + \
                [pass_numbers(ch.bwd, ch) for ch in chunks]
        x.stages.append(_Stage(s, orders[s], costs, [-1.0] * (2 * vpp * m),
                               [-1.0] * (2 * vpp * m)))
    for st in x.stages:
        _wire(st, x, plan.schedule)
    return x


def _wire(st: _Stage, x: _Plan, schedule) -> None:
    """Per pass kind ``k`` of ``st`` (forward of chunk ``k``, backward of chunk ``k - vpp``),
    from the schedule's placement (``schedule.upstream``, ``sends_downstream``): the stage
    and kind of the pass it consumes (stage -1: none), the list that input's time is read
    from (the producer's ``ends`` on this stage, its ``out`` on another), the offset of the
    producer's kind in it, whether the input crosses stages, whether the output does."""
    pp, vpp, m, s = x.pp, x.vpp, x.m, st.s
    st.wiring = []
    for k in range(2 * vpp):
        u = Unit(k < vpp, 0, k % vpp)
        up = upstream(u, s, pp, vpp, schedule)
        us, uk = (-1, 0) if up is None else (up[0], up[1].chunk + (0 if up[1].fwd else vpp))
        src = None if us < 0 else st.ends if us == s else x.stages[us].out
        st.wiring.append(_Wire(us, uk, src, uk * m, us >= 0 and us != s,
                               sends_downstream(u, s, pp, vpp, schedule)))


def _advance(st: _Stage, x: _Plan, rec: _Recorder | None = None) -> int:
    """Play ``st``'s passes in order until one needs a pass not yet played on another stage;
    returns how many it played. ``rec``: record the tasks (the critical stage's replay)."""
    order, m, vpp, wiring, costs, ends = st.order, x.m, x.vpp, st.wiring, st.costs, st.ends
    i = i0 = st.i
    n = len(order)
    while i < n:
        fwd, mb, c = order[i]
        k = c if fwd else vpp + c
        _, _, src, base, cross_in, sends = wiring[k]
        up = -1.0
        if src is not None:
            up = src[base + mb]
            if up < 0:
                break
        st.i = i
        end, ds = _pass(st, x, k, up, cross_in, rec)
        key = k * m + mb
        if sends:
            end = _send(st, x, key, end, rec)
        ends[key] = st.c_free = end
        g, _, _, layers = costs[k]
        st.prev = (ds, g, layers, end)
        st.prev_loss = plain_loss_pass(fwd, st.s, c, x.pp, vpp)
        if not fwd:
            st.last_bwd[c] = (i, ds, g)
        if rec is not None:
            rec.pass_done(key)
        i += 1
    st.i = i
    return i - i0


def _pass(st: _Stage, x: _Plan, k: int, up: float, cross: bool, rec: _Recorder | None
          ) -> tuple[float, float]:
    """One pass as ``step._issue`` plays it: (end of its last compute-stream task, device
    start). ``up``: when its input arrives (-1: no input); ``cross``: from another stage."""
    g, hh, first, _ = st.costs[k]
    if x.host == NO_HOST or hh <= 0:
        ds = max(st.c_free, up)
        st.compute_work_s += g
        if rec is not None:
            rec.unit(ds, g, up, -1.0)
        return ds + g, ds
    hdep, synced = _host_release(st, x, k < x.vpp)
    xdep = up if cross and x.p2p_sync else -1.0
    if x.host == SYNC_HOST:                          # host, then kernels, on one stream
        hs = max(st.c_free, xdep)
        he = hs + hh
        ds = max(he, up)
        st.compute_work_s += hh + g
        if rec is not None:
            rec.host(hs, hh, hdep, xdep, True, synced)
            rec.unit(ds, g, up, -1.0)
        return ds + g, ds
    hs = max(st.h_free, hdep, xdep)
    he = st.h_free = hs + hh
    r = hs + first * hh if first < 1 else he
    ds = max(st.c_free, r, up)
    st.host_work_s += hh
    st.compute_work_s += g
    if rec is not None:
        rec.host(hs, hh, hdep, xdep, False, synced)
        rec.unit(ds, g, up, r)
        if he > ds + g or x.p2p_sync or any(x.syncs):  # a marker at the pass's end adds
            rec.issued(max(ds + g, he))  # nothing and nothing waits on it (but a synced host)
    return max(ds + g, he), ds


def _host_release(st: _Stage, x: _Plan, next_fwd: bool) -> tuple[float, bool]:
    """When the host may start issuing the next pass (``step._host_deps``; -1: at once) and
    whether that is the previous pass's end (the host waits for the device)."""
    if st.prev is None:
        return -1.0, False
    ds, g, layers, end = st.prev
    if x.p2p_sync or host_waits(x.syncs, st.prev_loss, next_fwd):
        return end, True
    if x.lead >= 0:
        return ds + lead_release_frac(x.lead, layers) * g, False
    return -1.0, False


def _send(st: _Stage, x: _Plan, key: int, end: float, rec: _Recorder | None) -> float:
    """The pass's hand-off to the next stage: on the stream (blocking) or on the link."""
    if x.blocking:
        st.compute_work_s += x.t_send_s
        if rec is not None:
            rec.send(end, x.t_send_s)
        st.out[key] = end + x.t_send_s
        return st.out[key]
    st.out[key] = end + x.t_send_s
    _flow(x, st, x.send_link, end, x.t_send_s)
    return end


def _flow(x: _Plan, st: _Stage, link: str, start: float, dur: float) -> float:
    name = f"stage{st.s}.{link}"
    x.flows.setdefault(name, []).append((start, start + dur))
    st.link_work_s[name] = st.link_work_s.get(name, 0.0) + dur
    return start + dur


def _tail(st: _Stage, tc: TailCosts, x: _Plan, plan: Plan, rec: _Recorder | None = None
          ) -> None:
    """Gradient buckets, interference, optimizer and parameter all-gather
    (``step._dp_and_optimizer``); sets ``st.end_s``."""
    prev = -1.0
    if plan.zero_stage < 3 and x.reduces:
        for c in sorted(tc.buckets_s, key=lambda c: st.last_bwd[c][0]):   # earliest first
            prev = _buckets(st, tc.buckets_s[c], st.last_bwd[c], x, plan, tc.link, prev)
    if tc.interference_s > 0:
        if rec is not None:
            rec.plain(st.c_free, tc.interference_s, "interference")
        st.c_free += tc.interference_s
        st.compute_work_s += tc.interference_s
    if tc.tied_s > 0:                   # the tied embedding's all-reduce (step._dp_and_optimizer)
        prev = _flow(x, st, tc.tied_link, max(st.c_free, prev), tc.tied_s)
    start = max(st.c_free, prev)
    if rec is not None:
        rec.optimizer(start, tc.optimizer_s, prev)
    st.end_s = st.c_free = start + tc.optimizer_s
    st.compute_work_s += tc.optimizer_s
    if tc.gather_s > 0 and not plan.dp_overlap:
        st.end_s = _flow(x, st, tc.link, st.c_free, tc.gather_s)


def _buckets(st: _Stage, times: list[float], last_bwd: tuple[int, float, float], x: _Plan,
             plan: Plan, link: str, prev: float) -> float:
    """One chunk's gradient buckets, released as its last backward pass progresses
    (``step._chunk_buckets``); returns when the last one ends."""
    _, ds, g = last_bwd
    for j, t in enumerate(times):
        frac = (j + 1) / len(times) if plan.dp_overlap else 1.0
        r = ds + frac * g if frac < 1 else ds + g
        r = max(r, prev)
        if not plan.dp_overlap:
            r = max(r, st.c_free)
        prev = _flow(x, st, link, r, t)
    return prev


def _contended(flows: dict[str, list[tuple[float, float]]]) -> bool:
    """Whether some link carried two flows at once (beyond rounding)."""
    span = max((e for fl in flows.values() for _, e in fl), default=0.0)
    tol = OVERLAP_REL * max(1.0, span)
    for fl in flows.values():
        last = -1.0
        for a, b in sorted(f for f in fl if f[1] > f[0]):
            if a < last - tol:
                return True
            last = max(last, b)
    return False


# ---- the critical stage, recorded --------------------------------------------------------
_META = {k: {"kind": k} for k in ("fwd", "bwd", "host", "host_wait", "pp_send", "dp_comm",
                                  "interference", "optimizer")}   # shared: read, never written


class _Recorder:
    """The critical stage's tasks as the event engine would hold them (ids, kinds, start,
    end, the dependency that released each last), for ``breakdown.event_breakdown``."""

    def __init__(self, st: _Stage, x: _Plan) -> None:
        self.x, self.st = x, st
        self.comp = f"stage{st.s}.compute"
        self.tasks: list[Task] = []
        self.units: dict[int, Unit] = {}          # pass task id -> a unit of its kind
        self._kinds = {(f, c): Unit(f, 0, c) for f in (True, False) for c in range(x.vpp)}
        self.end_tid: dict[int, int] = {}         # pass key -> its last compute-stream task
        self.unit_tid = self.host_tid = self.prev_unit = self.prev_end = -1
        self.optimizer_tid = -1

    def _task(self, resource: str, start: float, work: float, kind: str, crit: int) -> int:
        t = Task(len(self.tasks), kind, resource, work, [], _META[kind], start, start + work,
                 start, crit)
        self.tasks.append(t)
        return t.tid

    def _upstream_tid(self, up: float) -> int:
        """The task whose end released a pass's input at ``up``: the producer's send on
        another stage (a stand-in task), or the pass's own stage's earlier task."""
        fwd, mb, c = self.st.order[self.st.i]
        us, uk = self.st.wiring[c if fwd else self.x.vpp + c][:2]
        if us == self.st.s:
            return self.end_tid[uk * self.x.m + mb]
        return self._task(f"stage{us}.send", up - self.x.t_send_s, self.x.t_send_s, "pp_send", -1)

    def host(self, hs: float, hh: float, hdep: float, xdep: float, on_stream: bool,
             synced: bool) -> None:
        own = self.prev_end if synced else self.prev_unit
        crit = own if hdep >= 0 else -1
        if xdep >= 0 and xdep >= hdep:
            crit = self._upstream_tid(xdep)
        self.host_tid = self._task(self.comp if on_stream else f"stage{self.st.s}.host", hs, hh,
                                   "host", crit)

    def unit(self, ds: float, g: float, up: float, host_release: float) -> None:
        crit = self.host_tid if host_release >= 0 else -1
        if up >= 0 and up >= host_release:
            crit = self._upstream_tid(up)
        fwd, _, c = self.st.order[self.st.i]
        self.unit_tid = self._task(self.comp, ds, g, "fwd" if fwd else "bwd", crit)
        self.units[self.unit_tid] = self._kinds[(fwd, c)]

    def issued(self, start: float) -> None:
        self._task(self.comp, start, 0.0, "host_wait", self.host_tid)

    def send(self, start: float, dur: float) -> None:
        self._task(self.comp, start, dur, "pp_send", -1)

    def plain(self, start: float, dur: float, kind: str) -> None:
        self._task(self.comp, start, dur, kind, -1)

    def optimizer(self, start: float, dur: float, bucket_end: float) -> None:
        crit = len(self.tasks) - 1
        if bucket_end >= 0 and bucket_end >= self.tasks[-1].end_s:
            crit = self._task(f"stage{self.st.s}.dp", bucket_end, 0.0, "dp_comm", -1)
        self.optimizer_tid = self._task(self.comp, start, dur, "optimizer", crit)

    def pass_done(self, key: int) -> None:
        self.end_tid[key] = len(self.tasks) - 1
        self.prev_unit, self.prev_end = self.unit_tid, self.end_tid[key]


def _explain(crit: int, stages, x: _Plan, plan: Plan, tc: TailCosts
             ) -> tuple[dict[str, float], float]:
    """Replay the critical stage with its tasks recorded; its breakdown and busy time."""
    old = x.stages[crit]
    st = _Stage(old.s, old.order, old.costs, [-1.0] * len(old.ends), [-1.0] * len(old.out))
    _wire(st, x, plan.schedule)
    x.stages[crit] = st
    rec = _Recorder(st, x)
    _advance(st, x, rec)
    _tail(st, tc, x, plan, rec)
    x.stages[crit] = old
    tasks = StageTasks({}, {}, rec.comp, -1, rec.optimizer_tid, [], -1)
    return event_breakdown(rec.tasks, tasks, stages[crit], old.end_s, rec.units)
