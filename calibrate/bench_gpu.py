"""Run the compute points of a calibration plan (``calibrate.budget``) on one device: GEMMs,
memory-bound kernels, attention. Device-generic: the same code runs on a GPU (CUDA-event
timer, 256 MiB+ cache flush, clocks settled and logged) and on a CPU (wall clock), which is
how CI exercises it.

Each point is built by the same functions the CPU sweep uses (``calibrate.bench``:
``_mm_operands``, ``_attn_fn``; ``calibrate.bench_mem.mem_fn``) with the device and dtype
of the point, timed by ``store.time_call`` with the device's timer and a cache flush before
every call, and written to ``OUT/measurements/<bench>.parquet`` at once (an interrupted or
budget-limited run resumes). With the point go the GPU's SM clock, power and clock-event
reasons (``calibrate.device.ClockLog``); a point measured under thermal or hardware
slowdown is flagged ``suspect`` (``calibrate.hygiene`` then decides what the fits use).

A group of points that cannot run here (fp8 on a GPU without fp8 tensor cores, the cuDNN
attention kernel where torch has none, out of memory) is skipped after its first failure,
with one note, and the rest goes on.
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .bench import _attn_fn, _dtype, _mm_operands, attention_flops, flush_cache
from .bench_mem import accounting, mem_fn
from .budget import MEM_COLS, POINT_BUDGET_S, REPEATS, WARMUP, GpuPlan, Point
from .device import BenchDevice, ClockLog, settle_clocks, slowed
from .store import Progress, Store, time_call

COMPUTE = ("gemm", "memory", "attention")


@dataclass
class RunReport:
    """What a run measured, resumed, left for lack of time, and could not run."""

    measured: int = 0
    resumed: int = 0
    over_budget: int = 0
    failed: dict[str, str] = field(default_factory=dict)      # group -> first error line
    clocks: list[int] = field(default_factory=list)            # SM MHz per measured point

    def notes(self) -> list[str]:
        out = [f"skipped {g}: {why}" for g, why in self.failed.items()]
        if self.over_budget:
            out.append(f"time budget reached: {self.over_budget} planned points not measured "
                       "(re-run the same command to continue; measured points are kept)")
        return out


def point_params(p: Point, dev: BenchDevice) -> dict[str, Any]:
    """The stored columns of a point: its parameters plus what the fits need (FLOPs, bytes
    as the simulator counts them) and where it ran."""
    q = p.p
    extra: dict[str, Any] = {"device_name": dev.name, "timer": dev.timer.kind,
                             "cache": "cold", "flush_bytes": dev.flush_bytes}
    if p.bench == "gemm":
        extra["flops"] = 2.0 * q["m"] * q["n"] * q["k"]
    elif p.bench == "memory":
        acc = accounting(q["kernel"], q["elems"], q["pass"])
        scale = 0.5 if q["dtype"] in ("bf16", "fp16") else 1.0
        extra.update(acc, bytes_moved=acc["bytes_moved"] * scale, cols=MEM_COLS)
    elif p.bench == "attention":
        extra["flops_fwd"] = attention_flops(q["batch"], q["heads"], q["seq"], q["head_dim"])
    return {**q, **extra}


def make_fn(p: Point, dev: BenchDevice):
    """The timed callable of one compute point on ``dev``."""
    q, where = p.p, dev.torch()
    if p.bench == "gemm":
        return _mm_operands(q["m"], q["n"], q["k"], q["dtype"], q["layout"], device=where)
    if p.bench == "memory":
        return mem_fn(q["kernel"], q["elems"], q["pass"], device=where,
                      dtype=_dtype(q["dtype"]), cols=MEM_COLS)
    if p.bench == "attention":
        return _attn_fn(q["batch"], q["heads"], q["seq"], q["head_dim"], q["pass"],
                        device=where, dtype=q["dtype"], backend=sdpa_backend(q["backend"]))
    raise ValueError(p.bench)


def sdpa_backend(name: str):
    """``SDPBackend`` for a point's backend name ("flash" = FlashAttention-2 kernels,
    "cudnn" = cuDNN fused attention, the simulator's "flash3" family)."""
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH}[name]


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 tensor-core math for fp32 matmuls inside (``tf32`` points only)."""
    import torch
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def measure_point(p: Point, dev: BenchDevice, log: ClockLog, timing: Mapping[str, Any]):
    """(stats, clock sample) of one point."""
    fn = make_fn(p, dev)
    with tf32(p.p.get("dtype") == "tf32"):
        st = time_call(fn, timing["warmup"], timing["repeats"], timing["budget_s"],
                       setup=lambda: flush_cache(dev), timer=dev.timer)
    return st, log.sample()


def _free(dev: BenchDevice) -> None:
    if dev.is_cuda:
        import torch
        torch.cuda.empty_cache()


def run_compute(out: Path, env: Mapping[str, str], plan: GpuPlan, dev: BenchDevice,
                deadline: float, quiet: bool = False, log: ClockLog | None = None,
                timing: Mapping[str, Any] | None = None) -> RunReport:
    """Measure the plan's gemm, memory and attention points on ``dev`` until ``deadline``
    (``time.perf_counter`` seconds): clocks settled first (GPU), stored points skipped."""
    if log is None:
        log = ClockLog(dev.index) if dev.is_cuda else ClockLog(nvml=_NoNvml)
    timing = timing or {"warmup": WARMUP, "repeats": REPEATS, "budget_s": POINT_BUDGET_S}
    rep = RunReport()
    settled = settle_clocks(dev, plan.settle_s, log)
    if settled and not quiet:
        print(f"[settle] {plan.settle_s:.0f} s of bf16 GEMMs: SM clock "
              f"{settled.get('sm_clock_mhz')} MHz ({settled.get('clock_reasons') or 'no events'})",
              file=sys.stderr, flush=True)
    for bench in COMPUTE:
        pts = plan.by_bench(bench)
        if not pts:
            continue
        if bench == "attention":
            settle_clocks(dev, plan.settle_s / 3, log)
        store, prog = Store(out, bench, env), Progress(bench, len(pts), quiet)
        for p in pts:
            _one(p, dev, store, prog, rep, deadline, log, timing)
    return rep


def _one(p: Point, dev: BenchDevice, store: Store, prog: Progress, rep: RunReport,
         deadline: float, log: ClockLog, timing: Mapping[str, Any]) -> None:
    if store.has(p.key):
        rep.resumed += 1
        prog.step(p.key, None)
        return
    if p.group in rep.failed:
        return
    if time.perf_counter() + p.est_s > deadline:
        rep.over_budget += 1
        return
    try:
        st, clock = measure_point(p, dev, log, timing)
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()
        rep.failed[p.group] = (first[0] if first else type(exc).__name__)[:160]
        _free(dev)
        return
    store.add(p.key, {**point_params(p, dev), **clock}, st, suspect=slowed(clock))
    rep.measured += 1
    if clock.get("sm_clock_mhz"):
        rep.clocks.append(int(clock["sm_clock_mhz"]))
    prog.step(p.key, st)
    _free(dev)


class _NoNvml:
    """Stands in for pynvml on a CPU device: every clock reading is empty."""

    @staticmethod
    def nvmlInit() -> None:
        raise RuntimeError("no GPU")
