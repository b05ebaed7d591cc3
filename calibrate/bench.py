"""Compute microbenchmarks with torch on the local device: GEMM, fused attention (memory-bound
kernels and the optimizer step live in ``calibrate.bench_mem``). torch is imported lazily.

Each point is timed with warm-up and repeats (``store.time_call``) and written to
``OUT/measurements/<bench>.parquet`` (``store.Store``) with its median, quartiles and
IQR. ``threads`` is part of every point: the default sweep uses torch's default thread
count, a short extra sweep uses 1 thread (what each rank gets with ``--nproc`` = cores).

GEMMs are timed as a training step runs them: the transformer shapes in all three operand
layouts a ``Linear`` layer uses (forward ``x @ W^T`` = NT, input gradient ``g @ W`` = NN,
weight gradient ``g^T @ x`` = TN) and with cold caches (a buffer larger than the last-level
cache is rewritten, untimed, before every call), because inside a step each GEMM's operands
were last touched several ops earlier. On this 2-core VM a training step's GEMMs ran
10-20% slower than the same GEMM repeated hot, and as fast as the cold-cache GEMM.

A shared host: every point records the CPU pressure during its timing (Linux PSI). A point
measured while other load competed (pressure > ``PRESSURE_MAX``) is re-measured after a
pause that doubles each time (``backoff_s``), within ``Plan.busy_retry_s`` per benchmark,
and the quietest attempt is kept; the fits use a low quantile (10th percentile) of its
samples, which is what a quiet host shows. If it stays contaminated beyond
``PRESSURE_SUSPECT`` it is flagged ``suspect`` and ``calibrate.hygiene`` decides whether the
fit can do without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .device import llc_bytes
from .store import Progress, Stats, Store, time_call

SUSPECT_RATIO = 3.0     # more threads should never be this much slower than one thread
RETRIES = 2
PRESSURE_MAX = 0.10     # re-measure a point when others held the CPU > 10% of its window
PRESSURE_SUSPECT = 0.25
BUSY_PAUSE_S = 1.0       # first pause before re-measuring on a busy host; doubles each time
BUSY_PAUSE_MAX_S = 8.0
LAYOUTS = ("NT", "NN", "TN")


@dataclass(frozen=True)
class Plan:
    """Which points to measure and how hard (``budget_s`` caps the timing of one point)."""

    gemm: tuple[tuple, ...]                               # (m, n, k, dtype[, layout])
    gemm_1thread: tuple[tuple, ...]                       # extra sweep at 1 thread
    memory_elems: tuple[int, ...]
    memory_kernels: tuple[str, ...]
    attention: tuple[tuple[int, int, int, int], ...]      # batch, heads, seq, head_dim
    comm_bytes: tuple[int, ...]
    comm_ops: tuple[str, ...]
    allreduce_bytes: tuple[int, ...]                      # denser sweep for all_reduce
    interference: tuple[tuple[int, int], ...]             # (gemm n, all-reduce bytes)
    warmup: int
    repeats: int
    budget_s: float
    optimizer_params: tuple[int, ...] = ()                # AdamW step over this many params
    cold_cache: bool = True                               # flush the LLC before each GEMM
    busy_retry_s: float = 120.0                           # wait-and-re-measure budget per
                                                          # benchmark while the host is busy


def linear_gemms(tokens: int, d_in: int, d_out: int) -> list[tuple[int, int, int, str]]:
    """(m, n, k, layout) of the three GEMMs of one ``Linear(d_in, d_out)`` on ``tokens`` rows:
    forward (NT), input gradient (NN), weight gradient (TN, ``d_out x d_in`` over tokens)."""
    return [(tokens, d_out, d_in, "NT"), (tokens, d_in, d_out, "NN"),
            (d_out, d_in, tokens, "TN")]


def _transformer_gemms(tokens: Sequence[int], hidden: Sequence[int]) -> list[tuple[int, int, int, str]]:
    """QKV, attention-out, MLP up and down projections (4h), all three GEMMs of each."""
    out = []
    for t in tokens:
        for h in hidden:
            for d_in, d_out in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)):
                out += linear_gemms(t, d_in, d_out)
    return out


def default_plan() -> Plan:
    sq = [(s, s, s, "fp32", "NN") for s in (64, 128, 192, 256, 384, 512, 768, 1024)]
    tr = [(m, n, k, "fp32", lay) for m, n, k, lay in
          _transformer_gemms((1024,), (128, 256, 512)) + _transformer_gemms((256,), (256,))
          + linear_gemms(512, 256, 4096)]
    bf = [(s, s, s, "bf16", "NN") for s in (128, 256, 512, 1024)] + \
        [(m, n, k, "bf16", lay) for m, n, k, lay in _transformer_gemms((1024,), (256,))]
    one = [(s, s, s, "fp32", "NN") for s in (64, 128, 256, 512)] + \
        [(m, n, k, "fp32", lay) for m, n, k, lay in
         _transformer_gemms((1024,), (128, 512)) + linear_gemms(512, 256, 4096)]
    return Plan(gemm=tuple(sq + tr + bf), gemm_1thread=tuple(one),
                memory_elems=tuple(2 ** e for e in range(14, 23)),
                memory_kernels=("copy", "layernorm", "gelu", "add", "cross_entropy",
                                "first_touch"),
                attention=((1, 4, 128, 32), (2, 4, 256, 32), (2, 8, 256, 64), (1, 8, 512, 64),
                           (4, 4, 512, 64), (2, 8, 1024, 64), (1, 16, 512, 32)),
                comm_bytes=tuple(2 ** e for e in range(10, 25, 2)),
                comm_ops=("all_gather", "reduce_scatter", "all_to_all", "send_recv"),
                allreduce_bytes=tuple(2 ** e for e in range(10, 25)),
                interference=((256, 2 ** 22), (384, 2 ** 23), (512, 2 ** 24), (512, 2 ** 25)),
                warmup=2, repeats=25, budget_s=0.35,
                optimizer_params=tuple(2 ** e for e in range(16, 26, 2)))


def quick_plan() -> Plan:
    sq = [(s, s, s, "fp32", "NN") for s in (64, 128, 256, 512, 768)]
    tr = [(m, n, k, "fp32", lay) for m, n, k, lay in _transformer_gemms((512,), (256,))]
    return Plan(gemm=tuple(sq + tr),
                gemm_1thread=tuple((s, s, s, "fp32", "NN") for s in (128, 256, 512)),
                memory_elems=tuple(2 ** e for e in range(14, 23, 2)),
                memory_kernels=("copy", "layernorm", "gelu", "cross_entropy"),
                attention=((1, 4, 128, 32), (2, 8, 256, 64), (1, 8, 512, 64)),
                comm_bytes=tuple(2 ** e for e in range(10, 25, 4)),
                comm_ops=("all_gather", "send_recv"),
                allreduce_bytes=tuple(2 ** e for e in range(10, 25, 2)),
                interference=((256, 2 ** 22), (384, 2 ** 23)),
                warmup=1, repeats=10, budget_s=0.12,
                optimizer_params=(2 ** 16, 2 ** 20, 2 ** 23), busy_retry_s=5.0)


def _dtype(name: str):
    """torch dtype of a GEMM dtype name (tf32: fp32 storage, TF32 tensor-core math, which
    ``calibrate.bench_gpu`` switches on around those points)."""
    import torch
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[name]


def _threads(n: int | None):
    """Context: set torch's intra-op threads for the duration (None = leave as is)."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def ctx():
        old = torch.get_num_threads()
        if n:
            torch.set_num_threads(n)
        try:
            yield torch.get_num_threads()
        finally:
            torch.set_num_threads(old)
    return ctx()


# ---- shared-host hygiene -------------------------------------------------------------------
def backoff_s(attempt: int) -> float:
    """Pause before the ``attempt``-th re-measurement (0-based): 1, 2, 4, 8, 8, ... s."""
    return min(BUSY_PAUSE_S * 2 ** attempt, BUSY_PAUSE_MAX_S)


def until_quiet(attempt: Callable[[], tuple[object, str]], wait_s: float,
                label: str = "") -> tuple[object, list[str]]:
    """Run ``attempt`` (a whole timed run returning (result, why it was noisy: '' when
    quiet)), and again after a ``backoff_s`` pause while it was noisy, within ``wait_s``
    seconds of pauses: (the last run's result, each run's noise)."""
    import sys
    attempts: list[str] = []
    waited = 0.0
    while True:
        res, why = attempt()
        attempts.append(why)
        if not why or waited >= wait_s:
            return res, attempts
        pause = backoff_s(len(attempts) - 1)
        print(f"{label}noisy ({why}): re-timing in {pause:g} s", file=sys.stderr)
        time.sleep(pause)
        waited += pause


def checked_rows(mechanism: str, bench, base: dict) -> list[dict]:
    """A framework bench's ``bench_framework`` entry: measure once (``bench.measure``:
    None without the framework), print its table, and return its rows (``bench.rows_of``)
    unless ``bench.problems`` finds the run unfit, which is said on stderr instead."""
    import sys
    m = bench.measure()
    bad = bench.problems(m) if m else []
    if m:
        bench.print_table(m)
    if bad:
        print(f"{mechanism} rows not written: " + "; ".join(bad), file=sys.stderr)
    return bench.rows_of(m, base) if m and not bad else []


class BusyRetry:
    """Time a point; re-measure it while the host was busy, pausing with exponential
    backoff, within a total pause budget (seconds of sleep) shared by one benchmark's
    points."""

    def __init__(self, budget_s: float) -> None:
        self.left_s = budget_s
        self.retried = 0

    def measure(self, timer: Callable[[], Stats]) -> tuple[Stats, bool]:
        """(least contaminated stats, suspect flag)."""
        best, attempt = timer(), 0
        while best.pressure > PRESSURE_MAX and self.left_s > 0:
            pause = min(backoff_s(attempt), self.left_s)
            time.sleep(pause)
            self.left_s -= pause
            st = timer()
            self.retried += 1
            attempt += 1
            best = st if st.pressure < best.pressure else best
        return best, best.pressure > PRESSURE_SUSPECT


_FLUSH: dict = {}


def flush_cache(dev=None) -> None:
    """Rewrite a buffer larger than the device's last-level cache (``dev.flush_bytes``:
    3x a CPU's L3 up to 256 MiB, 4x a GPU's L2 from 256 MiB; default this CPU): evicts the
    operands of the next timed call."""
    import torch
    name = dev.name if dev is not None else "cpu"
    if name not in _FLUSH:
        n = (dev.flush_bytes if dev is not None else min(3 * llc_bytes(), 256 * 1024 ** 2)) // 4
        _FLUSH[name] = torch.zeros(n, device=name)
    _FLUSH[name].add_(1.0)


# ---- GEMM ------------------------------------------------------------------------------------
def _gemm_point(p: tuple) -> tuple[int, int, int, str, str]:
    m, n, k, dt = p[:4]
    return int(m), int(n), int(k), dt, (p[4] if len(p) > 4 else "NN")


def _mm_operands(m: int, n: int, k: int, dt: str, layout: str, gen=None, device=None):
    """Operands stored as a training step stores them: W as (out, in), x as (tokens, in),
    on ``device`` (default the CPU). fp8 runs ``torch._scaled_mm`` (e4m3 operands, unit
    scales, bf16 output), which takes only the NT layout (row-major x, column-major W^T)."""
    import torch
    dtype = _dtype(dt)
    mk = (k, m) if layout == "TN" else (m, k)
    kn = (n, k) if layout == "NT" else (k, n)
    if device is None or torch.device(device).type == "cpu":
        a = torch.randn(*mk, generator=gen).to(dtype)
        b = torch.randn(*kn, generator=gen).to(dtype)
    else:
        a = torch.randn(*mk, device=device, dtype=torch.bfloat16).to(dtype)
        b = torch.randn(*kn, device=device, dtype=torch.bfloat16).to(dtype)
    a = a.t() if layout == "TN" else a
    b = b.t() if layout == "NT" else b
    if dt == "fp8":
        if layout != "NT":
            raise ValueError("fp8 GEMMs (torch._scaled_mm) take the NT layout only")
        one = torch.ones((), device=a.device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    return lambda: torch.mm(a, b)


def _gemm_key(m, n, k, dt, layout, cold, threads) -> str:
    if layout == "NN" and not cold:
        return f"{m}x{n}x{k}:{dt}:t{threads}"          # the original (hot, NN) points
    return f"{m}x{n}x{k}:{dt}:{layout}{':cold' if cold else ''}:t{threads}"


def bench_gemm(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """``torch.mm`` over (m, n, k, dtype, layout) at default threads, and fp32 at 1 thread."""
    import torch
    store = Store(out, "gemm", env)
    points = [(p, None) for p in plan.gemm] + \
        [(p, 1) for p in plan.gemm_1thread if 1 in thread_counts()]
    prog = Progress("gemm", len(points), quiet)
    gen = torch.Generator().manual_seed(0)
    busy = BusyRetry(plan.busy_retry_s)
    setup = flush_cache if plan.cold_cache else None
    budget = plan.budget_s * (2.0 if plan.cold_cache else 1.0)
    for p, thr in points:
        m, n, k, dt, lay = _gemm_point(p)
        with _threads(thr) as used:
            key = _gemm_key(m, n, k, dt, lay, plan.cold_cache, used)
            if store.has(key):
                prog.step(key, None)
                continue
            fn = _mm_operands(m, n, k, dt, lay, gen)
            st, bad = busy.measure(lambda: time_call(fn, plan.warmup, plan.repeats, budget,
                                                     setup=setup))
            store.add(key, {"m": m, "n": n, "k": k, "dtype": dt, "threads": used,
                            "layout": lay, "cache": "cold" if plan.cold_cache else "hot"},
                      st, suspect=bad)
            prog.step(key, st)
    recheck_threads(store, plan, _mm_fn, quiet)
    return store.path


def _mm_fn(r):
    return _mm_operands(int(r["m"]), int(r["n"]), int(r["k"]), r["dtype"],
                        r.get("layout") or "NN")


def thread_counts() -> tuple[int | None, ...]:
    """Default threads (None) and, on a multi-core host, 1 thread (one rank per core)."""
    import torch
    return (None, 1) if torch.get_num_threads() > 1 else (None,)


# ---- attention -------------------------------------------------------------------------------
def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """Executed forward FLOPs with the simulator's convention
    (``simulator.workload.ops.executed_attention_flops``): ``4 b h s^2 d``, of which a causal
    call executes half."""
    from simulator.workload.ops import executed_attention_flops
    full = 4.0 * batch * heads * seq * seq * head_dim
    return executed_attention_flops(full, seq, causal)


def bench_attention(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """``scaled_dot_product_attention`` (causal, fp32): forward, and forward+backward."""
    store = Store(out, "attention", env)
    points = [(p, pas, t) for t in thread_counts() for p in plan.attention
              for pas in ("fwd", "fwd_bwd")]
    prog = Progress("attention", len(points), quiet)
    busy = BusyRetry(plan.busy_retry_s)
    for (b, h, s, d), pas, thr in points:
        with _threads(thr) as used:
            key = f"{b}x{h}x{s}x{d}:{pas}{':cold' if plan.cold_cache else ''}:t{used}"
            if store.has(key):
                prog.step(key, None)
                continue
            fn = _attn_fn(b, h, s, d, pas)
            setup = flush_cache if plan.cold_cache else None
            st, bad = busy.measure(lambda: time_call(fn, plan.warmup, plan.repeats,
                                                     plan.budget_s, setup=setup))
            store.add(key, {"batch": b, "heads": h, "seq": s, "head_dim": d, "pass": pas,
                            "flops_fwd": attention_flops(b, h, s, d), "threads": used,
                            "cache": "cold" if plan.cold_cache else "hot"}, st, suspect=bad)
            prog.step(key, st)
    recheck_threads(store, plan, lambda r: _attn_fn(int(r["batch"]), int(r["heads"]),
                                                    int(r["seq"]), int(r["head_dim"]),
                                                    r["pass"]), quiet)
    return store.path


def _attn_fn(b: int, h: int, s: int, d: int, pas: str, device=None, dtype: str = "fp32",
             backend=None):
    """Causal SDPA on ``device`` in ``dtype``; ``backend`` (an ``SDPBackend``) pins the
    kernel (``calibrate.bench_gpu``: flash, cuDNN), None lets torch choose."""
    import contextlib

    import torch
    import torch.nn.functional as F
    kw = {} if device is None else {"device": device, "dtype": _dtype(dtype)}
    q, k, v = (torch.randn(b, h, s, d, requires_grad=(pas == "fwd_bwd"), **kw)
               for _ in range(3))
    grad = torch.ones(b, h, s, d, **kw) if pas == "fwd_bwd" else None

    def pinned():
        if backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel
        return sdpa_kernel(backend)

    def run():
        with pinned():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if pas == "fwd_bwd" and grad is None:
                o.sum().backward()
            elif pas == "fwd_bwd":      # the gradients alone: no accumulation into q.grad
                torch.autograd.grad(o, (q, k, v), grad)
    return run


# ---- re-measurement of multi-thread stalls ---------------------------------------------------
def recheck_threads(store: Store, plan: Plan, make_fn, quiet: bool = False) -> int:
    """Re-measure default-thread points that ran > SUSPECT_RATIO x slower than the same
    point on 1 thread (seen here as ~8 ms stalls per call when OpenMP workers spin on a
    throttled VM); points still anomalous after RETRIES are flagged ``suspect`` and the
    fitters skip them. Returns the number of points flagged."""
    one = {r["point"].rsplit(":t", 1)[0]: r for r in store.rows if r["threads"] == 1}
    flagged = 0
    for r in [r for r in store.rows if r["threads"] != 1]:
        base = one.get(r["point"].rsplit(":t", 1)[0])
        if base is None or r["median_s"] <= SUSPECT_RATIO * base["median_s"]:
            continue
        params = {k: v for k, v in r.items() if k not in STAT_KEYS}
        st: Stats | None = None
        setup = flush_cache if r.get("cache") == "cold" else None
        with _threads(int(r["threads"])):
            for _ in range(RETRIES):
                st = time_call(make_fn(r), plan.warmup, plan.repeats, plan.budget_s, setup=setup)
                if st.median_s <= SUSPECT_RATIO * base["median_s"]:
                    break
        bad = st.median_s > SUSPECT_RATIO * base["median_s"] or st.pressure > PRESSURE_SUSPECT
        flagged += bad
        store.add(r["point"], params, st, suspect=bad)
        if not quiet:
            Progress(store.path.stem, 1).step(f"re-measured {r['point']}"
                                              f"{' (still anomalous: suspect)' if bad else ''}", st)
    return flagged


STAT_KEYS = {"point", "median_s", "p25_s", "p75_s", "iqr_s", "mean_s", "p10_s", "n_samples",
             "suspect", "cpu_pressure", "device", "torch_version", "gloo", "date",
             "git_revision", "python", "cpu_pressure_avg60_pct"}
