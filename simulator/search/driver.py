"""Strategy search: enumerate plans, prune by rules and memory, rank analytically, confirm
the best on the event engine.

``search(targets, options)`` takes one ``EvalContext`` per (cluster size, global batch)
point and returns a ``SearchReport``: plans best first by the objective, each with step
time, throughput, MFU, memory headroom and main bottleneck, plus how many candidate plans
were rejected and why. Stages:

1. ``space.enumerate_space``: divisibility / topology / unsupported combinations;
2. ``space.estimate_stage_memory`` (no op pricing): plans that cannot fit;
   then dominance: where a cheaper recompute mode of the same plan fits, the dearer ones
   are dropped (recompute only adds work in this simulator);
3. ``simulate(engine="analytic")`` on every survivor (process pool or Ray);
4. ``simulate(engine="event")`` on the ``event_top`` best, and on further rounds while an
   unconfirmed candidate's analytic score could still beat the best confirmed one (up to
   ``event_max``); confirmed plans are ranked by their event-engine numbers.

With ``results_dir`` every evaluated candidate streams to a Parquet dataset and a
restarted search reuses the rows already there.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Mapping, Sequence

from .. import progress
from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan, Recompute, validate
from ..uncertainty.interval import Interval, log_interval_like
from ..workload.spec import TransformerSpec
from .executor import (
    BREAKDOWN_COLUMNS,
    Engine,
    EvalContext,
    ExecutorKind,
    default_workers,
    make_batches,
    make_executor,
)
from .space import (
    Knobs,
    Rejection,
    RejectReason,
    SearchSpace,
    enumerate_shapes,
    enumerate_space,
    fewest_recomputed,
    make_plan,
    peak_memory_bytes,
)
from .risk import (
    RISK_POOL,
    indistinguishable_from_best,
    pessimistic_tokens_per_s,
    step_intervals,
)
from .store import ResultStore, inputs_fingerprint, inputs_record

_RECOMPUTE_COST = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}


class Objective(str, Enum):
    THROUGHPUT = "throughput"                     # tokens/s of the whole cluster
    TIME_TO_TRAIN = "time-to-train"               # tokens / throughput (same order)
    COST = "cost"                                 # USD per token
    THROUGHPUT_PER_WATT = "throughput-per-watt"   # tokens/s per watt of GPU TDP
    # risk-averse: the pessimistic end of the 80 % interval (see ``search.risk``)
    TIME_TO_TRAIN_P90 = "time-to-train-p90"       # P90 time-to-train
    COST_P90 = "cost-p90"                         # P90 USD per token

    @property
    def risk_averse(self) -> bool:
        return self in (Objective.TIME_TO_TRAIN_P90, Objective.COST_P90)

    @property
    def point(self) -> "Objective":
        """The objective on point predictions that this one is the P90 of."""
        return {Objective.TIME_TO_TRAIN_P90: Objective.TIME_TO_TRAIN,
                Objective.COST_P90: Objective.COST}.get(self, self)


class Bottleneck(str, Enum):
    COMPUTE = "compute"
    TP_COMM = "tp-communication"
    CP_COMM = "cp-communication"
    EP_COMM = "ep-communication"
    DP_COMM = "dp-communication"
    PP_COMM = "pipeline-communication"
    BUBBLE = "pipeline-bubble"
    OPTIMIZER = "optimizer"
    INTERFERENCE = "comm-compute-interference"
    OVERHEAD = "fixed-overhead"


_LOSS_KIND = {"tp_comm_s": Bottleneck.TP_COMM, "cp_comm_s": Bottleneck.CP_COMM,
              "ep_comm_s": Bottleneck.EP_COMM, "dp_comm_s": Bottleneck.DP_COMM,
              "pp_comm_s": Bottleneck.PP_COMM, "bubble_s": Bottleneck.BUBBLE,
              "optimizer_s": Bottleneck.OPTIMIZER, "interference_s": Bottleneck.INTERFERENCE,
              "overhead_s": Bottleneck.OVERHEAD}


def main_bottleneck(breakdown: Mapping[str, float], compute_share: float = 0.85) -> Bottleneck:
    """``COMPUTE`` when compute is at least ``compute_share`` of the step; otherwise the
    largest non-compute time sink (the thing worth fixing)."""
    total = sum(max(0.0, v) for v in breakdown.values()) or 1.0
    if breakdown.get("compute_s", 0.0) / total >= compute_share:
        return Bottleneck.COMPUTE
    losses = [k for k in breakdown if k != "compute_s"]
    key = max(losses, key=lambda k: (breakdown.get(k, 0.0), k))
    return _LOSS_KIND.get(key, Bottleneck.OVERHEAD)


@dataclass(frozen=True)
class SearchOptions:
    space: SearchSpace = field(default_factory=SearchSpace)
    objective: Objective = Objective.THROUGHPUT
    top_k: int = 10
    event_top: int = 10
    event_max: int = 40
    event_tolerance: float = 0.01
    workers: int | None = None
    executor: ExecutorKind = ExecutorKind.LOCAL
    address: str | None = None
    results_dir: str | None = None
    progress: bool = False      # unused: progress goes to ``simulator.progress`` listeners
    price_usd_per_gpu_hour: float | None = None
    tokens: float | None = None
    intervals: bool = True                        # 80 % interval on every listed plan

    def __post_init__(self) -> None:
        for name, enum in (("objective", Objective), ("executor", ExecutorKind)):
            try:
                object.__setattr__(self, name, enum(getattr(self, name)))
            except ValueError:
                raise InvalidInputError(name, getattr(self, name),
                                        "one of " + ", ".join(e.value for e in enum)) from None
        if self.top_k < 1:
            raise InvalidInputError("top", self.top_k, "a positive integer")
        if self.event_top < 0:
            raise InvalidInputError("event_top", self.event_top, "0 or more")
        if self.price_usd_per_gpu_hour is not None and self.price_usd_per_gpu_hour < 0:
            raise InvalidInputError("price", self.price_usd_per_gpu_hour, "a price >= 0 USD/GPU-hour")


@dataclass(frozen=True)
class RankedPlan:
    """One searched plan with its predicted performance (``engine`` says which model)."""

    rank: int
    plan: Plan
    gpu: str
    n_gpus: int
    engine: str
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    num_microbatches: int
    breakdown: Mapping[str, float]
    main_bottleneck: Bottleneck
    score: float
    usd_per_gpu_hour: float
    tdp_w: float
    step_time_interval: Interval | None = None    # 80 % interval (``search.risk``)

    @property
    def memory_headroom_pct(self) -> float:
        return 100.0 * (1.0 - self.peak_memory_bytes / self.memory_capacity_bytes)

    def to_dict(self, tokens: float | None = None) -> dict[str, Any]:
        p = self.plan
        d = {"rank": self.rank, "gpu": self.gpu, "n_gpus": self.n_gpus,
             "global_batch": p.global_batch, "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp,
             "ep": p.ep, "vpp": p.vpp, "micro_batch": p.micro_batch, "zero_stage": p.zero_stage,
             "dp_shard": p.dp_shard,
             "recompute": p.recompute.value, "recompute_layers": p.recompute_layers,
             "sequence_parallel": p.sequence_parallel,
             "precision": p.precision.value, "schedule": p.schedule.value,
             "attention": p.attention.value, "moe_dispatcher": p.moe_dispatcher,
             "engine": self.engine,
             "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
             "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
             "num_microbatches": self.num_microbatches,
             "peak_memory_gb": self.peak_memory_bytes / 1e9,
             "memory_headroom_pct": self.memory_headroom_pct,
             "main_bottleneck": self.main_bottleneck.value, "score": self.score,
             "breakdown": dict(self.breakdown)}
        if self.usd_per_gpu_hour > 0:
            d["usd_per_million_tokens"] = 1e6 * self.n_gpus * self.usd_per_gpu_hour / 3600 / self.tokens_per_s
        if tokens:
            d["time_to_train_s"] = tokens / self.tokens_per_s
        iv = self.step_time_interval
        if iv is not None:
            d.update(iv.fields("step_time", "s"))
            d.update(log_interval_like(iv, self.tokens_per_s).fields("tokens_per_s"))
            if tokens:
                d.update(log_interval_like(iv, tokens / self.tokens_per_s).fields("time_to_train", "s"))
        return d


@dataclass(frozen=True)
class SearchReport:
    objective: Objective
    ranked: tuple[RankedPlan, ...]
    rejected: Mapping[str, int]
    generated: int
    simulated: Mapping[str, int]
    resumed: int
    search_wall_s: float
    targets: tuple[Mapping[str, Any], ...]
    space_rules: tuple[str, ...]
    records: tuple[Mapping[str, Any], ...] = field(default=(), repr=False, compare=False)
    tokens: float | None = None

    @property
    def winner(self) -> RankedPlan | None:
        return self.ranked[0] if self.ranked else None

    def rejection_summary(self) -> str:
        items = sorted(self.rejected.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k}={v}" for k, v in items) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective.value,
                "plans": [r.to_dict(self.tokens) for r in self.ranked],
                "rejected": dict(sorted(self.rejected.items())), "generated": self.generated,
                "simulated": dict(self.simulated), "resumed": self.resumed,
                "search_wall_s": self.search_wall_s, "targets": list(self.targets),
                "space_rules": list(self.space_rules),
                "indistinguishable_from_best": self.indistinguishable_from_best()}

    def indistinguishable_from_best(self) -> list[int]:
        """Ranks whose 80 % step-time interval overlaps the winner's by more than half."""
        return indistinguishable_from_best([r.step_time_interval for r in self.ranked])


# ---- targets -------------------------------------------------------------------------------
def make_context(model: TransformerSpec, cluster: ClusterSpec, profile: Profile,
                 global_batch: int) -> EvalContext:
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise InvalidInputError("global_batch", global_batch, "a positive integer")
    return EvalContext(model, cluster, profile, global_batch,
                       inputs_fingerprint(model, cluster, profile))


def _target_dict(ctx: EvalContext) -> dict[str, Any]:
    return {"model": ctx.model.name, "gpu": ctx.cluster.gpu.key, "n_gpus": ctx.cluster.n_gpus,
            "global_batch": ctx.global_batch, "seq_len": ctx.model.seq_len,
            "profile": ctx.profile.name, "fingerprint": ctx.fingerprint}


# ---- pruning -------------------------------------------------------------------------------
def prune(ctx: EvalContext, space: SearchSpace, rejected: Counter) -> tuple[list[Plan], int]:
    """Candidates that pass rules and memory, minus dominated recompute modes."""
    generated = 0
    groups: dict[Plan, list[Plan]] = {}
    cap = ctx.cluster.gpu.mem_bytes
    label = f"search: enumerate plans on {ctx.cluster.n_gpus} GPUs, batch {ctx.global_batch}"
    for item in progress.track(enumerate_space(ctx.model, ctx.cluster, ctx.global_batch, space),
                               label):
        if isinstance(item, Rejection):
            rejected[item.key] += item.count
            generated += item.count
            continue
        generated += 1
        if peak_memory_bytes(ctx.model, item) > cap:
            rejected[RejectReason.MEMORY.value] += 1
            continue
        groups.setdefault(replace(item, recompute=Recompute.NONE, recompute_layers=0), []).append(item)
    survivors: list[Plan] = []
    for plans in groups.values():
        plans.sort(key=lambda p: _RECOMPUTE_COST[p.recompute])
        lighter = fewest_recomputed(ctx.model, plans[0], cap) if space.partial_recompute \
            and plans[0].recompute == Recompute.FULL else None
        if lighter is not None:             # cheaper than recomputing every layer
            plans.insert(0, lighter)
        keep = plans[:1] if space.prune_dominated else plans
        survivors += keep
        rejected[RejectReason.DOMINATED.value] += len(plans) - len(keep)
    return survivors, generated


def _raise_if_unsplittable(contexts: Sequence[EvalContext], rejected: Counter,
                           n_survivors: int, space: SearchSpace) -> None:
    """Bad input, not an infeasible search: nothing even passed divisibility."""
    structural = (RejectReason.DIVISIBILITY.value, RejectReason.TOPOLOGY.value,
                  RejectReason.UNSUPPORTED.value, RejectReason.DUPLICATE.value)
    if n_survivors or any(not k.startswith(structural) for k in rejected):
        return
    if any(k.endswith(":global_batch") for k in rejected):
        ctx = contexts[0]
        dps = _valid_dps(ctx, space)
        raise InvalidInputError(
            "global_batch", ",".join(str(c.global_batch) for c in contexts),
            f"a multiple of micro_batch*dp for some plan on {ctx.cluster.n_gpus} GPUs "
            f"(possible dp: {', '.join(map(str, dps[:8])) or 'none'})")
    field_name = max((k for k in rejected), key=lambda k: rejected[k]).split(":")[-1]
    raise InvalidInputError(field_name, "any", "no parallel layout of this model fits this "
                            f"cluster (rejected: {', '.join(f'{k}={v}' for k, v in rejected.items())})")


def _valid_dps(ctx: EvalContext, space: SearchSpace) -> list[int]:
    out = set()
    for sh in enumerate_shapes(ctx.model, ctx.cluster.n_gpus, space):
        plan = make_plan(sh, Knobs(1, 1, 0, Recompute.NONE, False, space.precisions[0]),
                         sh.dp, space)
        try:
            validate(plan, ctx.model, ctx.cluster)
        except InvalidInputError:
            continue
        out.add(sh.dp)
    return sorted(out)


# ---- scoring -------------------------------------------------------------------------------
def price_for(ctx: EvalContext, options: SearchOptions) -> float:
    if options.price_usd_per_gpu_hour is not None:
        return options.price_usd_per_gpu_hour
    return ctx.cluster.gpu.price_usd_per_hour


def score(rec: Mapping[str, Any], ctx: EvalContext, options: SearchOptions) -> float:
    """Higher is better."""
    tps = rec["tokens_per_s"]
    obj = options.objective.point
    if obj == Objective.COST:
        price = price_for(ctx, options)
        if price <= 0:
            raise InvalidInputError("price", price, f"a price per GPU-hour for {ctx.cluster.gpu.key} "
                                    "(hardware_db has none; pass --price)")
        return -(ctx.cluster.n_gpus * price / 3600.0) / tps * 1e6      # -USD per 1M tokens
    if obj == Objective.THROUGHPUT_PER_WATT:
        return tps / (ctx.cluster.n_gpus * ctx.cluster.gpu.tdp_w)
    return tps


def _ranked(rec: Mapping[str, Any], ctx: EvalContext, plan: Plan, options: SearchOptions,
            rank: int) -> RankedPlan:
    bd = {c: rec[c] for c in BREAKDOWN_COLUMNS}
    return RankedPlan(rank=rank, plan=plan, gpu=ctx.cluster.gpu.key, n_gpus=ctx.cluster.n_gpus,
                      engine=rec["engine"], step_time_s=rec["step_time_s"],
                      tokens_per_s=rec["tokens_per_s"],
                      tokens_per_s_per_gpu=rec["tokens_per_s_per_gpu"], mfu=rec["mfu"],
                      hfu=rec["hfu"], peak_memory_bytes=rec["peak_memory_bytes"],
                      memory_capacity_bytes=rec["memory_capacity_bytes"],
                      num_microbatches=rec["num_microbatches"], breakdown=bd,
                      main_bottleneck=main_bottleneck(bd), score=score(rec, ctx, options),
                      usd_per_gpu_hour=price_for(ctx, options), tdp_w=ctx.cluster.gpu.tdp_w)


# ---- evaluation ----------------------------------------------------------------------------
@dataclass
class _Run:
    contexts: Sequence[EvalContext]
    options: SearchOptions
    store: ResultStore | None
    executor: Any = None
    resumed: int = 0

    def evaluate(self, items: list[tuple[int, Plan]], engine: Engine,
                 label: str) -> list[tuple[int, Plan, dict[str, Any]]]:
        """Records for ``items`` in input order; stored ones are reused, not recomputed."""
        from .store import candidate_key
        out: dict[int, dict[str, Any]] = {}
        todo: list[tuple[int, Plan]] = []
        index: dict[str, int] = {}
        for n, (i, plan) in enumerate(items):
            key = candidate_key(self.contexts[i].fingerprint, plan, engine.value)
            rec = self.store.get(key) if self.store else None
            if rec is not None:
                out[n] = rec
                self.resumed += 1
            else:
                index[key] = n
                todo.append((i, plan))
        self._run(todo, engine, label, index, out)
        return [(i, plan, out[n]) for n, (i, plan) in enumerate(items)]

    def _run(self, todo, engine, label, index, out) -> None:
        if not todo:
            return
        if self.executor is None:
            self.executor = make_executor(self.options.executor, self.contexts,
                                          self.options.workers, self.options.address)
        workers = getattr(self.executor, "workers", 1) or 1
        try:
            with progress.task(f"search: {label}", len(todo)) as bar:
                for recs in self.executor.run(make_batches(todo, engine, workers), len(todo)):
                    for r in recs:
                        out[index[r["key"]]] = r
                    if self.store:
                        self.store.add(recs)
                    bar.update(len(recs))
        finally:
            if self.store:
                self.store.flush()


def _top(scored: list[tuple[float, int, Plan, dict]], k: int) -> list[tuple[float, int, Plan, dict]]:
    """Best ``k`` by score; ties go to the plan with more memory headroom."""
    return sorted(scored, key=lambda t: (-t[0], t[3]["peak_memory_bytes"], t[3]["key"]))[:k]


def search(contexts: Sequence[EvalContext], options: SearchOptions | None = None) -> SearchReport:
    """Search every target in ``contexts``; plans from all of them are ranked together."""
    options = options or SearchOptions()
    if not contexts:
        raise InvalidInputError("targets", "[]", "at least one (cluster, global batch)")
    t0 = time.perf_counter()
    rejected: Counter = Counter()
    items: list[tuple[int, Plan]] = []
    generated = 0
    for i, ctx in enumerate(contexts):
        plans, gen = prune(ctx, options.space, rejected)
        generated += gen
        items += [(i, p) for p in plans]
    _raise_if_unsplittable(contexts, rejected, len(items), options.space)
    store = ResultStore(options.results_dir) if options.results_dir else None
    if store:
        for ctx in contexts:
            store.register_inputs(ctx.fingerprint, {**inputs_record(ctx.model, ctx.cluster, ctx.profile),
                                                    "global_batch": ctx.global_batch})
    run = _Run(contexts, options, store)
    analytic = run.evaluate(items, Engine.ANALYTIC, "rank (analytic engine)")
    scored = _score_ok(analytic, contexts, options, rejected)
    confirmed = _confirm(run, scored, contexts, options, rejected)
    ranked = _final_ranking(confirmed, scored, contexts, options, _local_workers(options))
    simulated = {Engine.ANALYTIC.value: len(analytic), Engine.EVENT.value: len(confirmed)}
    return SearchReport(objective=options.objective, ranked=tuple(ranked), rejected=dict(rejected),
                        generated=generated, simulated=simulated, resumed=run.resumed,
                        search_wall_s=time.perf_counter() - t0,
                        targets=tuple(_target_dict(c) for c in contexts),
                        space_rules=tuple(options.space.rules()),
                        records=tuple(r for _, _, r in analytic), tokens=options.tokens)


def _local_workers(options: SearchOptions) -> int:
    """Processes for the intervals of the ranked plans: the local executor's workers (one
    with Ray: its cluster is not ours to fork)."""
    if ExecutorKind(options.executor) != ExecutorKind.LOCAL:
        return 1
    return options.workers or default_workers()


def _score_ok(evaluated, contexts, options, rejected: Counter) -> list[tuple[float, int, Plan, dict]]:
    out = []
    for i, plan, rec in evaluated:
        if rec["status"] != "ok":
            rejected[rec["status"]] += 1
            continue
        out.append((score(rec, contexts[i], options), i, plan, rec))
    return out


def _confirm(run: _Run, scored, contexts, options, rejected: Counter):
    """Event-simulate the best analytic candidates: at least ``event_top``, then more in
    rounds of ``event_top`` while an unconfirmed candidate's analytic score could still
    beat the best confirmed one (the analytic form assumes ideal overlap, so it is mostly
    optimistic), up to ``event_max`` in all."""
    if options.event_top == 0:
        return []
    order = _top(scored, len(scored))
    cap = max(options.event_top, options.event_max)
    confirmed: list = []
    i = 0
    while i < min(len(order), cap):
        batch = order[i:min(i + options.event_top, cap)]
        evaluated = run.evaluate([(j, p) for _, j, p, _ in batch], Engine.EVENT,
                                 "confirm best (event engine)")
        confirmed += _score_ok(evaluated, contexts, options, rejected)
        i += len(batch)
        if not confirmed or i >= len(order):
            continue
        best = max(t[0] for t in confirmed)
        if order[i][0] <= best + abs(best) * options.event_tolerance:
            break
    return confirmed


def _final_ranking(confirmed, scored, contexts, options, workers: int = 1) -> list[RankedPlan]:
    """Confirmed plans first, then the best analytic ones; with intervals on each (over
    ``workers`` local processes). A risk-averse objective re-ranks the best ``RISK_POOL``
    by their P90."""
    seen = {(i, p) for _, i, p, _ in confirmed}
    rest = [t for t in scored if (t[1], t[2]) not in seen]
    risk = options.objective.risk_averse
    n = max(options.top_k, RISK_POOL) if risk else options.top_k
    ordered = (_top(confirmed, len(confirmed)) + _top(rest, n))[:n]
    ranked = [_ranked(rec, contexts[i], plan, options, k + 1)
              for k, (_, i, plan, rec) in enumerate(ordered)]
    if options.intervals or risk:
        ivs = step_intervals([(contexts[i], r.plan, r.step_time_s)
                              for r, (_, i, _, _) in zip(ranked, ordered)], workers)
        ranked = [replace(r, step_time_interval=iv) for r, iv in zip(ranked, ivs)]
    if risk:
        ranked = [replace(r, score=_risk_score(r, contexts[i], options))
                  for r, (_, i, _, _) in zip(ranked, ordered)]
        ranked = [r for _, r in sorted(enumerate(ranked), key=lambda t: (-t[1].score, t[0]))]
    return [replace(r, rank=k + 1) for k, r in enumerate(ranked[:options.top_k])]


def _risk_score(r: RankedPlan, ctx: EvalContext, options: SearchOptions) -> float:
    """The point objective's score at the pessimistic end of the interval."""
    tps = pessimistic_tokens_per_s(r.tokens_per_s, r.step_time_interval)
    return score({"tokens_per_s": tps}, ctx, options)
