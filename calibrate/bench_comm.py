"""Collective and overlap-interference benchmarks through ``torch.distributed`` (gloo on CPU)
between local processes. torch is imported lazily (inside the worker).

Size conventions follow ``simulator.network.collectives.ring_steps_and_traffic``: all-reduce buffer,
all-gather *output*, reduce-scatter *input*, all-to-all send buffer per rank, send/recv
message (timed as half a ping-pong). Each sample starts after a barrier and is the slowest
rank's time. On a small VM gloo times are heavy-tailed (scheduler wake-ups of ~4 ms hit a
fraction of calls), so the rows keep the mean as well as the median. Interference: a GEMM timed alone and while an async all-reduce is in flight
(the DDP overlap pattern). Each worker uses 1 intra-op thread (as ``torchrun`` sets
``OMP_NUM_THREADS=1`` for several processes per host).
"""
from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Mapping

from simulator.errors import ComplexityError

from .bench import Plan, backoff_s
from .store import ForeignLoadMeter, Progress, Store, stats_of

WORLD = 2
COMM_BUDGET_FACTOR = 3.0  # gloo timings are heavy-tailed here: more samples per point
INNER_TARGET_S = 0.04      # each sample averages back-to-back calls over ~40 ms (mean cost)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
FOREIGN_MAX = 0.10        # re-measure when other processes used > 10% of the host's CPUs
FOREIGN_SUSPECT = 0.25


class BenchmarkError(ComplexityError):
    """A benchmark could not run (e.g. the gloo workers failed to start)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _op_fn(op: str, nbytes: int, rank: int):
    import torch
    import torch.distributed as dist
    n = max(WORLD, nbytes // 4 // WORLD * WORLD)
    full, part = torch.ones(n), torch.ones(n // WORLD)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: ag(full, part)
    if op == "reduce_scatter":
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: rs(part, full)
    if op == "all_to_all":
        out = torch.empty(n)
        return lambda: dist.all_to_all_single(out, full)
    peer = 1 - rank

    def pingpong():
        if rank == 0:
            dist.send(full, peer)
            dist.recv(full, peer)
        else:
            dist.recv(full, peer)
            dist.send(full, peer)
    return pingpong


def _timed_samples(fn, plan: Plan, scale: float = 1.0, inner_target_s: float = 0.0) -> list[float]:
    """Barrier-aligned samples, each the max over ranks (seconds per call, times ``scale``).

    With ``inner_target_s`` > 0 each sample times back-to-back calls lasting about that long
    (amortises barrier skew and scheduler jitter for microsecond-scale collectives).
    """
    import torch
    import torch.distributed as dist
    t0 = time.perf_counter()
    for _ in range(max(1, plan.warmup)):
        fn()
    inner = 1
    if inner_target_s > 0:
        est = torch.tensor([(time.perf_counter() - t0) / max(1, plan.warmup)])
        dist.all_reduce(est, op=dist.ReduceOp.MAX)         # both ranks agree on ``inner``
        inner = max(1, min(400, int(inner_target_s / max(float(est), 1e-7))))
    samples, start = [], time.perf_counter()
    reps = max(5, min(plan.repeats, 7) if inner_target_s > 0 else plan.repeats)
    budget = plan.budget_s * COMM_BUDGET_FACTOR
    while len(samples) < reps and (len(samples) < 5 or time.perf_counter() - start < budget):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) * scale / inner)
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _collectives(rank: int, plan: Plan, store: Store | None, prog: Progress | None,
                 done: frozenset[str]) -> None:
    sweep = [("all_reduce", b) for b in plan.allreduce_bytes] + \
        [(op, b) for op in plan.comm_ops for b in plan.comm_bytes]
    busy = _AgreedRetry(plan.busy_retry_s)
    for op, nbytes in sweep:
        key = f"{op}:{nbytes}:n{WORLD}"
        if key in done:
            if prog:
                prog.step(key, None)
            continue
        scale = 0.5 if op == "send_recv" else 1.0
        fn = _op_fn(op, nbytes, rank)
        st, load = busy.measure(lambda: _timed_samples(fn, plan, scale, INNER_TARGET_S))
        if store is not None:
            store.add(key, {"op": op, "size_bytes": float(nbytes), "n_ranks": WORLD,
                            "backend": "gloo", "foreign_load": load}, st,
                      suspect=load > FOREIGN_SUSPECT)
            prog.step(key, st)


class _AgreedRetry:
    """Re-measure a collective point while other processes loaded the host (foreign CPU
    time, ``store.ForeignLoadMeter``, summed over the ranks' own CPU time so gloo's helper
    threads do not count); every decision is all-reduced so the ranks stay in step."""

    def __init__(self, budget_s: float) -> None:
        self.left_s = budget_s              # pauses are planned, so every rank agrees
        self.attempt = 0

    def measure(self, sampler):
        import torch
        import torch.distributed as dist
        best = None
        while True:
            meter = ForeignLoadMeter().start()
            samples = sampler()
            own, _ = meter.stop()
            t = torch.tensor([own], dtype=torch.float64)
            dist.all_reduce(t)
            v = torch.tensor([meter.foreign(float(t))], dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            load = float(v)
            if best is None or load < best[1]:
                best = (stats_of(samples), load)
            if load <= FOREIGN_MAX or self.left_s <= 0:
                return best
            pause = min(backoff_s(self.attempt), self.left_s)
            self.left_s -= pause + 0.5       # + a nominal re-measurement, the same everywhere
            self.attempt += 1
            time.sleep(pause)


def _interference(rank: int, plan: Plan, store: Store | None, prog: Progress | None,
                  done: frozenset[str]) -> None:
    """Compute slowed by an all-reduce in flight, as DDP overlaps them: a loop of GEMMs
    lasting about twice the all-reduce, timed alone and with the all-reduce launched (async)
    at its start. ``alone_s`` / ``median_s``: the loop alone / overlapped; ``comm_alone_s``:
    the all-reduce alone. The extra time over the overlapped span is what
    ``simulator.cost.layer.interference_s`` charges: ``(slowdown - 1) * overlap``. On a CPU
    host the collective needs cores the GEMMs are using (gloo reduces and copies on the CPU),
    so a GEMM that only covers the start of the all-reduce understates it."""
    import math
    from dataclasses import replace

    import torch
    import torch.distributed as dist
    short = replace(plan, repeats=min(plan.repeats, 9), warmup=1)
    for n, nbytes in plan.interference:
        key = f"span:mm{n}:ar{nbytes}:n{WORLD}"
        if key in done:
            if prog:
                prog.step(key, None)
            continue
        a, b, buf = torch.randn(n, n), torch.randn(n, n), torch.ones(nbytes // 4)
        comm = stats_of(_timed_samples(lambda: dist.all_reduce(buf), short))
        t_mm = stats_of(_timed_samples(lambda: torch.mm(a, b), short)).median_s
        reps = torch.tensor([max(2, math.ceil(2.0 * comm.median_s / t_mm))])
        dist.all_reduce(reps, op=dist.ReduceOp.MAX)            # both ranks run the same loop

        def loop(k=int(reps)):
            for _ in range(k):
                torch.mm(a, b)
        alone = stats_of(_timed_samples(loop, short))
        holder: dict[str, list[float]] = {"t": []}

        def overlapped():
            work = dist.all_reduce(buf, async_op=True)
            t0 = time.perf_counter()
            loop()
            holder["t"].append(time.perf_counter() - t0)
            work.wait()
        _timed_samples(overlapped, short)
        t = torch.tensor(holder["t"][short.warmup:], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        st = stats_of(t.tolist())
        if store is not None:
            store.add(key, {"gemm_n": n, "allreduce_bytes": float(nbytes), "n_ranks": WORLD,
                            "gemm_reps": int(reps), "mode": "span", "alone_s": alone.median_s,
                            "alone_iqr_s": alone.iqr_s, "comm_alone_s": comm.median_s}, st)
            prog.step(key, st)


def _worker(rank: int, port: int, out: str, env: Mapping[str, str], plan: Plan,
            quiet: bool) -> None:
    import warnings

    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=120))
    try:
        stores = {b: Store(Path(out), b, env) for b in ("collectives", "interference")}
        done = {b: frozenset(s.done) for b, s in stores.items()}
        lead = rank == 0
        n_coll = len(plan.comm_ops) * len(plan.comm_bytes) + len(plan.allreduce_bytes)
        _collectives(rank, plan, stores["collectives"] if lead else None,
                     Progress("collectives", n_coll, quiet) if lead else None,
                     done["collectives"])
        _interference(rank, plan, stores["interference"] if lead else None,
                      Progress("interference", len(plan.interference), quiet) if lead else None,
                      done["interference"])
        dist.barrier()
    finally:
        dist.destroy_process_group()


ATTEMPTS = 3      # gloo runs of the whole sweep; each resumes the points already stored


def bench_comm(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> None:
    """Run the gloo collective and interference sweeps in ``WORLD`` local processes. A failed
    run (a worker crash, a gloo timeout) is retried on a fresh port after a pause, keeping the
    points already stored; after ``ATTEMPTS`` failures one ``BenchmarkError`` says why."""
    import torch.multiprocessing as mp
    errors: list[str] = []
    for attempt in range(ATTEMPTS):
        try:
            mp.start_processes(_worker, args=(free_port(), str(out), dict(env), plan, quiet),
                               nprocs=WORLD, join=True, start_method="spawn")
            return
        except Exception as exc:   # noqa: BLE001 - retried, then one line; keep measurements
            first = str(exc).strip().splitlines()
            errors.append(first[-1] if first else type(exc).__name__)
        if attempt + 1 < ATTEMPTS:
            if not quiet:
                print(f"[collectives] gloo run failed ({errors[-1]}); retrying "
                      f"({attempt + 2}/{ATTEMPTS}), measured points are kept", file=sys.stderr,
                      flush=True)
            time.sleep(backoff_s(attempt))
    raise BenchmarkError(f"gloo collective benchmark failed {ATTEMPTS} times: {errors[-1]}")
