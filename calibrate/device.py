"""Where a microbenchmark runs and how it is timed: one code path for CPUs and GPUs.

Every benchmark takes a ``BenchDevice``: the torch device its tensors live on, the timer
that measures one call, and the size of the buffer that evicts the last-level cache (the
L3 of a CPU, the L2 of a GPU) before each timed call.

Timers (injectable, so the GPU branches are tested on a CPU with fakes):

- ``WallTimer``: ``time.perf_counter`` around the call, with an optional ``sync`` before
  and after (a CPU needs none);
- ``CudaEventTimer``: two CUDA events recorded around the call on the current stream, then
  ``end.synchronize()``: the device time between them, without the host's timer noise and
  without timing an asynchronous launch instead of its kernel. ``sync()`` is
  ``torch.cuda.synchronize``.

Clocks (``ClockLog``, pynvml optional): the SM clock, power and clock-event ("throttle")
reasons of one GPU, logged with every measured point; ``settle_clocks`` runs a sustained
bf16 GEMM first, so points are measured at the clock a GPU holds at its power limit, as a
training step runs (the reference profiles use that sustained level too:
``calibrate.reference.sustained``).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

MIB = 1024 ** 2
CPU_FLUSH_FACTOR = 3             # rewrite 3x the CPU's last-level cache ...
CPU_FLUSH_MAX_BYTES = 256 * MIB  # ... up to 256 MiB
GPU_FLUSH_FACTOR = 4             # rewrite 4x the GPU's L2 ...
GPU_FLUSH_MIN_BYTES = 256 * MIB  # ... and never less than 256 MiB (H100/H200 L2: 50-60 MB)
SETTLE_N = 8192                  # square bf16 GEMM that holds a GPU at its power limit


class Timer(Protocol):
    """Seconds one call of ``fn`` takes on the device (its kernels included)."""

    kind: str

    def sample(self, fn: Callable[[], Any]) -> float: ...

    def sync(self) -> None: ...


class WallTimer:
    """Wall clock around the call; ``sync`` (if any) runs before and after it."""

    kind = "wall"

    def __init__(self, sync: Callable[[], Any] | None = None) -> None:
        self._sync = sync

    def sync(self) -> None:
        if self._sync:
            self._sync()

    def sample(self, fn: Callable[[], Any]) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0


class CudaEventTimer:
    """CUDA events around the call (``elapsed_time`` is in milliseconds)."""

    kind = "cuda_event"

    def __init__(self, event_factory: Callable[[], Any] | None = None,
                 synchronize: Callable[[], Any] | None = None) -> None:
        if event_factory is None or synchronize is None:
            import torch
            event_factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
            synchronize = synchronize or torch.cuda.synchronize
        self._event, self._sync = event_factory, synchronize

    def sync(self) -> None:
        self._sync()

    def sample(self, fn: Callable[[], Any]) -> float:
        start, end = self._event(), self._event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e-3


@dataclass(frozen=True)
class BenchDevice:
    """A torch device to benchmark on, its timer and its cache-flush size."""

    kind: str                      # "cpu" or "cuda"
    index: int
    timer: Any                     # a Timer
    flush_bytes: int

    @property
    def name(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def torch(self) -> Any:
        import torch
        return torch.device(self.name)


def flush_bytes_for(kind: str, cache_bytes: float) -> int:
    """Bytes rewritten before each timed call to evict the last-level cache: 3x a CPU's L3
    (at most 256 MiB), 4x a GPU's L2 (at least 256 MiB)."""
    if kind == "cuda":
        return int(max(GPU_FLUSH_MIN_BYTES, GPU_FLUSH_FACTOR * cache_bytes))
    return int(min(CPU_FLUSH_FACTOR * cache_bytes, CPU_FLUSH_MAX_BYTES))


def llc_bytes() -> int:
    """The CPU's last-level cache size from sysfs (32 MiB if unknown)."""
    try:
        txt = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        mult = {"K": 1024, "M": 1024 ** 2}.get(txt[-1], 1)
        return int(txt.rstrip("KM")) * mult
    except (OSError, ValueError, IndexError):
        return 32 * 1024 ** 2


def cpu_device(llc: float | None = None) -> BenchDevice:
    """This CPU, wall-clock timing, flush sized from its L3."""
    return BenchDevice("cpu", 0, WallTimer(), flush_bytes_for("cpu", llc or llc_bytes()))


def cuda_device(index: int = 0, timer: Any = None) -> BenchDevice:
    """GPU ``index`` (made current) with CUDA-event timing, flush sized from its L2."""
    import torch
    torch.cuda.set_device(index)
    props = torch.cuda.get_device_properties(index)
    l2 = float(getattr(props, "L2_cache_size", 0) or 50e6)
    return BenchDevice("cuda", index, timer or CudaEventTimer(), flush_bytes_for("cuda", l2))


def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:          # noqa: BLE001 - no torch / broken driver: no CUDA here
        return False


# ---- clocks (pynvml, optional) ----------------------------------------------------------
CLOCK_EVENT_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap",
                    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal",
                    0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks"}
# Reasons that mean the GPU ran slower than its settled power-limited clock: a point
# measured under them is flagged suspect (sw_power_cap is the normal sustained state).
SLOWDOWN_REASONS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def reason_names(mask: int) -> tuple[str, ...]:
    """NVML clock-event bit mask -> names (``CLOCK_EVENT_BITS``)."""
    return tuple(name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit)


class ClockLog:
    """SM clock, power and clock-event reasons of one GPU through pynvml; every reading is
    empty (0 / "") where pynvml or the GPU is missing."""

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        self.nv, self.handle = None, None
        try:
            nv = nvml
            if nv is None:
                import pynvml as nv
            nv.nvmlInit()
            from .discover import visible_indices
            self.handle = nv.nvmlDeviceGetHandleByIndex(
                visible_indices(nv.nvmlDeviceGetCount())[index])
            self.nv = nv
        except Exception:      # noqa: BLE001 - no pynvml / no driver: clocks not logged
            self.nv = None

    def sample(self) -> dict[str, Any]:
        """``sm_clock_mhz``, ``power_w`` and ``clock_reasons`` (comma-separated names)."""
        if self.nv is None:
            return {"sm_clock_mhz": 0, "power_w": 0.0, "clock_reasons": ""}
        nv, h = self.nv, self.handle
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return {"sm_clock_mhz": int(_safe(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), 0)),
                "power_w": float(_safe(lambda: nv.nvmlDeviceGetPowerUsage(h), 0)) / 1000.0,
                "clock_reasons": ",".join(reason_names(int(_safe(lambda: reasons(h), 0))))}

    def driver(self) -> str:
        if self.nv is None:
            return ""
        v = _safe(self.nv.nvmlSystemGetDriverVersion, "")
        return v.decode() if isinstance(v, bytes) else str(v)


def slowed(sample: Mapping[str, Any]) -> bool:
    """Whether a clock sample shows thermal / hardware slowdown (not the normal power cap)."""
    return any(r in SLOWDOWN_REASONS for r in str(sample.get("clock_reasons", "")).split(","))


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:          # noqa: BLE001 - an NVML query unsupported on this SKU
        return default


def settle_clocks(dev: BenchDevice, seconds: float, log: ClockLog | None = None
                  ) -> dict[str, Any]:
    """Run back-to-back bf16 ``SETTLE_N``^3 GEMMs for ``seconds`` so the GPU reaches the
    clock it holds at its power limit; returns the clock sample at the end (empty on a
    CPU, where there is nothing to settle)."""
    if not dev.is_cuda or seconds <= 0:
        return {}
    import torch
    a = torch.randn(SETTLE_N, SETTLE_N, device=dev.torch(), dtype=torch.bfloat16)
    b = torch.randn(SETTLE_N, SETTLE_N, device=dev.torch(), dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            torch.mm(a, b)
        dev.timer.sync()
    return (log or ClockLog(dev.index)).sample()


# ---- naming the measured GPU --------------------------------------------------------------
def gpu_key_for(name: str, mem_bytes: float, keys: Sequence[str] | None = None
                ) -> str | None:
    """The ``hardware_db`` key of a GPU from the name NVML / torch report ("NVIDIA H200",
    "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"): the keys of its model family (the
    first token like ``h100``), PCIe parts only for a name saying PCIe, then the closest
    memory size. None when hardware_db does not list the model."""
    if keys is None:
        import hardware_db
        keys = hardware_db.list_gpus()
    low = re.sub(r"gaudi[\s_-]*(\d)", r"gaudi\1", name.lower())       # "Intel Gaudi 2"
    low = re.sub(r"\bhl-?([23])\d\d[a-z]*", r"gaudi\1", low)          # HL-225H, HL-325L
    fams = [t for t in re.split(r"[^a-z0-9]+", low)
            if re.fullmatch(r"(gb|gh|mi|gaudi|[a-z])\d+[a-z]*", t)]
    pcie = "pcie" in low
    for fam in fams:
        cands = [k for k in keys if k.split("-")[0] == fam and ("pcie" in k) == pcie]
        if cands:
            return min(cands, key=lambda k: abs(_key_mem_gb(k) - mem_bytes / 1e9)
                       if _key_mem_gb(k) else 0.0)
    return None


def _key_mem_gb(key: str) -> float:
    m = re.search(r"(\d+)gb", key)
    return float(m.group(1)) if m else 0.0
