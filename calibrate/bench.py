"""Compute microbenchmarks with torch on the local device: GEMM, memory-bound kernels,
fused attention. torch is imported lazily inside the functions.

Each point is timed with warm-up and repeats (``store.time_call``) and written to
``OUT/measurements/<bench>.parquet`` (``store.Store``) with its median, quartiles and
IQR. ``threads`` is part of every point: the default sweep uses torch's default thread
count, a short extra sweep uses 1 thread (what each rank gets with ``--nproc`` = cores).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .store import Progress, Stats, Store, time_call

SUSPECT_RATIO = 3.0     # more threads should never be this much slower than one thread
RETRIES = 2


@dataclass(frozen=True)
class Plan:
    """Which points to measure and how hard (``budget_s`` caps the timing of one point)."""

    gemm: tuple[tuple[int, int, int, str], ...]
    gemm_1thread: tuple[tuple[int, int, int, str], ...]   # extra sweep at 1 thread
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


def _transformer_shapes(tokens: Sequence[int], hidden: Sequence[int]) -> list[tuple[int, int, int]]:
    """(m, n, k) of QKV, attention-out, MLP up/down and their weight-gradient GEMMs."""
    out = []
    for t in tokens:
        for h in hidden:
            out += [(t, 3 * h, h), (t, h, h), (t, 4 * h, h), (t, h, 4 * h), (h, 4 * h, t)]
    return out


def default_plan() -> Plan:
    sq = [(s, s, s) for s in (64, 128, 192, 256, 384, 512, 768, 1024)]
    tr = _transformer_shapes((256, 1024), (128, 256, 512))
    gemm = tuple((m, n, k, "fp32") for m, n, k in sq + tr) + \
        tuple((m, n, k, "bf16") for m, n, k in [(s, s, s) for s in (128, 256, 512, 1024)]
              + _transformer_shapes((1024,), (256, 512)))
    one = tuple((s, s, s, "fp32") for s in (64, 128, 256, 512, 768)) + \
        tuple((m, n, k, "fp32") for m, n, k in _transformer_shapes((512,), (256,)))
    return Plan(gemm=gemm, gemm_1thread=one,
                memory_elems=tuple(2 ** e for e in range(12, 23)),
                memory_kernels=("copy", "add", "layernorm", "softmax", "gelu"),
                attention=((1, 4, 128, 32), (2, 4, 256, 32), (2, 8, 256, 64), (1, 8, 512, 64),
                           (4, 4, 512, 64), (2, 8, 1024, 64), (1, 16, 512, 32)),
                comm_bytes=tuple(2 ** e for e in range(10, 25, 2)),
                comm_ops=("all_gather", "reduce_scatter", "all_to_all", "send_recv"),
                allreduce_bytes=tuple(2 ** e for e in range(10, 25)),
                interference=((256, 2 ** 22), (384, 2 ** 23), (512, 2 ** 24), (320, 2 ** 23)),
                warmup=2, repeats=25, budget_s=0.35)


def quick_plan() -> Plan:
    sq = [(s, s, s) for s in (64, 128, 256, 512, 768)]
    tr = _transformer_shapes((512,), (256,))
    return Plan(gemm=tuple((m, n, k, "fp32") for m, n, k in sq + tr),
                gemm_1thread=tuple((s, s, s, "fp32") for s in (128, 256, 512)),
                memory_elems=tuple(2 ** e for e in range(12, 23, 2)),
                memory_kernels=("copy", "add", "layernorm", "softmax"),
                attention=((1, 4, 128, 32), (2, 8, 256, 64), (1, 8, 512, 64)),
                comm_bytes=tuple(2 ** e for e in range(10, 25, 4)),
                comm_ops=("all_gather", "send_recv"),
                allreduce_bytes=tuple(2 ** e for e in range(10, 25, 2)),
                interference=((256, 2 ** 22), (384, 2 ** 23)),
                warmup=1, repeats=10, budget_s=0.12)


def _dtype(name: str):
    import torch
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


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


def bench_gemm(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """``torch.mm`` over (m, n, k, dtype) at default threads, and fp32 at 1 thread."""
    import torch
    store = Store(out, "gemm", env)
    points = [(p, None) for p in plan.gemm] + \
        [(p, 1) for p in plan.gemm_1thread if 1 in thread_counts()]
    prog = Progress("gemm", len(points), quiet)
    gen = torch.Generator().manual_seed(0)
    for (m, n, k, dt), thr in points:
        with _threads(thr) as used:
            key = f"{m}x{n}x{k}:{dt}:t{used}"
            if store.has(key):
                prog.step(key, None)
                continue
            a = torch.randn(m, k, generator=gen).to(_dtype(dt))
            b = torch.randn(k, n, generator=gen).to(_dtype(dt))
            st = time_call(lambda: torch.mm(a, b), plan.warmup, plan.repeats, plan.budget_s)
            store.add(key, {"m": m, "n": n, "k": k, "dtype": dt, "threads": used}, st)
            prog.step(key, st)
    recheck_threads(store, plan, _mm_fn, quiet)
    return store.path


def _mm_fn(r):
    import torch
    a = torch.randn(int(r["m"]), int(r["k"])).to(_dtype(r["dtype"]))
    b = torch.randn(int(r["k"]), int(r["n"])).to(_dtype(r["dtype"]))
    return lambda: torch.mm(a, b)


# bytes moved per element (fp32): reads + writes
MEM_KERNELS = {"copy": 8, "add": 12, "layernorm": 8, "softmax": 8, "gelu": 8}


def _mem_fn(kernel: str, elems: int):
    import torch
    import torch.nn.functional as F
    cols = 256 if elems >= 256 else elems
    x = torch.randn(elems // cols, cols)
    y = torch.randn(elems // cols, cols)
    if kernel == "copy":
        return lambda: x.clone()
    if kernel == "add":
        return lambda: torch.add(x, y)
    if kernel == "layernorm":
        return lambda: F.layer_norm(x, (cols,))
    if kernel == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    return lambda: F.gelu(x)


def bench_memory(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """Bandwidth-bound kernels over sizes (fp32, rows of 256 like a hidden dimension)."""
    store = Store(out, "memory", env)
    points = [(k, e, t) for t in thread_counts() for k in plan.memory_kernels
              for e in plan.memory_elems]
    prog = Progress("memory", len(points), quiet)
    for kernel, elems, thr in points:
        with _threads(thr) as used:
            key = f"{kernel}:{elems}:t{used}"
            if store.has(key):
                prog.step(key, None)
                continue
            st = time_call(_mem_fn(kernel, elems), plan.warmup, plan.repeats, plan.budget_s)
            store.add(key, {"kernel": kernel, "elems": elems, "bytes_moved":
                            float(MEM_KERNELS[kernel] * elems), "threads": used}, st)
            prog.step(key, st)
    recheck_threads(store, plan, lambda r: _mem_fn(r["kernel"], int(r["elems"])), quiet)
    return store.path


def thread_counts() -> tuple[int | None, ...]:
    """Default threads (None) and, on a multi-core host, 1 thread (one rank per core)."""
    import torch
    return (None, 1) if torch.get_num_threads() > 1 else (None,)


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """Executed forward FLOPs with the simulator's convention (simulator/workload/ops.py):
    ``4 b h s^2 d``, causal kernels skip the masked half (block size 128)."""
    full = 4.0 * batch * heads * seq * seq * head_dim
    return full * (0.5 + 0.5 / max(1, seq // 128)) if causal else full


def bench_attention(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """``scaled_dot_product_attention`` (causal, fp32): forward, and forward+backward."""
    store = Store(out, "attention", env)
    points = [(p, pas, t) for t in thread_counts() for p in plan.attention
              for pas in ("fwd", "fwd_bwd")]
    prog = Progress("attention", len(points), quiet)
    for (b, h, s, d), pas, thr in points:
        with _threads(thr) as used:
            key = f"{b}x{h}x{s}x{d}:{pas}:t{used}"
            if store.has(key):
                prog.step(key, None)
                continue
            st = time_call(_attn_fn(b, h, s, d, pas), plan.warmup, plan.repeats, plan.budget_s)
            store.add(key, {"batch": b, "heads": h, "seq": s, "head_dim": d, "pass": pas,
                            "flops_fwd": attention_flops(b, h, s, d), "threads": used}, st)
            prog.step(key, st)
    recheck_threads(store, plan, lambda r: _attn_fn(int(r["batch"]), int(r["heads"]),
                                                    int(r["seq"]), int(r["head_dim"]),
                                                    r["pass"]), quiet)
    return store.path


def _attn_fn(b: int, h: int, s: int, d: int, pas: str):
    import torch
    import torch.nn.functional as F
    q, k, v = (torch.randn(b, h, s, d, requires_grad=(pas == "fwd_bwd")) for _ in range(3))

    def run():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if pas == "fwd_bwd":
            o.sum().backward()
    return run


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
        params = {k: v for k, v in r.items() if k not in _STAT_KEYS}
        st: Stats | None = None
        with _threads(int(r["threads"])):
            for _ in range(RETRIES):
                st = time_call(make_fn(r), plan.warmup, plan.repeats, plan.budget_s)
                if st.median_s <= SUSPECT_RATIO * base["median_s"]:
                    break
        bad = st.median_s > SUSPECT_RATIO * base["median_s"]
        flagged += bad
        store.add(r["point"], params, st, suspect=bad)
        if not quiet:
            Progress(store.path.stem, 1).step(f"re-measured {r['point']}"
                                              f"{' (still anomalous: suspect)' if bad else ''}", st)
    return flagged


_STAT_KEYS = {"point", "median_s", "p25_s", "p75_s", "iqr_s", "mean_s", "p10_s", "n_samples",
              "suspect", "device", "torch_version", "gloo", "date", "git_revision", "python",
              "cpu_pressure_avg60_pct"}
