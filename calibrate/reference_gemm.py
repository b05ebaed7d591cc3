"""GEMM models of the reference profiles: one shape-true model per GPU family.

``t = launch + max(flops / min(peak * eff_max * wave * k/(k + k_half), peak * sustained),
bytes / bw)`` (``simulator.cost.kernels.gemm_time_core_s``). Each factor describes one loss
and nothing else:

- ``wave``: tile and wave quantization of the output tiles (best of cuBLAS's CTA tiles);
  Hopper/Blackwell cuBLAS kernels are persistent (no last-wave tail), A100's are not;
- ``k/(k + k_half)``: per-tile prologue/epilogue amortised over the k loop;
- ``eff_max``: the level the best shapes reach at boost clock;
- ``sustained``: the rate the power limit holds (MSMF), a ceiling, not a multiplier.

The shape terms are fitted to measured shape sweeps (every row cited), with a per-call
floor per timing harness (Triton's ``do_bench`` adds ~8 us per call that a bare kernel
does not have). No "realistic-shape" factor: a realistic shape's loss is what the shape
terms compute. CSV line numbers count the header as line 1.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from simulator.cost.kernels import gemm_time_core_s, tile_efficiency
from simulator.hardware.profile import Coefficient, GemmModel

from .csvrows import Row, cite, select
from .fit import FitResult, GemmPoint, fit_gemm, harness_param
from .reference_data import DATASHEET

# cuBLAS picks among several CTA tiles per shape; the best of this set is what its
# heuristics approach (CUTLASS's default SM80/SM90 tile shapes).
CUBLAS_TILES = ((128, 128), (128, 256), (256, 128), (64, 128), (128, 64), (64, 256), (256, 64))
PERSISTENT_KERNEL_GPUS = ("h100-sxm", "h200-sxm", "h800", "gh200", "h100-pcie", "b200", "gb200",
                          "b300", "gb300")
MEMORY_BW_EFF = 2903.0 / 3350.0      # kernels.csv line 37 (H100 D2D copy), see memory_model()


def tile_for(key: str) -> int:
    """Single-tile wave model for profiles fitted with the earlier one-tile form (the GPU
    calibration builder, ``calibrate.gpu_profile``): 0 (no wave quantization) on GPUs with
    persistent kernels, else 128."""
    return 0 if key in PERSISTENT_KERNEL_GPUS else 128
DO_BENCH = "do_bench"
TILE_NOTE = ("best of CTA tiles 128x128/128x256/256x128/64x128/128x64/64x256/256x64 "
             "(cost.kernels.tile_efficiency)")


@dataclass(frozen=True)
class FamilyFit:
    """The shape fit of one GPU family, with what a profile needs to cite it."""

    fit: FitResult
    rows: tuple[Row, ...]
    what: str                     # one line: which rows, which harnesses
    persistent: bool

    def src(self, key: str) -> str:
        return (f"fit of cost.kernels.gemm_time_core_s ({TILE_NOTE}, "
                f"{'persistent' if self.persistent else 'waves'}) to {self.what}; held-out "
                f"(every 3rd shape by FLOPs) MAPE {self.fit.heldout_mape_pct:.1f}%")


def _shape(r: Row) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in r.data["shape_MxNxK"].split("x"))
    return m, n, k


def _tf_point(r: Row, elem: int = 2, harness: str = "") -> GemmPoint:
    return GemmPoint.from_tflops(*_shape(r), float(r.data["value"]), elem, harness=harness)


def _bmm_point(r: Row) -> GemmPoint:
    """``B=8;128x128x128`` rows timed in ms (kernels_more.csv torch.bmm rows)."""
    b, mnk = r.data["shape_MxNxK"].split(";")
    m, n, k = (int(x) for x in mnk.split("x"))
    return GemmPoint(m, n, k, float(r.data["value"]) * 1e-3, 2, int(b.split("=")[1]))


def mamf(kern: Sequence[Row], gpu: str, dtype: str, file_rows: Sequence[Row] = ()) -> Row:
    rows = [r for r in [*kern, *file_rows] if "mamf" in r.data["source"].lower()
            and "sustainable" not in r.data["metric"]
            and r.data["gpu"] == gpu and r.data["dtype"].startswith(dtype)]
    if len(rows) != 1:
        raise LookupError(f"expected one MAMF row for {gpu} {dtype}, found {len(rows)}")
    return rows[0]


def _bw(key: str) -> float:
    return DATASHEET[key].mem_bw_gbytes_per_s * MEMORY_BW_EFF


# ---- measured families -------------------------------------------------------------------
def fit_hopper_bf16(kern: Sequence[Row], extra: Sequence[Row], more: Sequence[Row]) -> FamilyFit:
    """H100/H200 (one GH100 die) 16-bit cuBLAS: every shape sweep in the shared data.

    kernels_extra.csv 3-7 (H100 fp16 2048xNxN, do_bench), kernels.csv 4 (MAMF best shape),
    kernels_more.csv 441 (TE #2053 Linear 8192x2048x2048, GPU time), 442-446 (H200 torch.bmm,
    kernel time), 431/433/435/437 (vLLM #49363 skinny bf16, memory-bound). kernels_more.csv
    426-430 repeat kernels_extra.csv 3-7 and are not counted twice.
    """
    sweep = select(extra, lambda d: d["gpu"] == "H100 SXM" and "triton-lang/triton" in d["source"])
    best = [mamf(kern, "H100 SXM", "bf16")]
    linear = select(more, lambda d: d["gpu"].startswith("H100 SXM (DGX)")
                    and "Linear" in d["kernel"])
    bmm = select(more, lambda d: d["gpu"] == "H200" and "torch.bmm" in d["kernel"])
    skinny = select(more, lambda d: "vllm" in d["source"].lower() and d["dtype"] == "bf16")
    m, n, k = _shape(linear[0])
    pts = ([_tf_point(r, harness=DO_BENCH) for r in sweep] + [_tf_point(best[0])]
           + [GemmPoint(m, n, k, float(linear[0].data["value"]) * 1e-6)]
           + [_bmm_point(r) for r in bmm] + [_tf_point(r) for r in skinny])
    ds = DATASHEET["h100-sxm"]
    fit = fit_gemm(pts, ds.peak["bf16"], ds.sm_count, _bw("h100-sxm"), tiles=CUBLAS_TILES,
                   persistent=True)
    rows = (*sweep, *best, *linear, *bmm, *skinny)
    what = (f"{cite(sweep)} (H100 cuBLAS fp16 2048xNxN, triton-lang/triton#2339, do_bench), "
            f"{cite(best)} (MAMF best shape), {cite(linear)} (TE#2053 nn.Linear GPU time), "
            f"{cite(bmm)} (H200 torch.bmm), {cite(skinny)} (vLLM#49363 skinny bf16); "
            f"{ds.sm_count} SMs, peak {ds.peak['bf16']} TF [{ds.cite}]; do_bench per-call floor "
            f"{fit.values[harness_param(DO_BENCH)]:.1f} us fitted separately")
    return FamilyFit(fit, rows, what, True)


def fit_a100_16bit(kern: Sequence[Row], more: Sequence[Row]) -> FamilyFit:
    """A100 16-bit cuBLAS: the triton#3551 square sweep (kernels_more.csv 402-425, do_bench,
    2024 cuBLAS) and the MAMF best shape (kernels.csv 2). The 2020 blog sweep
    (kernels.csv 15-30, digitized, CUDA 11.0) disagrees with it point by point by 10-20%
    (different tile choices) and is not mixed in."""
    sweep = select(more, lambda d: d["gpu"].startswith("A100") and "torch.matmul" in d["kernel"]
                   and d["dtype"] == "fp16" and d["shape_MxNxK"][:1].isdigit())
    best = [mamf(kern, "A100 SXM", "bf16")]
    ds = DATASHEET["a100-sxm-80gb"]
    pts = [_tf_point(r, harness=DO_BENCH) for r in sweep] + [_tf_point(best[0])]
    fit = fit_gemm(pts, ds.peak["bf16"], ds.sm_count, _bw("a100-sxm-80gb"), tiles=CUBLAS_TILES,
                   fixed={"launch_us": 0.0})
    what = (f"{cite(sweep)} (A100 cuBLAS fp16 square 256-3200, triton-lang/triton#3551, "
            f"do_bench) and {cite(best)} (MAMF best shape); {ds.sm_count} SMs, peak "
            f"{ds.peak['bf16']} TF [{ds.cite}]; do_bench per-call floor "
            f"{fit.values[harness_param(DO_BENCH)]:.1f} us fitted separately; the kernel "
            "floor is not identified by these rows (fixed 0 in the fit; a 1 us floor is "
            "<1% of every kernel-timed point)")
    return FamilyFit(fit, (*sweep, *best), what, False)


def fit_level(rows: Sequence[Row], key: str, dtype: str, k_half: float, launch_us: float,
              tiles: tuple, persistent: bool):
    """The GEMM fit of ``key``'s ``dtype`` to best-shape ``rows`` with ``k_half`` and the
    launch time held fixed, on the given tile set: what fixes ``eff_max``."""
    ds = DATASHEET[key]
    return fit_gemm([_tf_point(r, 1 if dtype == "fp8" else 2) for r in rows], ds.peak[dtype],
                    ds.sm_count, _bw(key), tiles=tiles, persistent=persistent,
                    fixed={"k_half": k_half, "launch_us": launch_us})


def solve_level(rows: Sequence[Row], key: str, dtype: str, k_half: float, launch_us: float,
                what: str) -> Coefficient:
    """``eff_max`` from best-shape rows with the family's shape terms held fixed."""
    ds = DATASHEET[key]
    fit = fit_level(rows, key, dtype, k_half, launch_us, CUBLAS_TILES,
                    key in PERSISTENT_KERNEL_GPUS)
    shapes = "; ".join(f"{r.data['gpu']} {r.data['value']} TF at {r.data['shape_MxNxK']}"
                       for r in rows)
    return fit.coefficient("eff_max", "fraction", (
        f"solved from {cite(rows)} ({what}: {shapes}; {ds.sm_count} SMs, peak {ds.peak[dtype]} "
        f"TF [{ds.cite}]) with k_half {k_half:.0f} and launch {launch_us:.2f} us held fixed; "
        "best-shape rows at boost clock"))


def sustained_cap(extra: Sequence[Row], msmf_gpu: str, dtype: str, key: str,
                  why: str = "", scale: float = 1.0) -> Coefficient:
    """Power-limit ceiling as a fraction of ``key``'s dtype peak from an MSMF row."""
    row_dtype = "fp8" if dtype == "fp8" else "bf16"
    rows = [r for r in extra if "sustainable" in r.data["metric"]
            and r.data["gpu"] == msmf_gpu and r.data["dtype"].startswith(row_dtype)]
    peak = DATASHEET[key].peak[dtype]
    tf = float(rows[0].data["value"]) * scale
    src = (f"MSMF {rows[0].data['value']} TF ({msmf_gpu} {rows[0].data['dtype']}, {cite(rows)}, "
           f"stas00 mamf-finder sustained mode: the best rate held 2-4 s after the clock "
           f"settles at the power limit) over the {peak} TF peak [{DATASHEET[key].cite}]; a "
           "ceiling on the shape-limited rate, not a factor on it")
    return Coefficient(tf / peak, "fraction", src + (f"; {why}" if why else ""))


def same_tool_ratio(extra: Sequence[Row]) -> tuple[float, str]:
    """MSMF over MAMF measured by one tool on one GPU (the MSMF rows' notes give that run's
    MAMF range): how far the power limit pulls the best shape below its boost-clock burst."""
    ratios, parts = [], []
    for r in extra:
        m = re.search(r"MAMF, boost burst, (\d+)-(\d+)", r.data["notes"])
        if "sustainable" in r.data["metric"] and m:
            mamf_tf = (float(m.group(1)) + float(m.group(2))) / 2
            ratios.append(float(r.data["value"]) / mamf_tf)
            parts.append(f"{r.data['gpu']} {r.data['value']}/{mamf_tf:g} = {ratios[-1]:.3f} "
                         f"({cite([r])})")
    return sum(ratios) / len(ratios), "; ".join(parts)


def transferred_cap(refs: GemmRefs, key: str, gpu: str, rows: Sequence[Row] = ()) -> Coefficient:
    """A power-limit ceiling for a GPU without an MSMF row: its MAMF row times the same-tool
    MSMF/MAMF ratio measured on H200 and B200."""
    ratio, parts = same_tool_ratio(refs.extra)
    row = mamf(refs.kern, gpu, "bf16", rows)
    tf = float(row.data["value"]) * ratio
    peak = DATASHEET[key].peak["bf16"]
    return Coefficient(tf / peak, "fraction", (
        f"assumed (transferred): no MSMF row for {key}; its MAMF bf16 row ({cite([row])}, "
        f"{row.data['value']} TF) x {ratio:.3f}, the mean same-tool MSMF/MAMF ratio of the "
        f"GPUs where it is measured ({parts}) = {tf:.0f} TF of {peak} TF. Every power-capped "
        "GPU measured so far settles below its burst rate under sustained matmuls; if this one "
        f"held its boost clock, large GEMMs would run up to {100 * (1 / ratio - 1):.0f}% "
        "faster than modelled"))


# ---- per GPU -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmRefs:
    hopper: FamilyFit
    a100: FamilyFit
    kern: Sequence[Row]
    extra: Sequence[Row]
    more: Sequence[Row]
    blackwell: Mapping[str, FamilyFit] | None = None   # B200 fits by dtype

    @property
    def fits(self) -> Mapping[str, FitResult]:
        out = {"gemm_hopper_16bit": self.hopper.fit, "gemm_a100_16bit": self.a100.fit}
        if self.blackwell:
            out.update({f"gemm_blackwell_{d}": f.fit for d, f in self.blackwell.items()})
        return out


def transferred_k_half(key: str, base_key: str, base: Coefficient, label: str) -> Coefficient:
    """``k_half`` carried to another GPU by datasheet ratios: per-tile fixed work is bound by
    memory traffic, so in k-loop units it grows with the tensor rate per SM and shrinks with
    the memory bandwidth per SM (``dtype_scale``: fp8's doubled rate)."""
    a, ds = DATASHEET[base_key], DATASHEET[key]
    tensor = (ds.peak["bf16"] / ds.sm_count) / (a.peak["bf16"] / a.sm_count)
    mem = (ds.mem_bw_gbytes_per_s / ds.sm_count) / (a.mem_bw_gbytes_per_s / a.sm_count)
    f = tensor / mem
    src = (f"transferred: {label} k_half {base.value:.0f} x tensor-rate/SM ratio {tensor:.2f} / "
           f"memory-bandwidth/SM ratio {mem:.2f} ({key} vs {base_key}: {ds.cite}; {a.cite}); "
           f"{label}: {base.source}")
    return Coefficient(base.value * f, "elements", src, base.stderr * f if base.stderr else None)


def _fp8_k_half(kh: Coefficient, key: str) -> Coefficient:
    ds = DATASHEET[key]
    r = ds.peak["fp8"] / ds.peak["bf16"]
    return Coefficient(kh.value * r, "elements", (
        f"transferred: the 16-bit k_half x {r:g} (fp8 tensor rate / bf16 rate at the same "
        f"memory bandwidth; no fp8 shape sweep of cuBLAS in shared data): {kh.source}"),
        kh.stderr * r if kh.stderr else None)


def _family_coefs(ff: FamilyFit, key: str, tag: str) -> tuple[Coefficient, Coefficient, Coefficient]:
    src = ff.src(key)
    if tag:
        src = f"{tag}: {src}"
    f = ff.fit
    eff = f.coefficient("eff_max", "fraction", src)
    kh = f.coefficient("k_half", "elements", src)
    launch = Coefficient(f.values["launch_us"], "us", (
        f"kernel floor (launch + ramp/tail of a GPU kernel, back-to-back) from {src}"),
        f.err("launch_us"))
    return eff, kh, launch


def _same(c: Coefficient, why: str) -> Coefficient:
    return Coefficient(c.value, c.unit, f"{why}; {c.source}", c.stderr, c.heldout_error_pct)


def _grouped_shape(r: Row) -> tuple[int, int, int, int]:
    """``G=256;M_total=262144 (avg 1024/expert);N=4096;K=6144`` -> (G, rows/group, N, K)."""
    d = {k: v.split()[0] for k, v in (p.split("=", 1) for p in r.data["shape_MxNxK"].split(";"))}
    g = int(d["G"])
    return g, int(d["M_total"]) // g, int(d["N"]), int(d["K"])


def grouped_eff(refs: GemmRefs, eff: float, kh: float, launch: float, cap: float) -> Coefficient:
    """Rate of PyTorch's grouped GEMM (torch._grouped_mm, MoE up-projection, 256 experts,
    1k-8k tokens per expert) over the dense Hopper model at the same shapes, sustained
    ceiling included (the rows ran power-limited). Held-out: the ratio from the 1k and 4k
    rows predicts the 2k and 8k rows."""
    rows = select(refs.more, lambda d: "torch._grouped_mm" in d["kernel"])
    ds = DATASHEET["h200-sxm"]
    peak = ds.peak["bf16"] * 1e12

    def ratio(r: Row) -> float:
        g, mg, n, k = _grouped_shape(r)
        wave = tile_efficiency(mg, n, CUBLAS_TILES, ds.sm_count, g, True)
        t = gemm_time_core_s(g * mg, n, k, 2.0 * g * (mg * k + k * n + mg * n), peak, eff, kh,
                             launch * 1e-6, wave, _bw("h200-sxm") * 1e9, cap * peak)
        return float(r.data["value"]) * 1e12 / (2.0 * g * mg * n * k / t)
    x = [ratio(r) for r in rows]
    train, test = x[0::2], x[1::2]
    ho = sum(abs(sum(train) / len(train) / v - 1) for v in test) / len(test) * 100
    return Coefficient(sum(x) / len(x), "fraction", (
        f"measured over modelled rate of {cite(rows)} (H200 torch._grouped_mm bf16, G=256, "
        f"1k-8k tokens per expert, N=4096, K=6144; ratios {', '.join(f'{v:.3f}' for v in x)}) "
        "against the dense Hopper model with its sustained ceiling: flat in tokens per "
        "expert, so a level loss of the grouped kernel, not a shape effect. Medium "
        "confidence: the rows' author reports the GPU clock-bound near 1.4 GHz; DeepGEMM's "
        "grouped bf16 kernel on the same rows runs ~8% faster (kernels_more.csv 294-306)"),
        None, round(ho, 2))


def fp8_grouped(refs: GemmRefs) -> Coefficient:
    rows = select(refs.more, lambda d: d["kernel"].startswith("DeepGEMM m_grouped_gemm_fp8")
                  and "contiguous" in (d["source_locator"] + d["notes"]).lower())
    return Coefficient(1.0, "fraction", (
        f"no grouped loss for fp8: DeepGEMM's contiguous-layout m-grouped fp8 GEMMs "
        f"({cite(rows)}, H800, 4-8 groups of 4k-8k rows) run at 1.0-1.14x the dense fp8 "
        "model at the same shapes"))


def hopper_gemm(key: str, refs: GemmRefs) -> GemmModel:
    tag = {"h100-sxm": "", "h800": "H800 = H100 compute (same GH100 die, 700 W; only its "
           "NVLink is cut)", "gh200": "GH200 = H100 compute (same GH100 die and 132 SMs; the "
           "H100 SXM 700 W ceiling assumed for its 680 W superchip, see the profile notes)"
           }.get(key, "H200 = H100 compute (same GH100 die, 700 W)")
    eff, kh, launch = _family_coefs(refs.hopper, key, tag)
    kh8 = _fp8_k_half(kh, key)
    fp8_rows = [mamf(refs.kern, g, "fp8") for g in ("H100 SXM", "H200 SXM")]
    eff8 = solve_level(fp8_rows, key, "fp8", kh8.value, launch.value,
                       "MAMF fp8 e4m3 best shapes, H100 and H200 jointly (same die)")
    why = "" if key == "h200-sxm" else "MSMF measured on H200 (same GH100 die and 700 W limit)"
    caps = {"bf16": sustained_cap(refs.extra, "H200 SXM", "bf16", key, why),
            "fp8": sustained_cap(refs.extra, "H200 SXM", "fp8", key, why)}
    effs = {"bf16": eff, "fp16": _same(eff, "fp16 = bf16 (same tensor-core rate)"), "fp8": eff8}
    ge = grouped_eff(refs, eff.value, kh.value, launch.value, caps["bf16"].value)
    grouped = {"bf16": ge, "fp16": _same(ge, "fp16 = bf16"), "fp8": fp8_grouped(refs)}
    return GemmModel(eff_max=effs, k_half=kh, launch_us=launch, tile_m=128, tile_n=128,
                     tiles=CUBLAS_TILES, persistent=True, sustained_eff=caps,
                     k_half_dtype={"fp8": kh8}, grouped_eff=grouped)


def _blog(kern: Sequence[Row], dtype_prefix: str) -> list[Row]:
    return select(kern, lambda d: "CUDA 11 Features" in d["source"]
                  and d["dtype"].startswith(dtype_prefix))


def a100_fp32_levels(refs: GemmRefs, kh: float, launch: float) -> dict[str, Coefficient]:
    """TF32 from the 2020 blog's TF32 series and FP32 from its SGEMM row (the only A100
    rows for these dtypes), with the 16-bit fit's shape terms held fixed."""
    ds = DATASHEET["a100-sxm-80gb"]
    out = {}
    for dtype, prefix, what in (("tf32", "tf32", "TF32 series"), ("fp32", "fp32", "SGEMM")):
        rows = _blog(refs.kern, prefix)
        f = fit_gemm([_tf_point(r, 4) for r in rows], ds.peak[dtype], ds.sm_count,
                     _bw("a100-sxm-80gb"), tiles=CUBLAS_TILES,
                     fixed={"k_half": kh, "launch_us": launch})
        out[dtype] = f.coefficient("eff_max", "fraction", (
            f"fit to {cite(rows)} (NVIDIA CUDA 11 blog A100 {what}, digitized; peak "
            f"{ds.peak[dtype]} TF [{ds.cite}]) with the A100 16-bit fit's k_half and launch "
            "held fixed"))
    return out


A100_MAMF = {"a100-sxm-80gb": "A100 SXM", "a100-sxm-40gb": "A100 SXM",
             "a100-pcie-80gb": "A100 PCIe", "a800-sxm-80gb": "A100 SXM"}
A100_TAG = {"a100-sxm-40gb": "A100 40GB = 80GB compute (same GA100 die)",
            "a800-sxm-80gb": "A800 = A100 SXM 80GB compute (same GA100 die, 400 W; only its "
                             "NVLink is cut)",
            "a100-pcie-80gb": "A100 PCIe = A100 SXM shape terms and burst level (same GA100 "
                              "die; its 300 W limit shows in its own MAMF row, which sets its "
                              "ceiling)"}


def a100_gemm(key: str, refs: GemmRefs, launch: Coefficient) -> GemmModel:
    """A100 SXM 40/80 GB and PCIe (same GA100 compute): measured shape and level; a
    ceiling transferred onto each card's own MAMF row (A100_MAMF)."""
    eff, kh, _ = _family_coefs(refs.a100, key, A100_TAG.get(key, ""))
    fp32 = a100_fp32_levels(refs, kh.value, launch.value)
    if key == "a100-pcie-80gb":
        fp32 = {d: _same(c, A100_TAG[key]) for d, c in fp32.items()}
    effs = {"bf16": eff, "fp16": _same(eff, "fp16 = bf16 (same tensor-core rate)"), **fp32}
    cap = transferred_cap(refs, key, A100_MAMF[key])
    return GemmModel(eff_max=effs, k_half=kh, launch_us=launch, tile_m=128, tile_n=128,
                     tiles=CUBLAS_TILES, persistent=False,
                     sustained_eff={"bf16": cap, "fp16": _same(cap, "fp16 = bf16")},
                     grouped_eff=hopper_grouped(refs, key))


def hopper_launch(refs: GemmRefs) -> Coefficient:
    return _family_coefs(refs.hopper, "h100-sxm", "")[2]


def transferred(c: Coefficient, to: str, why: str = "no row for it") -> Coefficient:
    return Coefficient(c.value, c.unit, f"transferred to {to} ({why}): {c.source}",
                       c.stderr, None)


# the MAMF rows each Blackwell GPU's level and ceiling are scaled by; GB300 has none of its
# own: the larger of its B300 die's row and GB200's (the same NVL72 packaging and datasheet
# peaks at a lower power limit, fewer SMs), per dtype (blackwell_mamf)
BLACKWELL_MAMF = {"b200": ("B200 SXM",), "gb200": ("GB200 SXM",), "b300": ("B300 SXM",),
                  "gb300": ("B300 SXM", "GB200 SXM")}
HIGHER_LIMIT = {"gb200": "GB200's 1200 W", "gb300": "GB300's 1400 W"}


def blackwell_mamf(kern: Sequence[Row], key: str, dtype: str) -> Row:
    """The MAMF row a Blackwell GPU's level and ceiling follow (BLACKWELL_MAMF)."""
    return max((mamf(kern, g, dtype) for g in BLACKWELL_MAMF[key]),
               key=lambda r: float(r.data["value"]))


def blackwell_cap(key: str, dtype: str, refs: GemmRefs) -> Coefficient:
    """Measured for B200 bf16 (MSMF); elsewhere the B200 bf16 MSMF/MAMF ratio (the clock the
    power limit holds) applied to the GPU's own MAMF row of that dtype, said so."""
    measured = sustained_cap(refs.extra, "B200 SXM", "bf16", "b200")
    if (key, dtype) == ("b200", "bf16"):
        return measured
    b_mamf = mamf(refs.kern, "B200 SXM", "bf16")
    ratio = measured.value * DATASHEET["b200"].peak["bf16"] / float(b_mamf.data["value"])
    own = blackwell_mamf(refs.kern, key, dtype)
    tf = float(own.data["value"]) * ratio
    return Coefficient(tf / DATASHEET[key].peak[dtype], "fraction", (
        f"assumed: the B200 bf16 MSMF/MAMF ratio {ratio:.3f} ({cite([b_mamf])}; "
        f"{measured.source}) applied to the {own.data['gpu']} {own.data['dtype']} MAMF row "
        f"({cite([own])}, {own.data['value']} TF) = {tf:.0f} TF of {DATASHEET[key].peak[dtype]} "
        "(no MSMF row for it)" + (f"; {HIGHER_LIMIT[key]} limit leaves more clock headroom, "
                                  "so this is the pessimistic side" if key in HIGHER_LIMIT
                                  else "")))


AMD_MAMF = {   # GPU key -> (its MAMF row's gpu column, what the row is)
    "mi300x": ("AMD MI300X", "MAMF v2 bf16 best shape, TunableOp on"),
    "mi325x": ("AMD MI325X", "MAMF v2 bf16 best shape, TunableOp on, 1000 W card (the same "
               "CDNA3 die as MI300X, whose 750 W row is 14.8 % lower)"),
    "mi355x": ("AMD MI355X", "MAMF v2 bf16 best shape, TunableOp off, ROCm 7.0.2 (CDNA4)"),
    "mi250x": ("AMD MI250X (one GCD)", "MAMF v1 bf16 best shape on one GCD, ROCm 6.2 (likely "
               "optimistic: the v2 method measured MI300X 14.5 % below v1, and another user "
               "reports 127 TF, 13.6 % below this row)"),
}


def mi300x_gemm(refs: GemmRefs, key: str = "mi300x") -> GemmModel:
    """AMD Instinct from each card's own MAMF row (AMD_MAMF: MI250X one GCD, MI300X, MI325X,
    MI355X). Shape terms: the Hopper fit's, carried by datasheet ratios (assumed)."""
    h_eff, h_kh, h_launch = _family_coefs(refs.hopper, "h100-sxm", "")
    kh = transferred_k_half(key, "h100-sxm", h_kh, "Hopper cuBLAS fit (assumed for hipBLASLt)")
    launch = transferred(h_launch, key)
    gpu, what = AMD_MAMF[key]
    bf = solve_level([mamf(refs.kern, gpu, "bf16", refs.extra)], key, "bf16",
                     kh.value, launch.value, what)
    effs = {"bf16": bf, "fp16": _same(bf, "fp16 = bf16 (same matrix-core rate)")}
    if "fp8" in DATASHEET[key].peak:
        effs["fp8"] = _same(bf, "assumed: fp8 eff = bf16 eff (no fp8 microbenchmark row)")
    cap = transferred_cap(refs, key, gpu, refs.extra)
    return GemmModel(eff_max=effs, k_half=kh, launch_us=launch, tile_m=128, tile_n=128,
                     tiles=CUBLAS_TILES, persistent=False,
                     sustained_eff={"bf16": cap, "fp16": _same(cap, "fp16 = bf16")})


def ada_gemm(refs: GemmRefs, launch: Coefficient, key: str = "l40s") -> GemmModel:
    """L40S (Ada, sm89; no shape sweep of it): the A100 family's shape terms (assumed: the
    same non-persistent cuBLAS tiles on an SM without TMA/wgmma), its level solved from its
    own MAMF row, a ceiling from that row x the same-tool MSMF/MAMF ratio; fp8 assumed at
    the bf16 fraction of its peak."""
    kh = _family_coefs(refs.a100, key, "assumed: A100 (Ampere) cuBLAS shape terms for Ada")[1]
    bf = solve_level([mamf(refs.kern, "L40S", "bf16", refs.extra)], key, "bf16", kh.value,
                     launch.value, "MAMF bf16 best shape (mag-/gpu_benchmark)")
    cap = transferred_cap(refs, key, "L40S", refs.extra)
    fp8 = "assumed: fp8 at the bf16 fraction of its peak (no fp8 row for it)"
    return GemmModel(eff_max={"bf16": bf, "fp16": _same(bf, "fp16 = bf16 (same tensor-core rate)"),
                              "fp8": _same(bf, fp8)},
                     k_half=kh, launch_us=launch, tile_m=128, tile_n=128, tiles=CUBLAS_TILES,
                     persistent=False,
                     sustained_eff={"bf16": cap, "fp16": _same(cap, "fp16 = bf16"),
                                    "fp8": _same(cap, fp8)},
                     grouped_eff=hopper_grouped(refs, key))


def h100_pcie_gemm(refs: GemmRefs) -> GemmModel:
    """H100 PCIe (GH100 with 114 SMs at 350 W), as A100 PCIe is built from A100 SXM: the
    H100 SXM shape terms and burst levels as fractions of its own peak (same die), and the
    power limit in the ceiling: the SXM ceilings scaled by one tool's MAMF ratio of the two
    cards (mag-/gpu_benchmark, both rows in one table)."""
    key, sxm = "h100-pcie", hopper_gemm("h100-sxm", refs)
    rows = [mamf(refs.kern, g, "bf16", refs.extra) for g in ("H100 PCIe", "H100 SXM 80GB")]
    r = float(rows[0].data["value"]) / float(rows[1].data["value"])
    tag = ("H100 PCIe = H100 SXM shape terms and burst level (same GH100 die; its 350 W "
           "limit shows in its own MAMF row, which sets its ceiling)")
    why = (f"the same-tool MAMF ratio H100 PCIe / H100 SXM {rows[0].data['value']} / "
           f"{rows[1].data['value']} TF = {r:.3f} ({cite(rows)})")

    def cap(c: Coefficient, dtype: str) -> Coefficient:
        tf = c.value * DATASHEET["h100-sxm"].peak[dtype] * r
        return Coefficient(tf / DATASHEET[key].peak[dtype], "fraction", (
            f"assumed (transferred) power-limited ceiling: the H100 SXM {dtype} ceiling "
            f"{c.value:.4g} of {DATASHEET['h100-sxm'].peak[dtype]} TF x {why} = {tf:.0f} TF of "
            f"{DATASHEET[key].peak[dtype]} TF [{DATASHEET[key].cite}]; {c.source}"))
    return GemmModel(eff_max={d: _same(c, tag) for d, c in sxm.eff_max.items()},
                     k_half=_same(sxm.k_half, tag), launch_us=transferred(sxm.launch_us, key),
                     tile_m=128, tile_n=128, tiles=CUBLAS_TILES, persistent=True,
                     sustained_eff={d: cap(sxm.sustained_eff[d], d) for d in ("bf16", "fp8")},
                     k_half_dtype={d: _same(c, tag) for d, c in sxm.k_half_dtype.items()},
                     grouped_eff=hopper_grouped(refs, key))


def hopper_grouped(refs: GemmRefs, key: str) -> dict[str, Coefficient]:
    """The Hopper grouped-GEMM ratios, carried to a GPU with no grouped-GEMM row."""
    h = hopper_gemm("h100-sxm", refs).grouped_eff
    return {d: transferred(c, key, "no grouped-GEMM row for it") for d, c in h.items()}
