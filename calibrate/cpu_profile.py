"""Fit a measured device's Profile from ``OUT/measurements/*.parquet`` (calibrate.bench).

A CPU has no datasheet peak we trust, so the device's peaks *are* the fitted asymptotes:
``peak_tflops[dtype]`` = fitted asymptotic GEMM rate with ``eff_max = 1.0``;
``mem_bw_gbytes_per_s`` = fitted bandwidth with ``bw_eff = 1.0``; the host link's bandwidth
= the fitted gloo large-message bandwidth with ``bw_eff = 1.0``. ``sm_count = 0`` turns wave
quantization off. Efficiencies of attention are relative to the fitted fp32 peak.

One profile per thread count measured: ``profile.json`` (one process, torch's default
threads) and, on a multi-core host, ``profile_1thread.json`` (one thread per rank, as
``torchrun --nproc`` = cores runs). Collectives and interference are always measured with
one thread per rank and appear in both.
"""
from __future__ import annotations

import sys

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.errors import InvalidInputError
from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    LinkCoefficients,
    MemoryModel,
    Profile,
)
from simulator.hardware.specs import GPUSpec, LinkKind, LinkSpec, NodeSpec
from simulator.hardware.profile_schema import MAX_MEASURED_FRACTION
from simulator.network.collectives import Collective, ring_steps_and_traffic

from .cpu_host import host_launch, host_model, load_host_rows, step_overhead
from .discover import DeviceInfo, discover_cpu
from .fit import (
    MN_HALF,
    AttnPoint,
    FitResult,
    GemmPoint,
    InterferencePoint,
    LinkPoint,
    MemPoint,
    composite_eff,
    fit_attention,
    fit_gemm,
    fit_interference,
    fit_link,
    fit_memory,
    link_model,
)
from .hygiene import (
    COMPUTE_BENCHES,
    OPTIONAL_BENCHES,
    assumed_overlap,
    mark,
    select_rows,
)
from .store import FINGERPRINT_KEYS, read_rows

BIG = 1e4      # upper bound for "efficiency" parameters that carry absolute rates


def t_compute(r: Mapping[str, Any]) -> float:
    """Time of a compute point used by the fits: the 10th percentile of its samples (robust
    to stalls from other load on a shared host; falls back to the median for old files)."""
    return r.get("p10_s") or r["median_s"]


@dataclass(frozen=True)
class Measurements:
    """Raw rows per benchmark (dicts as stored in Parquet), as the fits may use them
    (``calibrate.hygiene.select_rows``)."""

    gemm: list[dict[str, Any]]
    memory: list[dict[str, Any]]
    attention: list[dict[str, Any]]
    collectives: list[dict[str, Any]]
    interference: list[dict[str, Any]]
    # bench -> thread counts (None = whole bench) whose fit had to use suspect points
    contaminated: Mapping[str, frozenset] = field(default_factory=dict)
    failed: tuple[str, ...] = ()          # optional benchmarks that left no file

    def dirty(self, bench: str, threads: int | None = None) -> bool:
        marks = self.contaminated.get(bench, frozenset())
        return None in marks or threads in marks


def load_measurements(out_dir: Path, strict: bool = False) -> Measurements:
    """Read every benchmark file; one-line errors for a missing directory or file (a missing
    collectives or interference file is tolerated unless ``strict``: that benchmark failed)."""
    mdir = Path(out_dir) / "measurements"
    if not mdir.is_dir():
        raise InvalidInputError("out", str(out_dir), "a directory containing measurements/ "
                                "(run `complexity calibrate --out DIR` first)")
    rows, dirty, failed = {}, {}, []
    for bench in COMPUTE_BENCHES + OPTIONAL_BENCHES:
        path = mdir / f"{bench}.parquet"
        if not path.exists():
            if bench in OPTIONAL_BENCHES and not strict:
                rows[bench] = []
                failed.append(bench)
                continue
            raise InvalidInputError("measurements", str(path), "an existing file (re-run "
                                    "`complexity calibrate`; it resumes where it stopped)")
        sel = select_rows(bench, read_rows(path), path, strict)
        rows[bench] = sel.rows
        if sel.contaminated_threads:
            dirty[bench] = sel.contaminated_threads
    return Measurements(**rows, contaminated=dirty, failed=tuple(failed))


def _src(bench: str, rows: Sequence[Mapping[str, Any]], what: str) -> str:
    stat = "mean" if bench == "collectives" else ("median" if bench == "interference"
                                                 else "10th-percentile")
    return (f"fit to measurements/{bench}.parquet ({len(rows)} points, {stat} time per point"
            f"{', ' + what if what else ''})")


# ---- compute ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeFit:
    """Fitted compute side of one thread count."""

    peak_tflops: Mapping[str, float]
    mem_bw_gbytes_per_s: float
    gemm: GemmModel
    memory: MemoryModel
    attention: AttentionModel
    fits: Mapping[str, FitResult]


def _mem_pts(rows: Sequence[Mapping[str, Any]]) -> list[MemPoint]:
    return [MemPoint(r["bytes_moved"], t_compute(r), int(r.get("kernels") or 1)) for r in rows]


def _group(r: Mapping[str, Any]) -> str:
    return f"{r['kernel']}:{r.get('pass') or 'fwd'}"


def _memory(rows: Sequence[Mapping[str, Any]], threads: int
            ) -> tuple[float, MemoryModel, dict[str, FitResult]]:
    """Per kernel group (calibrate.bench_mem, e.g. ``layernorm:bwd``) a fit of
    ``kernels * launch + bytes / (bw * eff)``: the device bandwidth is the copy kernel's
    (pure streaming, eff 1); each other group's ``eff`` is its asymptotic bandwidth relative
    to copy and its launch its own fixed per-op cost (autograd and fused-optimizer overheads
    differ a lot between groups on a CPU). ``kind_eff`` of each op-graph family is the
    composite of its groups (``FAMILY_MIX``); the profile's single per-op ``launch_us`` is
    the median of the groups' launches. Older files without families: one bandwidth and
    launch fitted to every kernel."""
    if not any(r.get("family") for r in rows) or not any(r["kernel"] == "copy" for r in rows):
        return _memory_single(rows, threads)
    from .bench_mem import FAMILY_MIX
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(_group(r), []).append(r)
    fc = fit_memory(_mem_pts(by["copy:fwd"]), 1.0, bw_eff_upper=BIG)
    bw = fc.values["bw_eff"]
    fits, eff, launches = {"memory": fc}, {}, [fc.values["launch_us"]]
    for g, sel in sorted(by.items()):
        if g == "copy:fwd" or len(sel) < 3:
            continue
        fits[f"memory_{g.replace(':', '_')}"] = f = fit_memory(_mem_pts(sel), bw, bw_eff_upper=BIG)
        if f.values["bw_eff"] >= 0.99 * BIG:
            # the time did not grow with the bytes (a busy host between sizes): no rate to
            # take; its family falls back to the other groups, or to the copy bandwidth
            print(f"calibrate: memory group {g}: the fitted rate hit its bound (time did not "
                  "grow with bytes: a busy host?); not used", file=sys.stderr)
            continue
        eff[g] = (f.values["bw_eff"], f.heldout_mape_pct)
        if not g.startswith("first_touch"):        # not an op of the graph: no launch
            launches.append(f.values["launch_us"])
    what = (f"fp32, {threads} threads; bytes as simulator/workload/ops.py (optimizer: "
            "simulator.engine.step.optimizer_bytes_per_param) counts them")
    kind_eff = {"copy": Coefficient(1.0, "fraction", "1.0 by construction: the device "
                                    "bandwidth is the copy kernel's", None, fc.heldout_mape_pct)}
    for fam, mix in FAMILY_MIX.items():
        parts = [(b, eff[g][0]) for g, b in mix if g in eff]
        if not parts:
            continue
        held = [eff[g][1] for g, _ in mix if g in eff and eff[g][1] is not None]
        used = ", ".join(f"{g} {eff[g][0]:.3f}" for g, _ in mix if g in eff)
        kind_eff[fam] = Coefficient(
            composite_eff(parts), "fraction", f"bytes-weighted composite (FAMILY_MIX) of the "
            f"fitted asymptotic efficiencies {used}, relative to copy {bw:.1f} GB/s; "
            + _src("memory", [r for g, _ in mix for r in by.get(g, [])], what),
            None, sum(held) / len(held) if held else None)
    src = _src("memory", rows, f"copy (x.clone()) {what}")
    launch = sorted(launches)[len(launches) // 2]   # median: robust to the multi-kernel groups
    model = MemoryModel(
        bw_eff=Coefficient(1.0, "fraction", f"1.0 by construction: the device bandwidth is the "
                           f"fitted copy bandwidth {bw:.2f} GB/s (+/- {fc.stderr['bw_eff']:.2f}); "
                           + src, None, fc.heldout_mape_pct),
        launch_us=Coefficient(launch, "us", "median of the per-group fitted launch costs ("
                              + ", ".join(f"{x:.1f}" for x in sorted(launches)) + " us); "
                              + src, None, fc.heldout_mape_pct),
        kind_eff=kind_eff)
    return bw, model, fits


def _memory_single(rows: Sequence[Mapping[str, Any]], threads: int
                   ) -> tuple[float, MemoryModel, dict[str, FitResult]]:
    f = fit_memory(_mem_pts(rows), 1.0, bw_eff_upper=BIG)
    src = _src("memory", rows, f"copy/add/layernorm/softmax/gelu fp32, {threads} threads")
    bw = f.values["bw_eff"]
    model = MemoryModel(
        bw_eff=Coefficient(1.0, "fraction", f"1.0 by construction: the device bandwidth is the "
                           f"fitted {bw:.2f} GB/s (+/- {f.stderr['bw_eff']:.2f}); {src}",
                           None, f.heldout_mape_pct),
        launch_us=f.coefficient("launch_us", "us", src))
    return bw, model, {"memory": f}


MIN_MN_HALF_POINTS = 4


def training_gemm_rows(rows: Sequence[Mapping[str, Any]], by: str = "") -> list[Mapping[str, Any]]:
    """The cold-cache points (as kernels run inside a training step) where there are any,
    per value of column ``by`` (e.g. per memory kernel); hot points elsewhere (files from
    older calibrations, the optimizer points)."""
    out: list[Mapping[str, Any]] = []
    for key in dict.fromkeys(r.get(by) if by else None for r in rows):
        sel = [r for r in rows if (r.get(by) if by else None) == key]
        cold = [r for r in sel if r.get("cache") == "cold"]
        out += cold if cold else sel
    return out


def separates_mn_half(pts: Sequence[GemmPoint]) -> bool:
    """Whether a sweep can tell the output-panel term from the k-loop term: at least
    ``MIN_MN_HALF_POINTS`` shapes whose smaller output dimension differs from their k (on
    cubes the two factors are one and the same)."""
    return len({(p.m, p.n, p.k) for p in pts if min(p.m, p.n) != p.k}) >= MIN_MN_HALF_POINTS


def _gemm(rows: Sequence[Mapping[str, Any]], mem_bw: float, threads: int
          ) -> tuple[dict[str, float], GemmModel, dict[str, FitResult]]:
    rows = training_gemm_rows(rows)
    cold = any(r.get("cache") == "cold" for r in rows)

    def pts(dt: str) -> list[GemmPoint]:
        return [GemmPoint(r["m"], r["n"], r["k"], t_compute(r), 2 if dt == "bf16" else 4)
                for r in rows if r["dtype"] == dt]
    fp32 = [r for r in rows if r["dtype"] == "fp32"]
    # mn_half: the rate's saturation in the smaller output dimension (a blocked CPU GEMM
    # packs each operand panel once per pass over the other output dimension). Without it
    # the small shapes' loss went into the cold-sweep intercept, which the simulator does
    # not charge inside a step (cpu_host.host_launch), so narrow GEMMs came out at the
    # asymptotic rate: 1.25-1.38x fast for the n=128 GEMMs of tiny-2l-128 (torch.profiler).
    f32 = fit_gemm(pts("fp32"), 1.0, 0, mem_bw, 0, 0, eff_max_upper=BIG,
                   fit_mn_half=separates_mn_half(pts("fp32")))
    how = ("cold caches, NT/NN/TN layouts of the transformer GEMMs" if cold else "hot caches")
    src = _src("gemm", fp32, f"torch.mm fp32, {threads} threads, {how}; peak 1.0 TF "
               "placeholder, so eff_max = asymptotic TFLOP/s")
    peaks, fits = {"fp32": f32.values["eff_max"]}, {"gemm_fp32": f32}
    eff = {"fp32": _unit_eff(f32, "fp32", src)}
    mn_half = (f32.coefficient(MN_HALF, "elements", src) if MN_HALF in f32.values else None)
    if len(pts("bf16")) >= 2:
        fixed = {k: f32.values[k] for k in ("k_half", "launch_us", MN_HALF) if k in f32.values}
        fb = fit_gemm(pts("bf16"), 1.0, 0, mem_bw, 0, 0, fixed=fixed, eff_max_upper=BIG)
        bsrc = _src("gemm", [r for r in rows if r["dtype"] == "bf16"],
                    f"torch.mm bf16, {threads} threads; k_half/launch from the fp32 fit")
        peaks["bf16"], fits["gemm_bf16"] = fb.values["eff_max"], fb
        eff["bf16"] = _unit_eff(fb, "bf16", bsrc)
    model = GemmModel(eff_max=eff, k_half=f32.coefficient("k_half", "elements", src),
                      launch_us=f32.coefficient("launch_us", "us", src), tile_m=0, tile_n=0,
                      mn_half=mn_half)
    return peaks, model, fits


def _unit_eff(f: FitResult, dtype: str, src: str) -> Coefficient:
    rate, err = f.values["eff_max"], f.stderr["eff_max"]
    return Coefficient(1.0, "fraction", f"1.0 by construction: device peak_tflops[{dtype}] is "
                       f"the fitted asymptote {rate * 1e3:.1f} GFLOP/s (+/- {err * 1e3:.1f}); "
                       f"{src}", None, f.heldout_mape_pct)


def _attention(rows: Sequence[Mapping[str, Any]], peak_fp32: float, launch_us: float,
               threads: int) -> tuple[AttentionModel, dict[str, FitResult]]:
    by = {(r["batch"], r["heads"], r["seq"], r["head_dim"], r["pass"]): r for r in rows}
    fwd = [AttnPoint(r["flops_fwd"], t_compute(r)) for r in rows if r["pass"] == "fwd"]
    bwd = []
    for (b, h, s, d, pas), r in by.items():
        f = by.get((b, h, s, d, "fwd"))
        if pas == "fwd_bwd" and f and t_compute(r) > t_compute(f):
            bwd.append(AttnPoint(2.5 * r["flops_fwd"], t_compute(r) - t_compute(f)))
    ff = fit_attention(fwd, peak_fp32, launch_us)
    fb = fit_attention(bwd, peak_fp32, launch_us)
    what = (f"scaled_dot_product_attention causal fp32, {threads} threads; fraction of the "
            f"fitted fp32 peak {peak_fp32 * 1e3:.1f} GFLOP/s; FLOPs as simulator/workload/ops.py")
    fc = ff.coefficient("eff", "fraction", _src("attention", rows, what + " (forward)"))
    bc = fb.coefficient("eff", "fraction", _src("attention", rows, what + "; backward = "
                        "(fwd+bwd - fwd) time at 2.5x forward FLOPs"))
    return AttentionModel(fwd_eff={"fp32": fc}, bwd_eff={"fp32": bc}), \
        {"attention_fwd": ff, "attention_bwd": fb}


def fit_compute(m: Measurements, threads: int) -> ComputeFit:
    """GEMM, memory and attention fits for the rows measured with ``threads`` threads."""
    pick = lambda rows: [r for r in rows if r["threads"] == threads]
    mem_rows = training_gemm_rows(pick(m.memory), by="kernel")
    gemm_rows, attn_rows = pick(m.gemm), training_gemm_rows(pick(m.attention))
    if not (mem_rows and gemm_rows and attn_rows):
        raise InvalidInputError("threads", threads, "a thread count present in gemm, memory "
                                "and attention measurements")
    bw, memory, fm = _memory(mem_rows, threads)
    peaks, gemm, fg = _gemm(gemm_rows, bw, threads)
    attention, fa = _attention(attn_rows, peaks["fp32"], memory.launch_us.value, threads)
    return ComputeFit(peaks, bw, gemm, memory, attention, {**fm, **fg, **fa})


# ---- communication -------------------------------------------------------------------------
def fit_host_link(rows: Sequence[Mapping[str, Any]]) -> tuple[float, LinkCoefficients, FitResult]:
    """gloo collectives -> (bandwidth GB/s, host-link coefficients with bw_eff = 1, fit).

    Uses each point's mean time (gloo latencies are heavy-tailed here and a training step
    pays the mean).
    """
    def pts(sel):
        return [LinkPoint(r["size_bytes"], r["mean_s"] or r["median_s"], Collective(r["op"]),
                          int(r["n_ranks"])) for r in sel]
    ar = [r for r in rows if r["op"] == "all_reduce"]
    f = fit_link(pts(ar), 1.0, 0.0, 1.0, eff_upper=BIG)
    bw = f.values["bw_eff"]
    src = _src("collectives", ar, "gloo all_reduce between local processes (the collective "
               "data parallelism uses; other ops are kept in the file and scored in the notes), "
               "mean time per point; link bandwidth 1 GB/s placeholder, hop latency 0")
    c = LinkCoefficients(
        alpha_us=f.coefficient("alpha_us", "us", src),
        small_bw_eff=_small_eff(f, bw, ar, src),
        base_us=f.coefficient("base_us", "us", src),
        bw_eff=Coefficient(1.0, "fraction", f"1.0 by construction: host link bandwidth is the "
                           f"fitted {bw:.3f} GB/s (+/- {f.stderr['bw_eff']:.3f}); {src}",
                           None, f.heldout_mape_pct))
    return bw, c, f


def _small_eff(f: FitResult, bw: float, rows: Sequence[Mapping[str, Any]],
               src: str) -> Coefficient:
    """The small-message bandwidth as a fraction of the large-message one. Where the
    messages the latency regime serves are latency-dominated, the fit can drive that
    bandwidth term to ~0 (a fraction in the thousands: seen on a loaded CI host); the term is
    then unidentified, so it is held at ``MAX_MEASURED_FRACTION`` and the source says by how
    much that moves the largest all-reduce measured at <= 1 MiB."""
    gbs = f.values["small_bw_eff"]
    small = gbs / bw
    what = f"fitted small-message bandwidth {gbs:.3f} GB/s / large {bw:.3f} GB/s; "
    if small <= MAX_MEASURED_FRACTION:
        return Coefficient(small, "fraction", what + src, f.err("small_bw_eff", 1.0 / bw),
                           f.heldout_mape_pct)
    big = max((r for r in rows if r["size_bytes"] <= 1 << 20),
              key=lambda r: (r["size_bytes"], int(r["n_ranks"])), default=None)
    wire = ring_steps_and_traffic(Collective.ALL_REDUCE, int(big["n_ranks"]),
                                  big["size_bytes"])[1] if big else float(1 << 21)
    shift_us = wire / (bw * 1e9) * (1.0 / MAX_MEASURED_FRACTION - 1.0 / small) * 1e6
    return Coefficient(MAX_MEASURED_FRACTION, "fraction", what + f"unidentified (the "
                       f"bandwidth term is negligible next to the latency in these messages), "
                       f"held at {MAX_MEASURED_FRACTION:g}: adds {shift_us:.3f} us to a "
                       f"{wire / 1e6:.3f} MB-on-the-wire all-reduce; " + src, None,
                       f.heldout_mape_pct)


def other_ops_error_pct(rows: Sequence[Mapping[str, Any]], f: FitResult) -> dict[str, float]:
    """MAPE (%) of the all-reduce-fitted host link on each other measured collective."""
    model = link_model(1.0, 0.0, 1.0)
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["op"] == "all_reduce":
            continue
        t = r["mean_s"] or r["median_s"]
        p = model(f.values, LinkPoint(r["size_bytes"], t, Collective(r["op"]), int(r["n_ranks"])))
        out.setdefault(r["op"], []).append(abs(p - t) / t * 100.0)
    return {op: sum(v) / len(v) for op, v in sorted(out.items())}


def fit_overlap(rows: Sequence[Mapping[str, Any]]) -> tuple[Coefficient, FitResult]:
    span = [r for r in rows if r.get("mode") == "span"]
    if span:
        pts = [InterferencePoint(r["alone_s"], r["median_s"], r["comm_alone_s"]) for r in span]
        what = ("a loop of torch.mm lasting ~2x a gloo all_reduce, timed alone and with the "
                "all_reduce in flight (async, as DDP overlaps buckets), 1 thread per rank; "
                "slowdown - 1 = extra compute time / overlapped time")
        rows = span
    else:
        pts = [InterferencePoint(r["alone_s"], r["median_s"]) for r in rows]
        what = ("torch.mm timed alone vs while an async gloo all_reduce is in flight, 1 "
                "thread per rank")
    f = fit_interference(pts)
    return f.coefficient("slowdown", "multiplier", _src("interference", rows, what)), f


# ---- assembly ------------------------------------------------------------------------------
def build_device(info: DeviceInfo, cf: ComputeFit, threads: int, date: str) -> GPUSpec:
    return GPUSpec(key=info.key, name=info.name, vendor=info.name.split()[0] if info.name else "",
                   peak_tflops=dict(cf.peak_tflops), mem_bytes=info.mem_bytes,
                   mem_bw_gbytes_per_s=cf.mem_bw_gbytes_per_s, tdp_w=0.0, sm_count=0,
                   source=f"measured by `complexity calibrate` on {date} with {threads} torch "
                          "thread(s): peaks are fitted GEMM asymptotes, bandwidth the fitted "
                          "memory-kernel bandwidth")


def build_node(info: DeviceInfo, bw: float, ranks: int) -> NodeSpec:
    host = LinkSpec(key="host-gloo", kind=LinkKind.HOST, bandwidth_gbytes_per_s=bw,
                    latency_us=0.0, source="fitted gloo large-message bandwidth between local "
                    "processes (latency folded into alpha_us/base_us)")
    nic = LinkSpec(key="none", kind=LinkKind.ETHERNET, bandwidth_gbytes_per_s=0.0,
                   latency_us=0.0, source="single host: no network measured")
    return NodeSpec(key=f"{info.key}-host", gpu_key=info.key, gpus_per_node=ranks,
                    scale_up=host, scale_up_domain_gpus=ranks, in_switch_reduction=False,
                    nics_per_node=0, nic=nic,
                    source=f"this host: up to {ranks} ranks (one per logical core)")


def _communication(m: Measurements) -> tuple[float, dict, Coefficient, dict[str, FitResult]]:
    """(host-link GB/s, links, overlap slowdown, fits); what a failed benchmark could not
    measure is absent (links) or assumed (overlap), marked contaminated."""
    links, fits, bw = {}, {}, 0.0
    if m.collectives:
        bw, host, fits["host_link"] = fit_host_link(m.collectives)
        links["host"] = mark(host) if m.dirty("collectives") else host
    if m.interference:
        overlap, fits["interference"] = fit_overlap(m.interference)
        overlap = mark(overlap) if m.dirty("interference") else overlap
    else:
        overlap = assumed_overlap("no measurements/interference.parquet")
    return bw, links, overlap, fits


def _compute_marked(cf: ComputeFit, m: Measurements, threads: int) -> ComputeFit:
    return replace(cf, gemm=mark(cf.gemm) if m.dirty("gemm", threads) else cf.gemm,
                   memory=mark(cf.memory) if m.dirty("memory", threads) else cf.memory,
                   attention=mark(cf.attention) if m.dirty("attention", threads)
                   else cf.attention)


def fit_profiles(out_dir: Path, info: DeviceInfo | None = None,
                 strict: bool = False) -> dict[str, Profile]:
    """Profiles keyed by file name (``profile.json``, ``profile_1thread.json``)."""
    m = load_measurements(out_dir, strict)
    info = info or discover_cpu()
    bw, links, overlap, comm_fits = _communication(m)
    env = {k: str(m.gemm[0].get(k, "")) for k in FINGERPRINT_KEYS}
    hsel = load_host_rows(out_dir, strict)
    out = {}
    for threads in sorted({r["threads"] for r in m.gemm}, reverse=True):
        cf = _compute_marked(fit_compute(m, threads), m, threads)
        name = "profile.json" if threads == max(r["threads"] for r in m.gemm) \
            else f"profile_{threads}thread.json"
        fits = {**cf.fits, **comm_fits}
        gemm, memory, host, hnote = cf.gemm, cf.memory, None, ""
        overhead = Coefficient(0.0, "s", "assumed: per-step overhead not measured")
        if hsel is not None and any(int(r["threads"]) == threads for r in hsel.rows):
            host = host_model(hsel.rows, threads, threads in hsel.contaminated_threads)
            gemm, memory, hnote = host_launch(gemm, memory)
            overhead = step_overhead(hsel.rows, threads, host) or overhead
        out[name] = Profile(
            name=f"{info.key}-measured-{threads}t", device_key=info.key, gemm=gemm,
            memory=memory, attention=cf.attention, links=links, host=host,
            overlap_slowdown=overlap,
            step_overhead_s=overhead,
            fingerprint={**env, "threads": str(threads), "builder": "calibrate.cpu_profile",
                         **({"failed_benchmarks": ",".join(m.failed)} if m.failed else {})},
            notes=_notes(fits, threads) + _extra_notes(m, threads, comm_fits.get("host_link"))
            + hnote,
            device=build_device(info, cf, threads, env["date"]),
            node=build_node(info, bw, max(1, info.cores) if links else 1))
    # no reference profile to fall back on: a fitted value out of range is refused here
    return {name: prof.validate() for name, prof in out.items()}


def per_kernel_bandwidth(rows: Sequence[Mapping[str, Any]], threads: int) -> dict[str, float]:
    """Fitted GB/s (op-graph bytes) of each memory-bound kernel and pass alone."""
    out = {}
    for k, pas in sorted({(r["kernel"], r.get("pass") or "fwd") for r in rows}):
        sel = _mem_pts([r for r in rows if r["kernel"] == k and (r.get("pass") or "fwd") == pas
                        and r["threads"] == threads])
        if len(sel) >= 3:
            out[f"{k} {pas}"] = fit_memory(sel, 1.0, bw_eff_upper=BIG).values["bw_eff"]
    return out


def _extra_notes(m: Measurements, threads: int, fl: FitResult | None) -> str:
    kb = per_kernel_bandwidth(m.memory, threads)
    text = (" Memory-bound kernels differ a lot on a CPU; per-kernel fitted GB/s (op-graph "
            "bytes): " + ", ".join(f"{k} {v:.1f}" for k, v in kb.items()) + ".")
    if fl is not None:
        oe = other_ops_error_pct(m.collectives, fl)
        text += (" Host-link (all_reduce fit) MAPE on other gloo ops: "
                 + ", ".join(f"{k} {v:.0f}%" for k, v in oe.items()) + ".")
    if m.failed:
        text += (f" Benchmarks that did not complete: {', '.join(m.failed)} (no host link: "
                 "single-process predictions only)." if "collectives" in m.failed else
                 f" Benchmarks that did not complete: {', '.join(m.failed)}.")
    return text


def _notes(fits: Mapping[str, FitResult], threads: int) -> str:
    parts = [f"Measured on this host with {threads} torch thread(s) for compute. Held-out "
             "MAPE per fit:"]
    for name, f in sorted(fits.items()):
        h = "n/a" if f.heldout_mape_pct is None else f"{f.heldout_mape_pct:.1f}%"
        parts.append(f"{name} {h} (train {f.train_mape_pct:.1f}%, n={f.n_points});")
    return " ".join(parts)
