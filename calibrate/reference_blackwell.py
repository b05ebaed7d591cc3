"""Blackwell (B200 / GB200) GEMM model from Blackwell shape sweeps.

``hardware_db/data/measurements/gemm_sweeps.csv`` holds three public Blackwell sweeps
(line numbers count the header as line 1; its XLA ``sm_90`` rows are a held-out check of
the Hopper model, used by no fit):

- Tilebench's B200 ``torch.matmul`` rows (bf16 LLM shapes at K=4096, fp16 M=N=4096 with K
  1024..20480, two runs each): CUDA-graph replays with a 64 MB L2-evicting write before
  every call, at the burst clock (4096^3: 1572 TF).
- pytorch/ao PR #2427's bf16 ``nn.Linear`` squares 1024..8192 (profiler kernel time, calls
  back to back). Their large sizes come out near the B200's sustained (MSMF) rate, but
  3072^3 and 6144^3 run above it, so they are not read as power-limited: fitted as they are.
- XLA's matmul performance table for ``sm_100`` (m, n, k 256..4096, bf16 and fp8, kernels
  chosen by XLA, kernel-tracer time): the only Blackwell sweep with K below 1024, so the
  only one that shows the k-loop ramp. Its mid-size rates run 10-15 % below the PyTorch
  rows at the same shapes (2048^3: 986 TF vs 1130 in pytorch/ao); fitted with a per-call
  floor of its own (harness ``xla``), that gap is the floor (5.2 us against 2.7 us), and a
  level of its own on top moves by 2 % (0.977 +/- 0.03), so the level is shared.

One fit per dtype of the model every GPU family uses (``simulator.cost.kernels.
gemm_time_core_s``: tile/wave fill of the best cuBLAS tile over 148 SMs, persistent kernels,
k-loop saturation, a kernel floor, the level ``eff_max`` at boost clock; the sustained
ceiling applies in the profile, not in the fit): bf16 on all three sweeps and the B200 MAMF
best shape; fp8 on the XLA fp8 table and the fp8 MAMF best shape, with the bf16 kernel floor
held. What this replaces: the Hopper fit's k_half and floor carried over as they were, and
levels solved from single best-shape rows, which put mid-size B200 GEMMs 37 % (bf16) and
64 % (fp8) above the XLA table.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from simulator.hardware.profile import Coefficient, GemmModel

from .csvrows import Row, cite, select
from .fit import GemmPoint, fit_gemm, harness_param
from .reference_data import DATASHEET
from .reference_gemm import (
    CUBLAS_TILES,
    FamilyFit,
    _bw,
    _same,
    _shape,
    _tf_point,
    blackwell_cap,
    blackwell_mamf,
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
    """pytorch/ao #2427 bf16 squares (time in s)."""
    return select(rows, lambda d: "pytorch/ao" in d["source"])


XLA = "xla"                     # the timing harness of XLA's table (its own per-call floor)


def _xla_points(rows: Sequence[Row], dtype: str) -> list[GemmPoint]:
    elem = 1 if dtype == "fp8" else 2
    return [GemmPoint.from_tflops(*_shape(r), float(r.data["value"]), elem, harness=XLA)
            for r in _xla(rows, dtype)]


def fit_blackwell(rows: Sequence[Row], kern: Sequence[Row], dtype: str,
                  launch_us: float | None = None) -> FamilyFit:
    """B200 shape fit of ``dtype``: bf16 on Tilebench, pytorch/ao, XLA's table (own floor)
    and the MAMF best shape; fp8 on XLA's fp8 table and the fp8 MAMF best shape with the
    bf16 fit's kernel floor ``launch_us`` held."""
    best = [mamf(kern, "B200 SXM", dtype)]
    xla = _xla(rows, dtype)
    pts = _xla_points(rows, dtype) + [_tf_point(best[0], 1 if dtype == "fp8" else 2)]
    used: list[Row] = [*xla, *best]
    if dtype == "bf16":
        tb, ao = _tilebench(rows), ao_squares(rows)
        pts += [_timed_point(r) for r in tb] + [GemmPoint(*_shape(r), float(r.data["value"]), 2)
                                               for r in ao]
        used += [*tb, *ao]
    ds = DATASHEET["b200"]
    fixed = {} if launch_us is None else {"launch_us": launch_us}
    fit = fit_gemm(pts, ds.peak[dtype], ds.sm_count, _bw("b200"), tiles=CUBLAS_TILES,
                   persistent=True, fixed=fixed)
    parts = [f"{cite(xla)} (XLA sm_100 {dtype} table, its own per-call floor "
             f"{fit.values[harness_param(XLA)]:.2f} us fitted separately)",
             f"{cite(best)} (MAMF {dtype} best shape)"]
    if dtype == "bf16":
        parts += [f"{cite(tb)} (Tilebench B200 torch.matmul bf16/fp16, CUDA graphs with L2 "
                  "eviction)", f"{cite(ao)} (pytorch/ao #2427 bf16 squares)"]
    else:
        parts += [f"kernel floor {launch_us:.2f} us held from the bf16 fit"]
    what = (", ".join(parts) + f"; {ds.sm_count} SMs, peak {ds.peak[dtype]} TF [{ds.cite}]")
    return FamilyFit(fit, tuple(used), what, True)


def blackwell_fits(rows: Sequence[Row], kern: Sequence[Row]) -> dict[str, FamilyFit]:
    f16 = fit_blackwell(rows, kern, "bf16")
    return {"bf16": f16,
            "fp8": fit_blackwell(rows, kern, "fp8", f16.fit.values["launch_us"])}


def xla_check(rows: Sequence[Row], dtype: str, predict, min_mn: int = 1024,
              min_k: int = 1024) -> tuple[float, float, int]:
    """(mean signed, mean absolute) % error of ``predict(m, n, k)`` (TFLOP/s) against the
    XLA sm_100 rows of ``dtype`` with m, n >= ``min_mn`` and k >= ``min_k``, and their count."""
    sel = [r for r in _xla(rows, dtype)
           if min(_shape(r)[:2]) >= min_mn and _shape(r)[2] >= min_k]
    e = [100.0 * (predict(*_shape(r)) / float(r.data["value"]) - 1) for r in sel]
    return sum(e) / len(e), sum(abs(x) for x in e) / len(e), len(e)


CARRY_WHY = {"gb200": "same Blackwell GPU, higher power limit",
             "b300": "Blackwell Ultra: the same SM generation with 160 SMs and a 1100 W limit",
             "gb300": "Blackwell Ultra (the B300 die) in NVL72 at 1400 W"}


def _carry(c: Coefficient, key: str) -> Coefficient:
    if key == "b200":
        return c
    return Coefficient(c.value, c.unit, f"transferred from B200 ({CARRY_WHY[key]}; no {key} "
                       f"shape sweep): {c.source}", c.stderr, None)


def _coef(ff: FamilyFit, name: str, unit: str, key: str) -> Coefficient:
    return _carry(ff.fit.coefficient(name, unit, ff.src("b200")), key)


def _level(fits: Mapping[str, FamilyFit], dtype: str, key: str, refs) -> Coefficient:
    """The B200 level of ``dtype`` fitted to the sweeps; on GB200 scaled by the ratio of the
    two GPUs' MAMF best-shape rates (same tool, same search) in that dtype."""
    c = fits[dtype].fit.coefficient("eff_max", "fraction", fits[dtype].src("b200"))
    if key == "b200":
        return c
    own, b = blackwell_mamf(refs.kern, key, dtype), mamf(refs.kern, "B200 SXM", dtype)
    tf = c.value * DATASHEET["b200"].peak[dtype] * float(own.data["value"]) / float(b.data["value"])
    die = (" (no gb300 row: the larger of its B300 die's and GB200's, the pessimistic side "
           "at 1400 W with 160 SMs)") if key == "gb300" else ""
    return Coefficient(tf / DATASHEET[key].peak[dtype], "fraction", (
        f"the B200 {dtype} level fitted to the sweeps x the MAMF ratio {own.data['gpu']} "
        f"{own.data['value']} TF / B200 {b.data['value']} TF ({cite([own, b])}){die}; no "
        f"{key} shape sweep; {c.source}"), None, None)


def blackwell_gemm(key: str, refs) -> GemmModel:
    """B200/GB200 from the B200 shape fits: k_half per dtype, the kernel floor and the
    levels fitted on B200 and carried to GB200 (levels by MAMF ratios), ceilings from the
    B200 MSMF row."""
    fits = refs.blackwell
    f16 = fits["bf16"]
    kh, kh8 = (_coef(fits[d], "k_half", "elements", key) for d in ("bf16", "fp8"))
    launch = Coefficient(f16.fit.values["launch_us"], "us", (
        "kernel floor (launch + ramp/tail of a GPU kernel, back to back) from "
        + _coef(f16, "launch_us", "us", key).source), f16.fit.err("launch_us"))
    effs = {"bf16": _level(fits, "bf16", key, refs), "fp8": _level(fits, "fp8", key, refs)}
    effs["fp16"] = _same(effs["bf16"], "fp16 = bf16 (same tensor-core rate)")
    caps = {d: blackwell_cap(key, d, refs) for d in ("bf16", "fp8")}
    return GemmModel(eff_max=effs, k_half=kh, launch_us=launch, tile_m=128, tile_n=128,
                     tiles=CUBLAS_TILES, persistent=True, sustained_eff=caps,
                     k_half_dtype={"fp8": kh8})
