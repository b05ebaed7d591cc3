"""The strategy search space: which plans exist, which are rejected and why.

``enumerate_space`` walks every combination of the knobs in a ``SearchSpace`` for one
(model, cluster, global batch) and yields either a ``Plan`` worth simulating or a
``Rejection`` (a reason and how many candidate plans it covers). Rules that *define* the
space, rather than reject from it, are listed in ``SearchSpace.rules()`` so a report can
say what was never generated:

* tp is a power of two; a tp above the scale-up (NVLink) domain is rejected (topology);
* pp is a divisor of ``n_gpus / (tp * cp)``; uneven layer splits are allowed for 1F1B;
* interleaved stages (vpp > 1) need ``n_layers % (pp * vpp) == 0`` (Megatron's rule);
* cp > 1 only when ``seq_len >= cp_min_seq_len``; ep > 1 only for MoE models;
* sequence parallelism only when tp > 1; ZeRO-3 only without pipeline parallelism
  (neither Megatron nor DeepSpeed pipelines shard weights); ZeRO-1 with a data-parallel
  group of one is the same plan as ZeRO-0.

Memory is checked by ``estimate_stage_memory``: the same accounting as
``simulator.engine.simulate.stage_memory`` (a test keeps the two equal) without pricing any op, so a
plan that cannot fit is dropped before it is simulated.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from functools import lru_cache
from typing import Iterator

from ..engine.memory_fit import estimate_stage_memory as _estimate
from ..engine.stage_work import chunk_layers, layer_shape, partition_layers
from ..errors import InvalidInputError
from ..hardware.specs import ClusterSpec, Dtype
from ..memory.accounting import StageMemory, live_chunk_counts, stage_memory
from ..memory.chunk import chunk_memory, layer_kind_counts
from ..parallel.plan import (
    AttentionImpl,
    Plan,
    Recompute,
    Schedule,
    check_moe_dispatcher,
    flex_fits,
    validate,
)
from ..parallel.schedule import chunk_parts
from ..workload.ops import LayerShape
from ..workload.spec import TransformerSpec

_POW2 = tuple(2 ** i for i in range(11))          # 1 .. 1024


class RejectReason(str, Enum):
    """Why a candidate plan was not simulated (or not kept)."""

    TOPOLOGY = "topology"               # tp larger than the scale-up domain
    DIVISIBILITY = "divisibility"       # heads / layers / batch / experts do not split
    UNSUPPORTED = "unsupported"         # a combination frameworks do not run
    DUPLICATE = "duplicate"             # identical to another candidate
    MEMORY = "memory"                   # does not fit in GPU memory
    DOMINATED = "dominated"             # a cheaper recompute mode of the same plan fits
    FAILED = "failed"                   # the simulator refused it (InfeasiblePlanError)


@dataclass(frozen=True)
class Rejection:
    reason: RejectReason
    detail: str                          # e.g. the field that failed validation
    count: int = 1                       # candidate plans this rejection stands for

    @property
    def key(self) -> str:
        return f"{self.reason.value}:{self.detail}" if self.detail else self.reason.value


@dataclass(frozen=True)
class SearchSpace:
    """Knob values to try. Framework behaviour (attention kernel, overlaps) is fixed per
    search so that plans are compared under one software stack."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    zero_stages: tuple[int, ...] = (0, 1, 3)
    recomputes: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    precisions: tuple[Dtype, ...] = (Dtype.BF16,)
    vpps: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    max_tp: int = 64
    max_cp: int = 16
    cp_min_seq_len: int = 8192
    attention: AttentionImpl = AttentionImpl.FLASH
    dp_overlap: bool = True
    tp_overlap: bool = False
    prune_dominated: bool = True
    moe_dispatcher: str = "alltoall"          # "flex" (DeepEP): MoE shapes with tp 1, ep > 1
    # HSDP shard groups to try beside full sharding for ZeRO-3 plans (Plan.dp_shard); () none
    dp_shards: tuple[int, ...] = ()
    # where full recompute is the cheapest mode that fits, also try recomputing only the
    # fewest layers per chunk that fit (Plan.recompute_layers; driver.fewest_recomputed)
    partial_recompute: bool = False

    def __post_init__(self) -> None:
        for name in ("micro_batches", "vpps"):
            vals = getattr(self, name)
            if not vals or any(not isinstance(v, int) or v < 1 for v in vals):
                raise InvalidInputError(name, vals, "a non-empty list of positive integers")
        if any(not isinstance(v, int) or v < 1 for v in self.dp_shards):
            raise InvalidInputError("dp_shards", self.dp_shards, "positive shard group sizes")
        if not self.zero_stages or any(z not in (0, 1, 2, 3) for z in self.zero_stages):
            raise InvalidInputError("zero_stages", self.zero_stages, "values among 0, 1, 2, 3")
        object.__setattr__(self, "recomputes", tuple(Recompute(r) for r in self.recomputes))
        object.__setattr__(self, "precisions", tuple(Dtype(p) for p in self.precisions))
        object.__setattr__(self, "attention", AttentionImpl(self.attention))
        check_moe_dispatcher(self.moe_dispatcher)
        if not self.recomputes or not self.precisions:
            raise InvalidInputError("recomputes/precisions", "()", "at least one value each")

    def rules(self) -> list[str]:
        return [
            "tp: powers of two; tp > scale-up domain rejected (topology)",
            "pp: divisors of n_gpus/(tp*cp); uneven layer split allowed without interleaving",
            "vpp > 1: interleaved 1F1B, n_layers divisible by pp*vpp",
            f"cp > 1 only when seq_len >= {self.cp_min_seq_len}; cp <= {self.max_cp}",
            "ep > 1 only for MoE: divisors of the expert count that divide dp*cp",
            "sequence parallel only when tp > 1; ZeRO-3 only when pp == 1",
            f"HSDP shard groups {list(self.dp_shards) or 'none'} beside full sharding for ZeRO-3 "
            "(each a proper divisor of dp*cp and a multiple of cp and ep)",
            f"attention={self.attention.value} dp_overlap={self.dp_overlap} "
            f"tp_overlap={self.tp_overlap} moe_dispatcher={self.moe_dispatcher} (fixed for "
            "the whole search; flex: tp = 1 and ep > 1 for MoE models)",
        ]


# ---- shapes: (tp, cp, pp, dp, ep) ---------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _cp_options(model: TransformerSpec, space: SearchSpace) -> list[int]:
    if model.seq_len < space.cp_min_seq_len:
        return [1]
    return [c for c in _POW2 if c <= space.max_cp]


def _ep_options(model: TransformerSpec, dp: int, cp: int) -> list[int]:
    if model.moe is None:
        return [1]
    return [e for e in _divisors(model.moe.experts) if (dp * cp) % e == 0]


def enumerate_shapes(model: TransformerSpec, n_gpus: int, space: SearchSpace) -> Iterator[Shape]:
    """Every (tp, cp, pp, dp, ep) whose product of tp*cp*pp*dp is ``n_gpus``."""
    tps = [t for t in _POW2 if t <= min(space.max_tp, n_gpus)]
    for tp in tps:
        for cp in _cp_options(model, space):
            if n_gpus % (tp * cp):
                continue
            rest = n_gpus // (tp * cp)
            for pp in _divisors(rest):
                dp = rest // pp
                for ep in _ep_options(model, dp, cp):
                    if space.moe_dispatcher != "flex" or flex_fits(model, tp, ep):
                        yield Shape(tp, cp, pp, dp, ep)


# ---- knobs per shape ------------------------------------------------------------------------
@dataclass(frozen=True)
class Knobs:
    micro_batch: int
    vpp: int
    zero_stage: int
    recompute: Recompute
    sequence_parallel: bool
    precision: Dtype
    dp_shard: int = 0


def _shards(shape: Shape, zero: int, space: SearchSpace) -> list[int]:
    """0 (shard over all of dp x cp) and, for ZeRO-3, each HSDP group this shape takes."""
    ranks = shape.dp * shape.cp
    extra = [s for s in space.dp_shards if zero == 3 and s < ranks and ranks % s == 0
             and s % shape.cp == 0 and s % shape.ep == 0]
    return [0] + sorted(set(extra))


def knob_options(model: TransformerSpec, shape: Shape, space: SearchSpace) -> list[Knobs]:
    vpps = [1] if shape.pp == 1 else [v for v in space.vpps
                                      if v == 1 or model.n_layers % (shape.pp * v) == 0]
    sps = (False, True) if shape.tp > 1 else (False,)
    return [Knobs(mb, v, z, rc, sp, prec, ds)
            for prec in space.precisions for mb in space.micro_batches for v in vpps
            for z in space.zero_stages for ds in _shards(shape, z, space) for sp in sps
            for rc in space.recomputes]


def make_plan(shape: Shape, k: Knobs, global_batch: int, space: SearchSpace) -> Plan:
    return Plan(tp=shape.tp, pp=shape.pp, dp=shape.dp, cp=shape.cp, ep=shape.ep, vpp=k.vpp,
                micro_batch=k.micro_batch, global_batch=global_batch,
                sequence_parallel=k.sequence_parallel, recompute=k.recompute,
                zero_stage=k.zero_stage, dp_shard=k.dp_shard, precision=k.precision,
                schedule=Schedule.INTERLEAVED if k.vpp > 1 else Schedule.ONE_F_ONE_B,
                attention=space.attention, dp_overlap=space.dp_overlap,
                tp_overlap=space.tp_overlap, moe_dispatcher=space.moe_dispatcher)


def _rule_rejection(shape: Shape, k: Knobs) -> Rejection | None:
    if k.zero_stage >= 2 and shape.pp > 1:
        return Rejection(RejectReason.UNSUPPORTED, "zero2/3 with pipeline")
    if k.zero_stage == 1 and shape.dp * shape.cp == 1:
        return Rejection(RejectReason.DUPLICATE, "zero1 without data parallelism")
    return None


def _validation_rejection(plan: Plan, model: TransformerSpec, cluster: ClusterSpec) -> Rejection | None:
    try:
        validate(plan, model, cluster)
    except InvalidInputError as exc:
        reason = RejectReason.TOPOLOGY if exc.field == "tp" and \
            plan.tp > cluster.node.scale_up_domain_gpus else RejectReason.DIVISIBILITY
        return Rejection(reason, exc.field)
    return None


def enumerate_space(model: TransformerSpec, cluster: ClusterSpec, global_batch: int,
                    space: SearchSpace) -> Iterator[Plan | Rejection]:
    """Candidate plans that pass validation and the space's rules, and rejections (with the
    number of plans each covers) for everything else. Memory is not checked here."""
    for shape in enumerate_shapes(model, cluster.n_gpus, space):
        knobs = knob_options(model, shape, space)
        base = make_plan(shape, Knobs(1, 1, 0, Recompute.NONE, False, space.precisions[0]),
                         global_batch, space)
        shape_rej = _validation_rejection(replace(base, global_batch=base.dp), model, cluster)
        if shape_rej is not None:
            yield replace(shape_rej, count=len(knobs))
            continue
        for k in knobs:
            rej = _rule_rejection(shape, k)
            if rej is None:
                plan = make_plan(shape, k, global_batch, space)
                rej = _validation_rejection(plan, model, cluster)
                if rej is None:
                    yield plan
                    continue
            yield rej


# ---- fast memory estimate -------------------------------------------------------------------
def _stage_memory(model: TransformerSpec, plan: Plan, sh: LayerShape, parts: list[list[int]],
                  s: int) -> StageMemory:
    C, placed = chunk_parts(plan.schedule, plan.pp, plan.vpp)
    chunks = [chunk_memory(model, plan, sh, parts[g], g == 0, g == C - 1)
              for g in placed[s]]
    return stage_memory(s, chunks, plan)


def estimate_stage_memory(model: TransformerSpec, plan: Plan) -> list[StageMemory]:
    """Peak memory of one rank per pipeline stage, without pricing any op (the simulator's
    own accounting: ``simulator.engine.memory_fit.estimate_stage_memory``)."""
    return _estimate(model, plan)


@lru_cache(maxsize=100_000)
def _live(schedule: Schedule, stage: int, pp: int, m: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    return live_chunk_counts(schedule, stage, pp, m, vpp)


def peak_memory_bytes(model: TransformerSpec, plan: Plan) -> float:
    """``max(estimate_stage_memory(...))`` computed once per distinct stage content: stages
    holding the same layer counts differ only in how many micro-batches are in flight, and
    the one holding the most (for every chunk) has the highest peak."""
    C, placed = chunk_parts(plan.schedule, plan.pp, plan.vpp)
    parts = partition_layers(model.n_layers, C)
    groups: dict[tuple, list[tuple[int, tuple]]] = {}
    for s in range(plan.pp):
        sig = tuple((layer_kind_counts(model, tuple(parts[g]), plan.recompute_layers),
                     g == 0, g == C - 1)
                    for g in placed[s])
        live = _live(plan.schedule, s, plan.pp, plan.num_microbatches, plan.vpp)
        kept = groups.setdefault(sig, [])
        if not any(_covers(k, live) for _, k in kept):
            kept[:] = [(t, k) for t, k in kept if not _covers(live, k)] + [(s, live)]
    sh = layer_shape(model, plan)
    return max(_stage_memory(model, plan, sh, parts, s).total_bytes
               for kept in groups.values() for s, _ in kept)


@lru_cache(maxsize=100_000)              # the same live sets meet again across plans
def _covers(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> bool:
    """Every live-count vector of ``b`` is matched or exceeded by one of ``a``, so ``a``'s
    activation peak is at least ``b``'s for any non-negative per-chunk activations."""
    return all(any(all(p >= q for p, q in zip(u, v)) for u in a) for v in b)


def fewest_recomputed(model: TransformerSpec, plan: Plan, cap: float) -> Plan | None:
    """``plan`` (full recompute, fitting in ``cap`` bytes) with the fewest layers per chunk
    recomputed that still fit (memory falls as the count grows: a bisection), or None when
    only every layer fits."""
    most = max(len(p) for p in chunk_layers(model, plan))
    lo, hi = 1, most                      # hi: every layer, which fits
    while lo < hi:
        mid = (lo + hi) // 2
        if peak_memory_bytes(model, replace(plan, recompute_layers=mid)) <= cap:
            hi = mid
        else:
            lo = mid + 1
    return replace(plan, recompute_layers=lo) if lo < most else None
