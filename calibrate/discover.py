"""Device discovery: NVIDIA GPUs through pynvml (or torch.cuda where pynvml is missing),
otherwise this CPU.

No GPU is a normal case: ``discover()`` then says "no NVIDIA GPU found" and describes the
CPU (model, cores, the threads torch uses). ``discover_cpu()`` describes the CPU even on a
GPU host (``complexity calibrate --device cpu``: the profile names the device measured).
Only the GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible are listed (in torch's order); two
GPUs are "NVLINK" connected only where NVML reports NVLink peer-to-peer between them;
the SM count comes from torch. Nothing here raises on a machine without pynvml, torch or a
GPU; torch and pynvml are imported lazily.
"""
from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field, replace


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
    sm_count: int = 0


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
    driver: str = ""                           # NVIDIA driver version ("" unknown / CPU)

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


def visible_indices(count: int, visible: str | None = None) -> list[int]:
    """NVML indices of the GPUs torch sees, in torch's order (``CUDA_VISIBLE_DEVICES`` as
    integers; UUIDs or unset: all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return list(range(count))
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in ids):
        return list(range(count))
    out = []
    for v in ids:               # CUDA stops at the first invalid entry
        if int(v) >= count or int(v) in out:
            break
        out.append(int(v))
    return out


def _nvml_gpus() -> tuple[list[GpuInfo], list[tuple[str, ...]], str] | None:
    """Visible GPUs, their link matrix and the driver version from NVML, or None without
    pynvml / a GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:          # noqa: BLE001 - pynvml missing or no driver: not an error
        return None
    try:
        idx = visible_indices(pynvml.nvmlDeviceGetCount())
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in idx]
        sms = _torch_sm_counts(len(handles))
        gpus = [replace(_gpu_info(pynvml, i, h), sm_count=sms[i]) for i, h in enumerate(handles)]
        topo = [tuple("X" if i == j else _link(pynvml, a, b) for j, b in enumerate(handles))
                for i, a in enumerate(handles)]
        driver = _safe(pynvml.nvmlSystemGetDriverVersion, "")
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        return (gpus, topo, driver) if gpus else None
    except Exception:          # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:      # noqa: BLE001
            pass


def _torch_sm_counts(n: int) -> list[int]:
    """SMs of torch's GPUs 0..n-1 (0 where torch or CUDA is missing)."""
    try:
        import torch
        if torch.cuda.is_available():
            return [int(torch.cuda.get_device_properties(i).multi_processor_count)
                    if i < torch.cuda.device_count() else 0 for i in range(n)]
    except Exception:          # noqa: BLE001
        pass
    return [0] * n


def _torch_gpus() -> list[GpuInfo]:
    """GPUs as torch.cuda sees them (no pynvml): name, memory, SMs; clocks unknown."""
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except Exception:          # noqa: BLE001 - broken driver: no GPU
        return []
    return [GpuInfo(i, p.name, float(p.total_memory), 0, 0, 0.0, 0, 0, 0,
                    int(p.multi_processor_count)) for i, p in enumerate(props)]


def _link(nv, a, b) -> str:
    """"NVLINK" where NVML reports NVLink peer-to-peer between the two, else the PCIe
    topology level."""
    ok = _safe(lambda: nv.nvmlDeviceGetP2PStatus(a, b, nv.NVML_P2P_CAPS_INDEX_NVLINK), None)
    if ok is not None and ok == getattr(nv, "NVML_P2P_STATUS_OK", 0):
        return "NVLINK"
    return _topo(nv, a, b)


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
    """Describe this machine: its visible NVIDIA GPUs, else its CPU; never raises."""
    cores, threads = os.cpu_count() or 1, torch_threads()
    found = _nvml_gpus()
    if found is None and _torch_gpus():
        found = (_torch_gpus(), [], "")
    if found:
        gpus, topo, driver = found
        how = "" if topo or len(gpus) == 1 else " (pynvml missing: clocks and links unknown)"
        return DeviceInfo("cuda", gpus[0].name, cores, threads, gpus[0].mem_bytes,
                          tuple(gpus), tuple(tuple(r) for r in topo),
                          f"{len(gpus)} x {gpus[0].name}{how}", driver=driver)
    return discover_cpu("no NVIDIA GPU found; ")


def discover_cpu(prefix: str = "") -> DeviceInfo:
    """This host's CPU (model, cores, the threads torch uses), whatever GPUs it has."""
    cores, threads, mem, name = os.cpu_count() or 1, torch_threads(), host_mem_bytes(), \
        cpu_model_name()
    msg = (f"{prefix}calibrating the CPU: {name}, {cores} logical cores, "
           f"torch uses {threads or 'n/a (torch not installed)'} threads")
    return DeviceInfo("cpu", name, cores, threads, mem, message=msg, flags=cpu_flags())


def describe(info: DeviceInfo) -> str:
    """Human-readable summary (several lines)."""
    lines = [info.message]
    if info.kind == "cpu":
        lines.append(f"  memory {info.mem_bytes / 1e9:.1f} GB; SIMD: "
                     f"{' '.join(info.flags) or 'unknown'}")
    for g in info.gpus:
        lines.append(f"  GPU{g.index}: {g.name}, {g.mem_bytes / 1e9:.0f} GB, {g.sm_count} SMs, "
                     f"SM clock max {g.sm_clock_mhz} "
                     f"MHz, mem {g.mem_clock_mhz} MHz, {g.power_limit_w:.0f} W, PCIe gen "
                     f"{g.pcie_gen} x{g.pcie_width}, {g.nvlinks_active} NVLinks up")
    if info.driver:
        lines.append(f"  NVIDIA driver {info.driver}")
    if info.topology:
        lines.append("  topology: " + " | ".join(" ".join(r) for r in info.topology))
    return "\n".join(lines)
