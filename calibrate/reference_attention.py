"""Fused-attention curves of the reference profiles, fitted to published kernel sweeps.

``eff(s) = emax(head_dim) * s / (s + s_half)`` per GPU, kernel family and direction
(``simulator.hardware.profile.AttentionCurve``), fitted to the non-causal rows of
``kernels_more.csv`` (FlashAttention-2/-3 and cuDNN on A100/H100, from the FA2 README
figures and the FA3 paper), ``attention_blackwell.csv`` (B200 rows transcribed from
GitHub threads) and ``attention_fa1.csv`` (FlashAttention-1 and its Triton port on A100 and
H100, the FA2 release figures' other bars). Causal calls use the same curve with the half-length constant
``2 * s_half + 128`` (average kv tiles per query tile halve; the diagonal tile is computed
in full) times ``causal_eff``, fitted once on the A100 FA2 causal rows and carried to the
other GPUs and families; a family whose sweep has causal rows of its own (``flash1``; on
H100 the FlashAttention-2 and cuDNN forward panels, B200 cuDNN forward) fits its own
factor (``AttentionCurve.causal_eff``), which its backward curve inherits (assumed: no
causal backward rows); B200 FlashAttention-2 takes H100's (transferred). Families: ``flash`` = FlashAttention-2 (PyTorch SDPA's flash backend);
``flash1`` = FlashAttention-1 and its pre-MLIR Triton port (what llm-foundry ran in 2023);
``flash3`` = what Transformer Engine runs on Hopper and Blackwell, cuDNN fused
attention ("TE prefers cuDNN flash attention on Hopper+ when both apply", NeMo docs,
NVIDIA/NeMo PR #9188). CSV line numbers count the header as line 1.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from simulator.hardware.profile import AttentionCurve, AttentionModel, Coefficient

from .csvrows import Row, cite
from .fit import AttnCurvePoint, FitResult, fit_attention_curve
from .reference_data import AMPERE_A100

CAUSAL_BLOCK = 128.0
CAUSAL_BLOCK_SRC = ("kernel tile: FlashAttention-2/3 and cuDNN process causal attention in "
                    "128-token query/key blocks, and the diagonal block is computed in full "
                    "while the FLOP convention counts half the square (FA2 paper, FA3 paper); "
                    "a fixed constant of the causal formula, not fitted")
# where a caller gives no shape: the curve at this point
REPRESENTATIVE = {"seq_k": 4096, "head_dim": 128, "causal": True}
PEAK_TFLOPS = {"A100": 312.0, "H100": 989.5, "B200": 2250.0}


def _kv(shape: str) -> dict[str, int]:
    out = {}
    for part in shape.split(";"):
        k, _, v = part.partition("=")
        m = re.match(r"\d+", v.strip())
        if m:
            out[k.strip()] = int(m.group())
    return out


def _family(kernel: str) -> str:
    k = kernel.lower()
    if "triton fused attention" in k:
        return "triton"
    if "flashattention-1" in k:
        return "fa1"
    if "flashattention-3" in k:
        return "fa3"
    if "flashattention-2" in k:
        return "fa2"
    if "cudnn" in k:
        return "cudnn"
    return ""


def _direction(metric: str) -> str:
    if metric.startswith("fwd+bwd"):
        return "fwd+bwd"
    return "bwd" if metric.startswith("bwd") else "fwd"


def _gpu(label: str) -> str:
    return next((g for g in PEAK_TFLOPS if label.startswith(g)), "")


@dataclass(frozen=True)
class Sweep:
    rows: tuple[Row, ...]
    points: tuple[AttnCurvePoint, ...]


def sweep(rows: Sequence[Row], gpu: str, family: str, direction: str, causal: bool | None = False,
          min_seq: int = 0) -> Sweep:
    """Rows of one GPU / family / direction (``causal=None``: both), as curve points."""
    keep = []
    for r in rows:
        d = r.data
        if not d["shape_MxNxK"].startswith("seq=") or _gpu(d["gpu"]) != gpu:
            continue
        kv = _kv(d["shape_MxNxK"])
        c = bool(kv.get("causal", 0))
        if _family(d["kernel"]) != family or _direction(d["metric"]) != direction:
            continue
        if (causal is not None and c != causal) or kv["seq"] < min_seq:
            continue
        keep.append((r, AttnCurvePoint(kv["seq"], kv["hdim"], c,
                                       float(d["value"]) / PEAK_TFLOPS[gpu])))
    if not keep:
        raise LookupError(f"no attention rows for {gpu} {family} {direction}")
    return Sweep(tuple(r for r, _ in keep), tuple(p for _, p in keep))


@dataclass(frozen=True)
class CurveFit:
    curve: AttentionCurve
    fit: FitResult


def fit_curve(sw: Sweep, what: str, causal_eff: float | None = 1.0) -> CurveFit:
    """``causal_eff=None``: the sweep's causal rows fit the family's own causal factor
    (``curve.causal_eff``) together with the curve."""
    fixed = {} if causal_eff is None else {"causal_eff": causal_eff}
    f = fit_attention_curve(sw.points, CAUSAL_BLOCK, fixed=fixed)
    dims = sorted({p.head_dim for p in sw.points})
    masks = "causal and non-causal" if causal_eff is None else "non-causal"
    src = (f"fit of AttentionCurve (eff = emax(hdim) * s/(s + s_half)) to {cite(sw.rows)} "
           f"({what}; head dims {'/'.join(map(str, dims))}, seq "
           f"{min(p.seq for p in sw.points)}-{max(p.seq for p in sw.points)}, {masks}); "
           f"held-out (every 3rd point) MAPE {f.heldout_mape_pct:.1f}%")
    emax = {str(d): f.coefficient(f"emax_{d}", "fraction", src) for d in dims}
    causal = f.coefficient("causal_eff", "fraction", src) if causal_eff is None else None
    return CurveFit(AttentionCurve(emax, f.coefficient("s_half", "tokens", src), causal), f)


def _own_causal(cf: CurveFit, causal_rows: Sweep) -> CurveFit:
    """``cf``'s curve with its own causal factor, fitted to ``causal_rows`` with the
    non-causal curve held fixed (where the causal rows are too few or cover other head dims
    to refit the whole curve: B200 cuDNN's are head dim 64 only)."""
    c = cf.curve
    f = _causal_fit(c, causal_rows)
    ce = f.coefficient("causal_eff", "fraction", (
        f"fit to {cite(causal_rows.rows)} (causal rows) with the non-causal curve held fixed; "
        f"held-out (every 3rd point) MAPE {f.heldout_mape_pct:.1f}%"))
    return CurveFit(replace(c, causal_eff=ce), cf.fit)


def _causal_fit(c: AttentionCurve, causal_rows: Sweep) -> FitResult:
    """The causal factor alone, fitted to ``causal_rows`` with ``c`` (its emax at the rows'
    head dims and its s_half) held fixed."""
    dims = {str(p.head_dim) for p in causal_rows.points}
    fixed = {f"emax_{d}": e.value for d, e in c.emax.items() if d in dims}
    fixed["s_half"] = c.s_half.value
    return fit_attention_curve(causal_rows.points, CAUSAL_BLOCK, fixed=fixed)


def causal_eff(more: Sequence[Row], a100_fa2: CurveFit) -> tuple[Coefficient, FitResult]:
    """The shared causal factor, fitted on the A100 FA2 causal rows with the non-causal
    curve held fixed, for families and GPUs without causal rows of their own."""
    sw = sweep(more, "A100", "fa2", "fwd+bwd", causal=True)
    f = _causal_fit(a100_fa2.curve, sw)
    return f.coefficient("causal_eff", "fraction", (
        f"fit to {cite(sw.rows)} (A100 FlashAttention-2 fwd+bwd, causal, head dims 64/128) with "
        f"the non-causal A100 curve held fixed: causal kernels lose this fraction to the "
        f"scheduling imbalance of triangular work beyond the 2*s_half+{CAUSAL_BLOCK:g} "
        "half-length; carried to the GPUs and families without causal rows of their own (it "
        "predicted the H100 FA2/cuDNN causal forward rows within 8 % before those got their "
        "own factors)")), f


def scaled_curve(c: AttentionCurve, factor: Mapping[str, float], s_half: Coefficient,
                 why: str) -> AttentionCurve:
    emax = {d: Coefficient(e.value * factor.get(d, factor.get("*", 1.0)), e.unit,
                           f"{why}: {e.source}") for d, e in c.emax.items()}
    return AttentionCurve(emax, s_half, c.causal_eff)


def constants(curves: Mapping[str, AttentionCurve], g: Coefficient, key: str
              ) -> tuple[dict[str, Coefficient], dict[str, Coefficient]]:
    """The constant fractions for callers that give no shape: each curve at REPRESENTATIVE."""
    m = AttentionModel({}, {}, curves, g, Coefficient(CAUSAL_BLOCK, "tokens", CAUSAL_BLOCK_SRC))
    fwd, bwd = {}, {}
    rep = REPRESENTATIVE
    for name in sorted(curves):
        kernel, direction = name.split(":")
        e = m.curve_eff(kernel, direction == "bwd", rep["seq_k"], rep["head_dim"], rep["causal"])
        src = (f"the {name} curve at head_dim {rep['head_dim']}, causal, seq {rep['seq_k']}, for "
               f"callers that give no shape; {curves[name].s_half.source}")
        table = bwd if direction == "bwd" else fwd
        for dt in ("bf16", "fp16"):
            table[dt if kernel == "flash" else f"{kernel}:{dt}"] = Coefficient(e, "fraction", src)
    return fwd, bwd


@dataclass(frozen=True)
class AttentionRefs:
    """Every fitted curve, keyed ``"<GPU>:<kernel>:<direction>"``, plus the causal factor."""

    curves: Mapping[str, CurveFit]
    causal: Coefficient
    fits: Mapping[str, FitResult]


def _flash1_curves(fa1: Sequence[Row]) -> dict[str, CurveFit]:
    """FlashAttention-1-class curves, fitted to flash-attn 1.x's bars (causal and non-causal,
    with the family's own causal factor) on A100 and H100. llm-foundry's default
    ``attn_impl: triton`` runs HazyResearch's Triton port of that kernel, whose docstring
    (flash_attn_triton.py @ eff9fe6b, vendored by llm-foundry) says its forward + backward
    is "slightly slower" than the CUDA kernel: no bar times the port, so it is priced at
    FlashAttention-1's rate (slightly optimistic for it)."""
    why = ("flash-attn 1.x bars of the Dao-AILab README figure; llm-foundry's Triton port of "
           "this kernel is priced at its rate (the port's docstring: forward faster, backward "
           "slower, fwd+bwd 'slightly slower' than the CUDA kernel; no bar times the port)")
    return {f"{gpu}:flash1:fb": fit_curve(sweep(fa1, gpu, "fa1", "fwd+bwd", causal=None),
                                          f"{gpu} FlashAttention-1 fwd+bwd, {why}", None)
            for gpu in ("A100", "H100")}


def _h100_curves(more: Sequence[Row], fam: str, kernel: str, label: str
                 ) -> dict[str, CurveFit]:
    """The H100 forward curve with its own causal factor (the FA3 paper's forward figures
    have causal panels for every family), the backward curve from the non-causal backward
    rows, which inherits the forward's causal factor (no causal backward rows)."""
    fwd = fit_curve(sweep(more, "H100", fam, "fwd", causal=None),
                    f"H100 {label} fwd, FA3 paper figures", causal_eff=None)
    bwd = fit_curve(sweep(more, "H100", fam, "bwd"), f"H100 {label} bwd, FA3 paper figures")
    ce = fwd.curve.causal_eff
    inherited = Coefficient(ce.value, ce.unit, "assumed: the same kernel family's forward "
                            "causal factor (no H100 causal backward rows in the data): "
                            + ce.source, ce.stderr, ce.heldout_error_pct)
    return {f"H100:{kernel}:fwd": fwd,
            f"H100:{kernel}:bwd": CurveFit(replace(bwd.curve, causal_eff=inherited), bwd.fit)}


def build_attention_refs(more: Sequence[Row], blackwell: Sequence[Row],
                         fa1: Sequence[Row]) -> AttentionRefs:
    c: dict[str, CurveFit] = {}
    c["A100:flash:fb"] = fit_curve(sweep(more, "A100", "fa2", "fwd+bwd"),
                                   "A100 FlashAttention-2 fwd+bwd, Dao-AILab README figure")
    c.update(_flash1_curves(fa1))
    for fam, kernel, label in (("fa2", "flash", "FlashAttention-2"),
                               ("cudnn", "flash3", "cuDNN fused attention")):
        c.update(_h100_curves(more, fam, kernel, label))
    c["B200:flash:fwd"] = fit_curve(
        sweep(blackwell, "B200", "fa2", "fwd", min_seq=512),
        "B200 FlashAttention-2 fwd, flash-attention#1589 and tritonbench#171; seq < 512 left "
        "out: fewer query tiles than SMs there, an occupancy loss the curve does not model")
    c["B200:flash:bwd"] = fit_curve(sweep(blackwell, "B200", "fa2", "bwd"),
                                    "B200 FlashAttention-2 bwd, flash-attention#1589")
    c["B200:flash3:fwd"] = fit_curve(
        sweep(blackwell, "B200", "cudnn", "fwd"), what=
        "B200 cuDNN fused attention fwd, flash-attention#2605; head dim 128 has one point "
        "(seq 1k), extrapolated with the shared s_half: its emax sits ~5% above the best "
        "Blackwell attention kernel published (FA4, kernels_more.csv line 277: 1613 TF = 71.7% "
        "of 2250), so hd-128 forward may be up to ~5% optimistic")
    c["B200:flash3:fwd"] = _own_causal(c["B200:flash3:fwd"],
                                       sweep(blackwell, "B200", "cudnn", "fwd", causal=True))
    g, gf = causal_eff(more, c["A100:flash:fb"])
    fits = {f"attn_{k.replace(':', '_')}": v.fit for k, v in c.items()}
    fits["attn_causal_eff"] = gf
    return AttentionRefs(c, g, fits)


def _blackwell_curves(refs: AttentionRefs) -> dict[str, AttentionCurve]:
    c = refs.curves
    fwd2, bwd2 = c["B200:flash:fwd"].curve, c["B200:flash:bwd"].curve
    r128 = fwd2.emax["128"].value / fwd2.emax["64"].value
    e64 = bwd2.emax["64"]
    bwd2 = AttentionCurve({**bwd2.emax, "128": Coefficient(
        e64.value * r128, "fraction", f"transferred: the hdim-64 backward value x {r128:.3f} "
        f"(B200 FA2 forward hdim-128/hdim-64 ratio; no hdim-128 backward row): {e64.source}")},
        bwd2.s_half)
    f3 = c["B200:flash3:fwd"].curve
    h_f, h_b = c["H100:flash3:fwd"].curve, c["H100:flash3:bwd"].curve
    ratio = {d: f3.emax_at(int(d)) / h_f.emax_at(int(d)) for d in h_b.emax}
    b3 = scaled_curve(h_b, ratio, Coefficient(
        h_b.s_half.value, "tokens", f"transferred from H100 (no Blackwell cuDNN backward row): "
        f"{h_b.s_half.source}"), "transferred: the H100 cuDNN backward emax x the B200/H100 "
        "cuDNN forward emax ratio per head dim (no Blackwell cuDNN backward row in the data)")
    own = f3.causal_eff                          # B200 cuDNN: fitted to its causal rows
    b3 = replace(b3, causal_eff=Coefficient(
        own.value, own.unit, "assumed: B200 cuDNN forward's causal factor (no B200 causal "
        "backward rows): " + own.source, own.stderr, own.heldout_error_pct))
    h2 = c["H100:flash:fwd"].curve.causal_eff    # B200 FA2: no causal rows at all
    fa2 = Coefficient(h2.value, h2.unit, "transferred: H100 FlashAttention-2 forward's causal "
                      "factor (no B200 FA2 causal rows): " + h2.source, h2.stderr,
                      h2.heldout_error_pct)
    return {"flash:fwd": replace(fwd2, causal_eff=fa2), "flash:bwd": replace(bwd2, causal_eff=fa2),
            "flash3:fwd": f3, "flash3:bwd": b3}


def _relabel(curves: Mapping[str, AttentionCurve], why: str) -> dict[str, AttentionCurve]:
    def re(c: Coefficient) -> Coefficient:
        return Coefficient(c.value, c.unit, f"{why}: {c.source}", c.stderr, c.heldout_error_pct)
    return {name: AttentionCurve({d: re(e) for d, e in cv.emax.items()}, re(cv.s_half),
                                 re(cv.causal_eff) if cv.causal_eff else None)
            for name, cv in curves.items()}


def _both_directions(kernel: str, fb: AttentionCurve) -> dict[str, AttentionCurve]:
    """A curve fitted to a fwd+bwd sweep, used for both directions."""
    why = ("the sweep times fwd+bwd together (FLOPs 3.5x the forward): the same curve for "
           "both directions reproduces the pair's total; the split between them is not "
           "identified")
    return _relabel({f"{kernel}:fwd": fb, f"{kernel}:bwd": fb}, why)


def attention_curves(key: str, refs: AttentionRefs) -> AttentionModel | None:
    """Curve-based AttentionModel for GPUs with attention sweeps (or a sibling's), else None."""
    c = refs.curves
    if key.startswith(AMPERE_A100):
        curves = {**_both_directions("flash", c["A100:flash:fb"].curve),
                  **_both_directions("flash1", c["A100:flash1:fb"].curve)}
        if key.startswith("a800"):
            curves = _relabel(curves, "A800 = A100 compute (same GA100 die)")
    elif key in ("h100-sxm", "h200-sxm", "h100-pcie", "h800", "gh200"):
        curves = {k.split(":", 1)[1]: v.curve for k, v in c.items()
                  if k.startswith("H100:") and not k.endswith(":fb")}
        curves.update(_both_directions("flash1", c["H100:flash1:fb"].curve))
        if key in ("h200-sxm", "h800", "gh200"):
            name = "GH200" if key == "gh200" else key[:4].upper()
            curves = _relabel(curves, f"{name} = H100 compute (same GH100 die)")
        elif key == "h100-pcie":
            curves = _relabel(curves, "assumed: H100 PCIe reaches the H100 SXM fraction of "
                              "its own peak (same GH100 SM; no H100 PCIe attention row), held "
                              "to its lower power-limited GEMM ceiling")
    elif key in ("b200", "gb200", "b300", "gb300"):
        curves = _blackwell_curves(refs)
        if key != "b200":
            label = {"gb200": "GB200", "b300": "B300", "gb300": "GB300"}[key]
            curves = _relabel(curves, f"transferred from B200 (same Blackwell SM; no {label} "
                              f"attention row), as a fraction of {label}'s own peak")
    else:
        return None
    fwd, bwd = constants(curves, refs.causal, key)
    return AttentionModel(fwd, bwd, curves, refs.causal,
                          Coefficient(CAUSAL_BLOCK, "tokens", CAUSAL_BLOCK_SRC))
