"""GEMM model of Intel Gaudi 2 / Gaudi 3 reference profiles, from their own MAMF rows.

A Gaudi runs a matmul on its MMEs (matrix engines: 2 on Gaudi 2, 8 on Gaudi 3, each a
256x256 MAC array; stas00/ml-engineering compute/accelerator/README.md 'Intel Gaudi' table),
not on CUDA-style SMs, so the shape terms are its own, not carried from cuBLAS:

- ``wave``: output tiles of 256x256 (one MME's array) spread over the MMEs in waves
  (assumed: the graph compiler may reshape the array's geometry; a shape that is not a
  multiple of 256 loses what a 256x256 tile pads);
- ``k/(k + k_half)`` with ``k_half = 0`` (assumed): Gaudi 3's best shape in a brute-force
  search (M, N, K to 20480 in steps of 256, PR #118) has K = 768, which a k-loop loss of Hopper's size (about K/2 at that K) would not
  pick; so the per-tile prologue is taken as negligible;
- ``eff_max`` per dtype solved from that dtype's own MAMF row (kernels_extra.csv lines
  17-20) with the terms above held fixed: the model gives each row back at its shape;
- ``sustained`` (the power-limit ceiling): Gaudi 2's author saw the MME clock stay within
  1550-1650 MHz throughout the sweep (stas00/ml-engineering issue #115), so its ceiling is
  the row at the lowest of those clocks, 1550/1650 of it. Gaudi 3's author saw the clock
  drop during the bf16 run (PR #118), by how much is not said, and each best-shape timing
  is short (150 calls of ~83 us): it gets the same-tool MSMF/MAMF ratio measured on H200 and
  B200, transferred (assumed), as the AMD cards do.

Only best-shape rows exist for Gaudi, so ordinary training shapes (no sweep to fit) are
priced at the best shape's level less tile padding: likely optimistic for small or skinny
GEMMs. CSV line numbers count the header as line 1.
"""
from __future__ import annotations

from simulator.hardware.profile import Coefficient, GemmModel

from .csvrows import cite
from .reference_data import DATASHEET
from .reference_gemm import (
    GemmRefs,
    _same,
    fit_level,
    hopper_launch,
    mamf,
    transferred,
    transferred_cap,
)

GAUDI_GPUS = ("gaudi2", "gaudi3")
MME_TILE = (256, 256)
_ROW_GPU = {"gaudi2": "Intel Gaudi 2", "gaudi3": "Intel Gaudi 3"}
K_HALF_SRC = ("assumed 0 (no k-loop term): Gaudi 3's best bf16 shape in a brute-force search "
              "over M, N, K to 20480 in steps of 256 (stas00/ml-engineering PR #118) has "
              "K = 768 (kernels_extra.csv line 19), "
              "which a per-tile prologue of Hopper's size (k_half ~460, about 0.6x the rate at "
              "that K) would not let win")
# what the row's author reports of the MME clock during the run
ROW_CLOCK = {
    "gaudi2": "its author reports the MME clock within 1550-1650 MHz throughout the sweep "
              "(stas00/ml-engineering issue #115): a boost-clock row",
    "gaudi3": "its author watched the MME clock drop during the bf16 run, more than during "
              "fp8 (stas00/ml-engineering PR #118): a level between burst and sustained"}
# Gaudi 2: the lowest MME clock its author saw during the sweep, against the clock of its
# peak (issue #115; the README's MME table: 1650 MHz)
GAUDI2_CLOCK_FLOOR = (1550.0, 1650.0)


def _level(refs: GemmRefs, key: str, dtype: str, launch_us: float) -> Coefficient:
    row = mamf(refs.kern, _ROW_GPU[key], dtype, refs.extra)
    ds = DATASHEET[key]
    fit = fit_level([row], key, dtype, 0.0, launch_us, (MME_TILE,), False)
    return fit.coefficient("eff_max", "fraction", (
        f"solved from {cite([row])} ({row.data['gpu']} MAMF v2 {dtype} best shape "
        f"{row.data['value']} TF at {row.data['shape_MxNxK']}, {row.data['software']}; "
        f"{ds.sm_count} MMEs of 256x256 tiles, peak {ds.peak[dtype]} TF [{ds.cite}]) with "
        f"k_half 0 and launch {launch_us:.2f} us held fixed; a best-shape row at the MME clock "
        f"the card ran; {ROW_CLOCK[key]}"))


def _gaudi2_cap(refs: GemmRefs) -> Coefficient:
    """The bf16 row at the lowest MME clock its author saw (``GAUDI2_CLOCK_FLOOR``)."""
    row = mamf(refs.kern, _ROW_GPU["gaudi2"], "bf16", refs.extra)
    lo, hi = GAUDI2_CLOCK_FLOOR
    tf = float(row.data["value"]) * lo / hi
    return Coefficient(tf / DATASHEET["gaudi2"].peak["bf16"], "fraction", (
        f"the bf16 MAMF row ({cite([row])}, {row.data['value']} TF, 96.9 % of the 1650 MHz "
        f"peak) scaled to {lo:.0f} MHz, the lowest MME clock its author saw during the sweep "
        f"(stas00/ml-engineering issue #115: 'consistently within the range of 1550-1650 MHz "
        f"throughout the benchmark') = {tf:.0f} TF; no sustained-mode (MSMF) row"))


def gaudi_gemm(refs: GemmRefs, key: str) -> GemmModel:
    """Gaudi 2 / Gaudi 3: each dtype's level from its own MAMF row (module docstring)."""
    launch = transferred(hopper_launch(refs), key, "assumed: a graph-mode HPU op's fixed "
                         "cost taken as a CUDA kernel's")
    effs = {d: _level(refs, key, d, launch.value) for d in ("bf16", "fp8")}
    cap = _gaudi2_cap(refs) if key == "gaudi2" else \
        transferred_cap(refs, key, _ROW_GPU[key], refs.extra)
    sustained = {"bf16": cap, "fp8": _same(cap, "assumed: fp8 at the bf16 ceiling's fraction "
                                           "of its peak (no fp8 sustained row)")}
    return GemmModel(eff_max=effs, k_half=Coefficient(0.0, "elements", K_HALF_SRC),
                     launch_us=launch, tile_m=MME_TILE[0], tile_n=MME_TILE[1],
                     tiles=(MME_TILE,), persistent=False, sustained_eff=sustained)
