"""Raw measurement storage (Parquet) with resume, plus the timing loop the benchmarks share.

Each benchmark owns ``OUT/measurements/<bench>.parquet``: one row per measured point with
its parameters, the timing statistics (median, quartiles, IQR and mean, in seconds) and the
environment fingerprint. The file is rewritten after every point, so an interrupted
calibration keeps what it measured; a re-run skips points whose ``point`` key is present
(when the fingerprint's device and torch version match).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from simulator import progress
from simulator.errors import InvalidInputError

REPO = Path(__file__).resolve().parent.parent
FINGERPRINT_KEYS = ("device", "torch_version", "gloo", "date", "git_revision", "python",
                    "cpu_pressure_avg60_pct")


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, timeout=5,
                             capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_pressure_pct() -> str:
    """Linux PSI 'some' CPU pressure over the last 60 s (%), or '' where unavailable: how much
    other load competed for the CPU while measuring."""
    try:
        with open("/proc/pressure/cpu") as fh:
            first = fh.readline().split()
        return next(f.split("=")[1] for f in first if f.startswith("avg60="))
    except (OSError, StopIteration, IndexError):
        return ""


def environment(device: str) -> dict[str, str]:
    """The fingerprint stored with every row."""
    import torch
    import torch.distributed as dist
    gloo = "yes" if dist.is_available() and dist.is_gloo_available() else "no"
    return {"device": device, "torch_version": torch.__version__, "gloo": gloo,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
            "git_revision": git_revision(), "python": platform.python_version(),
            "cpu_pressure_avg60_pct": cpu_pressure_pct()}


@dataclass(frozen=True)
class Stats:
    """Timing statistics of one point, seconds. ``pressure``: fraction of the timing window
    in which some task on this host waited for a CPU (Linux PSI), i.e. how much other load
    competed with the measurement (0 where PSI is unavailable)."""

    median_s: float
    p25_s: float
    p75_s: float
    n_samples: int
    mean_s: float = 0.0
    p10_s: float = 0.0
    pressure: float = 0.0

    @property
    def iqr_s(self) -> float:
        return self.p75_s - self.p25_s


def cpu_pressure_total_us() -> int | None:
    """Linux PSI: cumulative microseconds in which some task waited for a CPU."""
    try:
        with open("/proc/pressure/cpu") as fh:
            first = fh.readline().split()
        return int(next(f.split("=")[1] for f in first if f.startswith("total=")))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


class PressureMeter:
    """Fraction of wall time with CPU pressure between ``start()`` and ``stop()``."""

    def start(self) -> "PressureMeter":
        self.p0, self.t0 = cpu_pressure_total_us(), time.perf_counter()
        return self

    def stop(self) -> float:
        p1, wall = cpu_pressure_total_us(), time.perf_counter() - self.t0
        if self.p0 is None or p1 is None or wall <= 0:
            return 0.0
        return max(0.0, (p1 - self.p0) / (wall * 1e6))


def host_busy_s() -> float | None:
    """Seconds of CPU time all CPUs of this host spent busy since boot (``/proc/stat``:
    everything but idle and iowait, hypervisor steal included)."""
    try:
        with open("/proc/stat") as fh:
            f = [float(x) for x in fh.readline().split()[1:]]
        return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class ForeignLoadMeter:
    """CPU time other processes used during a window, as a fraction of the host's CPUs:
    ``(host busy - own busy) / (wall * cpus)``. Unlike PSI it does not count this job's own
    threads waiting for each other (gloo's helper threads in a DDP run). ``own_s`` of
    several processes is summed by the caller (``foreign(own_total_s)``)."""

    def start(self) -> "ForeignLoadMeter":
        self.h0, self.o0, self.t0 = host_busy_s(), time.process_time(), time.perf_counter()
        return self

    def stop(self) -> tuple[float, float]:
        """(own CPU seconds of this process, wall seconds) since ``start()``."""
        self.h1, self.wall = host_busy_s(), time.perf_counter() - self.t0
        return time.process_time() - self.o0, self.wall

    def foreign(self, own_total_s: float) -> float:
        if self.h0 is None or self.h1 is None or self.wall <= 0:
            return 0.0
        cpus = os.cpu_count() or 1
        return max(0.0, (self.h1 - self.h0 - own_total_s) / (self.wall * cpus))


def time_call(fn: Callable[[], Any], warmup: int, repeats: int, budget_s: float,
              sync: Callable[[], Any] | None = None,
              setup: Callable[[], Any] | None = None, timer: Any = None) -> Stats:
    """Run ``fn`` ``warmup`` times, then time up to ``repeats`` calls (at least 3) or until
    ``budget_s`` seconds (wall clock) have passed; ``setup`` (e.g. a cache flush) runs
    untimed before each call. ``timer`` (``calibrate.device``: CUDA events on a GPU) times
    each call; without one, the wall clock with ``sync`` (if any) around each call."""
    from .device import WallTimer
    timer = timer or WallTimer(sync)
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    samples: list[float] = []
    meter = PressureMeter().start()
    start = time.perf_counter()
    while len(samples) < repeats and (len(samples) < 3 or time.perf_counter() - start < budget_s):
        if setup:
            setup()
        samples.append(timer.sample(fn))
    return stats_of(samples, meter.stop())


def stats_of(samples: list[float], pressure: float = 0.0) -> Stats:
    a = np.asarray(samples, dtype=float)
    p10, p25, med, p75 = np.percentile(a, [10, 25, 50, 75])
    return Stats(float(med), float(p25), float(p75), len(samples), float(a.mean()), float(p10),
                 float(pressure))


class Store:
    """Rows of one benchmark, persisted to Parquet after every added point."""

    def __init__(self, out_dir: Path, bench: str, env: Mapping[str, str]) -> None:
        self.path = Path(out_dir) / "measurements" / f"{bench}.parquet"
        self.env = dict(env)
        self.rows: list[dict[str, Any]] = []
        if self.path.exists():
            old = read_rows(self.path)
            if old and all(old[0].get(k) == self.env[k] for k in ("device", "torch_version")):
                self.rows = old
        self.done = {r["point"] for r in self.rows}

    def has(self, point: str) -> bool:
        return point in self.done

    def add(self, point: str, params: Mapping[str, Any], st: Stats, suspect: bool = False) -> None:
        """Add (or replace) one point and persist the file."""
        row = {"point": point, **params, "median_s": st.median_s, "p25_s": st.p25_s,
               "p75_s": st.p75_s, "iqr_s": st.iqr_s, "mean_s": st.mean_s, "p10_s": st.p10_s,
               "n_samples": st.n_samples, "cpu_pressure": st.pressure, "suspect": suspect,
               **self.env}
        self.rows = [r for r in self.rows if r["point"] != point] + [row]
        self.done.add(point)
        self.flush()

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".parquet.tmp")
        keys = list(dict.fromkeys(k for r in self.rows for k in r))   # union, first-seen order
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in self.rows]), tmp)
        tmp.replace(self.path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of one measurements file; a one-line error if it is unreadable."""
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInputError("measurements", str(path), "a Parquet file written by "
                                "`complexity calibrate`", str(exc).splitlines()[0]) from None


class Progress:
    """Per measured point: a progress bar when a ``simulator.progress`` listener is on (the
    command line on a terminal), else one status line on stderr
    (``[gemm 3/40] m=512 ... 1.23 ms``, a log of what was measured); nothing if ``quiet``."""

    def __init__(self, bench: str, total: int, quiet: bool = False) -> None:
        self.bench, self.total, self.i, self.quiet = bench, total, 0, quiet
        self.bar = None

    def step(self, label: str, st: Stats | None) -> None:
        self.i += 1
        if self.quiet:
            return
        t = "resumed" if st is None else f"{st.median_s * 1e3:.3f} ms (IQR {st.iqr_s * 1e3:.3f})"
        if st is not None and st.pressure >= 0.01:
            t += f" [host CPU pressure {100 * st.pressure:.0f}%]"
        if progress.active():
            if self.bar is None:
                self.bar = progress.open_task(f"calibrate: {self.bench}", self.total)
            self.bar.note(f"{label}: {t}"[:60])
            self.bar.update(1)
            if self.i >= self.total:
                self.bar.close()
            return
        print(f"[{self.bench} {self.i}/{self.total}] {label}: {t}", file=sys.stderr, flush=True)
