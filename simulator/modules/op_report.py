"""Price a traced operator graph on a device and place every op on the roofline.

Times use the same closed forms as the rest of the simulator (``simulator.cost.kernels``): a GEMM
(matmul or implicit-GEMM convolution) is ``launch + max(flops / (peak * eff * wave * k_sat),
bytes / bw)`` with the traced bytes (the tensors the op really reads and writes, not an
im2col estimate); fused attention is priced by its FLOPs and the profile's attention
efficiency, floored by its bytes; everything else is bandwidth-bound
(``launch + bytes / (bw * bw_eff)``).

Roofline placement: arithmetic intensity = FLOPs / bytes; an op is compute-bound when its
intensity is at or above the ridge point ``peak(dtype) / bandwidth`` of its dtype.
fp32 convolutions count as TF32 on GPUs that have it (cuDNN's default,
``torch.backends.cudnn.allow_tf32 = True``); fp32 matmuls stay fp32 unless ``tf32_matmul``.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..cost.kernels import (
    attention_time_s,
    gemm_time_core_s,
    memory_time_s,
    tile_efficiency,
)
from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..workload.ops import OpKind
from ..workload.traced import BACKWARD, FORWARD, LOSS, TracedGraph, TracedOp

FLOAT_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class PriceOptions:
    tf32_conv: bool = True
    tf32_matmul: bool = False


def compute_dtype(t: TracedOp, gpu: GPUSpec, opts: PriceOptions = PriceOptions()) -> str:
    """The dtype whose peak an op runs at (fp64 / integer ops are priced as fp32)."""
    d = t.op.dtype if t.op.dtype in FLOAT_DTYPES else "fp32"
    if d == "fp32" and gpu.peak_tflops.get("tf32", 0) > 0:
        is_conv = "conv" in t.aten
        if (is_conv and opts.tf32_conv) or (not is_conv and opts.tf32_matmul and t.kind == OpKind.GEMM):
            return "tf32"
    return d


def _mem_bw(gpu: GPUSpec, prof: Profile) -> float:
    return gpu.mem_bw_gbytes_per_s * 1e9 * prof.memory.bw_eff.value


def gemm_efficiency(t: TracedOp, dtype: str, prof: Profile) -> float:
    """The profile's GEMM efficiency; a convolution uses ``eff_max['conv:<dtype>']`` when the
    profile measured one (``simulator.modules.calib`` does), else the GEMM value."""
    if "conv" in t.aten:
        c = prof.gemm.eff_max.get(f"conv:{dtype}")
        if c is not None:
            return c.value
    return prof.gemm_eff(dtype)


def gemm_op_time_s(t: TracedOp, dtype: str, gpu: GPUSpec, prof: Profile) -> float:
    o = t.op
    if o.m <= 0 or o.n <= 0 or o.k <= 0:
        return memory_time_s(o.bytes_moved, gpu, prof)
    g = prof.gemm
    wave = tile_efficiency(o.m, o.n, g.tile_shapes(), gpu.sm_count, o.batch, g.persistent)
    peak = gpu.peak(dtype) * 1e12
    return gemm_time_core_s(o.batch * o.m, o.n, o.k, o.bytes_moved, peak,
                            gemm_efficiency(t, dtype, prof), g.k_half_for(dtype),
                            g.launch_us.value * 1e-6, wave, _mem_bw(gpu, prof),
                            peak * g.sustained_for(dtype), g.mn_half_value(), min(o.m, o.n))


def op_time_s(t: TracedOp, gpu: GPUSpec, prof: Profile,
              opts: PriceOptions = PriceOptions()) -> float:
    """Seconds one traced op takes on ``gpu`` under ``prof``."""
    if t.kind == OpKind.GEMM:
        return gemm_op_time_s(t, compute_dtype(t, gpu, opts), gpu, prof)
    if t.kind == OpKind.ATTENTION:
        d = compute_dtype(t, gpu, opts)
        return max(attention_time_s(t.flops, d, t.phase == BACKWARD, gpu, prof),
                   memory_time_s(t.bytes_moved, gpu, prof))
    if t.kind == OpKind.MEMORY:
        return memory_op_time_s(t, gpu, prof)
    return 0.0


MEMORY_CLASSES = (
    ("batch_norm", ("batch_norm",)), ("layer_norm", ("layer_norm", "group_norm", "softmax")),
    ("max_pool", ("max_pool", "avg_pool", "adaptive")),
    ("gelu", ("gelu", "silu", "sigmoid", "tanh", "exp", "log", "erf", "pow", "sqrt")),
    ("relu", ("relu", "threshold")),
    ("copy", ("copy", "clone", "cat", "stack", "_to_copy", "embedding", "index", "gather",
              "scatter", "zeros", "ones", "fill", "full", "arange", "where")),
    ("add", ("add", "sub", "mul", "div", "sum", "mean", "neg", "addcmul", "addcdiv")),
)


def memory_class(aten: str) -> str:
    """Which measured kernel class a bandwidth-bound op belongs to ("" = none)."""
    name = aten.split(".")[1] if aten.startswith("aten.") else aten
    for cls, needles in MEMORY_CLASSES:
        if any(n in name for n in needles):
            return cls
    return ""


def memory_op_time_s(t: TracedOp, gpu: GPUSpec, prof: Profile) -> float:
    """Bandwidth-bound op; a profile may carry the bandwidth of its kernel class as
    ``gemm.eff_max['membw:<class>']`` (a fraction of the device bandwidth)."""
    c = prof.gemm.eff_max.get(f"membw:{memory_class(t.aten)}")
    if c is None or t.bytes_moved <= 0:
        return memory_time_s(t.bytes_moved, gpu, prof, kernels=1)
    return prof.memory.launch_us.value * 1e-6 + t.bytes_moved / (_mem_bw(gpu, prof) * c.value)


def price_graph(g: TracedGraph, gpu: GPUSpec, prof: Profile,
                opts: PriceOptions = PriceOptions()) -> tuple[float, ...]:
    """Per-op seconds, aligned with ``g.ops``."""
    return tuple(op_time_s(t, gpu, prof, opts) for t in g.ops)


def ridge_flop_per_byte(gpu: GPUSpec, dtype: str) -> float:
    return gpu.peak(dtype) * 1e12 / (gpu.mem_bw_gbytes_per_s * 1e9)


# ---- the report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpRow:
    index: int
    name: str
    aten: str
    module: str
    phase: str
    kind: str
    dtype: str
    flops: float
    bytes: float
    intensity: float             # FLOP per byte
    bound: str                   # "compute" or "memory"
    time_s: float
    share: float                 # of the step's compute time
    achieved_tflops: float
    custom: str = ""


@dataclass(frozen=True)
class OpReport:
    model: str
    device: str
    profile: str
    peak_tflops: dict[str, float]
    mem_bw_gbytes_per_s: float
    rows: tuple[OpRow, ...]
    forward_flops: float
    backward_flops: float
    loss_flops: float
    params: int
    forward_s: float
    backward_s: float
    loss_s: float
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.loss_s

    def top(self, n: int = 10) -> list[OpRow]:
        return sorted(self.rows, key=lambda r: (-r.time_s, r.index))[:n]

    def bound_share(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for r in self.rows:
            out[r.bound] += r.share
        return dict(sorted(out.items()))

    def by_module(self, depth: int = 1) -> list[tuple[str, float, float]]:
        """(module prefix, seconds, FLOPs), slowest first."""
        acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for r in self.rows:
            key = ".".join(r.module.split(".")[:depth]) if r.module else "<root>"
            acc[key][0] += r.time_s
            acc[key][1] += r.flops
        return sorted(((k, v[0], v[1]) for k, v in acc.items()), key=lambda x: (-x[1], x[0]))

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        d = {"model": self.model, "device": self.device, "profile": self.profile,
             "peak_tflops": self.peak_tflops, "mem_bw_gbytes_per_s": self.mem_bw_gbytes_per_s,
             "forward_flops": self.forward_flops, "backward_flops": self.backward_flops,
             "loss_flops": self.loss_flops, "params": self.params,
             "forward_s": self.forward_s, "backward_s": self.backward_s, "loss_s": self.loss_s,
             "compute_s": self.total_s, "bound_share": self.bound_share(),
             "top_ops": [r.name for r in self.top(10)], "notes": list(self.notes), **self.extra}
        if ops:
            d["ops"] = [asdict(r) for r in self.rows]
        return d

    def to_json(self, ops: bool = True) -> str:
        return json.dumps(self.to_dict(ops), indent=2, sort_keys=True)


def op_report(g: TracedGraph, gpu: GPUSpec, prof: Profile,
              opts: PriceOptions = PriceOptions()) -> OpReport:
    times = price_graph(g, gpu, prof, opts)
    total = sum(times) or 1.0
    rows = []
    for t, s in zip(g.ops, times):
        d = compute_dtype(t, gpu, opts)
        inten = t.intensity
        bound = "compute" if t.flops > 0 and inten >= ridge_flop_per_byte(gpu, d) else "memory"
        rows.append(OpRow(t.index, t.name, t.aten, t.module, t.phase, t.kind.value, d, t.flops,
                          t.bytes_moved, inten, bound, s, s / total,
                          t.flops / s / 1e12 if s > 0 else 0.0, t.custom))
    phase_s = defaultdict(float)
    for t, s in zip(g.ops, times):
        phase_s[t.phase] += s
    return OpReport(model=g.name, device=gpu.key, profile=prof.name,
                    peak_tflops=dict(gpu.peak_tflops), mem_bw_gbytes_per_s=gpu.mem_bw_gbytes_per_s,
                    rows=tuple(rows), forward_flops=g.forward_flops, backward_flops=g.backward_flops,
                    loss_flops=g.loss_flops, params=g.param_count, forward_s=phase_s[FORWARD],
                    backward_s=phase_s[BACKWARD], loss_s=phase_s[LOSS], notes=g.notes,
                    extra={"custom_functions": list(g.custom_functions),
                           "saved_activation_bytes": g.saved_activation_bytes})


# ---- text and picture --------------------------------------------------------------------------
def _si(x: float, unit: str = "") -> str:
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f} {p}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def format_report(r: OpReport, top: int = 15) -> str:
    lines = [
        f"model      {r.model}: {r.params / 1e6:.2f} M params",
        f"device     {r.device} (profile {r.profile}); bandwidth {r.mem_bw_gbytes_per_s:.0f} GB/s; "
        + ", ".join(f"{k} {v:g} TFLOP/s" for k, v in sorted(r.peak_tflops.items())),
        f"FLOPs      forward {_si(r.forward_flops)}  backward {_si(r.backward_flops)}  "
        f"loss {_si(r.loss_flops)}",
        f"time       forward {r.forward_s * 1e3:.3f} ms  backward {r.backward_s * 1e3:.3f} ms  "
        f"loss {r.loss_s * 1e3:.3f} ms  (compute only, one rank)",
        "bound      " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in r.bound_share().items()),
        "", f"top {top} ops by time:",
        f"  {'#':>4s} {'op':44s} {'phase':8s} {'kind':9s} {'FLOPs':>10s} {'bytes':>10s} "
        f"{'FLOP/B':>8s} {'bound':7s} {'time ms':>9s} {'share':>6s}",
    ]
    for row in r.top(top):
        name = row.name if len(row.name) <= 44 else "..." + row.name[-41:]
        lines.append(f"  {row.index:4d} {name:44s} {row.phase:8s} {row.kind:9s} "
                     f"{_si(row.flops):>10s} {_si(row.bytes, 'B'):>10s} {row.intensity:8.1f} "
                     f"{row.bound:7s} {row.time_s * 1e3:9.4f} {100 * row.share:5.1f}%")
    lines += ["", "time by top-level module:"]
    for mod, s, f in r.by_module()[:12]:
        lines.append(f"  {mod:32s} {s * 1e3:10.3f} ms  {100 * s / (r.total_s or 1):5.1f} %  {_si(f)}FLOP")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def write_roofline_png(r: OpReport, path: str, label_top: int = 10) -> None:
    """Log-log roofline of the traced ops (``report.roofline.draw_roofline``): achieved
    TFLOP/s vs intensity per op, sized by time, top ops labelled without overlap; ops
    without FLOPs as achieved bandwidth beside it."""
    from ..report.roofline import RooflinePoint, draw_roofline
    dtypes = sorted({row.dtype for row in r.rows if row.flops > 0} or {"fp32"})
    roofs = {d: r.peak_tflops.get(d) or max(r.peak_tflops.values()) for d in dtypes}
    pts = [RooflinePoint(row.name.split("#")[0], row.flops, row.bytes, row.time_s,
                         row.bound == "memory") for row in r.rows]
    draw_roofline(pts, roofs, r.mem_bw_gbytes_per_s, path, f"{r.model} on {r.device}", label_top)


def rows_json(rows: Sequence[OpRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
