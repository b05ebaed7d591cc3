"""Cost models: time of one op on one device, time of one collective over given links.

These closed forms are shared with ``calibrate.fit``: the fitters fit exactly these
functions, so a fitted coefficient means the same thing when the simulator uses it.
All times are seconds; sizes are bytes / FLOPs / elements as named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .hardware import GPUSpec
from .profile import LinkCoefficients, Profile


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
class Collective(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


def ring_steps_and_traffic(op: Collective, n: int, size_bytes: float) -> tuple[int, float]:
    """(sequential steps, bytes each rank sends) for a ring over ``n`` ranks.

    ``size_bytes`` is the full buffer (all-reduce input, all-gather output, reduce-scatter
    input, all-to-all send buffer per rank, send/recv message).
    """
    if op == Collective.SEND_RECV:
        return 1, size_bytes
    if n <= 1:
        return 0, 0.0
    frac = (n - 1) / n
    if op == Collective.ALL_REDUCE:
        return 2 * (n - 1), 2 * frac * size_bytes
    if op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        return n - 1, frac * size_bytes
    return n - 1, frac * size_bytes      # all-to-all: pairwise exchange, (n-1)/n leaves


def alpha_beta_time_s(steps: int, wire_bytes: float, link_bw_bytes_per_s: float,
                      hop_latency_s: float, c: LinkCoefficients, bw_scale: float = 1.0) -> float:
    """Faster of the small-message and large-message protocol regimes."""
    if steps == 0 or wire_bytes <= 0:
        return 0.0
    small = steps * (c.alpha_us.value * 1e-6 + hop_latency_s) \
        + wire_bytes / (link_bw_bytes_per_s * c.small_bw_eff.value * bw_scale)
    large = c.base_us.value * 1e-6 + steps * hop_latency_s \
        + wire_bytes / (link_bw_bytes_per_s * c.bw_eff.value * bw_scale)
    return min(small, large)


@dataclass(frozen=True)
class LinkUse:
    """The bottleneck link class a collective's ring crosses, as the topology reports it."""

    kind: str                         # LinkKind value, keys Profile.links
    bandwidth_gbytes_per_s: float     # per direction, available to one ring flow
    latency_us: float                 # datasheet one-hop latency


class Algorithm(str, Enum):
    AUTO = "auto"        # the fastest of those the fabric offers, as NCCL's tuner picks
    RING = "ring"
    TREE = "tree"        # double binary tree (all-reduce only)
    IN_SWITCH = "nvls"   # reduction inside the switch (NVLink SHARP), all-reduce only


def tree_steps_and_traffic(n: int, size_bytes: float) -> tuple[int, float]:
    """Double-binary-tree all-reduce: reduce up and broadcast down, ``2*ceil(log2 n)``
    sequential steps; each rank sends its buffer once up and once down (2 x size)."""
    if n <= 1:
        return 0, 0.0
    return 2 * math.ceil(math.log2(n)), 2.0 * size_bytes


def collective_time_s(op: Collective, n: int, size_bytes: float, link: LinkUse,
                      prof: Profile, in_switch: bool = False,
                      algorithm: Algorithm = Algorithm.AUTO) -> float:
    """Collective time over ``n`` ranks on the given bottleneck link.

    Ring for every collective; for all-reduce also the double binary tree (fewer steps,
    wins on small messages) and, where the fabric reduces in the switch (``in_switch``),
    NVLS. ``Algorithm.AUTO`` takes the fastest available.
    """
    c = prof.link(link.kind)
    bw, lat = link.bandwidth_gbytes_per_s * 1e9, link.latency_us * 1e-6
    steps, wire = ring_steps_and_traffic(op, n, size_bytes)
    ring = alpha_beta_time_s(steps, wire, bw, lat, c)
    if op != Collective.ALL_REDUCE or algorithm == Algorithm.RING:
        return ring
    options = {Algorithm.RING: ring}
    t_steps, t_wire = tree_steps_and_traffic(n, size_bytes)
    options[Algorithm.TREE] = alpha_beta_time_s(t_steps, t_wire, bw, lat, c)
    if in_switch and c.in_switch_speedup is not None:
        options[Algorithm.IN_SWITCH] = alpha_beta_time_s(steps, wire, bw, lat, c,
                                                         c.in_switch_speedup.value)
    if algorithm != Algorithm.AUTO:
        return options.get(algorithm, ring)
    return min(options.values())
