"""``complexity calibrate --from-trace``: a profile from a trace's own durations
(``calibrate.trace_fit``), on top of a base profile whose coefficients the trace cannot
inform (kept, and said so).

Base: ``--profile`` if given; else, for a GPU trace, the shipped reference profile of the
GPU named in the trace (``deviceProperties``, or ``--gpu``); else (a CPU trace) none: the
device is described by the trace itself (peaks = fitted GEMM asymptotes, bandwidth = the
fitted bandwidth of the bandwidth-bound operators, host link = the fitted collective rate)
and coefficients the trace cannot inform are assumed and marked so.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.errors import InvalidInputError
from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    MemoryModel,
    Profile,
)
from simulator.hardware.specs import GPUSpec, LinkKind, LinkSpec, NodeSpec
from simulator.parallel.plan import Plan
from simulator.workload.spec import TransformerSpec

from .profile_io import write_profile
from .profile_range import keep_in_range
from .trace_fit import (
    HOST_FOLDED_KEY,
    HOST_GEMM_FOLDED_KEY,
    Fitted,
    fit_attention_family,
    fit_gemm_family,
    fit_host,
    fit_links,
    fit_memory_families,
    fit_memory_launch,
    fit_overlap_family,
    inputs,
)
from .trace_import import KinetoTrace, load_trace


@dataclass(frozen=True)
class Base:
    profile: Profile | None
    device: GPUSpec | None
    node: NodeSpec | None
    name: str


@dataclass(frozen=True)
class TraceCalibration:
    profile: Profile
    path: Path
    fitted: Fitted
    trace: KinetoTrace
    informed: tuple[str, ...]
    kept: tuple[str, ...]


def match_gpu(name: str) -> str | None:
    """hardware_db key of a GPU named as ``deviceProperties`` names it
    (``NVIDIA H100 80GB HBM3`` -> ``h100-sxm``, ``AMD Instinct MI250X`` -> ``mi250x``), or
    None: the device probe's own matcher (``calibrate.device.gpu_key_for``: the model
    family, PCIe parts only for a name saying PCIe, the memory size the name states)."""
    from .device import gpu_key_for
    size = re.search(r"(\d+)\s*gb", name.lower())
    return gpu_key_for(name, float(size.group(1)) * 1e9 if size else 0.0)


def resolve_base(trace: KinetoTrace, profile_path: str | None, gpu: str | None) -> Base:
    if profile_path:
        p = Profile.read_json(profile_path)
        dev = p.device
        if dev is None:
            import hardware_db
            dev = hardware_db.load_gpu(gpu or p.device_key)
        return Base(p, dev, p.node, f"{Path(profile_path).name} ({p.name})")
    if not trace.has_gpu and not gpu:
        return Base(None, None, None, "")
    key = gpu or match_gpu(trace.device)
    if key is None:
        raise InvalidInputError("gpu", trace.device, "a GPU this tool knows (pass --gpu KEY or "
                                "--profile PROFILE.json; `complexity list gpus`)")
    import hardware_db
    return Base(hardware_db.load_profile(key), hardware_db.load_gpu(key),
                hardware_db.default_node_for_gpu(key), f"shipped reference profile {key}")


def calibrate_from_trace(trace_path: str | Path, out_dir: str | Path,
                         model: TransformerSpec | None = None, plan: Plan | None = None,
                         profile_path: str | None = None, gpu: str | None = None
                         ) -> TraceCalibration:
    """Fit, assemble and write ``OUT/profile.json``."""
    trace = load_trace(trace_path)
    base = resolve_base(trace, profile_path, gpu)
    fi = inputs(trace, model, plan)
    out = Fitted()
    fit_gemm_family(fi, base.profile and replace(base.profile, device=base.device), out)
    mix_bw = fit_memory_launch(fi, out)
    mem_bw = base.device.mem_bw_gbytes_per_s if base.device else mix_bw
    launch = out.memory_launch.value if out.memory_launch else (
        base.profile.memory.launch_us.value if base.profile else 0.0)
    if mem_bw > 0:
        fit_memory_families(fi, mem_bw, launch, out)
    peak = (base.device.peak("fp32") if base.device and not trace.has_gpu else
            base.device.peak("bf16") if base.device else out.peaks.get("fp32", 0.0))
    if peak > 0:
        fit_attention_family(fi, peak, launch, out)
    if not trace.has_gpu:
        fit_host(fi, out)
    kind = "host" if not trace.has_gpu else (base.node.scale_up.kind.value if base.node
                                             else LinkKind.NVLINK.value)
    blink = base.profile.links.get(kind) if base.profile else None
    lbw = (base.node.scale_up.bandwidth_gbytes_per_s if base.node else None) if blink else None
    fit_links(fi, blink, lbw, out, kind)
    fit_overlap_family(fi, out)
    prof, informed, kept = assemble(trace, base, out, mem_bw, fi.steps_note)
    odir = Path(out_dir)
    if odir.exists() and not odir.is_dir():
        raise InvalidInputError("out", str(odir), "a directory (it is a file)")
    odir.mkdir(parents=True, exist_ok=True)
    path = odir / "profile.json"
    write_profile(prof, path)
    (odir / "trace_fit.json").write_text(json.dumps(fit_report(out, informed, kept),
                                                    indent=2, sort_keys=True) + "\n")
    return TraceCalibration(prof, path, out, trace, informed, kept)


# ---- assembly -----------------------------------------------------------------------------
def _assumed(value: float, unit: str, what: str) -> Coefficient:
    return Coefficient(value, unit, f"assumed ({what}); the trace does not inform it")


def _skeleton(trace: KinetoTrace) -> Profile:
    """What a CPU trace without a base profile starts from: every value assumed."""
    a = lambda v, u, w: _assumed(v, u, w)  # noqa: E731
    return Profile(
        name="skeleton", device_key="cpu",
        gemm=GemmModel({"fp32": a(1.0, "fraction", "no GEMM in the trace")},
                       a(0.0, "elements", "no GEMM shapes"), a(0.0, "us", "no GEMM shapes"), 0, 0),
        memory=MemoryModel(a(1.0, "fraction", "device bandwidth = the fitted operator mix"),
                           a(0.0, "us", "no bandwidth-bound operators")),
        attention=AttentionModel({"fp32": a(0.5, "fraction", "no fused attention in the trace")},
                                 {"fp32": a(0.5, "fraction", "no fused attention in the trace")}),
        links={}, overlap_slowdown=a(1.0, "multiplier", "no collective overlapped an operator"),
        step_overhead_s=a(0.0, "s", "per-step cost is folded into the per-op host time"))


def _gemm(p: Profile, out: Fitted, host: float) -> GemmModel:
    eff = dict(p.gemm.eff_max)
    for key, c in out.gemm.items():
        if key.startswith("eff_max:"):
            eff[key.split(":", 1)[1]] = c
    g = replace(p.gemm, eff_max=eff, k_half=out.gemm.get("k_half", p.gemm.k_half),
                launch_us=out.gemm.get("launch_us", p.gemm.launch_us))
    fitted = {k.split(":", 1)[1] for k in out.gemm if k.startswith("eff_max:")}
    # a level fitted from the trace's kernels already ran at the clock the job held, so the
    # base profile's sustained-clock ceiling does not apply to it a second time
    g = replace(g, sustained_eff={d: c for d, c in g.sustained_eff.items() if d not in fitted})
    if host > 0:
        g = replace(g, launch_us=_plus_host(g.launch_us, host))
    return g


def _plus_host(c: Coefficient, host: float) -> Coefficient:
    return replace(c, value=c.value + host, stderr=None,
                   source=f"{c.value:.3f} us fitted operator intercept + {host:.3f} us host "
                          f"time per launch (folded here, the profile's host model left out; on a "
                          f"CPU host and compute share one thread): {c.source}")


def _memory(p: Profile, out: Fitted, host: float, new_device: bool) -> MemoryModel:
    kind = {**p.memory.kind_eff, **out.kind_eff}
    m = replace(p.memory, kind_eff=kind,
                launch_us=out.memory_launch or p.memory.launch_us)
    if new_device:
        m = replace(m, bw_eff=Coefficient(1.0, "fraction", "1.0 by construction: the device "
                                          "bandwidth is the fitted operator-mix bandwidth; "
                                          + (out.memory_launch.source if out.memory_launch
                                             else "")))
    if host > 0:
        m = replace(m, launch_us=_plus_host(m.launch_us, host))
    return m


def _attention(p: Profile, out: Fitted) -> AttentionModel:
    fwd, bwd = dict(p.attention.fwd_eff), dict(p.attention.bwd_eff)
    for key, c in out.attention.items():
        d, dt = key.split(":")
        (bwd if d == "bwd" else fwd)[dt] = c
    return AttentionModel(fwd, bwd)


def _new_device(trace: KinetoTrace, out: Fitted, mem_bw: float) -> tuple[GPUSpec, NodeSpec]:
    name = Path(trace.path).name
    dev = GPUSpec(key="cpu-from-trace", name=f"CPU of trace {name}", vendor="",
                  peak_tflops=dict(out.peaks) or {"fp32": 1.0}, mem_bytes=0.0,
                  mem_bw_gbytes_per_s=mem_bw or 1.0, tdp_w=0.0, sm_count=0,
                  source=f"described by trace {name}: peaks are fitted GEMM asymptotes, "
                         "bandwidth the fitted bandwidth of its bandwidth-bound operators; "
                         "memory capacity unknown (0)")
    ranks = max(trace.world_size, os.cpu_count() or 1)
    bw = out.link_bw_gbytes_per_s or 0.0
    host = LinkSpec("host-gloo", LinkKind.HOST, bw, 0.0,
                    source=f"fitted gloo rate in trace {name}" if bw else "no collective in trace")
    nic = LinkSpec("none", LinkKind.ETHERNET, 0.0, 0.0, source="single host")
    node = NodeSpec("cpu-from-trace-host", dev.key, ranks, host, ranks, False, 0, nic,
                    source=f"one host, up to {ranks} ranks")
    return dev, node


def assemble(trace: KinetoTrace, base: Base, out: Fitted, mem_bw: float, steps_note: str
             ) -> tuple[Profile, tuple[str, ...], tuple[str, ...]]:
    name = Path(trace.path).name
    p = base.profile or _skeleton(trace)
    host = out.host_us_per_op or 0.0
    host_gemm = out.host_us_per_gemm or 0.0
    new = base.device is None
    # host time folded into the launch costs replaces the base's host model (else twice)
    prof = replace(p, gemm=_gemm(p, out, host_gemm), memory=_memory(p, out, host, new),
                   attention=_attention(p, out), links={**p.links, **out.links},
                   overlap_slowdown=out.overlap or p.overlap_slowdown,
                   host=None if host > 0 or host_gemm > 0 else p.host)
    informed = tuple(sorted(out.fits))
    kept = _mark_kept(prof, p, name, base.name) if base.profile else ()
    prof = kept[0] if kept else prof
    dev, node = (_new_device(trace, out, mem_bw) if new else
                 (base.profile.device, base.profile.node))
    n_ops = sum(1 for o in trace.ops if o.family != "other")
    fp = {"builder": "calibrate.trace_profile", "trace": name, "steps": steps_note,
          "threads": str(trace.meta.get("threads_per_process", "")),
          HOST_FOLDED_KEY: f"{host:.4f}" if host > 0 else "0",
          HOST_GEMM_FOLDED_KEY: f"{host_gemm:.4f}" if host_gemm > 0 else "0"}
    notes = (f"Fitted from trace {name} ({n_ops} operators, {len(trace.kernels)} kernels, "
             f"{len(trace.comms)} collective records; {steps_note}). "
             + (f"Base: {base.name}. " if base.name else "No base profile: coefficients the "
                "trace cannot inform are assumed. ") + out.host_note + " "
             + " ".join(out.notes) + " Held-out MAPE per fit: "
             + "; ".join(f"{k} {'n/a' if f.heldout_mape_pct is None else f'{f.heldout_mape_pct:.1f}%'}"
                         f" (train {f.train_mape_pct:.1f}%, n={f.n_points})"
                         for k, f in sorted(out.fits.items())))
    prof = replace(prof, name=f"{p.device_key if not new else 'cpu'}-from-trace",
                   device_key=dev.key if dev else p.device_key, fingerprint=fp, notes=notes,
                   device=dev, node=node)
    prof, rejected = keep_in_range(prof, p, f"not informed by trace {name}",
                                   base.name or "the assumed values of a trace without a base")
    if rejected:
        out.notes.append("fitted out of range, not used (base value kept): "
                         + "; ".join(f"{k} {v}" for k, v in rejected.items()))
        prof = replace(prof, notes=f"{prof.notes} {out.notes[-1]}.")
    return prof.validate(), informed, (kept[1] if kept else ()) + tuple(rejected)


def _mark_kept(prof: Profile, base: Profile, trace: str, bname: str
               ) -> tuple[Profile, tuple[str, ...]]:
    """Prefix every coefficient still identical to the base's with "not informed"."""
    d, b = prof.to_dict(), base.to_dict()
    kept: list[str] = []

    def walk(x, y, path):
        if isinstance(x, dict) and {"value", "unit", "source"} <= x.keys():
            if x == y:
                kept.append(path)
                x["source"] = f"not informed by trace {trace}; kept from {bname}: {x['source']}"
            return
        if isinstance(x, dict):
            for k in x:
                walk(x[k], y.get(k) if isinstance(y, dict) else None, f"{path}.{k}")
    for key in ("gemm", "memory", "attention", "links", "overlap_slowdown", "step_overhead_s"):
        walk(d[key], b.get(key), key)
    return Profile.from_dict(d), tuple(kept)


def fit_report(out: Fitted, informed, kept) -> dict:
    return {"informed_by_trace": list(informed), "kept_from_base": list(kept),
            "host_us_per_op": out.host_us_per_op, "host_note": out.host_note,
            "notes": out.notes,
            "fits": {k: {"values": dict(f.values), "stderr": dict(f.stderr),
                         "heldout_mape_pct": f.heldout_mape_pct,
                         "train_mape_pct": f.train_mape_pct, "n_points": f.n_points}
                     for k, f in sorted(out.fits.items())}}
