"""What a GPU calibration measures, how long each point should take, and which points fit
a time budget (``complexity calibrate --device cuda --budget-s S [--dry-run]``).

The sweep (``candidate_points``) is what a training step runs on a GPU: bf16/fp16/tf32/fp8
GEMMs over square and transformer shapes in the three layouts of a ``Linear`` (forward NT,
input-gradient NN, weight-gradient TN; fp8 through ``torch._scaled_mm``, NT only), HBM
bandwidth (copies of 256 KiB..2 GiB buffers) and the memory-bound kernels, causal SDPA
flash attention in bf16 by sequence length and head dimension (forward, forward+backward),
NCCL collectives over every GPU of the node (1 KiB..1 GiB) and the slowdown of GEMMs while
an all-reduce runs (the last two only with at least 2 GPUs).

Estimates are rooflines from the simulator's own cost formulas with the shipped reference
profile of the GPU (``simulator.cost.kernels``; the h100-sxm reference stands in for a GPU
without one), times the calls a point makes (warm-up + repeats, at least ``MIN_SAMPLES``,
bounded by ``POINT_BUDGET_S``), plus fixed costs: CUDA start-up, clock settling, one
process spawn + NCCL initialisation per collective run.

Selection, "the most informative points that fit": every point has a tier. Tier 0 holds the
points that identify each fitted coefficient (GEMM efficiency per dtype and the k-ramp,
HBM bandwidth and launch cost, attention efficiency fwd/bwd, the two regimes of the
collective model); tier 1 densifies those sweeps (more shapes and layouts, head_dim 64,
other collectives, NVLS vs ring, interference), which is what the fits' held-out errors
need; tier 2 adds what only sharpens a secondary coefficient (per-kernel-family memory
efficiencies, fp16 and cuDNN attention, all-to-all). Points are taken tier by tier, in
each the compute points round-robin across benchmark groups (each group listed in spread
order: the ends of its range first, then bisections) before the collective ones, whose
first point also pays the process spawn, while the estimated total stays within
``SAFETY`` x the budget: tier 0 as a prefix (a larger budget never loses a tier-0 point),
later tiers greedily. Points already stored count as free (a re-run resumes and goes
further).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, Iterable, Mapping, Sequence

from simulator.hardware.profile import Profile
from simulator.hardware.specs import GPUSpec, NodeSpec

from .device import GPU_FLUSH_MIN_BYTES

BENCH_ORDER = ("gemm", "memory", "attention", "collectives", "interference")
WARMUP, REPEATS, MIN_SAMPLES = 3, 20, 5
POINT_BUDGET_S = 0.25          # timing window of one compute point
# Overheads of the estimate, assumed (not yet measured on a GPU host: compare the plan's
# estimate with "calibration done in X s" of a real run and adjust):
POINT_OVERHEAD_S = 0.05        # operands, cuBLAS heuristics, rewriting the Parquet file
CALL_OVERHEAD_S = 20e-6        # Python and launch per timed call
CUDA_INIT_S = 8.0              # CUDA context, cuBLAS / cuDNN handles, first kernels
SPAWN_S, SPAWN_PER_RANK_S = 20.0, 1.5    # one mp.spawn of the ranks + NCCL init
SETTLE_S = 15.0                # sustained GEMM before measuring (at most 5% of a budget)
NCCL_WARMUP, NCCL_SAMPLES, NCCL_INNER_S = 5, 5, 0.02
SAFETY = 0.9                   # plan to 90% of the budget: estimates are rooflines
KIB, MIB, GIB = 1024, 1024 ** 2, 1024 ** 3


@dataclass(frozen=True)
class Point:
    """One measurement: its benchmark, stored key, parameters, estimate and tier."""

    bench: str
    key: str
    params: tuple[tuple[str, Any], ...]
    est_s: float
    tier: int
    group: str                    # display group, e.g. "gemm bf16", "nccl all_reduce"

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass(frozen=True)
class Target:
    """The node a plan is for: its GPU (datasheet), how many, its node type and the
    reference profile the estimates use."""

    gpu: GPUSpec
    gpus: int
    node: NodeSpec
    ref: Profile

    @property
    def collectives(self) -> bool:
        return self.gpus >= 2


def target_for(gpu_key: str, gpus: int) -> Target:
    """A target from hardware_db: datasheet, default node, reference profile (h100-sxm's
    where the GPU has none; only the estimates use it)."""
    import hardware_db
    from simulator.errors import CalibrationMissingError, InvalidInputError
    if not isinstance(gpus, int) or gpus < 1:
        raise InvalidInputError("gpus", gpus, "a GPU count >= 1")
    gpu = hardware_db.load_gpu(gpu_key)
    try:
        node = hardware_db.default_node_for_gpu(gpu.key)
    except InvalidInputError:
        node = hardware_db.default_node_for_gpu("h100-sxm")
    try:
        ref = hardware_db.load_profile(gpu.key)
    except CalibrationMissingError:
        ref = hardware_db.load_profile("h100-sxm")
    return Target(gpu, gpus, node, ref)


# ---- estimates ---------------------------------------------------------------------------
def _flush_s(t: Target) -> float:
    flush = max(GPU_FLUSH_MIN_BYTES, 4 * t.gpu.l2_bytes)
    return 2.0 * flush / (t.gpu.mem_bw_gbytes_per_s * 1e9 * 0.8)


def point_s(call_s: float, flush_s: float) -> float:
    """Wall time of one compute point: warm-up and timed calls (at least MIN_SAMPLES, up to
    REPEATS within POINT_BUDGET_S), each with its cache flush, plus the fixed overhead."""
    per = call_s + flush_s + CALL_OVERHEAD_S
    n = max(MIN_SAMPLES, min(REPEATS, math.ceil(POINT_BUDGET_S / per)))
    return POINT_OVERHEAD_S + (WARMUP + n) * per


def gemm_s(t: Target, m: int, n: int, k: int, dtype: str) -> float:
    from simulator.cost.kernels import gemm_time_s
    return gemm_time_s(m, n, k, dtype, t.gpu, t.ref)


def attention_s(t: Target, b: int, h: int, s: int, d: int, pas: str) -> float:
    from simulator.cost.kernels import attention_time_s

    from .bench import attention_flops
    fl = attention_flops(b, h, s, d)
    fwd = attention_time_s(fl, "bf16", False, t.gpu, t.ref)
    return fwd + (attention_time_s(2.5 * fl, "bf16", True, t.gpu, t.ref) if pas == "fwd_bwd"
                  else 0.0)


def memory_s(t: Target, bytes_moved: float) -> float:
    from simulator.cost.kernels import memory_time_s
    return memory_time_s(bytes_moved, t.gpu, t.ref)


def collective_s(t: Target, op: str, size: float, ranks: int) -> float:
    """Ring roofline on the node's scale-up link at 70% of its bandwidth, 20 us floor."""
    from simulator.network.collectives import Collective, ring_steps_and_traffic
    steps, wire = ring_steps_and_traffic(Collective(op), ranks, size)
    return 20e-6 + steps * 1e-6 + wire / (t.node.scale_up.bandwidth_gbytes_per_s * 1e9 * 0.7)


def nccl_point_s(call_s: float) -> float:
    """Warm-up calls, then ``NCCL_SAMPLES`` samples of back-to-back calls (~20 ms each)."""
    inner = max(1, min(50, math.ceil(NCCL_INNER_S / call_s)))
    return POINT_OVERHEAD_S + (NCCL_WARMUP + NCCL_SAMPLES * inner) * (call_s + CALL_OVERHEAD_S)


# ---- the sweep ---------------------------------------------------------------------------
def spread(seq: Sequence[Any]) -> list[Any]:
    """Ends first, then bisections: the order that covers a range soonest."""
    seq = list(seq)
    if len(seq) <= 2:
        return seq
    out, idx = [seq[0], seq[-1]], [(0, len(seq) - 1)]
    while idx:
        nxt = []
        for lo, hi in idx:
            mid = (lo + hi) // 2
            if mid not in (lo, hi):
                out.append(seq[mid])
                nxt += [(lo, mid), (mid, hi)]
        idx = nxt
    return out


def linear_shapes(tokens: int, hidden: int) -> list[tuple[int, int, int, str]]:
    """(m, n, k, layout) of QKV, attention-out, MLP up and down (4h) in their three
    layouts (``calibrate.bench.linear_gemms``)."""
    from .bench import linear_gemms
    out = []
    for d_in, d_out in ((hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden),
                        (4 * hidden, hidden)):
        out += linear_gemms(tokens, d_in, d_out)
    return out


def _gemm(t: Target, m: int, n: int, k: int, dt: str, lay: str, tier: int) -> Point:
    key = f"{m}x{n}x{k}:{dt}:{lay}:cold"
    return Point("gemm", key, (("m", m), ("n", n), ("k", k), ("dtype", dt), ("layout", lay)),
                 point_s(gemm_s(t, m, n, k, dt), _flush_s(t)), tier, f"gemm {dt}")


def gemm_points(t: Target) -> list[Point]:
    sq = lambda sizes, dt, lay, tier: [_gemm(t, s, s, s, dt, lay, tier) for s in spread(sizes)]
    llm = lambda tok, h, dt, lays, tier: [_gemm(t, m, n, k, dt, lay, tier) for m, n, k, lay
                                          in linear_shapes(tok, h) if lay in lays]
    return [
        *sq((256, 1024, 4096, 8192), "bf16", "NN", 0), *llm(8192, 4096, "bf16", ("NT",), 0),
        *sq((4096, 8192), "fp8", "NT", 0), *llm(8192, 4096, "fp8", ("NT",), 0),
        *sq((4096, 8192), "tf32", "NN", 0), *sq((4096, 8192), "fp16", "NN", 0),
        *llm(8192, 4096, "bf16", ("NN", "TN"), 1), *sq((512, 2048, 16384), "bf16", "NN", 1),
        *llm(16384, 8192, "bf16", ("NT",), 1), *sq((512, 1024, 2048), "fp8", "NT", 1),
        *llm(16384, 8192, "fp8", ("NT",), 1), *llm(8192, 4096, "fp16", ("NT",), 1),
        *sq((1024, 2048), "tf32", "NN", 1),
        *llm(4096, 2048, "bf16", ("NT", "NN", "TN"), 2), *llm(4096, 2048, "fp8", ("NT",), 2),
    ]


MEM_COLS = 4096                  # row length of the GPU norm / elementwise points


def _mem(t: Target, kernel: str, elems: int, pas: str, dt: str, tier: int) -> Point:
    from .bench_mem import accounting
    acc = accounting(kernel, elems, pas)
    moved = acc["bytes_moved"] * (0.5 if dt == "bf16" else 1.0)
    group = "hbm copy" if kernel == "copy" else f"memory {kernel}"
    return Point("memory", f"{kernel}:{elems}:{dt}:{pas}",
                 (("kernel", kernel), ("elems", elems), ("pass", pas), ("dtype", dt)),
                 point_s(memory_s(t, moved), _flush_s(t)), tier, group)


def memory_points(t: Target) -> list[Point]:
    """Copies of fp32 buffers 256 KiB .. 2 GiB (tier 0 every 4x), then bf16 LayerNorm,
    GELU and residual add forward and backward, 16 MiB .. 1 GiB of elements moved."""
    sizes = [2 ** e for e in range(16, 30)]            # fp32 elements: 256 KiB .. 2 GiB
    tier0 = sizes[::4] + [sizes[-1]]
    pts = [_mem(t, "copy", e, "fwd", "fp32", 0 if e in tier0 else 1) for e in spread(sizes)]
    for kern in ("layernorm", "gelu", "add"):
        for e in spread([2 ** x for x in range(22, 30, 2)]):
            pts += [_mem(t, kern, e, pas, "bf16", 2) for pas in ("fwd", "bwd")]
    return pts


ATTN_TOKENS, ATTN_HIDDEN = 16384, 2048     # batch x seq and heads x head_dim of each point


def attention_shape(seq: int, head_dim: int) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head_dim) with ``ATTN_TOKENS`` tokens and ``ATTN_HIDDEN`` width."""
    return max(1, ATTN_TOKENS // seq), ATTN_HIDDEN // head_dim, seq, head_dim


def _attn(t: Target, seq: int, d: int, pas: str, dt: str, backend: str, tier: int) -> Point:
    b, h, s, d = attention_shape(seq, d)
    group = f"{'cudnn' if backend == 'cudnn' else 'flash'} attention {dt}"
    return Point("attention", f"{b}x{h}x{s}x{d}:{dt}:{backend}:{pas}",
                 (("batch", b), ("heads", h), ("seq", s), ("head_dim", d), ("pass", pas),
                  ("dtype", dt), ("backend", backend)),
                 point_s(attention_s(t, b, h, s, d, pas), _flush_s(t)), tier, group)


def attention_points(t: Target) -> list[Point]:
    """bf16 flash, head_dim 128: sequence 512..16k (tier 0 at 1k, 4k, 16k); head_dim 64
    (tier 1); fp16 and the cuDNN kernel (the simulator's "flash3") at 1k, 4k, 16k (tier 2)."""
    full, three = (512, 1024, 2048, 4096, 8192, 16384), (1024, 4096, 16384)
    pts = [_attn(t, s, 128, pas, "bf16", "flash", 0 if s in three else 1)
           for s in spread(full) for pas in ("fwd", "fwd_bwd")]
    pts += [_attn(t, s, 64, pas, "bf16", "flash", 1) for s in spread(full)
            for pas in ("fwd", "fwd_bwd")]
    for dt, backend in (("fp16", "flash"), ("bf16", "cudnn")):
        pts += [_attn(t, s, 128, pas, dt, backend, 2) for s in spread(three)
                for pas in ("fwd", "fwd_bwd")]
    return pts


def _coll(t: Target, op: str, size: int, algo: str, tier: int) -> Point:
    return Point("collectives", f"{op}:{size}:n{t.gpus}:{algo}",
                 (("op", op), ("size_bytes", size), ("n_ranks", t.gpus), ("algo", algo)),
                 nccl_point_s(collective_s(t, op, size, t.gpus)), tier, f"nccl {op}"
                 + ("" if algo == "default" else f" ({algo})"))


def collective_points(t: Target) -> list[Point]:
    """NCCL over all GPUs: all-reduce 1 KiB..1 GiB (tier 0 every 4x, the rest tier 1),
    all-gather / reduce-scatter every 4x, ring-only all-reduce (NVLS off) where the node
    reduces in the switch (tier 1), all-to-all (tier 2)."""
    if not t.collectives:
        return []
    sizes = [2 ** e for e in range(10, 31)]
    every4 = sizes[::2]
    pts = [_coll(t, "all_reduce", s, "default", 0 if s in every4[::2] + [sizes[-1]] else 1)
           for s in spread(sizes)]
    for op in ("all_gather", "reduce_scatter"):
        pts += [_coll(t, op, s, "default", 1) for s in spread(every4)]
    if t.node.in_switch_reduction:
        pts += [_coll(t, "all_reduce", s, "ring", 1) for s in spread(every4)]
    pts += [_coll(t, "all_to_all", s, "default", 2) for s in spread(every4[::2])]
    return pts


def interference_points(t: Target) -> list[Point]:
    """A bf16 GEMM loop alone and with an all-reduce in flight (3 runs of each)."""
    if not t.collectives:
        return []
    pts = []
    for n, size in ((8192, 256 * MIB), (4096, GIB)):
        comm = collective_s(t, "all_reduce", size, t.gpus)
        est = POINT_OVERHEAD_S + 3 * (NCCL_WARMUP + NCCL_SAMPLES) * comm * 3
        pts.append(Point("interference", f"span:mm{n}:ar{size}:n{t.gpus}",
                         (("gemm_n", n), ("allreduce_bytes", size), ("n_ranks", t.gpus)),
                         est, 1, "gemm+nccl interference"))
    return pts


def candidate_points(t: Target) -> list[Point]:
    return (gemm_points(t) + memory_points(t) + attention_points(t) + collective_points(t)
            + interference_points(t))


# ---- selection ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuPlan:
    """The points to measure (in benchmark order), what the budget left out, the fixed
    costs and the estimated total."""

    target: Target
    budget_s: float | None
    points: tuple[Point, ...]
    left_out: tuple[Point, ...]
    fixed_s: Mapping[str, float] = field(default_factory=dict)
    done: frozenset[str] = frozenset()

    @property
    def settle_s(self) -> float:
        return self.fixed_s.get("clock settle", 0.0)

    @property
    def total_est_s(self) -> float:
        return sum(self.fixed_s.values()) + sum(p.est_s for p in self.points
                                                if p.key not in self.done)

    def by_bench(self, bench: str) -> list[Point]:
        return [p for p in self.points if p.bench == bench]


def settle_s_for(budget_s: float | None) -> float:
    return SETTLE_S if budget_s is None else min(SETTLE_S, 0.05 * budget_s)


def spawn_s(t: Target) -> float:
    return SPAWN_S + SPAWN_PER_RANK_S * t.gpus


def _interleave(points: Iterable[Point]) -> list[Point]:
    """Round-robin across groups, each group in its listed (spread) order."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(p)
    return [p for row in zip_longest(*groups.values()) for p in row if p is not None]


def _runs(points: Iterable[Point], done: frozenset[str] = frozenset()) -> set[str]:
    """Process spawns the collective points not yet measured need: the default NCCL run,
    the ring run."""
    return {p.p.get("algo", "default") for p in points
            if p.bench in ("collectives", "interference") and p.key not in done}


COMM = ("collectives", "interference")


def selection_order(points: Sequence[Point]) -> list[list[Point]]:
    """Tier by tier; in each, the compute points (round-robin across groups), then the
    collective ones (they need a process spawn, worth it once the compute is covered)."""
    out = []
    for tier in sorted({p.tier for p in points}):
        sel = [p for p in points if p.tier == tier]
        out.append(_interleave(p for p in sel if p.bench not in COMM)
                   + _interleave(p for p in sel if p.bench in COMM))
    return out


def make_plan(t: Target, budget_s: float | None = None,
              done: Iterable[str] = ()) -> GpuPlan:
    """Every candidate point (no budget), or the most informative that fit ``budget_s``:
    tier 0 as a prefix of ``selection_order`` (so a larger budget never loses a tier-0
    point), then the later tiers greedily (each point that still fits)."""
    done = frozenset(done)
    fixed = {"cuda start-up": CUDA_INIT_S, "clock settle": settle_s_for(budget_s)}
    cands = candidate_points(t)
    if budget_s is None:
        chosen, left = cands, []
    else:
        chosen, left, total = [], [], sum(fixed.values())
        for i, tier in enumerate(selection_order(cands)):
            blocked = False
            for p in tier:
                cost = 0.0 if p.key in done else p.est_s
                cost += spawn_s(t) * len(_runs([p], done) - _runs(chosen, done))
                blocked = blocked or (i == 0 and total + cost > SAFETY * budget_s)
                if not blocked and total + cost <= SAFETY * budget_s:
                    chosen.append(p)
                    total += cost
                else:
                    left.append(p)
    for run in sorted(_runs(chosen, done)):
        fixed[f"nccl spawn ({run})"] = spawn_s(t)
    rank = {b: i for i, b in enumerate(BENCH_ORDER)}
    chosen = sorted(chosen, key=lambda p: rank[p.bench])       # stable: spread order kept
    return GpuPlan(t, budget_s, tuple(chosen), tuple(left), fixed, done)


WHAT = {
    "gemm": "torch.mm (fp8: torch._scaled_mm e4m3, NT); square and transformer shapes, NT/NN/TN",
    "hbm copy": "x.clone() of fp32 buffers: HBM bandwidth and launch cost",
    "memory": "bf16 kernels (rows of 4096), forward and backward: per-family efficiency",
    "attention": "SDPA causal, seq 512..16384, head_dim 64/128, fwd and fwd+bwd",
    "nccl": "one rank per GPU (mp.spawn, NCCL), 1 KiB..1 GiB, bus bandwidth as nccl-tests",
    "gemm+nccl interference": "bf16 GEMM loop alone vs with an async all-reduce in flight",
}


def _what(group: str) -> str:
    for k in sorted(WHAT, key=len, reverse=True):
        if k in group:
            return WHAT[k]
    return ""


def plan_lines(plan: GpuPlan) -> list[str]:
    """The ``--dry-run`` text: one line per benchmark group, fixed costs, total."""
    t = plan.target
    lines = [f"calibration plan for {t.gpus} x {t.gpu.key} ({t.gpu.name}: bf16 "
             f"{t.gpu.peak('bf16'):g} TFLOP/s, HBM {t.gpu.mem_bw_gbytes_per_s:g} GB/s, "
             f"{t.gpu.sm_count} SMs; node {t.node.key}, scale-up {t.node.scale_up.key}), "
             + (f"budget {plan.budget_s:g} s" if plan.budget_s is not None else "no budget"),
             f"{'benchmark':34s} {'points':>6s} {'est. s':>7s}  what"]
    for name, s in plan.fixed_s.items():
        lines.append(f"{name:34s} {'-':>6s} {s:7.1f}")
    groups: dict[str, list[Point]] = {}
    for p in plan.points:
        groups.setdefault(p.group, []).append(p)
    for g, pts in groups.items():
        est = sum(p.est_s for p in pts if p.key not in plan.done)
        lines.append(f"{g:34s} {len(pts):6d} {est:7.1f}  {_what(g)}")
    if not t.collectives:
        lines.append("nccl collectives, interference: skipped (1 GPU: nothing to communicate "
                     "with); the profile's NVLink/NIC coefficients are then transferred")
    tail = f"total {len(plan.points)} points, estimated {plan.total_est_s:.0f} s"
    if plan.budget_s is not None:
        tail += f" of the {plan.budget_s:g} s budget"
    if plan.left_out:
        tiers = sorted({p.tier for p in plan.left_out})
        tail += (f"; left out {len(plan.left_out)} points (tier {','.join(map(str, tiers))}: "
                 f"{', '.join(sorted({p.group for p in plan.left_out}))})")
    if plan.done:
        tail += f"; {len(plan.done & {p.key for p in plan.points})} already measured (free)"
    return lines + [tail]
