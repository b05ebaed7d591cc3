"""Mixed-precision what-if for a traced model: fp32 vs TF32 vs bf16 / fp16 AMP vs fp8.

The traced graph (fp32) is rewritten the way ``torch.autocast`` (and, for fp8, Transformer
Engine's ``Linear``) would run it, then priced with the same cost models:

* matmul-class ops (GEMMs, convolutions, fused attention) run in the mode's dtype and move
  operands of that width (fp8: matmuls only; convolutions and attention stay bf16);
  ``tf32`` keeps fp32 storage and runs matmuls at the TF32 peak;
* bandwidth-bound ops move 16-bit activations, except those autocast keeps in fp32
  (softmax, log-softmax, layer/group norm, losses, reductions, exp/log/pow);
* added work: the per-forward cast of every weight a matmul reads to 16 bits (and of its
  gradient back to fp32), fp8 quantisation of both matmul operands (plus an amax pass), and
  for fp16 the loss scaler's unscale + inf check of every gradient (8 B/param);
* memory: fp32 master weights and gradients stay; autocast caches one 16-bit copy of the
  weights it casts; saved activations shrink with their dtype.

"Where the gain comes from" splits the change in step time into matmul, attention,
bandwidth-bound ops and the added casts / scaling.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from ..cost.kernels import memory_time_s
from ..errors import ComplexityError, InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..workload.aten_cost import packet_name
from ..workload.ops import OpKind
from ..workload.traced import BACKWARD, TracedGraph, TracedOp
from .ddp import OPTIMIZERS, optimizer_time_s
from .op_report import PriceOptions, op_time_s

MODES = ("fp32", "tf32", "bf16", "fp16", "fp8")
FP32_KEPT = frozenset({
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "_safe_softmax", "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
    "native_group_norm_backward", "nll_loss_forward", "nll_loss_backward", "mse_loss",
    "mse_loss_backward", "sum", "mean", "norm", "exp", "log", "pow", "cumsum", "prod",
    "binary_cross_entropy_with_logits", "smooth_l1_loss", "linalg_vector_norm"})
FP8_GEMMS = frozenset({"mm", "addmm", "bmm", "_scaled_mm"})


def _elem(mode: str) -> float:
    return {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 2.0}[mode]


def _gemm_dtype(t: TracedOp, mode: str) -> str:
    if mode == "fp8":
        return "fp8" if t.kind == OpKind.GEMM and packet_name(t.aten) in FP8_GEMMS else "bf16"
    return mode


def rewrite_op(t: TracedOp, mode: str) -> TracedOp:
    """The op as it would run under ``mode`` (see module doc)."""
    if mode == "fp32" or t.op.dtype != "fp32":
        return t
    if mode == "tf32":
        return t if t.kind == OpKind.MEMORY else replace(t, op=replace(t.op, dtype="tf32"))
    if t.kind in (OpKind.GEMM, OpKind.ATTENTION):
        d = _gemm_dtype(t, mode)
        scale = (1.0 if d == "fp8" else 2.0) / 4.0
        op = replace(t.op, dtype=d, bytes_moved=t.op.bytes_moved * scale,
                     saved_bytes=t.op.saved_bytes * 0.5)
        return replace(t, op=op, bytes_read=t.bytes_read * scale, bytes_written=t.bytes_written * scale)
    if packet_name(t.aten) in FP32_KEPT:
        return t
    op = replace(t.op, dtype="bf16" if mode != "fp16" else "fp16",
                 bytes_moved=t.op.bytes_moved * 0.5, saved_bytes=t.op.saved_bytes * 0.5)
    return replace(t, op=op, bytes_read=t.bytes_read * 0.5, bytes_written=t.bytes_written * 0.5)


@dataclass(frozen=True)
class PrecisionRow:
    mode: str
    supported: bool
    step_s: float
    gemm_s: float
    attention_s: float
    memory_bound_s: float
    casts_s: float
    loss_scaling_s: float
    optimizer_s: float
    speedup: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    total_bytes: float
    gain_from: dict[str, float]
    note: str = ""


def _cast_overheads(g: TracedGraph, mode: str, gpu: GPUSpec, prof: Profile) -> tuple[float, float]:
    """(cast seconds, loss-scaling seconds) added by ``mode``."""
    if mode in ("fp32", "tf32"):
        return 0.0, 0.0
    gemm_params = {p for t in g.ops if t.kind == OpKind.GEMM and t.phase != BACKWARD for p in t.params}
    info = {p.name: p for p in g.params}
    numel = sum(info[p].numel for p in gemm_params if p in info)
    casts = memory_time_s(numel * (4 + 2) * 2.0, gpu, prof, kernels=2 * max(1, len(gemm_params)))
    if mode == "fp8":
        q_bytes = sum(t.bytes_read for t in g.ops if t.kind == OpKind.GEMM
                      and packet_name(t.aten) in FP8_GEMMS)
        n = sum(1 for t in g.ops if t.kind == OpKind.GEMM and packet_name(t.aten) in FP8_GEMMS)
        casts += memory_time_s(q_bytes / 4.0 * (2 + 1 + 2), gpu, prof, kernels=3 * max(1, n))
    scaling = 0.0
    if mode == "fp16":
        grads = sum(p.numel for p in g.params if p.requires_grad)
        scaling = memory_time_s(8.0 * grads, gpu, prof, kernels=2)
    return casts, scaling


def _memory(g: TracedGraph, ops: Sequence[TracedOp], mode: str, optimizer: str) -> dict[str, float]:
    w = float(g.param_bytes)
    gemm_params = {p for t in g.ops if t.kind == OpKind.GEMM for p in t.params}
    cached = sum(p.numel for p in g.params if p.name in gemm_params)
    if mode not in ("fp32", "tf32"):
        w += cached * (2.0 + (1.0 if mode == "fp8" else 0.0))
    grads = float(sum(p.nbytes for p in g.params if p.requires_grad))
    opt = OPTIMIZERS[optimizer][2] * grads / 4.0
    act = sum(t.op.saved_bytes for t in ops) + max(
        0.0, g.saved_activation_bytes - sum(t.op.saved_bytes for t in g.ops))
    return {"weights_bytes": w, "grads_bytes": grads, "optimizer_bytes": opt,
            "activations_bytes": act, "total_bytes": w + grads + opt + act}


def _mode_row(g: TracedGraph, mode: str, gpu: GPUSpec, prof: Profile, optimizer: str,
              opts: PriceOptions) -> PrecisionRow:
    ops = [rewrite_op(t, mode) for t in g.ops]
    by = {"gemm": 0.0, "attention": 0.0, "memory": 0.0}
    for t in ops:
        s = op_time_s(t, gpu, prof, opts)
        by[{"gemm": "gemm", "attention": "attention"}.get(t.kind.value, "memory")] += s
    casts, scaling = _cast_overheads(g, mode, gpu, prof)
    opt = optimizer_time_s(g, optimizer, gpu, prof)
    step = sum(by.values()) + casts + scaling + opt + prof.step_overhead_s.value
    mem = _memory(g, ops, mode, optimizer)
    return PrecisionRow(mode, True, step, by["gemm"], by["attention"], by["memory"], casts,
                        scaling, opt, 1.0, mem["weights_bytes"], mem["grads_bytes"],
                        mem["optimizer_bytes"], mem["activations_bytes"], mem["total_bytes"], {})


@dataclass(frozen=True)
class PrecisionReport:
    model: str
    device: str
    rows: tuple[PrecisionRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "rows": [asdict(r) for r in self.rows]}


def precision_whatif(g: TracedGraph, gpu: GPUSpec, prof: Profile, modes: Sequence[str] = MODES,
                     optimizer: str = "adam") -> PrecisionReport:
    """One row per mode; ``speedup`` and ``gain_from`` are relative to fp32."""
    for m in modes:
        if m not in MODES:
            raise InvalidInputError("precision", m, f"one of {', '.join(MODES)}")
    opts = PriceOptions(tf32_conv=False, tf32_matmul=False)
    base = _mode_row(g, "fp32", gpu, prof, optimizer, opts)
    rows = []
    for m in modes:
        try:
            r = _mode_row(g, m, gpu, prof, optimizer, opts)
        except ComplexityError as exc:
            rows.append(replace(base, mode=m, supported=False, speedup=0.0,
                                note=f"{gpu.key} cannot run {m}: {exc}"))
            continue
        gain = {"gemm_s": base.gemm_s - r.gemm_s, "attention_s": base.attention_s - r.attention_s,
                "memory_bound_s": base.memory_bound_s - r.memory_bound_s,
                "casts_and_scaling_s": -(r.casts_s + r.loss_scaling_s)}
        rows.append(replace(r, speedup=base.step_s / r.step_s if r.step_s else 0.0,
                            gain_from=gain, note=_note(m, gain)))
    return PrecisionReport(g.name, gpu.key, tuple(rows))


def _note(mode: str, gain: dict[str, float]) -> str:
    if mode == "fp32":
        return "baseline"
    total = sum(gain.values())
    if total <= 0:
        return "no gain: the added casts outweigh the faster kernels"
    top = max(gain, key=lambda k: gain[k])
    share = 100 * gain[top] / total if total else 0.0
    return f"{share:.0f} % of the gain from {top.removesuffix('_s').replace('_', ' ')}"


def format_precision(r: PrecisionReport) -> str:
    lines = [f"mixed precision what-if: {r.model} on {r.device} (one rank, compute only)",
             f"  {'mode':5s} {'step ms':>9s} {'speedup':>8s} {'gemm ms':>9s} {'attn ms':>9s} "
             f"{'mem-bound':>9s} {'casts':>7s} {'scaler':>7s} {'memory GB':>10s}  note"]
    for x in r.rows:
        if not x.supported:
            lines.append(f"  {x.mode:5s} {'-':>9s}  {x.note}")
            continue
        lines.append(f"  {x.mode:5s} {x.step_s * 1e3:9.3f} {x.speedup:7.2f}x {x.gemm_s * 1e3:9.3f} "
                     f"{x.attention_s * 1e3:9.3f} {x.memory_bound_s * 1e3:9.3f} "
                     f"{x.casts_s * 1e3:7.3f} {x.loss_scaling_s * 1e3:7.3f} "
                     f"{x.total_bytes / 1e9:10.3f}  {x.note}")
    return "\n".join(lines)
