"""Fit a profile's coefficients from a Kineto trace's own durations (``complexity calibrate
--from-trace``), with the fitters of ``calibrate.fit`` and their held-out errors.

What each coefficient is fitted from (every one says so in its ``source``):

- GEMM ``eff_max``, ``k_half``, ``launch_us``: ``fit_gemm`` on each distinct recorded
  ``aten::mm/addmm/bmm`` shape (median time over its calls in the steps used): host time of
  the operator on a CPU trace, the time of the kernels it launched on a GPU trace.
- attention ``fwd_eff`` / ``bwd_eff``: ``fit_attention`` on the fused SDPA operators, FLOPs
  counted as ``simulator.workload.ops`` counts them (causal halving, backward 2.5x).
- memory ``launch_us``: ``fit_memory`` on every bandwidth-bound operator (bytes read and
  written from its recorded shapes); ``kind_eff[family]``: with the model known, the
  family's measured time per step against the bytes and launches the simulator's own op list
  charges for it (``calibrate.sim_ops``: so the efficiency means what the simulator will do
  with it), one point per step; else per distinct shape.
- host time per op (CPU traces): the step's time outside every priced operator and outside
  exposed communication (Python, autograd, views, and operators the simulator does not
  price), divided by the simulator's launches per step; on a CPU (where host and compute
  share one thread) it is added to ``gemm.launch_us`` and ``memory.launch_us``, and the
  fitted profile then carries no ``Profile.host`` (the per-op host model would count it
  again). On a GPU trace it is reported, not folded.
- host link (``links["host"]``, gloo) or the NCCL link: ``fit_link`` on the collectives'
  own executions; ``overlap_slowdown``: ``fit_interference`` on operators timed both alone
  and while a collective ran.

Everything else keeps the base profile's value, its source prefixed "not informed by trace".
So does a fitted value outside its physical range (the checks of a profile read from JSON;
``calibrate.profile_range``), its source then also giving the fitted value that was not used.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from simulator.errors import InvalidInputError
from simulator.hardware.profile import Coefficient, Profile
from simulator.parallel.plan import Plan
from simulator.workload.aten_cost import GEMM_OPS, _matmul_cost
from simulator.workload.ops import executed_attention_flops
from simulator.workload.spec import TransformerSpec

from .fit import (
    AttnPoint,
    FitResult,
    GemmPoint,
    MemPoint,
    fit_attention,
    fit_gemm,
    fit_memory,
)
from .sim_ops import family_totals, launches_per_step, step_ops
from .trace_import import KinetoTrace, OpRecord, numel
from .trace_stats import StepMeasure, clean_steps, event_cost, measure_step, op_time_s

BIG = 1e4
# fingerprint keys of a trace-fitted profile: host time per launch folded into the launch costs
HOST_FOLDED_KEY = "host_us_per_op_folded"          # non-GEMM launches (memory, attention)
HOST_GEMM_FOLDED_KEY = "host_us_per_gemm_folded"
DTYPES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}
ELEM = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}
MEMORY_FAMILIES = ("norm", "softmax", "elementwise", "copy", "optimizer")
# index of ``is_causal`` among the positional arguments (native_functions.yaml signatures)
CAUSAL_ARG = {"_scaled_dot_product_flash_attention_for_cpu": 4,
              "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
              "_scaled_dot_product_flash_attention": 4,
              "_scaled_dot_product_flash_attention_backward": 11,
              "_scaled_dot_product_efficient_attention": 6,
              "_scaled_dot_product_efficient_attention_backward": 11,
              "_scaled_dot_product_cudnn_attention": 6}


@dataclass
class FitInputs:
    """The trace, the steps used and what is known about the run."""

    trace: KinetoTrace
    measures: list[StepMeasure]
    steps_note: str
    model: TransformerSpec | None = None
    plan: Plan | None = None
    event_cost_s: float = 0.0              # the profiler's cost per recorded event
    event_note: str = ""

    @property
    def gpu(self) -> bool:
        return self.trace.has_gpu

    def t(self, op: OpRecord) -> float:
        return op_time_s(op, self.gpu, self.event_cost_s)

    def ops(self, family: str) -> list[OpRecord]:
        idx = {m.step for m in self.measures}
        return [o for o in self.trace.ops if o.family == family and o.step in idx
                and self.t(o) > 0]


@dataclass
class Fitted:
    """Coefficients the trace informed, with their fits."""

    fits: dict[str, FitResult] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)     # CPU without a base device
    gemm: dict[str, Coefficient] = field(default_factory=dict)
    attention: dict[str, Coefficient] = field(default_factory=dict)
    memory_launch: Coefficient | None = None
    kind_eff: dict[str, Coefficient] = field(default_factory=dict)
    mem_bw_gbytes_per_s: float | None = None
    host_us_per_op: float | None = None          # per non-GEMM launch
    host_us_per_gemm: float | None = None
    host_note: str = ""
    links: dict = field(default_factory=dict)
    link_bw_gbytes_per_s: float | None = None
    overlap: Coefficient | None = None
    notes: list[str] = field(default_factory=list)


def inputs(trace: KinetoTrace, model: TransformerSpec | None, plan: Plan | None) -> FitInputs:
    steps, note = clean_steps(trace)
    if not steps:
        raise InvalidInputError("trace", trace.path, "a trace with at least one step")
    cost, how = (0.0, "") if trace.has_gpu else event_cost(trace, steps)
    return FitInputs(trace, [measure_step(trace, s, cost) for s in steps], note, model, plan,
                     cost, how)


def coef(f: FitResult, name: str, unit: str, source: str) -> Coefficient:
    """``f.coefficient`` where the fit determined the value; a standard error as large as
    the value (too few or too noisy points) is dropped and said so, so that writing the
    profile does not round the value away."""
    return guard(f.coefficient(name, unit, source))


def guard(c: Coefficient) -> Coefficient:
    if c.stderr is not None and not (c.stderr < abs(c.value)):
        return replace(c, stderr=None, source=f"{c.source}; poorly determined: standard "
                       f"error {c.stderr:.3g} >= value")
    return c


def _median_groups(ops: Sequence[OpRecord], fi: "FitInputs") -> list[tuple[OpRecord, float, int]]:
    """(an op, median time, calls) per distinct (name, shapes, dtype, phase)."""
    groups: dict[tuple, list[OpRecord]] = {}
    for o in ops:
        groups.setdefault((o.name, o.shapes, o.dtype, o.phase, o.concrete), []).append(o)
    return [(g[0], statistics.median(fi.t(o) for o in g), len(g))
            for _, g in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def src(fi: FitInputs, what: str, n: int, extra: str = "") -> str:
    t = fi.trace
    return (f"fitted from trace {Path(t.path).name} ({what}: {n} distinct shapes from "
            f"{fi.steps_note}; {'kernel' if fi.gpu else 'host'} time, median per shape"
            f"{'; ' + extra if extra else ''})")


# ---- GEMM ---------------------------------------------------------------------------------
def gemm_points(fi: FitInputs) -> dict[str, list[GemmPoint]]:
    out: dict[str, list[GemmPoint]] = {}
    for op, t, _ in _median_groups(fi.ops("gemm"), fi):
        base = op.name.split("::")[-1]
        if base not in GEMM_OPS or len(op.shapes) < 2:
            continue
        try:
            c = _matmul_cost(base, op.shapes)
        except (IndexError, ValueError):
            continue
        dt = DTYPES.get(op.dtype, "fp32")
        if c.m * c.n * c.k > 0:
            out.setdefault(dt, []).append(GemmPoint(c.m * c.batch, c.n, c.k, t, ELEM.get(dt, 4)))
    return out


def fit_gemm_family(fi: FitInputs, base: Profile | None, out: Fitted) -> None:
    dev = base.device if base else None
    for dt, pts in sorted(gemm_points(fi).items()):
        if fi.gpu and dt == "fp32" and dev is not None and dev.peak_tflops.get("tf32"):
            dt = "tf32"           # fp32 matmuls on tensor cores (allow_tf32 / cuBLAS tensor-op)
        if len(pts) < 3:
            out.notes.append(f"GEMM {dt}: {len(pts)} distinct shapes in the trace (< 3): not fitted")
            continue
        peak = dev.peak_tflops.get(dt, 0.0) if dev else 0.0
        bw = (dev.mem_bw_gbytes_per_s * base.memory.bw_eff.value) if dev else BIG
        sm = dev.sm_count if dev else 0
        tm, tn = (base.gemm.tile_m, base.gemm.tile_n) if base else (0, 0)
        tiles, persistent = (base.gemm.tile_shapes(), base.gemm.persistent) if base else ((), False)
        # a GPU's datasheet peak bounds its efficiency; a CPU's "peak" is a fitted asymptote.
        # Kernel times in a trace already run at the clock the job held: no separate ceiling.
        f = fit_gemm(pts, peak or 1.0, sm, bw, tm, tn,
                     eff_max_upper=1.0 if (peak and fi.gpu) else BIG, tiles=tiles,
                     persistent=persistent)
        out.fits[f"gemm_{dt}"] = f
        s = src(fi, f"aten::mm/addmm/bmm {dt}", len(pts))
        if peak:
            out.gemm[f"eff_max:{dt}"] = coef(f, "eff_max", "fraction", s)
        else:
            out.peaks[dt] = f.values["eff_max"]
            out.gemm[f"eff_max:{dt}"] = Coefficient(
                1.0, "fraction", f"1.0 by construction: device peak_tflops[{dt}] is the fitted "
                f"asymptote {f.values['eff_max'] * 1e3:.1f} GFLOP/s; {s}", None,
                f.heldout_mape_pct)
        if "k_half" not in out.gemm:
            out.gemm["k_half"] = coef(f, "k_half", "elements", s)
            out.gemm["launch_us"] = coef(f, "launch_us", "us", s)


# ---- attention ----------------------------------------------------------------------------
def attention_flops(op: OpRecord) -> float | None:
    """FLOPs as simulator.workload.ops.core_attention_ops counts an executed call:
    ``4 b h s_q s_k d`` (``executed_attention_flops``: half of it when causal); backward
    2.5x the forward."""
    base = op.name.split("::")[-1]
    bwd = base.endswith("_backward")
    sh = op.shapes[1:4] if bwd else op.shapes[0:3]
    if len(sh) < 3 or len(sh[0]) < 3 or len(sh[1]) < 2:
        return None
    q, k = sh[0], sh[1]
    bh = numel(q[:-2])
    full = 4.0 * bh * q[-2] * k[-2] * q[-1]
    i = CAUSAL_ARG.get(base)
    causal = i is not None and i < len(op.concrete) and op.concrete[i] == "True"
    executed = executed_attention_flops(full, k[-2], causal)
    return executed * (2.5 if bwd else 1.0)


def fit_attention_family(fi: FitInputs, peak_tflops: float, launch_us: float,
                         out: Fitted) -> None:
    rows: dict[bool, list[AttnPoint]] = {False: [], True: []}
    dts = set()
    for op, t, _ in _median_groups(fi.ops("attention"), fi):
        f = attention_flops(op)
        if f:
            rows[op.name.endswith("_backward")].append(AttnPoint(f, t))
            dts.add(DTYPES.get(op.dtype, "fp32"))
    dt = sorted(dts)[0] if dts else "fp32"
    for bwd, pts in rows.items():
        if not pts:
            continue
        f = fit_attention(pts, peak_tflops, launch_us)
        name = "attention_bwd" if bwd else "attention_fwd"
        out.fits[name] = f
        s = src(fi, "fused SDPA " + ("backward" if bwd else "forward"), len(pts),
                f"fraction of peak {peak_tflops * 1e3:.1f} GFLOP/s")
        out.attention[f"{'bwd' if bwd else 'fwd'}:{dt}"] = coef(f, "eff", "fraction", s)


# ---- bandwidth-bound families ---------------------------------------------------------------
def shape_bytes(op: OpRecord) -> float:
    """Bytes a bandwidth-bound operator moves, from its shapes: every tensor input read
    once, an output the size of the largest input written once."""
    sizes = [numel(s) for s in op.shapes if s]
    return float((sum(sizes) + max(sizes, default=0)) * ELEM.get(DTYPES.get(op.dtype, "fp32"), 4))


def fit_memory_launch(fi: FitInputs, out: Fitted) -> float:
    """The fixed cost of one bandwidth-bound operator: per family with three or more
    distinct shapes, ``fit_memory`` of time vs bytes from shapes; the median of those
    intercepts, never more than half the fastest memory operator of the trace (a fixed cost
    cannot exceed the whole of the shortest call). Returns the bandwidth (GB/s) of all
    bandwidth-bound operators together (bytes over time, launches taken out)."""
    launches, fastest, total_b, total_t, n = [], float("inf"), 0.0, 0.0, 0
    for fam in MEMORY_FAMILIES:
        groups = _median_groups(fi.ops(fam), fi)
        pts = [MemPoint(shape_bytes(op), t) for op, t, _ in groups if shape_bytes(op) > 0]
        for (op, t, calls), p in zip(groups, pts):
            fastest = min(fastest, t)
            total_b, total_t, n = total_b + calls * p.bytes_moved, total_t + calls * t, n + calls
        if len(pts) >= 3:
            f = fit_memory(pts, 1.0, bw_eff_upper=BIG)
            out.fits[f"memory_ops_{fam}"] = f
            launches.append(f.values["launch_us"])
    if n == 0:
        out.notes.append("memory: no bandwidth-bound operators in the trace")
        return 0.0
    cap = 0.5 * fastest * 1e6
    launch = min(statistics.median(launches), cap) if launches else cap
    how = (f"median of the intercepts of {len(launches)} families "
           f"({', '.join(f'{x:.2f}' for x in launches)} us), at most half the fastest memory "
           f"operator ({fastest * 1e6:.2f} us)" if launches else
           f"no family with 3 distinct shapes: half the fastest memory operator "
           f"({fastest * 1e6:.2f} us)")
    out.memory_launch = Coefficient(launch, "us", src(fi, "bandwidth-bound operators, time vs "
                                                      "bytes read and written: " + how, n))
    return total_b / max(total_t - n * launch * 1e-6, 1e-12) / 1e9


def _family_points(fi: FitInputs, fam: str) -> tuple[list[MemPoint], str]:
    """Per step: (bytes and launches the simulator charges for the family, measured time);
    without the model, per distinct shape with shape bytes."""
    if fi.model is not None and fi.plan is not None:
        tot = family_totals(step_ops(fi.model, fi.plan))
        keys = [k for k in tot if k.split(":")[0] == fam]
        b = sum(tot[k]["bytes"] for k in keys)
        n = int(sum(tot[k]["launches"] for k in keys))
        if b <= 0:
            return [], ""
        pts = [MemPoint(b, m.family_s[fam], max(1, n)) for m in fi.measures if m.family_s[fam] > 0]
        return pts, (f"family time per step against the simulator's {b / 1e6:.2f} MB and {n} "
                     f"launches per step for {fi.model.name}")
    pts = [MemPoint(shape_bytes(op), t) for op, t, _ in _median_groups(fi.ops(fam), fi)]
    return [p for p in pts if p.bytes_moved > 0], "bytes from recorded shapes (model unknown)"


def fit_memory_families(fi: FitInputs, mem_bw: float, launch_us: float, out: Fitted) -> None:
    for fam in MEMORY_FAMILIES:
        pts, how = _family_points(fi, fam)
        if not pts:
            continue
        f = fit_memory(pts, mem_bw, fixed={"launch_us": launch_us}, bw_eff_upper=BIG)
        if f.values["bw_eff"] <= 2e-4:            # at the bound: launches explain it all
            out.notes.append(f"memory {fam}: its time is no more than its launches; not fitted")
            continue
        out.fits[f"memory_{fam}"] = f
        s = (f"fitted from trace {Path(fi.trace.path).name} ({fam}: {how}; {len(pts)} points "
             f"from {fi.steps_note}; relative to {mem_bw:.2f} GB/s, launch {launch_us:.2f} us)")
        out.kind_eff[fam] = coef(f, "bw_eff", "fraction", s)


# ---- host time per op -----------------------------------------------------------------------
def fit_host(fi: FitInputs, out: Fitted) -> None:
    """Host (and unpriced-operator) time per simulator launch, median over the steps, split
    into GEMM launches (host time that led to a GEMM) and all others; the profiler's own
    overhead (validate-run traces) is taken out in proportion."""
    if fi.model is not None and fi.plan is not None:
        ops = step_ops(fi.model, fi.plan)
        n_all = launches_per_step(ops)
        n_gemm = sum(s.launches for s in ops if s.family == "gemm")
        per = f"the simulator's launches per step for {fi.model.name}"
    else:
        n_all = int(statistics.median(sum(m.n_ops.values()) for m in fi.measures))
        n_gemm = int(statistics.median(m.n_ops.get("gemm", 0) for m in fi.measures))
        per = "priced operators per step (model unknown)"
    if n_all <= 0:
        return
    gemm = statistics.median(m.host_by_family.get("gemm", 0.0) for m in fi.measures)
    rest = statistics.median(m.host_s + m.unpriced_s for m in fi.measures)
    prof = statistics.median(m.profiler_s for m in fi.measures)
    g_us = gemm / n_gemm * 1e6 if n_gemm else 0.0
    m_us = max(0.0, rest - gemm) / max(1, n_all - n_gemm) * 1e6
    out.host_us_per_op, out.host_us_per_gemm = m_us, g_us
    unpriced = statistics.median(m.unpriced_s for m in fi.measures)
    out.host_note = (f"host time per launch: {g_us:.2f} us per GEMM ({n_gemm} per step), "
                     f"{m_us:.2f} us per other launch ({n_all - n_gemm}), {per}: host time and "
                     f"operators the simulator does not price {rest * 1e3:.3f} ms per step "
                     f"({gemm * 1e3:.3f} ms of it led to GEMMs, {unpriced * 1e3:.3f} ms are "
                     f"unpriced operators), after the profiler's own {prof * 1e3:.3f} ms per "
                     f"step was taken out: {fi.event_note}")


# ---- collectives and overlap ---------------------------------------------------------------
def link_points(fi: FitInputs) -> list:
    from simulator.network.collectives import Collective

    from .fit import LinkPoint
    idx = {m.step for m in fi.measures}
    pts = []
    for c in fi.trace.comms:
        if c.where != "device" or c.step not in idx or c.size_bytes <= 0 or c.dur_s <= 0:
            continue
        try:
            op = Collective(c.collective)
        except ValueError:
            continue
        n = c.group_size or fi.trace.world_size
        if n >= 2:
            pts.append(LinkPoint(c.size_bytes, c.dur_s, op, n))
    return pts


def fit_links(fi: FitInputs, base_link, link_bw: float | None, out: Fitted, kind: str) -> None:
    """``fit_link`` on the collectives' own executions. With a base link only ``bw_eff`` is
    fitted (the others kept): a collective's recorded time includes waiting for the slowest
    rank, which a per-message latency fitted from one trace would absorb. Without one (a
    new host), all four with four or more distinct sizes, else ``bw_eff`` with the others
    assumed 0."""
    from .fit import fit_link, link_coefficients
    pts = link_points(fi)
    if not pts:
        return
    sizes = {(p.op, p.size_bytes) for p in pts}
    fixed = {}
    if base_link is not None and link_bw:
        fixed = {"alpha_us": base_link.alpha_us.value, "small_bw_eff": base_link.small_bw_eff.value,
                 "base_us": base_link.base_us.value}
    elif len(sizes) < 4:
        fixed = {"alpha_us": 0.0, "small_bw_eff": 1e-4, "base_us": 0.0}
    bw = link_bw or 1.0
    f = fit_link(pts, bw, 0.0, 1.0, fixed=fixed, eff_upper=1.0 if link_bw else BIG)
    out.fits[f"link_{kind}"] = f
    s = (f"fitted from trace {Path(fi.trace.path).name} ({len(pts)} {fi.trace.backend or ''} "
         f"collective executions, {len(sizes)} distinct sizes, from {fi.steps_note}"
         + (f"; {', '.join(sorted(fixed))} " + ("kept from the base profile" if link_bw
                                                 else "assumed 0") if fixed else "") + ")")
    lc = link_coefficients(f, s)
    lc = replace(lc, alpha_us=guard(lc.alpha_us), small_bw_eff=guard(lc.small_bw_eff),
                 base_us=guard(lc.base_us), bw_eff=guard(lc.bw_eff))
    if not link_bw:                       # new host: the link's bandwidth is the fitted rate
        out.link_bw_gbytes_per_s = f.values["bw_eff"]
        lc = replace(lc, bw_eff=Coefficient(1.0, "fraction", "1.0 by construction: link "
                                            f"bandwidth is the fitted {f.values['bw_eff']:.3f} "
                                            f"GB/s; {s}", None, f.heldout_mape_pct),
                     small_bw_eff=replace(lc.small_bw_eff, value=min(
                         1.0, lc.small_bw_eff.value / max(f.values["bw_eff"], 1e-9))))
    out.links[kind] = lc


def fit_overlap_family(fi: FitInputs, out: Fitted) -> None:
    """Operators of one shape timed both while a collective ran and alone: the slowdown."""
    from .fit import InterferencePoint, fit_interference
    idx = {m.step for m in fi.measures}
    comm = sorted((c.ts_s, c.ts_s + c.dur_s) for c in fi.trace.comms
                  if c.where == "device" and c.step in idx)
    if not comm:
        return
    groups: dict[tuple, tuple[list[float], list[float]]] = {}
    for o in fi.trace.ops:
        if o.step not in idx or o.family == "other":
            continue
        busy = any(a < o.end_s and o.ts_s < b for a, b in comm)
        g = groups.setdefault((o.name, o.shapes, o.phase), ([], []))
        g[1 if busy else 0].append(fi.t(o))
    meds = [(statistics.median(a), statistics.median(b)) for a, b in groups.values() if a and b]
    # an operator no longer than the profiler's own cost per event (time <= 0 once that is
    # taken out) says nothing about a slowdown
    pts = [InterferencePoint(a, b) for a, b in meds if a > 0 and b > 0]
    if len(pts) < 3:
        return
    f = fit_interference(pts)
    out.fits["interference"] = f
    out.overlap = coef(f, "slowdown", "multiplier", (
        f"fitted from trace {Path(fi.trace.path).name} ({len(pts)} operator shapes timed both "
        f"alone and while a collective ran, median each, {fi.steps_note})"))
