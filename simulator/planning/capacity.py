"""Capacity planning and hardware comparison on top of the strategy search.

Every answer starts from the best plan that ``simulator.search.driver`` finds for a (model,
cluster, global batch) and turns its throughput into wall-clock time, GPU-hours, cost and
energy:

* ``seconds = tokens / tokens_per_s``; ``gpu_hours = n_gpus * seconds / 3600``;
* ``cost_usd = gpu_hours * price_usd_per_gpu_hour`` (hardware_db's on-demand ballpark
  unless the caller passes a price);
* ``energy_mwh = n_gpus * tdp_w * hours * pue / 1e6``. Assumption, stated: every GPU
  draws its TDP for the whole run (an upper bound for the GPUs; real training averages
  somewhat below TDP), and ``pue`` (default ``DEFAULT_PUE`` = 1.2, a modern hyperscale
  facility; industry surveys average ~1.5) multiplies it for cooling and power delivery.
  CPUs, NICs and switches are not counted unless folded into ``pue``.

Hardware comes from a ``HardwareCatalog`` (the CLI passes one backed by ``hardware_db``;
the simulator itself never imports it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Mapping, Protocol, Sequence

from .. import progress
from ..engine.stage_work import place_groups
from ..errors import ComplexityError, InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..search.driver import (
    Bottleneck,
    RankedPlan,
    SearchOptions,
    SearchReport,
    make_context,
    search,
)
from ..uncertainty.interval import Interval, distinguishable, log_interval_like
from ..workload.spec import TransformerSpec

DEFAULT_PUE = 1.2
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class HardwareChoice:
    """A cluster to price: GPU key, count, and optional NIC / node / fabric overrides
    (``oversubscription`` of the leaf uplinks, ``rail_optimized``, ``node`` preset)."""

    gpu: str
    n_gpus: int
    nic_gbps: float | None = None
    nics_per_node: int | None = None
    gpus_per_node: int | None = None
    oversubscription: float = 1.0
    rail_optimized: bool = True
    node: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n_gpus, bool) or not isinstance(self.n_gpus, int) or self.n_gpus < 1:
            raise InvalidInputError("gpus", self.n_gpus, "a positive GPU count")

    @property
    def label(self) -> str:
        s = f"{self.n_gpus}x{self.gpu}"
        if self.nic_gbps:
            s += f"@{self.nic_gbps:g}G"
        if self.nics_per_node:
            s += f"/{self.nics_per_node}nic"
        if self.node:
            s += f" {self.node}"
        if self.oversubscription != 1.0:
            s += f" {self.oversubscription:g}:1"
        if not self.rail_optimized:
            s += " no-rail"
        return s


class HardwareCatalog(Protocol):
    def cluster(self, choice: HardwareChoice) -> ClusterSpec: ...
    def profile(self, gpu_key: str) -> Profile: ...


class LimitingResource(str, Enum):
    COMPUTE = "gpu-compute"
    HBM_BANDWIDTH = "hbm-bandwidth"
    MEMORY_CAPACITY = "memory-capacity"
    SCALE_UP = "scale-up-fabric"
    SCALE_OUT = "scale-out-network"
    PIPELINE_BUBBLE = "pipeline-bubble"
    INTERFERENCE = "comm-compute-interference"
    OVERHEAD = "fixed-overhead"


_GROUP_OF = {Bottleneck.TP_COMM: "tp", Bottleneck.CP_COMM: "cp", Bottleneck.EP_COMM: "ep",
             Bottleneck.DP_COMM: "dp", Bottleneck.PP_COMM: "pp"}


def limiting_resource(best: RankedPlan, cluster: ClusterSpec,
                      tight_headroom_pct: float = 10.0) -> LimitingResource:
    """The hardware resource that bounds a plan: memory capacity when under
    ``tight_headroom_pct`` free; otherwise the main bottleneck mapped onto the resource
    it runs on (a collective group that spans scale-up domains is network-bound)."""
    if best.memory_headroom_pct < tight_headroom_pct:
        return LimitingResource.MEMORY_CAPACITY
    b = best.main_bottleneck
    if b in _GROUP_OF:
        g = place_groups(cluster, best.plan)[_GROUP_OF[b]]
        return LimitingResource.SCALE_OUT if g.domains > 1 else LimitingResource.SCALE_UP
    return {Bottleneck.COMPUTE: LimitingResource.COMPUTE,
            Bottleneck.BUBBLE: LimitingResource.PIPELINE_BUBBLE,
            Bottleneck.OPTIMIZER: LimitingResource.HBM_BANDWIDTH,
            Bottleneck.INTERFERENCE: LimitingResource.INTERFERENCE,
            Bottleneck.OVERHEAD: LimitingResource.OVERHEAD}[b]


# ---- arithmetic ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainingEstimate:
    """Time, GPU-hours, cost and energy to process ``tokens`` with one plan."""

    gpu: str
    n_gpus: int
    tokens: float
    tokens_per_s: float
    seconds: float
    gpu_hours: float
    price_usd_per_gpu_hour: float
    cost_usd: float | None                  # None when no price is known
    tdp_w: float
    pue: float
    energy_mwh: float
    plan: RankedPlan | None = None

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0

    @property
    def days(self) -> float:
        return self.seconds / SECONDS_PER_DAY

    def interval(self, value: float) -> Interval | None:
        """80 % interval of ``value`` (time, cost or energy of this estimate: all scale
        with the step time) from the plan's step-time interval; None without one."""
        iv = self.plan.step_time_interval if self.plan is not None else None
        return log_interval_like(iv, value) if iv is not None else None

    def interval_fields(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, v in (("seconds", self.seconds), ("days", self.days),
                        ("gpu_hours", self.gpu_hours), ("cost_usd", self.cost_usd),
                        ("energy_mwh", self.energy_mwh)):
            iv = self.interval(v) if v is not None else None
            if iv is not None:
                out.update(iv.fields(name))
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {"gpu": self.gpu, "n_gpus": self.n_gpus, "tokens": self.tokens,
             "tokens_per_s": self.tokens_per_s, "seconds": self.seconds, "hours": self.hours,
             "days": self.days, "gpu_hours": self.gpu_hours,
             "price_usd_per_gpu_hour": self.price_usd_per_gpu_hour, "cost_usd": self.cost_usd,
             "tdp_w": self.tdp_w, "pue": self.pue, "energy_mwh": self.energy_mwh,
             **self.interval_fields()}
        if self.plan is not None:
            d["plan"] = self.plan.to_dict()
        return d


def _check_positive(name: str, v: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InvalidInputError(name, v, "a positive number")


def training_estimate(tokens: float, tokens_per_s: float, n_gpus: int, gpu: str, tdp_w: float,
                      price_usd_per_gpu_hour: float, pue: float = DEFAULT_PUE,
                      plan: RankedPlan | None = None) -> TrainingEstimate:
    """The module docstring's formulas, nothing else."""
    _check_positive("tokens", tokens)
    _check_positive("tokens_per_s", tokens_per_s)
    _check_positive("pue", pue)
    if pue < 1.0:
        raise InvalidInputError("pue", pue, "a power usage effectiveness >= 1.0")
    if price_usd_per_gpu_hour < 0:
        raise InvalidInputError("price", price_usd_per_gpu_hour, "a price >= 0 USD/GPU-hour")
    seconds = tokens / tokens_per_s
    gpu_hours = n_gpus * seconds / 3600.0
    cost = gpu_hours * price_usd_per_gpu_hour if price_usd_per_gpu_hour > 0 else None
    energy = n_gpus * tdp_w * (seconds / 3600.0) * pue / 1e6
    return TrainingEstimate(gpu, n_gpus, float(tokens), tokens_per_s, seconds, gpu_hours,
                            price_usd_per_gpu_hour, cost, tdp_w, pue, energy, plan)


def estimate_for(best: RankedPlan, tokens: float, price: float | None = None,
                 pue: float = DEFAULT_PUE) -> TrainingEstimate:
    p = best.usd_per_gpu_hour if price is None else price
    return training_estimate(tokens, best.tokens_per_s, best.n_gpus, best.gpu, best.tdp_w, p,
                             pue, best)


# ---- searches ------------------------------------------------------------------------------
def best_plan(model: TransformerSpec, choice: HardwareChoice, global_batch: int,
              catalog: HardwareCatalog, options: SearchOptions) -> SearchReport:
    cluster = catalog.cluster(choice)
    ctx = make_context(model, cluster, catalog.profile(cluster.gpu.key), global_batch)
    return search([ctx], options)


def _best_or_none(model, choice, global_batch, catalog, options) -> RankedPlan | None:
    try:
        return best_plan(model, choice, global_batch, catalog, options).winner
    except ComplexityError:
        return None


def time_on(model: TransformerSpec, tokens: float, choice: HardwareChoice, global_batch: int,
            catalog: HardwareCatalog, options: SearchOptions, price: float | None = None,
            pue: float = DEFAULT_PUE) -> tuple[TrainingEstimate, SearchReport]:
    """How long (and how much) ``tokens`` take on ``choice`` with its best plan."""
    if price is not None:
        options = replace(options, price_usd_per_gpu_hour=price)
    report = best_plan(model, choice, global_batch, catalog, options)
    if report.winner is None:
        raise InvalidInputError("gpus", choice.n_gpus,
                                f"a cluster where some plan fits (rejected: {report.rejection_summary()})")
    return estimate_for(report.winner, tokens, price, pue), report


@dataclass(frozen=True)
class DeadlineAnswer:
    deadline_s: float
    estimate: TrainingEstimate | None       # None: no tried size meets the deadline
    tried: tuple[tuple[int, float | None], ...]   # (n_gpus, days or None if infeasible)

    def to_dict(self) -> dict[str, Any]:
        return {"deadline_days": self.deadline_s / SECONDS_PER_DAY,
                "n_gpus": self.estimate.n_gpus if self.estimate else None,
                "estimate": self.estimate.to_dict() if self.estimate else None,
                "tried": [{"n_gpus": n, "days": d} for n, d in self.tried]}


def gpus_for_deadline(model: TransformerSpec, tokens: float, deadline_s: float, gpu: str,
                      global_batch: int, catalog: HardwareCatalog, options: SearchOptions,
                      gpus_per_node: int, max_gpus: int = 65536, price: float | None = None,
                      pue: float = DEFAULT_PUE) -> DeadlineAnswer:
    """Smallest GPU count on the ladder ``gpus_per_node * 2^k`` (plus the 1.5x point below
    the first hit) whose best plan finishes by the deadline.

    Few searches: from the first count where a plan fits, jump to the count that linear
    scaling says is needed, then step down while the deadline still holds or up until it
    does. With a fixed global batch, throughput need not grow with the count (more GPUs
    force more model parallelism), so this is the smallest count *found*, not a proof."""
    _check_positive("deadline", deadline_s)
    ladder = []
    n = gpus_per_node
    while n <= max_gpus:
        ladder.append(n)
        n *= 2
    quick = replace(options, top_k=1, event_top=min(options.event_top, 2) or 0,
                    event_max=min(options.event_max, 8))
    tried: dict[int, RankedPlan | None] = {}

    def days(n: int) -> float | None:
        if n not in tried:
            tried[n] = _best_or_none(model, HardwareChoice(gpu, n), global_batch, catalog, quick)
        b = tried[n]
        return None if b is None else tokens / b.tokens_per_s / SECONDS_PER_DAY

    def meets(i: int) -> bool:
        d = days(ladder[i])
        return d is not None and d * SECONDS_PER_DAY <= deadline_s

    hit = _ladder_search(ladder, days, meets, deadline_s)
    est = None
    if hit is not None:
        n = hit
        mid = (3 * hit // 4) // gpus_per_node * gpus_per_node
        if mid > gpus_per_node and mid not in ladder:
            d = days(mid)
            if d is not None and d * SECONDS_PER_DAY <= deadline_s:
                n = mid
        est = estimate_for(tried[n], tokens, price, pue)
    return DeadlineAnswer(deadline_s, est, tuple((k, days(k)) for k in sorted(tried)))


def _ladder_search(ladder: list[int], days, meets, deadline_s: float) -> int | None:
    first = next((i for i in range(len(ladder)) if days(ladder[i]) is not None), None)
    if first is None:
        return None
    need = days(ladder[first]) * SECONDS_PER_DAY / deadline_s
    i = min(len(ladder) - 1, first + max(0, math.ceil(math.log2(need))) if need > 1 else first)
    if meets(i):
        while i > first and meets(i - 1):
            i -= 1
        return ladder[i]
    while i + 1 < len(ladder):
        i += 1
        if meets(i):
            return ladder[i]
    return None


@dataclass(frozen=True)
class WindowAnswer:
    """Most tokens a cluster processes in a fixed wall-clock window (whole steps only)."""

    window_s: float
    steps: int
    tokens: int
    best: RankedPlan | None
    by_batch: tuple[tuple[int, int], ...]          # (global_batch, tokens in the window)

    def to_dict(self) -> dict[str, Any]:
        return {"window_min": self.window_s / 60.0, "steps": self.steps, "tokens": self.tokens,
                "plan": self.best.to_dict() if self.best else None,
                "by_global_batch": [{"global_batch": b, "tokens": t} for b, t in self.by_batch]}


def window_plan(model: TransformerSpec, window_s: float, choice: HardwareChoice,
                batches: Sequence[int], catalog: HardwareCatalog,
                options: SearchOptions) -> WindowAnswer:
    """Over ``batches``: the plan whose whole steps in ``window_s`` cover the most tokens."""
    _check_positive("window", window_s)
    best: tuple[int, int, RankedPlan] | None = None
    rows = []
    for gb in progress.track(batches, f"plan: global batches on {choice.label}",
                             describe=lambda b: f"batch {b}"):
        quick = replace(options, top_k=1, event_top=min(options.event_top, 2),
                        event_max=min(options.event_max, 4))
        w = _best_or_none(model, choice, gb, catalog, quick)
        if w is None:
            continue
        steps = int(window_s // w.step_time_s)
        toks = steps * gb * model.seq_len
        rows.append((gb, toks))
        if best is None or toks > best[0]:
            best = (toks, steps, w)
    if best is None:
        raise InvalidInputError("global_batch", ",".join(map(str, batches)),
                                f"a batch some plan on {choice.label} can run")
    return WindowAnswer(window_s, best[1], best[0], best[2], tuple(rows))


# ---- comparison ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ComparisonRow:
    choice: HardwareChoice
    estimate: TrainingEstimate | None
    limiting: LimitingResource | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        ch = self.choice
        d: dict[str, Any] = {"hardware": ch.label, "gpu": ch.gpu, "n_gpus": ch.n_gpus,
                             "nic_gbps": ch.nic_gbps, "nics_per_node": ch.nics_per_node,
                             "oversubscription": ch.oversubscription,
                             "rail_optimized": ch.rail_optimized, "node": ch.node,
                             "limiting_resource": self.limiting.value if self.limiting else None,
                             "note": self.note}
        if self.estimate is not None:
            e, p = self.estimate, self.estimate.plan
            d.update(tokens_per_s=e.tokens_per_s, days=e.days, cost_usd=e.cost_usd,
                     energy_mwh=e.energy_mwh, gpu_hours=e.gpu_hours,
                     memory_headroom_pct=p.memory_headroom_pct if p else None,
                     mfu=p.mfu if p else None, plan=p.to_dict() if p else None)
        return d


def compare(model: TransformerSpec, tokens: float, choices: Sequence[HardwareChoice],
            global_batch: int, catalog: HardwareCatalog, options: SearchOptions,
            prices: Mapping[str, float] | None = None,
            pue: float = DEFAULT_PUE) -> list[ComparisonRow]:
    """Each hardware choice with its own best plan. ``prices`` maps GPU keys (canonical or
    as given) to USD per GPU-hour, overriding hardware_db's."""
    rows = []
    for ch in progress.track(choices, "compare: hardware choices", describe=lambda c: c.label):
        price = _price_for(prices, ch, catalog)
        try:
            est, rep = time_on(model, tokens, ch, global_batch, catalog, options, price, pue)
        except ComplexityError as exc:
            rows.append(ComparisonRow(ch, None, None, f"no plan: {exc}"))
            continue
        cluster = catalog.cluster(ch)
        note = "" if est.cost_usd is not None else "no price known (pass --price)"
        rows.append(ComparisonRow(ch, est, limiting_resource(rep.winner, cluster), note))
    return rows


def _price_for(prices: Mapping[str, float] | None, ch: HardwareChoice,
               catalog: HardwareCatalog) -> float | None:
    if not prices:
        return None
    if ch.gpu in prices:
        return prices[ch.gpu]
    return prices.get(catalog.cluster(ch).gpu.key)


def indistinguishable_from_best(rows: Sequence[ComparisonRow],
                                what: str = "days") -> tuple[ComparisonRow | None, list[ComparisonRow]]:
    """The best row by ``what`` (``days`` or ``cost_usd``, lower is better) and the rows
    whose 80 % interval of it overlaps the best's by more than half (not distinguishable)."""
    def value(r: ComparisonRow) -> float | None:
        return getattr(r.estimate, what) if r.estimate is not None else None
    ok = [r for r in rows if value(r) is not None]
    if not ok:
        return None, []
    best = min(ok, key=value)
    b_iv = best.estimate.interval(value(best))
    if b_iv is None:
        return best, []
    same = [r for r in ok if r is not best and r.estimate.interval(value(r)) is not None
            and not distinguishable(b_iv, r.estimate.interval(value(r)))]
    return best, same
