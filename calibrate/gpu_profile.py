"""Fit a GPU's Profile from a GPU calibration's ``OUT/measurements/*.parquet`` against the
GPU's datasheet peaks, so it drops in wherever the shipped reference profile does.

As ``calibrate.reference`` does for published rows, every efficiency is relative to the
datasheet (``hardware_db``) of the GPU measured: GEMM ``eff_max`` per dtype against the dense
peak of that dtype (``k_half`` and ``launch_us`` fitted on the dtype with the most points,
bf16 normally, and held for the others; wave quantization as the reference uses for that
GPU: off for Hopper/Blackwell's persistent kernels), ``bw_eff`` against the HBM datasheet
bandwidth (fp32 copies up to 2 GiB), per-family ``kind_eff`` from the bf16 kernels,
attention ``fwd_eff`` / ``bwd_eff`` per dtype against the dtype's dense peak (backward =
(fwd+bwd - fwd) time at 2.5x the forward FLOPs, the op graph's convention; cuDNN kernels
under ``flash3:<dtype>``). Links and overlap: ``calibrate.gpu_links``. What was not
measured (a dtype whose kernels could not run, links one node cannot reach) is transferred
from the reference profile and its source says so; so is a fitted value outside its
physical range (``calibrate.profile_range``), its source giving the value not used.

Provenance: every measured coefficient's source starts with "measured on <host>, <date>,
driver <version>, SM clock <median> MHz (<range>)"; the fingerprint keeps the raw facts.
Coefficients fitted from points that ``calibrate.hygiene`` found contaminated are marked.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.errors import InvalidInputError
from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    HostModel,
    MemoryModel,
    Profile,
)
from simulator.hardware.specs import GPUSpec

from .cpu_profile import Measurements, load_measurements, t_compute
from .fit import (
    AttnPoint,
    FitResult,
    GemmPoint,
    MemPoint,
    composite_eff,
    fit_attention,
    fit_gemm,
    fit_memory,
)
from .gpu_links import (
    other_ops_mape_pct,
    overlap,
    restamp,
    scale_up_link,
    transferred_links,
)
from .hygiene import assumed_overlap, mark
from .profile_range import keep_in_range

GPU_FINGERPRINT_KEYS = ("device", "gpu_key", "gpu_name", "gpus", "sm_count", "host", "driver",
                        "cuda", "nccl", "torch_version", "date", "git_revision", "python")
ELEM_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}


def is_gpu_calibration(out_dir: Path) -> bool:
    """Whether ``OUT/measurements`` holds a GPU calibration (its rows name a cuda device)."""
    from .store import read_rows
    path = Path(out_dir) / "measurements" / "gemm.parquet"
    if not path.exists():
        return False
    rows = read_rows(path)
    return bool(rows) and str(rows[0].get("device", "")).startswith("cuda-")


def provenance(env: Mapping[str, str], clocks: Sequence[int], reasons: Sequence[str]) -> str:
    """"measured on <host>, <date>, driver <d>, SM clock <median> MHz (<lo>-<hi>) ..."."""
    clk = "SM clock not logged (no pynvml)"
    if clocks:
        clk = (f"SM clock median {statistics.median(clocks):.0f} MHz ({min(clocks)}-"
               f"{max(clocks)}) after settling")
        seen = sorted({r for x in reasons for r in str(x).split(",") if r})
        clk += f", clock events: {', '.join(seen) or 'none'}"
    return (f"measured on {env.get('host') or 'unknown host'}, {env.get('date')}, driver "
            f"{env.get('driver') or 'unknown'}, {clk}")


def _src(prov: str, bench: str, rows: Sequence[Mapping[str, Any]], what: str) -> str:
    return (f"{prov}: fit to measurements/{bench}.parquet ({len(rows)} points, "
            f"{'median' if bench == 'collectives' else '10th-percentile'} time per point; "
            f"{what})")


# ---- compute -------------------------------------------------------------------------------
def fit_gemm_levels(rows: Sequence[Mapping[str, Any]], gpu: GPUSpec, mem_bw: float, tile: int,
                    prov: str) -> tuple[GemmModel, dict[str, FitResult]]:
    """eff_max per dtype; k_half and launch from the dtype with the most points."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["dtype"], []).append(r)
    pts = {d: [GemmPoint(int(r["m"]), int(r["n"]), int(r["k"]), t_compute(r), ELEM_BYTES[d])
               for r in sel] for d, sel in by.items()}
    main = max(sorted(pts), key=lambda d: (d == "bf16", len(pts[d])))
    if len(pts[main]) < 3:
        raise InvalidInputError("measurements", "gemm.parquet", "at least 3 GEMM points of "
                                "one dtype (re-run `complexity calibrate` with a larger budget)")
    f0 = fit_gemm(pts[main], gpu.peak(main), gpu.sm_count, mem_bw, tile, tile)
    how = (f"torch.mm / torch._scaled_mm, cold L2, square and transformer shapes; "
           f"{gpu.sm_count} SMs, wave quantization {'off' if tile == 0 else f'{tile}x{tile}'}")
    src0 = _src(prov, "gemm", by[main], f"{main}, peak {gpu.peak(main):g} TF datasheet; {how}")
    fits, eff = {f"gemm_{main}": f0}, {main: f0.coefficient("eff_max", "fraction", src0)}
    fixed = {"k_half": f0.values["k_half"], "launch_us": f0.values["launch_us"]}
    for d in sorted(pts):
        if d == main:
            continue
        f = fit_gemm(pts[d], gpu.peak(d), gpu.sm_count, mem_bw, tile, tile, fixed=fixed)
        fits[f"gemm_{d}"] = f
        eff[d] = f.coefficient("eff_max", "fraction", _src(
            prov, "gemm", by[d], f"{d}, peak {gpu.peak(d):g} TF datasheet; k_half/launch from "
            f"the {main} fit; {how}"))
    model = GemmModel(eff_max=eff, k_half=f0.coefficient("k_half", "elements", src0),
                      launch_us=f0.coefficient("launch_us", "us", src0), tile_m=tile,
                      tile_n=tile)
    return model, fits


def _mem_pts(rows: Sequence[Mapping[str, Any]]) -> list[MemPoint]:
    return [MemPoint(float(r["bytes_moved"]), t_compute(r), int(r.get("kernels") or 1))
            for r in rows]


def fit_memory_gpu(rows: Sequence[Mapping[str, Any]], gpu: GPUSpec, prov: str
                   ) -> tuple[MemoryModel, dict[str, FitResult]]:
    """bw_eff and launch from the copies; kind_eff per op-graph family from the others."""
    from .bench_mem import FAMILY_MIX
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(f"{r['kernel']}:{r.get('pass') or 'fwd'}", []).append(r)
    copy = groups.get("copy:fwd", [])
    if len(copy) < 3:
        raise InvalidInputError("measurements", "memory.parquet", "at least 3 copy points "
                                "(HBM bandwidth; re-run with a larger budget)")
    bw = gpu.mem_bw_gbytes_per_s
    fc = fit_memory(_mem_pts(copy), bw)
    src = _src(prov, "memory", copy, f"x.clone() of fp32 buffers up to "
               f"{max(float(r['bytes_moved']) for r in copy) / 2 / 2 ** 30:.1f} GiB, bytes read "
               f"+ written, datasheet HBM {bw:g} GB/s")
    fits, eff = {"memory": fc}, {}
    for g, sel in sorted(groups.items()):
        if g != "copy:fwd" and len(sel) >= 3:
            f = fit_memory(_mem_pts(sel), bw, fixed={"launch_us": fc.values["launch_us"]})
            fits[f"memory_{g.replace(':', '_')}"] = f
            eff[g] = (f.values["bw_eff"], f.heldout_mape_pct, sel)
    kind_eff = {}
    for fam, mix in FAMILY_MIX.items():
        parts = [(b, eff[g][0]) for g, b in mix if g in eff]
        if parts:
            used = [r for g, _ in mix if g in eff for r in eff[g][2]]
            kind_eff[fam] = Coefficient(composite_eff(parts), "fraction", _src(
                prov, "memory", used, "bytes-weighted composite (bench_mem.FAMILY_MIX) of "
                + ", ".join(f"{g} {eff[g][0]:.3f}" for g, _ in mix if g in eff)
                + f" of the datasheet {bw:g} GB/s; bf16, rows of 4096; launch from the copies"))
    return MemoryModel(bw_eff=fc.coefficient("bw_eff", "fraction", src),
                       launch_us=fc.coefficient("launch_us", "us", src),
                       kind_eff=kind_eff), fits


def _attn_points(rows: Sequence[Mapping[str, Any]]) -> tuple[list[AttnPoint], list[AttnPoint]]:
    by = {(r["batch"], r["heads"], r["seq"], r["head_dim"], r["pass"]): r for r in rows}
    fwd = [AttnPoint(float(r["flops_fwd"]), t_compute(r)) for r in rows if r["pass"] == "fwd"]
    bwd = []
    for (b, h, s, d, pas), r in sorted(by.items()):
        f = by.get((b, h, s, d, "fwd"))
        if pas == "fwd_bwd" and f and t_compute(r) > t_compute(f):
            bwd.append(AttnPoint(2.5 * float(r["flops_fwd"]), t_compute(r) - t_compute(f)))
    return fwd, bwd


def fit_attention_gpu(rows: Sequence[Mapping[str, Any]], gpu: GPUSpec, launch_us: float,
                      prov: str) -> tuple[AttentionModel, dict[str, FitResult], list[str]]:
    """fwd/bwd efficiency per (dtype, kernel); per-head_dim values go to the notes. A (dtype,
    kernel) without a forward and a longer forward+backward of one shape is not fitted and
    says so in the notes (``_compute`` transfers the reference's, marked as such)."""
    fwd_eff, bwd_eff, fits, notes = {}, {}, {}, []
    for (dt, backend) in sorted({(r["dtype"], r.get("backend") or "flash") for r in rows}):
        sel = [r for r in rows if r["dtype"] == dt and (r.get("backend") or "flash") == backend]
        fwd, bwd = _attn_points(sel)
        if not fwd or not bwd:
            notes.append(f"attention {dt} {backend}: no shape whose forward+backward outlasts "
                         "its forward (a busy host?): not fitted, the reference's transferred")
            continue
        key = dt if backend == "flash" else f"flash3:{dt}"
        what = (f"SDPA causal {backend} kernel, {dt}, seq {min(r['seq'] for r in sel)}.."
                f"{max(r['seq'] for r in sel)}, head_dim "
                f"{'/'.join(str(d) for d in sorted({r['head_dim'] for r in sel}))}; fraction of "
                f"the datasheet {gpu.peak(dt):g} TF; FLOPs as simulator/workload/ops.py")
        ff = fit_attention(fwd, gpu.peak(dt), launch_us)
        fb = fit_attention(bwd, gpu.peak(dt), launch_us)
        fwd_eff[key] = ff.coefficient("eff", "fraction", _src(prov, "attention", sel,
                                                               what + " (forward)"))
        bwd_eff[key] = fb.coefficient("eff", "fraction", _src(
            prov, "attention", sel, what + "; backward = (fwd+bwd - fwd) time at 2.5x forward "
            "FLOPs"))
        fits[f"attention_{key}_fwd"], fits[f"attention_{key}_bwd"] = ff, fb
        for d in sorted({r["head_dim"] for r in sel}):
            f_d, _ = _attn_points([r for r in sel if r["head_dim"] == d])
            if f_d:
                e = fit_attention(f_d, gpu.peak(dt), launch_us).values["eff"]
                notes.append(f"attention {key} head_dim {d}: forward eff {e:.3f}")
    return AttentionModel(fwd_eff=fwd_eff, bwd_eff=bwd_eff), fits, notes


# ---- assembly ------------------------------------------------------------------------------
def _reference(gpu_key: str) -> Profile:
    import hardware_db
    from simulator.errors import CalibrationMissingError
    try:
        return hardware_db.load_profile(gpu_key)
    except CalibrationMissingError:
        return hardware_db.load_profile("h100-sxm")


def _fill(measured: Mapping[str, Coefficient], ref: Mapping[str, Coefficient], what: str,
          ref_name: str) -> dict[str, Coefficient]:
    """Measured entries, plus the reference's for the keys not measured (said so)."""
    out = dict(measured)
    for k, c in sorted(ref.items()):
        if k not in out:
            out[k] = restamp(c, f"transferred from the reference profile {ref_name!r} ({what} "
                             f"{k} not measured here): ")
    return out


def _marked(obj: Any, m: Measurements, bench: str) -> Any:
    return mark(obj) if m.dirty(bench) else obj


def _compute(m: Measurements, gpu: GPUSpec, ref: Profile, prov: str, key: str):
    from .reference_gemm import tile_for
    memory, fm = fit_memory_gpu(m.memory, gpu, prov)
    gemm, fg = fit_gemm_levels(m.gemm, gpu, gpu.mem_bw_gbytes_per_s * memory.bw_eff.value,
                               tile_for(key), prov)
    gemm = replace(gemm, eff_max=_fill(gemm.eff_max, ref.gemm.eff_max, "GEMM dtype", ref.name))
    attn, fa, notes = fit_attention_gpu(m.attention, gpu, memory.launch_us.value, prov)
    attn = AttentionModel(_fill(attn.fwd_eff, ref.attention.fwd_eff, "attention", ref.name),
                          _fill(attn.bwd_eff, ref.attention.bwd_eff, "attention", ref.name))
    return (_marked(gemm, m, "gemm"), _marked(memory, m, "memory"),
            _marked(attn, m, "attention"), {**fm, **fg, **fa}, notes)


def _communication(m: Measurements, node, ref: Profile, prov: str, gpus: int):
    """(links, overlap, fits, notes)."""
    kind, fits, notes, keep = node.scale_up.kind.value, {}, [], {}
    src = f"{prov}: measurements/collectives.parquet ({gpus} ranks, NCCL, CUDA events)"
    got = scale_up_link(m.collectives, node, ref, src) if m.collectives else None
    if got is not None:
        keep[kind], f = got
        fits.update(f)
        keep[kind] = _marked(keep[kind], m, "collectives")
        oe = other_ops_mape_pct(m.collectives, keep[kind], node)
        if oe:
            notes.append("scale-up fit (all-reduce) MAPE on other NCCL ops: "
                         + ", ".join(f"{k} {v:.0f}%" for k, v in oe.items()))
    why = ("one node cannot measure it" if got is not None else
           f"no NCCL sweep measured: {'1 GPU' if gpus < 2 else 'benchmark did not run'}")
    links = transferred_links(ref, keep, why)
    if m.interference:
        ov, fits["interference"] = overlap(m.interference, f"{prov}: measurements/"
                                           "interference.parquet")
        ov = _marked(ov, m, "interference")
    elif gpus < 2:
        ov = restamp(ref.overlap_slowdown, f"transferred from the reference profile "
                     f"{ref.name!r} (1 GPU: no collective to overlap with): ")
    else:
        ov = assumed_overlap("no measurements/interference.parquet")
    return links, ov, fits, notes


def fit_gpu_profiles(out_dir: Path, strict: bool = False) -> dict[str, Profile]:
    """``{"profile.json": Profile}`` from a GPU calibration directory."""
    import hardware_db
    m = load_measurements(out_dir, strict)
    env = {k: str(m.gemm[0].get(k, "") or "") for k in GPU_FINGERPRINT_KEYS}
    key, gpus = env["gpu_key"], int(env.get("gpus") or 1)
    sheet = hardware_db.load_gpu(key)
    sms = int(env.get("sm_count") or 0) or sheet.sm_count
    gpu = replace(sheet, sm_count=sms, source=f"datasheet of the GPU measured "
                  f"({env['gpu_name'] or key}, {sms} SMs reported by torch): {sheet.source}")
    node = hardware_db.default_node_for_gpu(key)
    ref = _reference(key)
    rows = m.gemm + m.memory + m.attention
    prov = provenance(env, [int(r["sm_clock_mhz"]) for r in rows if r.get("sm_clock_mhz")],
                      [r.get("clock_reasons") or "" for r in rows])
    gemm, memory, attn, fits, notes = _compute(m, gpu, ref, prov, key)
    links, ov, cfits, cnotes = _communication(m, node, ref, prov, gpus)
    fits.update(cfits)
    prof = Profile(
        name=f"{key}-measured", device_key=key, gemm=gemm, memory=memory, attention=attn,
        links=links, overlap_slowdown=ov,
        step_overhead_s=Coefficient(0.0, "s", "assumed: per-step overhead not measured (as in "
                                    "the reference profiles)"),
        fingerprint={**env, "builder": "calibrate.gpu_profile", "provenance": prov,
                     **({"failed_benchmarks": ",".join(m.failed)} if m.failed and gpus > 1
                        else {})},
        notes=_notes(prov, fits, notes + cnotes, gpus), device=gpu, node=None,
        host=_host(ref))
    prof, rejected = keep_in_range(prof, ref, "not informed by this calibration",
                                   f"the reference profile {ref.name!r}")
    if rejected:
        prof = replace(prof, notes=f"{prof.notes} Fitted out of range, not used (reference "
                       "value kept): " + "; ".join(f"{k} {v}" for k, v in rejected.items()))
    return {"profile.json": prof.validate()}


def _host(ref: Profile) -> HostModel | None:
    """The reference profile's host model (per-op CPU issue cost), said to be transferred:
    the GPU benchmarks time kernels on the device, not the host that issues them."""
    if ref.host is None:
        return None
    why = (f"transferred from the reference profile {ref.name!r} (host time per op is not "
           f"measured by the GPU calibration): ")
    return restamp(ref.host, why)


def _notes(prov: str, fits: Mapping[str, FitResult], extra: Sequence[str], gpus: int) -> str:
    parts = [f"GPU calibration ({prov}); efficiencies relative to the datasheet peaks, as the "
             "reference profiles. Held-out MAPE per fit:"]
    for name, f in sorted(fits.items()):
        h = "n/a" if f.heldout_mape_pct is None else f"{f.heldout_mape_pct:.1f}%"
        parts.append(f"{name} {h} (train {f.train_mape_pct:.1f}%, n={f.n_points});")
    parts += [x + ";" for x in extra]
    if gpus < 2:
        parts.append("Single GPU: NCCL collectives and interference skipped; link "
                     "coefficients and overlap slowdown transferred from the reference profile.")
    return " ".join(parts)
