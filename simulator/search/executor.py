"""Evaluating search candidates: flat result records, and where they run.

``ExecutorKind.LOCAL`` runs batches on a ``concurrent.futures`` process pool over the
local cores (inline when one worker is asked for or the batch list is short);
``ExecutorKind.RAY`` submits the same batches as Ray tasks (``pip install
complexity-framework[ray]``; ``address=None`` starts or joins a local Ray instance).
Every candidate comes back as a flat record (one Parquet row in ``store``).
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, InvalidStateError, ProcessPoolExecutor, wait
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Iterator, Sequence

from ..engine.result import Breakdown, Result
from ..engine.simulate import simulate
from ..errors import InfeasiblePlanError, InvalidInputError, UnsupportedError, raise_if_stopped
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec
from .store import candidate_key, plan_dict

BREAKDOWN_COLUMNS = tuple(f.name for f in fields(Breakdown))


class Engine(str, Enum):
    ANALYTIC = "analytic"
    EVENT = "event"


class ExecutorKind(str, Enum):
    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True)
class EvalContext:
    """What every candidate of one search target shares."""

    model: TransformerSpec
    cluster: ClusterSpec
    profile: Profile
    global_batch: int
    fingerprint: str


# ---- records --------------------------------------------------------------------------------
def _base_record(ctx: EvalContext, plan: Plan, engine: Engine) -> dict[str, Any]:
    rec: dict[str, Any] = {"key": candidate_key(ctx.fingerprint, plan, engine.value),
                           "fingerprint": ctx.fingerprint, "model": ctx.model.name,
                           "gpu": ctx.cluster.gpu.key, "n_gpus": ctx.cluster.n_gpus,
                           "seq_len": ctx.model.seq_len, "engine": engine.value}
    rec.update(plan_dict(plan))
    return rec


def result_record(ctx: EvalContext, plan: Plan, engine: Engine, res: Result) -> dict[str, Any]:
    rec = _base_record(ctx, plan, engine)
    rec.update(status="ok" if res.fits_in_memory else "memory",
               step_time_s=res.step_time_s, tokens_per_s=res.tokens_per_s,
               tokens_per_s_per_gpu=res.tokens_per_s_per_gpu, mfu=res.mfu, hfu=res.hfu,
               peak_memory_bytes=max(res.peak_memory_bytes),
               memory_capacity_bytes=res.memory_capacity_bytes,
               critical_stage=res.critical_stage, num_microbatches=res.num_microbatches,
               sim_wall_s=res.sim_wall_s)
    rec.update(res.breakdown.as_dict())
    return rec


def failed_record(ctx: EvalContext, plan: Plan, engine: Engine, status: str) -> dict[str, Any]:
    rec = _base_record(ctx, plan, engine)
    nan = math.nan
    rec.update(status=status, step_time_s=nan, tokens_per_s=nan, tokens_per_s_per_gpu=nan,
               mfu=nan, hfu=nan, peak_memory_bytes=nan,
               memory_capacity_bytes=ctx.cluster.gpu.mem_bytes, critical_stage=-1,
               num_microbatches=plan.num_microbatches, sim_wall_s=0.0)
    rec.update({c: nan for c in BREAKDOWN_COLUMNS})
    return rec


def evaluate(ctx: EvalContext, plan: Plan, engine: Engine) -> dict[str, Any]:
    """Simulate one candidate; never raises for a plan the simulator refuses."""
    try:
        res = simulate(ctx.model, plan, ctx.cluster, ctx.profile, engine=engine.value)
    except InfeasiblePlanError as exc:
        return failed_record(ctx, plan, engine, f"failed:{exc.reason}")
    except InvalidInputError as exc:
        return failed_record(ctx, plan, engine, f"divisibility:{exc.field}")
    except UnsupportedError:
        return failed_record(ctx, plan, engine, "unsupported:simulator")
    return result_record(ctx, plan, engine, res)


# ---- batches --------------------------------------------------------------------------------
Batch = tuple[int, tuple[Plan, ...], Engine]       # (context index, plans, engine)

_WORKER_CONTEXTS: Sequence[EvalContext] = ()


def _init_worker(contexts: Sequence[EvalContext]) -> None:
    global _WORKER_CONTEXTS
    _WORKER_CONTEXTS = contexts


def _init_pool_worker(contexts: Sequence[EvalContext]) -> None:
    """A pool worker leaves Ctrl-C to its parent (which stops the pool: no traceback per
    worker), ends on SIGTERM without a traceback (the default action, not the parent's
    handler it inherited) and, on Linux, is sent SIGTERM if the parent dies without
    stopping it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):      # forked while the parent held SIGTERM back
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _die_with_parent()
    _init_worker(contexts)


class _sigterm_held:
    """SIGTERM held back in this thread while a pool forks its workers (``submit`` /
    ``map`` start them): Python would otherwise run the CLI's handler inside an at-fork
    hook (logging's ``_releaseLock``), where its exception is only printed ("Exception
    ignored in ..."). A signal that arrives meanwhile is delivered, normally, when the
    mask is restored; threads started meanwhile (the pool's manager) keep it held, so it
    comes to this one. The workers release it first thing (``_init_pool_worker``). In a
    process with other threads that do not hold it (not the CLI's), the kernel may hand
    the signal to one of them and Python then runs the handler here, hold or not."""

    def __enter__(self) -> None:
        self.old = (signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                    if hasattr(signal, "pthread_sigmask") else None)

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


def _die_with_parent() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel ends this process when its parent
    exits, even by SIGKILL (Linux only; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    # the parent may have died between the fork and the prctl: then no signal will come
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)


def _run_batch(batch: Batch) -> list[dict[str, Any]]:
    i, plans, engine = batch
    return [evaluate(_WORKER_CONTEXTS[i], p, engine) for p in plans]


def make_batches(items: Sequence[tuple[int, Plan]], engine: Engine, workers: int) -> list[Batch]:
    """Batches of plans of one context each, about 8 batches per worker."""
    by_ctx: dict[int, list[Plan]] = {}
    for i, p in items:
        by_ctx.setdefault(i, []).append(p)
    size = max(1, min(64, math.ceil(len(items) / max(1, 8 * workers))))
    return [(i, tuple(plans[j:j + size]), engine)
            for i, plans in sorted(by_ctx.items()) for j in range(0, len(plans), size)]


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 16))


class LocalExecutor:
    """Process pool over local cores; inline for one worker or few batches."""

    def __init__(self, contexts: Sequence[EvalContext], workers: int | None = None) -> None:
        self.contexts = list(contexts)
        self.workers = workers or default_workers()

    def run(self, batches: list[Batch], n_items: int) -> Iterator[list[dict[str, Any]]]:
        """Inline when a pool would not pay: one worker, one batch, or a short list of
        cheap analytic candidates (event candidates are worth a process each)."""
        cheap = bool(batches) and batches[0][2] == Engine.ANALYTIC
        if self.workers <= 1 or len(batches) < 2 or (cheap and n_items < 64):
            _init_worker(self.contexts)
            for b in batches:
                yield _run_batch(b)
            return
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        spare = children()
        pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context(method),
                                   initializer=_init_pool_worker, initargs=(self.contexts,))
        try:
            yield from _drain(pool, batches, self.workers * 2)
        except BaseException:            # Ctrl-C, SIGTERM, an error, or the caller stopped early
            stop_pool(pool, spare)
            raise
        pool.shutdown(wait=True)


def parallel_map(fn, args: Sequence[Any], workers: int) -> list[Any]:
    """``[fn(a) for a in args]`` over a forked pool of ``workers`` processes (``fn``: a
    module-level function; inline for one worker or one item, or where fork is missing)."""
    if workers <= 1 or len(args) < 2 or "fork" not in mp.get_all_start_methods():
        return [fn(a) for a in args]
    spare = children()
    pool = ProcessPoolExecutor(min(workers, len(args)), mp_context=mp.get_context("fork"),
                               initializer=_init_pool_worker, initargs=((),))
    try:
        with _sigterm_held():
            results = pool.map(fn, args)         # submits (and forks) now, yields later
        out = list(results)
    except BaseException:
        stop_pool(pool, spare)
        raise
    pool.shutdown(wait=True)
    return out


def children() -> frozenset[int]:
    """PIDs of this process's live multiprocessing children (before a pool is made, so that
    ``stop_pool`` leaves them alone)."""
    return frozenset(p.pid for p in mp.active_children())


def stop_pool(pool: ProcessPoolExecutor, spare: frozenset[int] = frozenset()) -> None:
    """End a pool now: drop queued work and terminate its workers (running batches are
    abandoned; their results were not needed), then reap them so none is left behind. A
    worker forked while the pool was being stopped may not be in the pool's list yet: every
    multiprocessing child not in ``spare`` (``children()`` taken before the pool) goes too.
    A second SIGTERM waits until this is done (``_sigterm_held``). A worker killed while
    it sent a result leaves half a message in the result pipe, and the manager thread
    would wait in ``recv`` forever (this process holds the pipe's write end) and hang the
    interpreter's exit, which joins it: once the workers are reaped that end is closed."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    known = {p.pid for p in procs} | spare
    procs += [p for p in mp.active_children() if p.pid not in known]
    manager = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)
    with _sigterm_held(), _quiet_manager(manager):
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        _close_writer(results)
        if manager is not None and manager.ident is not None:
            manager.join(timeout=5)


def _close_writer(queue) -> None:
    """Close this process's write end of a pool's result pipe (the manager reading it sees
    the end of the stream instead of waiting for the rest of a dead worker's message)."""
    writer = getattr(queue, "_writer", None)
    if writer is not None:
        try:
            writer.close()
        except OSError:
            pass


class _quiet_manager:
    """While a pool is stopped: the pool's manager thread sees its workers die and marks the
    pending futures failed, and on Python 3.11 ``set_exception`` raises
    ``InvalidStateError`` for a future the main thread has already cancelled
    (``Executor.map`` and ``_drain`` cancel theirs on the way out): a thread traceback on
    stderr after the command's own one-line message. That one error of that one thread
    is dropped; anything else still reaches ``threading.excepthook``."""

    def __init__(self, thread: threading.Thread | None) -> None:
        self.thread = thread

    def __enter__(self) -> None:
        self.previous = threading.excepthook

        def hook(args):
            if args.thread is self.thread and isinstance(args.exc_value, InvalidStateError):
                return
            self.previous(args)
        threading.excepthook = hook

    def __exit__(self, *exc) -> None:
        threading.excepthook = self.previous


def _drain(pool: ProcessPoolExecutor, batches: list[Batch], window: int):
    """Submit at most ``window`` batches ahead; yield results as they complete."""
    todo = list(reversed(batches))
    running = set()
    try:
        while todo or running:
            while todo and len(running) < window:
                with _sigterm_held():
                    running.add(pool.submit(_run_batch, todo.pop()))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            raise_if_stopped()
            for f in done:
                yield f.result()
    finally:
        for f in running:
            f.cancel()


class RayExecutor:
    """Evaluates batches as Ray tasks (``address=None``: local instance)."""

    def __init__(self, contexts: Sequence[EvalContext], address: str | None = None,
                 workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise UnsupportedError("--executor ray needs the optional extra: "
                                   "pip install 'complexity-framework[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": workers or default_workers()}
            ray.init(ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False, **kwargs)
        self.ctx_ref = ray.put(list(contexts))
        self._task = ray.remote(_ray_batch)

    def run(self, batches: list[Batch], n_items: int) -> Iterator[list[dict[str, Any]]]:
        pending = [self._task.remote(self.ctx_ref, b) for b in batches]
        try:
            while pending:
                done, pending = self.ray.wait(pending, num_returns=1)
                for ref in done:
                    yield self.ray.get(ref)
        except BaseException:            # stopped: cancel what has not run yet
            for ref in pending:
                self.ray.cancel(ref, force=True)
            raise


def _ray_batch(contexts: Sequence[EvalContext], batch: Batch) -> list[dict[str, Any]]:
    _init_worker(contexts)
    return _run_batch(batch)


def make_executor(kind: ExecutorKind, contexts: Sequence[EvalContext], workers: int | None,
                  address: str | None):
    if ExecutorKind(kind) == ExecutorKind.RAY:
        return RayExecutor(contexts, address, workers)
    return LocalExecutor(contexts, workers)
