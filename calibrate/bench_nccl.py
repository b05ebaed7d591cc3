"""Collectives and compute/communication interference across the GPUs of this node: one
rank per GPU (``torch.multiprocessing`` spawn; each rank ``torch.cuda.set_device(
LOCAL_RANK)``), NCCL, the plan's sizes (``calibrate.budget.collective_points``, 1 KiB..1 GiB).

Timing follows nccl-tests: after warm-up, each sample times back-to-back calls (as many as
last ~20 ms) between CUDA events on the rank's current stream (a blocking collective makes
that stream wait for NCCL's), and a point's sample is the slowest rank's. Rows carry the
algorithm bandwidth ``algbw = size / time`` and the bus bandwidth ``busbw = algbw x
factor`` (nccl-tests' PERFORMANCE.md: 2(n-1)/n all-reduce, (n-1)/n all-gather,
reduce-scatter and all-to-all, 1 send/recv; ``calibrate.fit.busbw_factor``). Sizes follow
``simulator.network.collectives``: all-reduce buffer, all-gather output, reduce-scatter
input, all-to-all buffer per rank.

Points with ``algo`` "ring" run in a second spawn with ``NCCL_NVLS_ENABLE=0`` and
``NCCL_ALGO=Ring`` (NCCL reads them at communicator creation): their ratio to the default
(NVLS on an NVSwitch node) is the in-switch speedup the profile records.

Interference: a bf16 GEMM loop lasting about twice an all-reduce, timed (CUDA events on the
compute stream) alone and with the all-reduce launched asynchronously at its start, as
DDP overlaps gradient buckets with backward; stored as the CPU benchmark stores it
(``mode`` "span", ``alone_s``, ``comm_alone_s``), so ``cpu_profile.fit_overlap`` fits it.

The same worker runs over gloo on CPU ranks (the CI test of this code path).
"""
from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

from .bench_comm import BenchmarkError, free_port
from .budget import NCCL_INNER_S, NCCL_SAMPLES, NCCL_WARMUP, Point
from .store import Progress, Store, stats_of

RING_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"}


def op_fn(op: str, nbytes: int, rank: int, world: int, device: Any):
    """One collective of ``nbytes`` (fp32 elements) on ``device`` tensors."""
    import torch
    import torch.distributed as dist
    n = max(world, int(nbytes) // 4 // world * world)
    full = torch.ones(n, device=device)
    part = torch.ones(n // world, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if op == "send_recv":
        peer = rank ^ 1

        def pingpong():
            if peer >= world:
                return
            if rank % 2 == 0:
                dist.send(full, peer)
                dist.recv(full, peer)
            else:
                dist.recv(full, peer)
                dist.send(full, peer)
        return pingpong
    raise ValueError(op)


def slowest(values: Sequence[float], device: Any) -> list[float]:
    """Element-wise max over ranks."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def timed_samples(fn, dev, warmup: int = NCCL_WARMUP, samples: int = NCCL_SAMPLES,
                  inner_s: float = NCCL_INNER_S, scale: float = 1.0) -> list[float]:
    """Seconds per call: warm-up, then ``samples`` barrier-aligned samples of back-to-back
    calls lasting ~``inner_s``; each the slowest rank's."""
    import torch.distributed as dist
    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
        fn()
    dev.timer.sync()
    est = slowest([(time.perf_counter() - t0) / max(1, warmup)], dev.torch())[0]
    inner = max(1, min(50, math.ceil(inner_s / max(est, 1e-7))))

    def loop():
        for _ in range(inner):
            fn()
    out = []
    for _ in range(samples):
        dist.barrier()
        out.append(dev.timer.sample(loop) * scale / inner)
    return slowest(out, dev.torch())


def bandwidths(op: str, size: float, n: int, t: float) -> dict[str, float]:
    """nccl-tests ``algbw`` and ``busbw`` in GB/s (10^9 B/s)."""
    from simulator.network.collectives import Collective

    from .fit import busbw_factor
    alg = size / t / 1e9
    return {"algbw_gbytes_per_s": alg, "busbw_gbytes_per_s": alg * busbw_factor(Collective(op), n)}


def _agree(go: bool, dev) -> bool:
    """Every rank goes on only if all do (rank 0 alone judges the deadline)."""
    return slowest([0.0 if go else 1.0], dev.torch())[0] == 0.0


def _collectives(ctx: Mapping[str, Any], points: Sequence[Point], store: Store | None,
                 done: frozenset[str]) -> None:
    rank, world, dev = ctx["rank"], ctx["world"], ctx["dev"]
    prog = Progress("collectives", len(points), ctx["quiet"]) if store is not None else None
    for p in points:
        if p.key in done:
            if prog:
                prog.step(p.key, None)
            continue
        if not _agree(time.perf_counter() + p.est_s <= ctx["deadline"], dev):
            continue
        q = p.p
        scale = 0.5 if q["op"] == "send_recv" else 1.0
        st = stats_of(timed_samples(op_fn(q["op"], q["size_bytes"], rank, world, dev.torch()),
                                    dev, scale=scale))
        if store is not None:
            store.add(p.key, {**q, "size_bytes": float(q["size_bytes"]),
                              "backend": ctx["backend"], "timer": dev.timer.kind,
                              **bandwidths(q["op"], q["size_bytes"], world, st.median_s)}, st)
            prog.step(p.key, st)


def _interference(ctx: Mapping[str, Any], points: Sequence[Point], store: Store | None,
                  done: frozenset[str]) -> None:
    import torch
    import torch.distributed as dist
    dev = ctx["dev"]
    dt = torch.bfloat16 if dev.is_cuda else torch.float32
    for p in points:
        if p.key in done:
            continue
        if not _agree(time.perf_counter() + p.est_s <= ctx["deadline"], dev):
            continue
        n, nbytes = p.p["gemm_n"], int(p.p["allreduce_bytes"])
        a = torch.randn(n, n, device=dev.torch(), dtype=dt)
        b = torch.randn(n, n, device=dev.torch(), dtype=dt)
        buf = torch.ones(nbytes // 4, device=dev.torch())
        comm = stats_of(timed_samples(lambda: dist.all_reduce(buf), dev, inner_s=0.0))
        mm = stats_of(timed_samples(lambda: torch.mm(a, b), dev, inner_s=0.0)).median_s
        reps = int(slowest([max(2, math.ceil(2.0 * comm.median_s / mm))], dev.torch())[0])

        def loop():
            for _ in range(reps):
                torch.mm(a, b)
        alone = stats_of(timed_samples(loop, dev, inner_s=0.0))
        spans = []
        for _ in range(NCCL_SAMPLES + 1):
            dist.barrier()
            work = dist.all_reduce(buf, async_op=True)
            spans.append(dev.timer.sample(loop))
            work.wait()
        st = stats_of(slowest(spans[1:], dev.torch()))
        if store is not None:
            store.add(p.key, {**p.p, "allreduce_bytes": float(nbytes), "gemm_reps": reps,
                              "mode": "span", "alone_s": alone.median_s,
                              "alone_iqr_s": alone.iqr_s, "comm_alone_s": comm.median_s,
                              "backend": ctx["backend"], "timer": dev.timer.kind}, st)


def _device(rank: int, backend: str):
    from .device import cpu_device, cuda_device
    if backend == "nccl":
        return cuda_device(rank)
    import torch
    torch.set_num_threads(1)
    return cpu_device()


def _worker(rank: int, world: int, port: int, out: str, env: Mapping[str, str],
            points: Sequence[Point], backend: str, extra_env: Mapping[str, str],
            deadline_in_s: float, quiet: bool) -> None:
    import warnings

    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.update({**extra_env, "LOCAL_RANK": str(rank), "RANK": str(rank),
                       "WORLD_SIZE": str(world)})
    dev = _device(rank, backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    try:
        stores = {b: Store(Path(out), b, env) for b in ("collectives", "interference")}
        done = {b: frozenset(s.done) for b, s in stores.items()}
        dist.barrier()                      # every rank has read what is stored
        lead = rank == 0
        ctx = {"rank": rank, "world": world, "dev": dev, "backend": backend, "quiet": quiet,
               "deadline": time.perf_counter() + deadline_in_s}
        _collectives(ctx, [p for p in points if p.bench == "collectives"],
                     stores["collectives"] if lead else None, done["collectives"])
        _interference(ctx, [p for p in points if p.bench == "interference"],
                      stores["interference"] if lead else None, done["interference"])
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_collectives(out: Path, env: Mapping[str, str], points: Sequence[Point], world: int,
                    deadline: float, backend: str = "nccl", quiet: bool = False) -> int:
    """Spawn ``world`` ranks per NCCL configuration the points need (default, ring) and
    measure them; returns how many planned points are not stored (left for lack of time).
    A failed run raises one ``BenchmarkError`` (the measured points are kept)."""
    import torch.multiprocessing as mp
    for algo in ("default", "ring"):
        pts = [p for p in points if p.p.get("algo", "default") == algo]
        if not pts:
            continue
        try:
            mp.start_processes(_worker, args=(world, free_port(), str(out), dict(env), pts,
                                              backend, RING_ENV if algo == "ring" else {},
                                              deadline - time.perf_counter(), quiet),
                               nprocs=world, join=True, start_method="spawn")
        except Exception as exc:   # noqa: BLE001 - one line; measurements are kept
            lines = str(exc).strip().splitlines()
            raise BenchmarkError(f"{backend} collective benchmark ({algo}) failed: "
                                 f"{lines[-1] if lines else type(exc).__name__}") from None
    stored = {b: Store(Path(out), b, env).done for b in ("collectives", "interference")}
    return sum(p.key not in stored[p.bench] for p in points)
