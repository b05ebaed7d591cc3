"""The reference GEMM models assembled: every family fit (``build_refs``) and the model of
each GPU (``gemm_for``) -- measured where a row exists, transferred (and said so) elsewhere.
The families themselves are in ``calibrate.reference_gemm`` (Hopper, A100, MI300X) and
``calibrate.reference_blackwell`` (B200/GB200)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from simulator.hardware.profile import GemmModel

from .csvrows import Row, load_rows
from .reference_blackwell import blackwell_fits, blackwell_gemm
from .reference_data import AMPERE_A100
from .reference_gaudi import GAUDI_GPUS, gaudi_gemm
from .reference_gemm import (
    BLACKWELL_MAMF,
    CUBLAS_TILES,
    GemmRefs,
    a100_gemm,
    fit_a100_16bit,
    ada_gemm,
    fit_hopper_bf16,
    h100_pcie_gemm,
    hopper_gemm,
    hopper_grouped,
    hopper_launch,
    mi300x_gemm,
    transferred,
)


def build_refs(kern: Sequence[Row], extra: Sequence[Row], more: Sequence[Row],
               blackwell: Sequence[Row] | None = None) -> GemmRefs:
    """Every family fit; ``blackwell``: the rows of ``gemm_sweeps.csv`` (read when not
    given)."""
    refs = GemmRefs(fit_hopper_bf16(kern, extra, more), fit_a100_16bit(kern, more), kern,
                    extra, more)
    rows = load_rows("gemm_sweeps.csv") if blackwell is None else blackwell
    return replace(refs, blackwell=blackwell_fits(rows, kern))



def gemm_for(key: str, refs: GemmRefs) -> GemmModel:
    """GemmModel per GPU: measured where a row exists, transferred (and said so) elsewhere."""
    launch = hopper_launch(refs)
    a100 = a100_gemm("a100-sxm-80gb", refs, transferred(launch, "A100"))
    if key.startswith(AMPERE_A100):
        return a100 if key == "a100-sxm-80gb" else a100_gemm(key, refs, a100.launch_us)
    if key in ("h100-sxm", "h200-sxm", "h800", "gh200"):
        g = hopper_gemm(key, refs)
    elif key in BLACKWELL_MAMF:
        g = blackwell_gemm(key, refs)
    elif key == "l40s":
        g = ada_gemm(refs, a100.launch_us, key)
    elif key == "h100-pcie":
        g = h100_pcie_gemm(refs)
    elif key in ("mi300x", "mi325x", "mi355x", "mi250x"):
        g = mi300x_gemm(refs, key)
    elif key in GAUDI_GPUS:
        g = gaudi_gemm(refs, key)
    else:                                          # V100: no GEMM row at all
        why = "V100"
        return GemmModel(eff_max={"fp16": transferred(a100.eff_max["bf16"], why),
                                  "fp32": transferred(a100.eff_max["fp32"], why)},
                         k_half=transferred(a100.k_half, why), launch_us=a100.launch_us,
                         tile_m=128, tile_n=128, tiles=CUBLAS_TILES, persistent=False,
                         sustained_eff={"fp16": transferred(a100.sustained_eff["bf16"], why)},
                         grouped_eff=a100.grouped_eff)
    effs = dict(g.eff_max)
    for d in ("tf32", "fp32"):
        effs[d] = transferred(a100.eff_max[d], key, f"{d}: only A100 rows")
    return GemmModel(eff_max=effs, k_half=g.k_half, launch_us=g.launch_us, tile_m=g.tile_m,
                     tile_n=g.tile_n, tiles=g.tiles, persistent=g.persistent,
                     sustained_eff=g.sustained_eff, k_half_dtype=g.k_half_dtype,
                     grouped_eff=g.grouped_eff or hopper_grouped(refs, key))
