"""Synthetic traces in the Kineto schema (what ``torch.profiler.export_chrome_trace`` writes
and HTA / Perfetto read): complete events ``{"ph": "X", "cat", "name", "pid", "tid", "ts",
"dur", "args"}`` in microseconds; ``cpu_op`` with ``Input Dims`` / ``Input type`` /
``Concrete Inputs``; ``cuda_runtime`` launches and ``kernel`` events joined by
``args.correlation``; ``ProfilerStep#N`` annotations; ``distributedInfo``;
``deviceProperties``. Every duration is chosen by the test, so fitted and measured numbers
can be checked against the closed forms that generated them."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN = 100


@dataclass
class Trace:
    events: list[dict[str, Any]] = field(default_factory=list)
    t: float = 1000.0                      # cursor on the main thread (us)
    corr: int = 1
    gpu_t: float = 0.0                     # cursor of the compute stream (us)
    meta: dict[str, Any] = field(default_factory=dict)
    dist: dict[str, Any] | None = None
    gpu_name: str | None = None

    def x(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = MAIN,
          **args: Any) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
              "args": args}
        self.events.append(ev)
        return ev

    def leaf(self, name: str, dur: float, dims=(), types=(), gap: float = 0.0,
             wrappers: tuple[str, ...] = (), concrete=(), kernel_us: float = 0.0,
             dtype: str = "float") -> None:
        """``gap`` us of host time, then the wrappers (1 us of own time each, before the
        leaf), then the leaf of ``dur`` us (and, with ``kernel_us``, its kernel)."""
        self.t += gap
        depth = len(wrappers)
        for i, w in enumerate(wrappers):
            self.x(w, self.t + i, dur + 2 * (depth - i))
        ts = self.t + depth
        args = {"Input Dims": [list(d) for d in dims],
                "Input type": list(types) or [dtype] * len(dims)}
        if concrete:
            args["Concrete Inputs"] = list(concrete)
        self.x(name, ts, dur, **args)
        if kernel_us:
            self.launch(ts + 0.5, kernel_us)
        self.t += dur + 2 * depth

    def launch(self, ts: float, kernel_us: float, name: str = "sm80_gemm_kernel",
               stream: int = 7, **kargs: Any) -> None:
        c = self.corr
        self.corr += 1
        self.x("cudaLaunchKernel", ts, 0.3, cat="cuda_runtime", correlation=c)
        start = max(self.gpu_t, ts + 2.0)
        self.x(name, start, kernel_us, cat="kernel", tid=stream, stream=stream,
               correlation=c, **kargs)
        if stream == 7:
            self.gpu_t = start + kernel_us

    def step(self, i: int, start: float, end: float) -> None:
        self.x(f"ProfilerStep#{i}", start, end - start, cat="user_annotation")

    def data(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schemaVersion": 1, "traceEvents": list(self.events),
                             "deviceProperties": [{"name": self.gpu_name}] if self.gpu_name
                             else [], "displayTimeUnit": "ms"}
        if self.dist:
            d["distributedInfo"] = self.dist
        if self.meta:
            d["complexity"] = self.meta
        return d

    def write(self, path: Path) -> Path:
        text = json.dumps(self.data())
        if path.name.endswith(".gz"):
            with gzip.open(path, "wt") as fh:
                fh.write(text)
        else:
            path.write_text(text)
        return path
