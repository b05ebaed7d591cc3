"""Reference calibration profiles for GPUs we cannot measure here.

``python -m calibrate.reference`` rebuilds ``hardware_db/data/profiles/<gpu>.json`` from the
public microbenchmark rows in ``hardware_db/data/measurements/*.csv`` (copies of
``shared/validation/kernels.csv`` / ``collectives.csv`` plus ``kernels_extra.csv``) and the
datasheet peaks below (from ``shared/hardware/gpus.csv`` / ``links.csv``; same values as
``hardware_db/data/gpus.json``). Every coefficient names the CSV lines it came from, or says
"assumed"/"transferred". Output is deterministic on one machine and reproducible within
each coefficient's standard error across machines (``calibrate.profile_io``).

CSV line numbers count the header as line 1 (``sed -n Np`` shows line N).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    LinkCoefficients,
    MemoryModel,
    Profile,
)

from . import reference_links as L
from .csvrows import Row, cite, load_rows, select
from .fit import FitResult, GemmPoint, fit_gemm
from .profile_io import write_profile
from .reference_data import ATTENTION, DATASHEET, LAUNCH_SRC, LAUNCH_US, Datasheet
from .reference_host import host_for

REPO = Path(__file__).resolve().parent.parent
PROFILE_DIR = REPO / "hardware_db" / "data" / "profiles"
GPU_KEYS = ("v100-sxm-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h200-sxm", "b200",
            "gb200", "mi300x")
FINGERPRINT = {"built_from": "hardware_db/data/measurements/*.csv",
               "builder": "calibrate.reference"}
TILE = 128
# Hopper/Blackwell cuBLAS runs persistent (stream-K style) kernels that largely avoid the
# last-wave quantization the A100 sweep shows: under a 128x128 wave model the H100 and
# H200 fp8 MAMF best shapes solve to inconsistent efficiencies (0.84 vs 0.96), without it
# they agree. tile 0 disables wave quantization in cost.kernels.wave_efficiency.
PERSISTENT_KERNEL_GPUS = ("h100-sxm", "h200-sxm", "b200", "gb200")


def tile_for(key: str) -> int:
    return 0 if key in PERSISTENT_KERNEL_GPUS else TILE


def _shape(r: Row) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in r.data["shape_MxNxK"].split("x"))
    return m, n, k


def _gemm_points(rows: Sequence[Row], elem_bytes: int) -> list[GemmPoint]:
    return [GemmPoint.from_tflops(*_shape(r), float(r.data["value"]), elem_bytes) for r in rows]


# ---- GEMM --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmRef:
    """A100 sweep fit shared (transferred) with the other GPUs."""

    eff: Mapping[str, Coefficient]
    k_half: Coefficient
    launch_us: Coefficient
    fits: Mapping[str, FitResult]
    # where ``k_half`` came from, as the solved efficiencies cite it
    k_half_note: str = "k_half from the A100 sweep fit"

    def fixed_note(self) -> str:
        """Provenance of the fixed ``k_half`` and ``launch_us`` a level is solved with."""
        return (f"solved with {self.k_half_note} ({self.k_half.value:.0f}) and launch_us "
                f"{self.launch_us.value:g} us ({self.launch_us.source.split(':')[0]})")


def _a100_sweep(kern: Sequence[Row], dtype_prefix: str) -> list[Row]:
    return select(kern, lambda d: "CUDA 11 Features" in d["source"]
                  and d["dtype"].startswith(dtype_prefix))


def fit_a100_gemm(kern: Sequence[Row]) -> GemmRef:
    """bf16 sweep -> eff_max, k_half (launch fixed); tf32 sweep and SGEMM row -> eff_max."""
    ds = DATASHEET["a100-sxm-40gb"]
    mem_bw = ds.mem_bw_gbytes_per_s * MEMORY_BW_EFF
    bf = _a100_sweep(kern, "bf16")
    f_bf = fit_gemm(_gemm_points(bf, 2), ds.peak["bf16"], ds.sm_count, mem_bw, TILE, TILE,
                    fixed={"launch_us": LAUNCH_US})
    src = (f"fit of cost.kernels.gemm_time_core_s (tile {TILE}x{TILE}, {ds.sm_count} SMs, "
           f"peak {ds.peak['bf16']} TF [{ds.cite}]) to {cite(bf)} (NVIDIA CUDA 11 blog Fig. 6, "
           f"A100 bf16 square GEMM sweep, digitized)")
    fixed = {"k_half": f_bf.values["k_half"], "launch_us": LAUNCH_US}
    tf = _a100_sweep(kern, "tf32")
    f_tf = fit_gemm(_gemm_points(tf, 4), ds.peak["tf32"], ds.sm_count, mem_bw, TILE, TILE,
                    fixed=fixed)
    sg = _a100_sweep(kern, "fp32")
    f_sg = fit_gemm(_gemm_points(sg, 4), ds.peak["fp32"], ds.sm_count, mem_bw, TILE, TILE,
                    fixed=fixed)
    kh_src = "k_half from the bf16 fit"
    shape_ref = GemmRef(eff={}, k_half=f_bf.coefficient("k_half", "elements", src),
                        launch_us=Coefficient(LAUNCH_US, "us", LAUNCH_SRC), fits={})
    bf16 = realistic(solve_eff(_mamf(kern, "A100 SXM", "bf16"), ds, "bf16", shape_ref,
                               "MAMF bf16 best shape, A100 SXM"))
    level_note = ("; level from the MAMF row, not the 2020 blog sweep (whose digitized top, "
                  f"{f_bf.values['eff_max']:.3f} eff_max, exceeds the exhaustive MAMF search on a "
                  "current stack); the blog sweep gives the shape (k_half)")
    eff = {
        "bf16": Coefficient(bf16.value, bf16.unit, bf16.source + level_note, bf16.stderr),
        "fp16": Coefficient(bf16.value, bf16.unit, bf16.source + level_note + "; fp16 = bf16 "
                            "(the blog's FP16 series is within ~3% of BF16, kernels.csv notes)"),
        "tf32": f_tf.coefficient("eff_max", "fraction", f"fit to {cite(tf)} (TF32 series, "
                                 f"peak {ds.peak['tf32']} TF); {kh_src}"),
        "fp32": f_sg.coefficient("eff_max", "fraction", f"solved from {cite(sg)} (SGEMM "
                                 f"8192^3, 18 TF of {ds.peak['fp32']}); {kh_src}"),
    }
    return GemmRef(eff=eff, k_half=f_bf.coefficient("k_half", "elements", src),
                   launch_us=Coefficient(LAUNCH_US, "us", LAUNCH_SRC),
                   fits={"bf16": f_bf, "tf32": f_tf})


def solve_eff(row: Row, ds: Datasheet, dtype: str, ref: GemmRef, what: str,
              tile: int = TILE) -> Coefficient:
    """eff_max from one best-shape row with k_half/launch transferred from the A100 fit."""
    elem = 1 if dtype == "fp8" else 2
    fixed = {"k_half": ref.k_half.value, "launch_us": ref.launch_us.value}
    fit = fit_gemm(_gemm_points([row], elem), ds.peak[dtype], ds.sm_count,
                   ds.mem_bw_gbytes_per_s * MEMORY_BW_EFF, tile, tile, fixed=fixed)
    m, n, k = _shape(row)
    src = (f"solved from {cite([row])} ({what}: {row.data['value']} TF at {m}x{n}x{k}, "
           f"{ds.sm_count} SMs, peak {ds.peak[dtype]} TF [{ds.cite}]); {ref.fixed_note()}; "
           f"a best-shape (MAMF) row, so an upper bound"
           + ("; wave quantization off (persistent kernels)" if tile == 0 else ""))
    return fit.coefficient("eff_max", "fraction", src)


def solve_gh100_fp8(kern: Sequence[Row], ds: Datasheet, ref: GemmRef) -> Coefficient:
    """fp8 eff_max from the H100 and H200 MAMF rows jointly (same GH100 compute die).

    Solved one at a time under a 128x128 wave model they give 0.84 and 0.96: that model
    charges the H200 best shape (1280x4096, 320 tiles on 132 SMs) 19% for quantization that
    cuBLAS's persistent Hopper kernels largely avoid, so Hopper fits run without wave
    quantization (``PERSISTENT_KERNEL_GPUS``), where the two rows agree.
    """
    rows = [_mamf(kern, g, "fp8") for g in ("H100 SXM", "H200 SXM")]
    fixed = {"k_half": ref.k_half.value, "launch_us": ref.launch_us.value}
    fit = fit_gemm(_gemm_points(rows, 1), ds.peak["fp8"], ds.sm_count,
                   ds.mem_bw_gbytes_per_s * MEMORY_BW_EFF, 0, 0, fixed=fixed)
    shapes = "; ".join(f"{r.data['gpu']} {r.data['value']} TF at {r.data['shape_MxNxK']}"
                       for r in rows)
    src = (f"joint fit to {cite(rows)} (MAMF fp8 e4m3 best shapes: {shapes}; {ds.sm_count} "
           f"SMs, peak {ds.peak['fp8']} TF [{ds.cite}]); {ref.fixed_note()}; best-shape rows, "
           "so an upper bound")
    return fit.coefficient("eff_max", "fraction", src)


REALISTIC_TF, BEST_TF = 720.0, 794.5
REALISTIC_SRC = (f"x {REALISTIC_TF / BEST_TF:.4f} realistic-shape factor: shared/hardware/nodes.md "
                 f"§3 'Sustained BF16 GEMM: H100 about {REALISTIC_TF:g} TF realistic shapes "
                 f"(SemiAnalysis)' over the H100 MAMF best shape {BEST_TF} TF (kernels.csv line 4). "
                 "MAMF rows are exhaustive best-shape maxima; transformer GEMMs are not tuned to "
                 "the best shape, and this is the one published realistic/best pair, so it is "
                 "applied to every best-shape row (transferred to other GPUs)")


def realistic(c: Coefficient) -> Coefficient:
    """A best-shape (MAMF) efficiency scaled to realistic transformer shapes."""
    f = REALISTIC_TF / BEST_TF
    return Coefficient(c.value * f, c.unit, f"{c.source}; {REALISTIC_SRC}",
                       c.stderr * f if c.stderr else c.stderr, c.heldout_error_pct)


# Sustained (power-limited) GEMM level: MSMF rows (kernels_extra.csv) over the MAMF row the
# level is solved from. Per profile key and dtype: (MSMF gpu label, MAMF gpu label, why).
SUSTAINED = {
    ("h100-sxm", "bf16"): ("H200 SXM", "H100 SXM", ("MSMF measured on H200 (same GH100 "
                           "compute die, same 700 W limit and bf16 peak as H100 SXM); the MAMF "
                           "author files H200 bf16 under the H100 row")),
    ("h100-sxm", "fp8"): ("H200 SXM", "H200 SXM", ("MSMF measured on H200 (same GH100 die and "
                          "700 W limit)")),
    ("h200-sxm", "bf16"): ("H200 SXM", "H100 SXM", ("the MAMF author files H200 bf16 under "
                           "the H100 row")),
    ("h200-sxm", "fp8"): ("H200 SXM", "H200 SXM", ""),
    ("b200", "bf16"): ("B200 SXM", "B200 SXM", ""),
    ("b200", "fp8"): ("B200 SXM", "B200 SXM", "assumed: the bf16 ratio (no B200 fp8 MSMF row)"),
    ("gb200", "bf16"): ("B200 SXM", "B200 SXM", ("assumed: the B200 ratio (no GB200 MSMF row; "
                        "GB200's 1200 W limit leaves more clock headroom, so this is the "
                        "pessimistic side)")),
    ("gb200", "fp8"): ("B200 SXM", "B200 SXM", "assumed: the B200 bf16 ratio (no GB200 MSMF row)"),
}


def sustained(c: Coefficient, key: str, dtype: str, kern: Sequence[Row],
              extra: Sequence[Row]) -> Coefficient:
    """Scale a MAMF-derived level to the clock a GPU holds at its power limit.

    MAMF rows time short runs of each shape; a training step is minutes of back-to-back
    matmuls at the power limit, where the SM clock settles lower (MSMF, the same tool's
    sustained mode). Where no MSMF row exists (A100, V100, MI300X) the level stays as
    measured and the profile says so.
    """
    spec = SUSTAINED.get((key, dtype))
    if spec is None:
        return c
    msmf_gpu, mamf_gpu, why = spec
    def msmf_rows(row_dtype: str) -> list[Row]:
        return [r for r in extra if "sustainable" in r.data["metric"]
                and r.data["gpu"] == msmf_gpu and r.data["dtype"].startswith(row_dtype)]
    row_dtype = "fp8" if dtype == "fp8" else "bf16"
    msmf = msmf_rows(row_dtype)
    if not msmf:                  # no row for this dtype: the bf16 ratio (SUSTAINED says so)
        row_dtype = "bf16"
        msmf = msmf_rows(row_dtype)
    mamf = _mamf(kern, mamf_gpu, row_dtype, extra)
    f = float(msmf[0].data["value"]) / float(mamf.data["value"])
    src = (f"{c.source}; x {f:.4f} sustained-clock factor: MSMF {msmf[0].data['value']} TF "
           f"({msmf_gpu} {msmf[0].data['dtype']}, {cite(msmf)}, stas00 mamf-finder sustained "
           f"mode) over the MAMF row's {mamf.data['value']} TF ({cite([mamf])})"
           + (f"; a ratio of runs on two GPUs (MSMF on {msmf_gpu}, MAMF row labelled "
              f"{mamf_gpu})" if msmf_gpu != mamf_gpu else "")
           + (f"; {why}" if why else "")
           + "; the SemiAnalysis realistic-shape figure does not say how long it ran, so if it "
             "was already at settled clocks the two factors overlap")
    return Coefficient(c.value * f, c.unit, src, c.stderr * f if c.stderr else c.stderr,
                       c.heldout_error_pct)


def _mamf(kern: Sequence[Row], gpu: str, dtype: str, file_rows: Sequence[Row] = ()) -> Row:
    rows = [r for r in [*kern, *file_rows] if "mamf" in r.data["source"].lower()
            and "sustainable" not in r.data["metric"]
            and r.data["gpu"] == gpu and r.data["dtype"].startswith(dtype)]
    if len(rows) != 1:
        raise LookupError(f"expected one MAMF row for {gpu} {dtype}, found {len(rows)}")
    return rows[0]


def scaled_k_half(key: str, ref: GemmRef) -> GemmRef:
    """Transfer the A100 ``k_half`` to another GPU by datasheet ratios.

    ``k_half`` measures per-tile fixed work (prologue / epilogue, bound by memory traffic) in
    units of the k-loop: it grows with the SM's tensor rate and shrinks with its memory
    bandwidth, so ``k_half = k_half_A100 * (tensor/SM ratio) / (bandwidth/SM ratio)``.
    """
    if key.startswith("a100"):
        return ref
    kh = scaled_k_half_from(key, "a100-sxm-80gb", ref.k_half, label="A100 fit",
                            sheet="A100 SXM")
    return GemmRef(eff=ref.eff, k_half=kh, launch_us=ref.launch_us, fits=ref.fits,
                   k_half_note="k_half transferred from the A100 sweep fit by datasheet ratios")


def scaled_k_half_from(key: str, base_key: str, base: Coefficient, label: str = "",
                       sheet: str = "") -> Coefficient:
    """``k_half`` transferred from ``base_key`` by datasheet ratios (see ``scaled_k_half``);
    ``label`` / ``sheet`` name the base value and datasheet in the provenance."""
    label, sheet = label or base_key, sheet or base_key
    a, ds = DATASHEET[base_key], DATASHEET[key]
    pa = a.peak.get("bf16", a.peak.get("fp16"))
    peak = ds.peak.get("bf16", ds.peak.get("fp16"))
    tensor = (peak / ds.sm_count) / (pa / a.sm_count)
    mem = (ds.mem_bw_gbytes_per_s / ds.sm_count) / (a.mem_bw_gbytes_per_s / a.sm_count)
    src = (f"{label} value {base.value:.0f} x tensor-rate/SM ratio {tensor:.2f} / "
           f"memory-bandwidth/SM ratio {mem:.2f} ({key} vs {sheet} datasheets: {ds.cite}; "
           f"{a.cite}); {label}: {base.source}")
    return Coefficient(base.value * tensor / mem, "elements", src,
                       base.stderr * tensor / mem if base.stderr else None)


def fit_gh100_k_half(extra: Sequence[Row]) -> Coefficient:
    """``k_half`` of Hopper cuBLAS from a measured H100 shape sweep (kernels_extra.csv).

    As on A100, a sweep gives the shape of the curve and the MAMF row the level. Rows whose
    output has fewer 128x128 tiles than the GPU has SMs are left out: the persistent-kernel
    model (no wave quantization) has no term for idle SMs, so they would bias ``k_half``.
    """
    ds = DATASHEET["h100-sxm"]
    rows = [r for r in select(extra, lambda d: d["gpu"] == "H100 SXM"
                              and "triton-lang/triton" in d["source"])
            if math.ceil(_shape(r)[0] / TILE) * math.ceil(_shape(r)[1] / TILE) >= ds.sm_count]
    fit = fit_gemm(_gemm_points(rows, 2), ds.peak["fp16"], ds.sm_count,
                   ds.mem_bw_gbytes_per_s * MEMORY_BW_EFF, 0, 0, fixed={"launch_us": LAUNCH_US})
    shapes = ", ".join(f"{r.data['shape_MxNxK']} {float(r.data['value']):.0f} TF" for r in rows)
    src = (f"fit of cost.kernels.gemm_time_core_s (no wave quantization, {ds.sm_count} SMs, peak "
           f"{ds.peak['fp16']} TF [{ds.cite}], launch fixed at {LAUNCH_US:g} us) to {cite(rows)} "
           f"(H100 cuBLAS fp16 sweep, triton-lang/triton#2339, 2023: {shapes}; rows with fewer "
           f"output tiles than SMs excluded); the sweep's own level (eff_max "
           f"{fit.values['eff_max']:.3f}) is not used: the level comes from the MAMF row")
    return fit.coefficient("k_half", "elements", src)


def gemm_for(key: str, kern: Sequence[Row], extra: Sequence[Row], ref: GemmRef) -> GemmModel:
    """GemmModel per GPU: measured where a row exists, transferred (and said so) elsewhere.

    ``k_half``: measured on A100 (2020 blog sweep) and on H100 (cuBLAS sweep); H200 shares
    the H100 die; Blackwell transfers it from H100, the nearest measured architecture.
    """
    ds = DATASHEET[key]
    if key in ("h100-sxm", "h200-sxm", "b200", "gb200"):
        gh, note = fit_gh100_k_half(extra), "k_half from the H100 cuBLAS sweep fit"
        if key == "h200-sxm":
            gh = Coefficient(gh.value, gh.unit, "H200 = H100 compute (same GH100 die): "
                             + gh.source, gh.stderr)
            note += " (H200 shares the GH100 die)"
        elif key in ("b200", "gb200"):
            gh = scaled_k_half_from(key, "h100-sxm", gh)
            note = "k_half transferred from the H100 cuBLAS sweep fit by datasheet ratios"
        ref = GemmRef(eff=ref.eff, k_half=gh, launch_us=ref.launch_us, fits=ref.fits,
                      k_half_note=note)
    else:
        ref = scaled_k_half(key, ref)
    eff = dict(ref.eff)
    if key == "v100-sxm-32gb":
        eff = {d: _transfer(ref.eff[s], "V100 (no V100 GEMM microbenchmark row)")
               for d, s in (("fp16", "bf16"), ("fp32", "fp32"))}
    elif key in MAMF_ROWS:
        bf_gpu, fp8_gpu = MAMF_ROWS[key]
        bf = sustained(realistic(solve_eff(_mamf(kern, bf_gpu, "bf16", extra), ds, "bf16", ref,
                                           f"MAMF bf16 best shape, {bf_gpu}", tile_for(key))),
                       key, "bf16", kern, extra)
        eff = {"bf16": bf, "fp16": _same(bf, "fp16 = bf16 (same tensor-core rate)")}
        if key in ("h100-sxm", "h200-sxm"):
            eff["fp8"] = sustained(realistic(solve_gh100_fp8(kern, ds, ref)), key, "fp8", kern,
                                   extra)
        elif fp8_gpu:
            eff["fp8"] = sustained(realistic(solve_eff(_mamf(kern, fp8_gpu, "fp8"), ds, "fp8",
                                                       ref, f"MAMF fp8 e4m3 best shape, "
                                                       f"{fp8_gpu}", tile_for(key))),
                                   key, "fp8", kern, extra)
        else:
            eff["fp8"] = _same(bf, "assumed: fp8 eff = bf16 eff (no fp8 microbenchmark row)")
        for d in ("tf32", "fp32"):
            eff[d] = _transfer(ref.eff[d], f"{key} (no {d} microbenchmark row)")
    return GemmModel(eff_max=eff, k_half=ref.k_half, launch_us=ref.launch_us,
                     tile_m=tile_for(key), tile_n=tile_for(key))


def _transfer(c: Coefficient, why: str) -> Coefficient:
    return Coefficient(c.value, c.unit, f"transferred from A100 to {why}: {c.source}",
                       c.stderr, None)


def _same(c: Coefficient, why: str) -> Coefficient:
    return Coefficient(c.value, c.unit, f"{why}; {c.source}", c.stderr, c.heldout_error_pct)


# (bf16 MAMF gpu label, fp8 MAMF gpu label or "") per profile key
MAMF_ROWS = {"h100-sxm": ("H100 SXM", "H100 SXM"),
             "h200-sxm": ("H100 SXM", "H200 SXM"),      # author: "H200 is the same" (bf16)
             "b200": ("B200 SXM", "B200 SXM"), "gb200": ("GB200 SXM", "GB200 SXM"),
             "mi300x": ("AMD MI300X", "")}
MEMORY_BW_EFF = 2903.0 / 3350.0      # kernels.csv line 37, see memory_model()


# ---- memory and attention -----------------------------------------------------------------
def memory_model(kern: Sequence[Row], key: str) -> MemoryModel:
    """bw_eff from the H100 device-to-device copy row; other GPUs transfer it (said so)."""
    row = select(kern, lambda d: d["kernel"].startswith("GPU device-to-device copy"))[0]
    meas, peak = float(row.data["value"]), float(row.data["peak_spec"])
    src = (f"{cite([row])}: H100 SXM D2D copy {meas:g} GB/s of {peak:g} GB/s HBM3 peak "
           "(aigatech/vpbenchmarking, large copy so launch time negligible)")
    if key != "h100-sxm":
        src = f"transferred from H100 to {key} (no memory-bandwidth row for it): {src}"
    return MemoryModel(bw_eff=Coefficient(meas / peak, "fraction", src),
                       launch_us=Coefficient(LAUNCH_US, "us", LAUNCH_SRC))


def attention_model(key: str, gemm: GemmModel, a100_bf16_eff: float) -> AttentionModel:
    """Flash-attention fractions of the bf16 peak (published papers; see reference_data).

    Plain dtype keys hold FlashAttention-2-class kernels; ``flash3:<dtype>`` keys hold the
    Hopper-specific kernels (FA3 / cuDNN fused attention) where the GPU has them.
    """
    def pair(family: str, scale: float, why: str) -> tuple[Coefficient, Coefficient]:
        f, b = ATTENTION[family]["fwd"], ATTENTION[family]["bwd"]
        pre = f"{why}: " if why else ""
        return (Coefficient(f[0] * scale, "fraction", pre + f[1]),
                Coefficient(b[0] * scale, "fraction", pre + b[1]))
    fa3 = None
    if key.startswith("a100"):
        fwd, bwd = pair("a100", 1.0, "")
    elif key in ("h100-sxm", "h200-sxm"):
        why = "" if key == "h100-sxm" else "H200 = H100 compute (same GH100 die)"
        fwd, bwd = pair("h100", 1.0, why)
        fa3 = pair("h100-flash3", 1.0, why)
    elif key in ("b200", "gb200"):
        why = (f"assumed: {key} achieves the H100 fraction (no Blackwell attention "
               "microbenchmark in shared data)")
        fwd, bwd = pair("h100", 1.0, why)
        fa3 = pair("h100-flash3", 1.0, why)
    elif key == "v100-sxm-32gb":
        fwd, bwd = pair("a100", 0.7, "assumed: 0.7 x the A100 FlashAttention-2 fraction "
                        "(FlashAttention-2 does not support sm70; V100 runs non-flash or "
                        "memory-efficient kernels)")
    else:
        r = gemm.eff_max["bf16"].value / a100_bf16_eff
        fwd, bwd = pair("a100", r, f"assumed: A100 FlashAttention-2 fraction x {r:.3f} "
                        "(MI300X/A100 bf16 GEMM efficiency ratio; no MI300X attention row)")
    dtypes = ("fp16",) if key == "v100-sxm-32gb" else ("bf16", "fp16")
    f_map = {d: fwd for d in dtypes}
    b_map = {d: bwd for d in dtypes}
    if fa3:
        f_map.update({f"flash3:{d}": fa3[0] for d in dtypes})
        b_map.update({f"flash3:{d}": fa3[1] for d in dtypes})
    return AttentionModel(fwd_eff=f_map, bwd_eff=b_map)


# ---- links per GPU ------------------------------------------------------------------------
def links_for(key: str, coll: Sequence[Row]) -> tuple[dict[str, LinkCoefficients], dict]:
    """All link kinds a cluster of this GPU can use, plus the fits behind them."""
    a100 = L.nvlink_a100(coll)
    fits = {"nvlink_a100": a100.fit}
    if key in ("h100-sxm", "h200-sxm"):
        nv = L.nvlink_h200(coll)
        fits["nvlink_h200"] = nv.fit
    elif key in ("b200", "gb200"):
        b200 = L.nvlink_b200(coll, L.nvlink_h200(coll))
        fits["nvlink_b200"] = b200.fit
        nv = b200 if key == "b200" else L.nvlink_gb200(coll, b200)
    elif key == "v100-sxm-32gb":
        nv = L.nvlink_v100(coll, a100)
    else:
        nv = a100
    sharp = L.ib_sharp_speedup(coll) if key in ("h100-sxm", "h200-sxm") else None
    links = L.scale_out_links(coll, sharp)
    links["pcie"] = L.pcie(coll, a100)
    links["host"] = L.host_from(links["pcie"])
    if key == "mi300x":
        links["xgmi"] = L.xgmi_from(a100)
    else:
        links["nvlink"] = nv.coefs
    return links, fits


# ---- profiles -----------------------------------------------------------------------------
NOTES = {
    "h100-sxm": "GEMM level: MAMF best-shape row x realistic-shape factor (nodes.md §3, "
                "SemiAnalysis ~720 TF) x sustained-clock factor (MSMF on H200, same die); "
                "k_half from an H100 cuBLAS shape sweep.",
    "h200-sxm": "bf16 GEMM efficiency uses the H100 MAMF row (the MAMF author: 'H200 is the "
                "same'); fp8 uses the H200 row.",
    "gb200": "GB200 NVLink latency terms transferred from the B200 sweep.",
    "mi300x": "MI300X GEMM from the MAMF v2 table (kernels_extra.csv, TunableOp on); links and "
              "attention are assumptions (no RCCL / attention rows in shared data).",
    "v100-sxm-32gb": "No V100 GEMM or attention microbenchmark: A100 efficiencies transferred.",
    "a100-sxm-80gb": "No sustained-clock (MSMF) GEMM measurement is published for A100: the "
                     "level is the MAMF row's (short runs per shape), so it may be optimistic "
                     "where a long run settles at the 400 W limit.",
    "a100-sxm-40gb": "No sustained-clock (MSMF) GEMM measurement is published for A100: the "
                     "level is the MAMF row's (short runs per shape).",
}


def build_profile(key: str, kern: Sequence[Row], extra: Sequence[Row], coll: Sequence[Row],
                  ref: GemmRef) -> tuple[Profile, dict]:
    gemm = gemm_for(key, kern, extra, ref)
    links, fits = links_for(key, coll)
    prof = Profile(
        name=f"{key}-reference", device_key=key, gemm=gemm, memory=memory_model(kern, key),
        attention=attention_model(key, gemm, ref.eff["bf16"].value), links=links,
        overlap_slowdown=Coefficient(
            1.189, "multiplier",
            "Lee et al. 2025, 'Characterizing Compute-Communication Overlap in GPU-Accelerated "
            "Distributed Deep Learning' (arXiv:2507.03114): compute kernels overlapped with "
            "collectives run on average 18.9% slower (max 40%) across A100, H100, MI250, MI210 "
            "with GPT and LLaMA workloads; the average is used for every GPU"),
        step_overhead_s=Coefficient(0.0, "s", "assumed: no per-step overhead microbenchmark "
                                    "in shared data"),
        host=host_for(key),
        fingerprint=dict(FINGERPRINT),
        notes=" ".join(filter(None, [
            "Reference profile built from public microbenchmarks (hardware_db/data/"
            "measurements) and datasheets; coefficients say 'assumed' or 'transferred' where "
            "no row exists for this GPU.", NOTES.get(key, "")])))
    return prof, {**ref.fits, **fits}


def build_all(out_dir: Path = PROFILE_DIR) -> dict[str, tuple[Profile, dict]]:
    kern, coll = load_rows("kernels.csv"), load_rows("collectives.csv")
    extra = load_rows("kernels_extra.csv")
    ref = fit_a100_gemm(kern)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    for key in GPU_KEYS:
        prof, fits = build_profile(key, kern, extra, coll, ref)
        write_profile(prof, out_dir / f"{key}.json")
        built[key] = (prof, fits)
    return built


def summary_lines(built: Mapping[str, tuple[Profile, dict]]) -> list[str]:
    """One line per GPU: the headline coefficients and held-out errors."""
    def v(c: Coefficient | None, fmt: str = ".3f") -> str:
        return "-" if c is None else format(c.value, fmt)
    lines = ["gpu             eff_bf16 eff_fp8 k_half launch_us nvl_bw_eff nvl_alpha_us "
             "nvl_base_us nvl_speedup ib_bw_eff"]
    for key, (p, _) in built.items():
        nv = p.links.get("nvlink") or p.links.get("xgmi")
        e = p.gemm.eff_max
        lines.append(f"{key:15s} {v(e.get('bf16') or e.get('fp16')):8s} {v(e.get('fp8')):7s} "
                     f"{v(p.gemm.k_half, '.0f'):6s} {v(p.gemm.launch_us, '.1f'):9s} "
                     f"{v(nv.bw_eff):10s} {v(nv.alpha_us, '.2f'):12s} {v(nv.base_us, '.1f'):11s} "
                     f"{v(nv.in_switch_speedup):11s} {v(p.links['infiniband'].bw_eff)}")
    fits = {}
    for _, (_, f) in built.items():
        fits.update(f)
    for name, f in sorted(fits.items()):
        lines.append(f"fit {name}: n={f.n_points} train MAPE {f.train_mape_pct:.1f}% held-out "
                     f"MAPE {f.heldout_mape_pct if f.heldout_mape_pct is None else round(f.heldout_mape_pct, 1)}% "
                     f"values {{{', '.join(f'{k}: {x:.4g}' for k, x in sorted(f.values.items()))}}}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    out = Path(argv[0]) if argv else PROFILE_DIR
    built = build_all(out)
    print("\n".join(summary_lines(built)))
    print(f"wrote {len(built)} profiles to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
