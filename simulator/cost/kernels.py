"""Cost models: time of one op on one device, time of one collective over given links.

These closed forms are shared with ``calibrate.fit``: the fitters fit exactly these
functions, so a fitted coefficient means the same thing when the simulator uses it.
All times are seconds; sizes are bytes / FLOPs / elements as named.
"""
from __future__ import annotations

import math

from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec


# ---- compute ------------------------------------------------------------------------------
def wave_efficiency(m: int, n: int, tile_m: int, tile_n: int, sm_count: int) -> float:
    """Busy fraction of the SM waves needed for ``ceil(m/tile_m) * ceil(n/tile_n)`` tiles.

    Also charges partial tiles (m or n not a multiple of the tile) as wasted work.
    ``sm_count <= 0`` (unknown, or a CPU) disables quantization.
    """
    if sm_count <= 0 or tile_m <= 0 or tile_n <= 0:
        return 1.0
    tm, tn = math.ceil(m / tile_m), math.ceil(n / tile_n)
    tiles = tm * tn
    waves = math.ceil(tiles / sm_count)
    useful = (m * n) / (tm * tile_m * tn * tile_n)
    return useful * tiles / (waves * sm_count)


def gemm_time_core_s(m: float, n: float, k: float, bytes_moved: float, peak_flops: float,
                     eff_max: float, k_half: float, launch_s: float, wave: float,
                     mem_bw_bytes_per_s: float) -> float:
    """The GEMM formula on plain numbers (vectorisable by the fitters)."""
    flops = 2.0 * m * n * k
    k_sat = k / (k + k_half)
    t_compute = flops / (peak_flops * eff_max * wave * k_sat)
    t_memory = bytes_moved / mem_bw_bytes_per_s
    return launch_s + max(t_compute, t_memory)


def gemm_time_s(m: int, n: int, k: int, dtype: str, gpu: GPUSpec, prof: Profile,
                batch: int = 1) -> float:
    """Time of ``batch`` independent (m x k) @ (k x n) matmuls in ``dtype``."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    g = prof.gemm
    elem = 1 if dtype == "fp8" else (4 if dtype in ("fp32", "tf32") else 2)
    bytes_moved = batch * elem * (m * k + k * n + m * n)
    wave = wave_efficiency(m * batch, n, g.tile_m, g.tile_n, gpu.sm_count)
    return gemm_time_core_s(batch * m, n, k, bytes_moved, gpu.peak(dtype) * 1e12,
                            prof.gemm_eff(dtype), g.k_half.value, g.launch_us.value * 1e-6,
                            wave, gpu.mem_bw_gbytes_per_s * 1e9 * prof.memory.bw_eff.value)


def memory_time_s(bytes_moved: float, gpu: GPUSpec, prof: Profile, kernels: int = 1,
                  kind: str = "") -> float:
    """Bandwidth-bound work: ``kernels`` launches moving ``bytes_moved`` in total; ``kind``
    picks a per-kernel-family efficiency where the profile has one."""
    if bytes_moved <= 0:
        return 0.0
    bw = gpu.mem_bw_gbytes_per_s * 1e9 * prof.memory.eff(kind)
    return kernels * prof.memory.launch_us.value * 1e-6 + bytes_moved / bw


def attention_time_s(flops: float, dtype: str, backward: bool, gpu: GPUSpec,
                     prof: Profile, kernel: str = "flash") -> float:
    """Fused attention kernel time from its FLOPs and the profile's achieved fraction."""
    if flops <= 0:
        return 0.0
    eff = prof.attn_eff(dtype, backward, kernel)
    peak = gpu.peak("bf16" if dtype == "fp8" else dtype) * 1e12   # attention stays in 16-bit
    return prof.memory.launch_us.value * 1e-6 + flops / (peak * eff)


# ---- communication ------------------------------------------------------------------------


