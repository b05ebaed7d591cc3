"""Blackwell (B200 / GB200) GEMM model from Blackwell shape sweeps.

``hardware_db/data/measurements/gemm_sweeps.csv`` holds three public Blackwell sweeps
(line numbers count the header as line 1; its XLA ``sm_90`` rows are a held-out check of
the Hopper model, used by no fit):

- Tilebench's B200 ``torch.matmul`` rows (bf16 LLM shapes at K=4096, fp16 M=N=4096 with K
  1024..20480, two runs each): CUDA-graph replays with a 64 MB L2-evicting write before
  every call, which leaves the GPU at its burst clock (4096^3: 1572 TF), so no ceiling.
- pytorch/ao PR #2427's bf16 ``nn.Linear`` squares 1024..8192 (profiler kernel time, calls
  back to back): the large ones sit at the B200's sustained (power-limited, MSMF) rate
  (8192^3: 1420 TF against the MSMF 1424 TF, where Tilebench's burst rows reach 1650), read
  as power-limited and fitted with the measured ceiling applied (``GemmPoint.capped``).
  Fitted as burst rows instead, the result hardly moves (eff_max 0.682 both ways, floor 3.33
  instead of 3.17 us, held-out 5.7 % instead of 5.5 %).
- XLA's matmul performance table for ``sm_100`` (m, n, k 256..4096, bf16 and fp8, calls
  back to back, kernel chosen by XLA): not fitted. Its mid-size shapes run 10-15 % below
  the PyTorch/cuBLAS rows at the same shapes (2048^3: 986 TF vs 1130 in pytorch/ao), a
  kernel-selection difference; the fit is made from the PyTorch rows our users' frameworks
  run, and the XLA table is the held-out check, with its gap stated.

The model is the one every GPU family uses (``simulator.cost.kernels.gemm_time_core_s``:
tile/wave fill of the best cuBLAS tile over 148 SMs, persistent kernels, k-loop saturation,
a kernel floor, the level ``eff_max`` at boost clock, the sustained ceiling). What this
replaces: the Hopper fit's k_half and floor carried over as they were, and levels solved
from single best-shape rows, which put mid-size B200 GEMMs 25-40 % above every sweep.
"""
from __future__ import annotations

from typing import Sequence

from simulator.hardware.profile import Coefficient, GemmModel

from .csvrows import Row, cite, select
from .fit import GemmPoint, fit_gemm
from .reference_data import DATASHEET
from .reference_gemm import (
    BLACKWELL_MAMF,
    CUBLAS_TILES,
    FamilyFit,
    _bw,
    _same,
    _shape,
    _tf_point,
    blackwell_cap,
    mamf,
)

XLA_GPU = "sm_100 (B200 or GB200; not named)"


def _xla(rows: Sequence[Row], dtype: str) -> list[Row]:
    return select(rows, lambda d: d["gpu"] == XLA_GPU and d["dtype"] == dtype)


def _tilebench(rows: Sequence[Row]) -> list[Row]:
    return select(rows, lambda d: "Tilebench" in d["source"] and d["gpu"] == "B200")


def _timed_point(r: Row) -> GemmPoint:
    """A row whose value is a time in ms (Tilebench)."""
    m, n, k = _shape(r)
    return GemmPoint(m, n, k, float(r.data["value"]) * 1e-3, 2)


def ao_squares(rows: Sequence[Row]) -> list[Row]:
    """pytorch/ao #2427 bf16 squares (time in s): the held-out check, not fitted."""
    return select(rows, lambda d: "pytorch/ao" in d["source"])


def fit_blackwell_bf16(rows: Sequence[Row], kern: Sequence[Row], cap_tflops: float
                       ) -> FamilyFit:
    """B200 16-bit cuBLAS shape fit: Tilebench (burst clock), pytorch/ao squares (with the
    sustained ceiling ``cap_tflops`` applied) and the B200 MAMF best shape (burst)."""
    tb, ao = _tilebench(rows), ao_squares(rows)
    best = [mamf(kern, "B200 SXM", "bf16")]
    pts = ([_timed_point(r) for r in tb]
           + [GemmPoint(*_shape(r), float(r.data["value"]), 2, capped=True) for r in ao]
           + [_tf_point(best[0])])
    ds = DATASHEET["b200"]
    fit = fit_gemm(pts, ds.peak["bf16"], ds.sm_count, _bw("b200"), tiles=CUBLAS_TILES,
                   persistent=True, cap_tflops=cap_tflops)
    what = (f"{cite(tb)} (Tilebench B200 torch.matmul bf16/fp16, CUDA graphs with L2 "
            f"eviction: burst clock), {cite(ao)} (pytorch/ao #2427 bf16 squares, back to back, "
            f"with the B200 sustained ceiling {cap_tflops:.0f} TF applied) and {cite(best)} "
            f"(MAMF best shape); {ds.sm_count} SMs, peak {ds.peak['bf16']} TF [{ds.cite}]")
    return FamilyFit(fit, (*tb, *ao, *best), what, True)


def xla_check(rows: Sequence[Row], dtype: str, predict) -> tuple[float, float, int]:
    """(mean signed, mean absolute) % error of ``predict(m, n, k)`` (TFLOP/s) against the
    XLA sm_100 rows of ``dtype`` with every dimension >= 1024, and their count."""
    sel = [r for r in _xla(rows, dtype) if min(_shape(r)) >= 1024]
    e = [100.0 * (predict(*_shape(r)) / float(r.data["value"]) - 1) for r in sel]
    return sum(e) / len(e), sum(abs(x) for x in e) / len(e), len(e)


def blackwell_fits(rows: Sequence[Row], kern: Sequence[Row], extra: Sequence[Row],
                   refs) -> FamilyFit:
    cap = blackwell_cap("b200", "bf16", refs).value * DATASHEET["b200"].peak["bf16"]
    return fit_blackwell_bf16(rows, kern, cap)


def _coef(ff: FamilyFit, name: str, unit: str, key: str) -> Coefficient:
    c = ff.fit.coefficient(name, unit, ff.src("b200"))
    if key == "b200":
        return c
    return Coefficient(c.value, unit, f"transferred from B200 (same Blackwell GPU, higher power "
                       f"limit; no {key} shape sweep): {c.source}", c.stderr, None)


def _level(ff: FamilyFit, dtype: str, key: str, refs) -> Coefficient:
    """The B200 bf16 level fitted to the sweeps, carried to another dtype / GPU by the ratio
    of MAMF best-shape rates (same tool, same search): the relative speed at like shapes."""
    c = ff.fit.coefficient("eff_max", "fraction", ff.src("b200"))
    if (key, dtype) in (("b200", "bf16"), ("b200", "fp16")):
        return c
    own, b = mamf(refs.kern, BLACKWELL_MAMF[key], dtype), mamf(refs.kern, "B200 SXM", "bf16")
    tf = c.value * DATASHEET["b200"].peak["bf16"] * float(own.data["value"]) / float(b.data["value"])
    return Coefficient(tf / DATASHEET[key].peak[dtype], "fraction", (
        f"the B200 bf16 level fitted to the sweeps x the MAMF ratio {own.data['gpu']} "
        f"{dtype} {own.data['value']} TF / B200 bf16 {b.data['value']} TF "
        f"({cite([own, b])}); no {key} {dtype} shape sweep is fitted; {c.source}"), None, None)


def blackwell_gemm(key: str, refs) -> GemmModel:
    """B200/GB200 from the B200 shape fit: shape terms and kernel floor fitted on B200 and
    shared by fp8 and GB200, levels from the fit carried by MAMF ratios, ceilings from the
    B200 MSMF row."""
    f16 = refs.blackwell
    kh = _coef(f16, "k_half", "elements", key)
    kh8 = Coefficient(kh.value, "elements", f"fp8 = the 16-bit fit's k_half (no fp8 sweep "
                      f"of cuBLAS fitted): {kh.source}", kh.stderr, None)
    launch = Coefficient(f16.fit.values["launch_us"], "us", (
        "kernel floor (launch + ramp/tail of a GPU kernel, back to back) from "
        + _coef(f16, "launch_us", "us", key).source), f16.fit.stderr["launch_us"] or None)
    effs = {"bf16": _level(f16, "bf16", key, refs), "fp8": _level(f16, "fp8", key, refs)}
    effs["fp16"] = _same(effs["bf16"], "fp16 = bf16 (same tensor-core rate)")
    caps = {d: blackwell_cap(key, d, refs) for d in ("bf16", "fp8")}
    return GemmModel(eff_max=effs, k_half=kh, launch_us=launch, tile_m=128, tile_n=128,
                     tiles=CUBLAS_TILES, persistent=True, sustained_eff=caps,
                     k_half_dtype={"fp8": kh8})
