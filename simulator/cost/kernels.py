"""Cost models: time of one op on one device, time of one collective over given links.

These closed forms are shared with ``calibrate.fit``: the fitters fit exactly these
functions, so a fitted coefficient means the same thing when the simulator uses it.
All times are seconds; sizes are bytes / FLOPs / elements as named.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec


# ---- compute ------------------------------------------------------------------------------
def wave_efficiency(m: int, n: int, tile_m: int, tile_n: int, sm_count: int, groups: int = 1,
                    persistent: bool = False) -> float:
    """Useful fraction of the SM time the output tiles of ``groups`` independent
    ``m x n`` outputs occupy, with ``tile_m x tile_n`` tiles on ``sm_count`` SMs.

    Partial tiles (m or n not a multiple of the tile) are wasted work. A classic kernel runs
    the tiles in waves of ``sm_count`` and idles SMs in a partial last wave; a persistent
    (stream-K style) kernel splits the work evenly over the SMs, so it only loses when there
    are fewer tiles than SMs (``persistent``). ``sm_count <= 0`` (unknown, or a CPU) or a
    zero tile disables quantization.
    """
    if sm_count <= 0 or tile_m <= 0 or tile_n <= 0:
        return 1.0
    tm, tn = math.ceil(m / tile_m), math.ceil(n / tile_n)
    tiles = groups * tm * tn
    useful = (m * n) / (tm * tile_m * tn * tile_n)
    if persistent:
        return useful * min(1.0, tiles / sm_count)
    waves = math.ceil(tiles / sm_count)
    return useful * tiles / (waves * sm_count)


def tile_efficiency(m: int, n: int, tiles: Sequence[tuple[int, int]], sm_count: int,
                    groups: int = 1, persistent: bool = False) -> float:
    """Best ``wave_efficiency`` over the tile shapes a library picks from (cuBLAS's
    heuristics choose among several CTA tiles per shape)."""
    return max(wave_efficiency(m, n, tm, tn, sm_count, groups, persistent) for tm, tn in tiles)


def gemm_time_core_s(m: float, n: float, k: float, bytes_moved: float, peak_flops: float,
                     eff_max: float, k_half: float, launch_s: float, wave: float,
                     mem_bw_bytes_per_s: float, cap_flops: float = math.inf,
                     mn_half: float = 0.0, out_min: float = 0.0) -> float:
    """The GEMM formula on plain numbers (shared with the fitters).

    ``t = launch + max(flops / min(peak * eff_max * wave * k/(k + k_half) * s/(s + mn_half),
    cap), bytes / bw)``: the shape terms (tile/wave fill, k-loop saturation, output-panel
    saturation) set the rate at the boost clock; ``cap_flops`` is the rate the GPU sustains
    at its power limit (a ceiling, not a factor: shapes that do not reach it lose nothing to
    it). ``m`` counts the rows of all groups. ``s = out_min`` is the smaller output dimension
    of one group (elements): a blocked CPU GEMM packs each operand panel once and reuses it
    across the other output dimension, so a narrow output amortises the packing over fewer
    FLOPs (``GemmModel.mn_half``; 0 on GPUs, whose output shape is the tile/wave term).
    """
    flops = 2.0 * m * n * k
    k_sat = k / (k + k_half)
    if mn_half > 0.0:
        k_sat *= out_min / (out_min + mn_half)
    t_compute = flops / min(peak_flops * eff_max * wave * k_sat, cap_flops)
    t_memory = bytes_moved / mem_bw_bytes_per_s
    return launch_s + max(t_compute, t_memory)


def gemm_time_s(m: int, n: int, k: int, dtype: str, gpu: GPUSpec, prof: Profile,
                batch: int = 1, grouped: bool = False) -> float:
    """Time of ``batch`` independent (m x k) @ (k x n) matmuls in ``dtype`` run as one
    batched / grouped kernel (tiles of every group share the SMs; each group has its own
    weights, so weight bytes scale with ``batch``). ``grouped``: a grouped-GEMM kernel
    (variable rows per group, MoE experts), at ``GemmModel.grouped_for`` of the rate."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    g = prof.gemm
    elem = 1 if dtype == "fp8" else (4 if dtype in ("fp32", "tf32") else 2)
    bytes_moved = batch * elem * (m * k + k * n + m * n)
    wave = tile_efficiency(m, n, g.tile_shapes(), gpu.sm_count, batch, g.persistent)
    peak = gpu.peak(dtype) * 1e12
    f = g.grouped_for(dtype) if grouped else 1.0
    return gemm_time_core_s(batch * m, n, k, bytes_moved, peak, prof.gemm_eff(dtype) * f,
                            g.k_half_for(dtype), g.launch_us.value * 1e-6, wave,
                            gpu.mem_bw_gbytes_per_s * 1e9 * prof.memory.bw_eff.value,
                            peak * g.sustained_for(dtype) * f, g.mn_half_value(), min(m, n))


def memory_time_s(bytes_moved: float, gpu: GPUSpec, prof: Profile, kernels: int = 1,
                  kind: str = "") -> float:
    """Bandwidth-bound work: ``kernels`` launches moving ``bytes_moved`` in total; ``kind``
    picks a per-kernel-family efficiency where the profile has one."""
    if bytes_moved <= 0:
        return 0.0
    bw = gpu.mem_bw_gbytes_per_s * 1e9 * prof.memory.eff(kind)
    return kernels * prof.memory.launch_us.value * 1e-6 + bytes_moved / bw


# Rows per CTA of the fused attention kernels (16-bit inputs), the dimension their grid is
# cut along: FlashAttention-3 forward, queries: kBlockM 192 for head dim <= 96, else 128
# (hopper/tile_size.h tile_size_fwd_sm90); backward, keys: kBlockN 128 for head dim <= 128,
# 96 at 192, 80 at 256 (flash_bwd_launch_template.h run_mha_bwd_hdim64/128/192/256; grid
# ceil(seqlen_k / kBlockN) x query heads x batch, L176-179; Dao-AILab/flash-attention @
# 0251105a). FlashAttention-2's forward splits the keys across CTAs when its grid is short
# (csrc/flash_attn/flash_api.cpp set_params_splitkv, num_splits heuristic without dropout),
# so only its backward is held to its grid. cuDNN's fused kernels publish no tile sizes:
# taken as FlashAttention-3's (assumed).


def attention_rows(backward: bool, head_dim: int) -> int:
    if backward:
        return 128 if head_dim <= 128 else (96 if head_dim <= 192 else 80)
    return 192 if 0 < head_dim <= 96 else 128


def attention_grid_fill(batch: int, seq_q: float, seq_k: float, head_dim: int,
                        backward: bool, causal: bool, kernel: str, sm_count: int,
                        grid_rows: int = 0) -> float:
    """Share of the SMs a fused attention kernel keeps busy when its grid cannot fill the
    GPU once: ``batch`` (micro-batch x local query heads) x row blocks of the queries
    (forward) or keys (backward) CTAs, one per SM (``attention_rows``; ``grid_rows`` where
    the call stands for two shapes, the slower one's rows in both directions). Blocks are
    counted fractionally (a partial block's CTA is as slow as a full one, but so is its work
    counted: more tokens never take less time). Without a causal mask every CTA has the same
    work, so ``min(1, CTAs / SMs)``; with one (``seq_q == seq_k``) block ``i`` of ``T`` does
    ``i + 1`` blocks of work (or ``T - i`` backward), and the kernel lasts as long as its
    longest CTA: ``min(1, total work / (SMs x T)) = min(1, batch (T + 1) / (2 SMs))``. Every
    point the efficiency curves were fitted to runs at least 512 CTAs (at least one full
    wave on every GPU), so they are untouched; the last wave's quantization of larger grids
    stays in the fitted curves. Context-parallel ring steps with few heads per GPU and short
    chunks are what falls below one wave. FlashAttention-2's forward (``flash``) is left
    alone: it splits the keys instead."""
    if sm_count <= 0 or batch <= 0 or kernel == "materialized":
        return 1.0
    if kernel == "flash" and not backward:
        return 1.0
    s = grid_rows or (seq_k if backward else seq_q)
    if s <= 0:
        return 1.0
    blocks = s / attention_rows(backward, head_dim)
    ctas = batch * ((blocks + 1) / 2.0 if causal else blocks)
    return min(1.0, ctas / sm_count)


def attention_time_s(flops: float, dtype: str, backward: bool, gpu: GPUSpec,
                     prof: Profile, kernel: str = "flash", seq_k: float = 0.0,
                     head_dim: int = 0, causal: bool = False, seq_q: float = 0.0,
                     batch: int = 0, grid_rows: int = 0) -> float:
    """Fused attention kernel time from its FLOPs (causal counted as half the square, the
    FlashAttention papers' convention) and the profile's achieved fraction of the 16-bit
    peak, which follows the key length ``seq_k``, ``head_dim`` and masking of the call where
    the profile has curves (``AttentionModel``).

    The curves are fitted to benchmark timings at the boost clock; under a training loop's
    sustained load the rate is held to the 16-bit GEMM's power-limited ceiling
    (``GemmModel.sustained_eff``, a measured MSMF), as a GEMM's is: a ceiling, so kernels
    below it lose nothing. Assumed: an attention kernel spends at least a GEMM's energy per
    tensor-core FLOP (its matmuls run on the same tensor cores, plus the softmax on top). It
    binds only where a curve exceeds the GEMM's sustained rate (Blackwell's cuDNN kernels).
    ``seq_q`` and ``batch`` (micro-batch x local heads), where given, scale the rate by
    ``attention_grid_fill``."""
    if flops <= 0:
        return 0.0
    d16 = "bf16" if dtype == "fp8" else dtype                      # attention stays in 16-bit
    eff = prof.attn_eff(dtype, backward, kernel, seq_k, head_dim, causal)
    peak = gpu.peak(d16) * 1e12
    rate = min(peak * eff, peak * prof.gemm.sustained_for(d16))
    rate *= attention_grid_fill(batch, seq_q, seq_k, head_dim, backward, causal, kernel,
                                gpu.sm_count, grid_rows)
    return prof.memory.launch_us.value * 1e-6 + flops / rate


# ---- communication ------------------------------------------------------------------------


