"""Device discovery: NVIDIA GPUs through pynvml when present, otherwise this CPU.

No GPU is a normal case: ``discover()`` then says "no NVIDIA GPU found" and describes the
CPU (model, cores, the threads torch uses). Nothing here raises on a machine without
pynvml, torch or a GPU; torch and pynvml are imported lazily.
"""
from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML reports it (clocks in MHz, power in W, memory in bytes)."""

    index: int
    name: str
    mem_bytes: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    power_limit_w: float
    pcie_gen: int
    pcie_width: int
    nvlinks_active: int


@dataclass(frozen=True)
class DeviceInfo:
    """What this machine offers for calibration."""

    kind: str                                  # "cuda" or "cpu"
    name: str                                  # GPU name, or CPU model name
    cores: int                                 # logical CPUs
    torch_threads: int                         # 0 when torch is missing
    mem_bytes: float                           # host RAM (cpu) or GPU memory (cuda)
    gpus: tuple[GpuInfo, ...] = ()
    topology: tuple[tuple[str, ...], ...] = () # GPU-to-GPU link matrix ("NVLINK", "PCIE", ...)
    message: str = ""
    flags: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        """A hardware_db-style key: ``cpu-amd-epyc`` / ``cuda-nvidia-h100-80gb-hbm3``."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")[:48] or "unknown"
        return f"{self.kind}-{slug}"


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def host_mem_bytes() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return 0.0


def cpu_flags() -> tuple[str, ...]:
    """SIMD features that matter for matmul speed (avx2 / avx512* / amx*)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return tuple(sorted(f for f in line.split(":", 1)[1].split()
                                        if f.startswith(("avx2", "avx512", "amx"))))
    except OSError:
        pass
    return ()


def torch_threads() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.get_num_threads())


def _nvml_gpus() -> tuple[list[GpuInfo], list[tuple[str, ...]]] | None:
    """GPUs and the topology matrix from NVML, or None without pynvml / a GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:          # noqa: BLE001 - pynvml missing or no driver: not an error
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = [_gpu_info(pynvml, i, h) for i, h in enumerate(handles)]
        topo = [tuple(_topo(pynvml, a, b) if a is not b else "X" for b in handles)
                for a in handles]
        return (gpus, topo) if gpus else None
    except Exception:          # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:      # noqa: BLE001
            pass


def _safe(fn, default):
    try:
        return fn()
    except Exception:          # noqa: BLE001 - NVML queries unsupported on some SKUs
        return default


def _gpu_info(nv, index: int, h) -> GpuInfo:
    name = _safe(lambda: nv.nvmlDeviceGetName(h), "NVIDIA GPU")
    name = name.decode() if isinstance(name, bytes) else str(name)
    links = 0
    for link in range(18):
        links += int(_safe(lambda: nv.nvmlDeviceGetNvLinkState(h, link), 0) == 1)
    return GpuInfo(
        index=index, name=name,
        mem_bytes=float(_safe(lambda: nv.nvmlDeviceGetMemoryInfo(h).total, 0)),
        sm_clock_mhz=int(_safe(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM), 0)),
        mem_clock_mhz=int(_safe(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM), 0)),
        power_limit_w=float(_safe(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), 0)) / 1000.0,
        pcie_gen=int(_safe(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h), 0)),
        pcie_width=int(_safe(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h), 0)),
        nvlinks_active=links)


def _topo(nv, a, b) -> str:
    level = _safe(lambda: nv.nvmlDeviceGetTopologyCommonAncestor(a, b), None)
    names = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
    return names.get(level, "UNKNOWN") if level is not None else "UNKNOWN"


def discover() -> DeviceInfo:
    """Describe this machine; never raises."""
    cores, threads, mem = os.cpu_count() or 1, torch_threads(), host_mem_bytes()
    found = _nvml_gpus()
    if found:
        gpus, topo = found
        topo = [tuple("NVLINK" if gpus[i].nvlinks_active and t not in ("X",) and
                      gpus[j].nvlinks_active else t for j, t in enumerate(row))
                for i, row in enumerate(topo)]
        return DeviceInfo("cuda", gpus[0].name, cores, threads, gpus[0].mem_bytes,
                          tuple(gpus), tuple(topo), f"{len(gpus)} x {gpus[0].name}")
    name = cpu_model_name()
    msg = (f"no NVIDIA GPU found; calibrating the CPU: {name}, {cores} logical cores, "
           f"torch uses {threads or 'n/a (torch not installed)'} threads")
    return DeviceInfo("cpu", name, cores, threads, mem, message=msg, flags=cpu_flags())


def describe(info: DeviceInfo) -> str:
    """Human-readable summary (several lines)."""
    lines = [info.message]
    if info.kind == "cpu":
        lines.append(f"  memory {info.mem_bytes / 1e9:.1f} GB; SIMD: "
                     f"{' '.join(info.flags) or 'unknown'}")
    for g in info.gpus:
        lines.append(f"  GPU{g.index}: {g.name}, {g.mem_bytes / 1e9:.0f} GB, SM {g.sm_clock_mhz} "
                     f"MHz, mem {g.mem_clock_mhz} MHz, {g.power_limit_w:.0f} W, PCIe gen "
                     f"{g.pcie_gen} x{g.pcie_width}, {g.nvlinks_active} NVLinks up")
    if info.topology:
        lines.append("  topology: " + " | ".join(" ".join(r) for r in info.topology))
    return "\n".join(lines)
