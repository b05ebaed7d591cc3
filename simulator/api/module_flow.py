"""The analyzer's three calls for any ``torch.nn.Module``: trace once on the meta device,
price every op on the GPU's roofline, play the data-parallel step (DDP buckets or FSDP
units) on the event engine. torch is imported only to build example inputs and trace."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..modules.ddp import DDPConfig, dp_comm, simulate_ddp
from ..modules.fsdp import FSDPConfig, simulate_fsdp
from ..modules.op_report import op_report, price_graph
from ..modules.precision_whatif import MODES, rewrite_op
from ..search.driver import Bottleneck, main_bottleneck
from ..workload.traced import TracedGraph
from .config import TrainingConfig
from .results import BaselineMetrics, Prediction

OPTIMIZER = "adam"
TORCH_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16",
                "bfloat16": "bfloat16", "int64": "long", "long": "long", "int32": "int32"}


def example_inputs(cfg: TrainingConfig) -> Any:
    """``config.example_inputs`` as given, else a meta tensor of ``input_shape``."""
    if cfg.example_inputs is not None:
        return cfg.example_inputs
    if cfg.input_shape is None:
        raise InvalidInputError("config.input_shape", None,
                                "an input shape such as (32, 3, 224, 224) or example_inputs "
                                "for a torch.nn.Module")
    if cfg.input_dtype not in TORCH_DTYPES:
        raise InvalidInputError("config.input_dtype", cfg.input_dtype, ", ".join(TORCH_DTYPES))
    import torch
    return torch.zeros(cfg.input_shape, dtype=getattr(torch, TORCH_DTYPES[cfg.input_dtype]),
                       device="meta")


def trace(module: Any, cfg: TrainingConfig) -> TracedGraph:
    from ..modules.trace_torch import trace_module
    return trace_module(module, example_inputs(cfg), name=type(module).__name__)


def with_precision(g: TracedGraph, precision: str) -> TracedGraph:
    """The graph with its GEMMs / activations in ``precision`` (as ``precision-whatif``)."""
    if precision not in MODES:
        raise InvalidInputError("precision", precision, f"one of {', '.join(MODES)}")
    if precision == "fp32":
        return g
    ops = tuple(rewrite_op(t, precision) for t in g.ops)
    saved = g.saved_activation_bytes + sum(t.op.saved_bytes for t in ops) - sum(
        t.op.saved_bytes for t in g.ops)
    return replace(g, ops=ops, saved_activation_bytes=saved)


@dataclass(frozen=True)
class _Step:
    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    optimizer_s: float
    memory_bytes: float
    details: dict[str, Any]


def _step(g: TracedGraph, cfg: TrainingConfig, cluster: ClusterSpec, prof: Profile) -> _Step:
    gpu = cluster.gpu
    comm, times = dp_comm(cluster, prof), price_graph(g, gpu, prof)
    precision = cfg.precision or "fp32"
    if cfg.strategy == "fsdp":
        half = 2 if precision in ("bf16", "fp16", "fp8") else None
        r = simulate_fsdp(g, times, comm, gpu, prof, FSDPConfig(param_bytes=half, reduce_bytes=half),
                          OPTIMIZER)
    else:
        r = simulate_ddp(g, times, comm, DDPConfig(bucket_cap_mib=cfg.bucket_cap_mb), gpu, prof,
                         OPTIMIZER)
    d = r.to_dict()
    return _Step(r.step_time_s, r.forward_s + r.backward_s, r.exposed_comm_s, r.optimizer_s,
                 r.memory["total_bytes"], d)


def _breakdown(s: _Step) -> dict[str, float]:
    rest = max(0.0, s.step_time_s - s.compute_s - s.exposed_comm_s - s.optimizer_s)
    return {"compute_s": s.compute_s, "dp_comm_s": s.exposed_comm_s,
            "optimizer_s": s.optimizer_s, "overhead_s": rest}


def _mfu(g: TracedGraph, step_s: float, cluster: ClusterSpec, precision: str) -> float:
    peak = cluster.gpu.peak("bf16" if precision == "fp8" else precision) * 1e12
    return g.total_flops / step_s / peak if peak and step_s else 0.0


def analyze(module: Any, cfg: TrainingConfig, cluster: ClusterSpec, prof: Profile,
            graph: TracedGraph | None = None) -> tuple[BaselineMetrics, TracedGraph]:
    base = graph or trace(module, cfg)
    precision = cfg.precision or "fp32"
    g = with_precision(base, precision)
    rep = op_report(g, cluster.gpu, prof)
    s = _step(g, cfg, cluster, prof)
    moved = sum(r.bytes for r in rep.rows)
    share = rep.bound_share()
    cls = "compute-bound" if share.get("compute", 0.0) >= share.get("memory", 0.0) else "memory-bound"
    b = main_bottleneck(_breakdown(s))
    batch = (cfg.input_shape or (1,))[0]
    ridge = cluster.gpu.peak("bf16" if precision == "fp8" else precision) * 1e12 / (
        cluster.gpu.mem_bw_gbytes_per_s * 1e9)
    return BaselineMetrics(
        model=g.name, kind="module", params_total=g.param_count, params_active=g.param_count,
        flops_per_step=g.total_flops * cluster.n_gpus, flops_per_token=None,
        peak_memory_bytes_per_gpu=s.memory_bytes, memory_capacity_bytes=cluster.gpu.mem_bytes,
        fits_in_memory=s.memory_bytes <= cluster.gpu.mem_bytes,
        arithmetic_intensity_flop_per_byte=g.total_flops / moved if moved else 0.0,
        ridge_flop_per_byte=ridge, roofline_class=cls,
        bottleneck=cls if b == Bottleneck.COMPUTE else b.value, step_time_s=s.step_time_s,
        tokens_per_s_per_gpu=None, samples_per_s=batch * cluster.n_gpus / s.step_time_s,
        mfu=_mfu(g, s.step_time_s, cluster, precision),
        config=replace(cfg, gpu=cluster.gpu.key, n_gpus=cluster.n_gpus, precision=precision),
        breakdown=_breakdown(s)), base


def predict(g: TracedGraph, cfg: TrainingConfig, cluster: ClusterSpec, prof: Profile) -> Prediction:
    precision = cfg.precision or "fp32"
    gp = with_precision(g, precision)
    s = _step(gp, cfg, cluster, prof)
    batch = (cfg.input_shape or (1,))[0]
    bd = _breakdown(s)
    return Prediction(
        model=g.name, config=replace(cfg, gpu=cluster.gpu.key, n_gpus=cluster.n_gpus,
                                     precision=precision),
        step_time_s=s.step_time_s, samples_per_s=batch * cluster.n_gpus / s.step_time_s,
        tokens_per_s_per_gpu=None, mfu=_mfu(gp, s.step_time_s, cluster, precision),
        peak_memory_bytes_per_gpu=s.memory_bytes, memory_capacity_bytes=cluster.gpu.mem_bytes,
        fits_in_memory=s.memory_bytes <= cluster.gpu.mem_bytes,
        main_bottleneck=main_bottleneck(bd).value, breakdown=bd, engine="event",
        details={k: v for k, v in s.details.items() if k in ("memory", "comm_s", "wrap_depth")})


def candidates(cfg: TrainingConfig) -> list[TrainingConfig]:
    """DDP at three bucket caps (torch's 25 MiB, 1 MiB, 100 MiB) and FSDP, in the config's
    precision or, when none is set, fp32 and bf16 mixed precision."""
    precisions = [cfg.precision] if cfg.precision else ["fp32", "bf16"]
    out = []
    for p in precisions:
        out += [replace(cfg, strategy="ddp", bucket_cap_mb=cap, precision=p) for cap in (None, 1.0, 100.0)]
        out.append(replace(cfg, strategy="fsdp", bucket_cap_mb=None, precision=p))
    return out


def tune(g: TracedGraph, cfg: TrainingConfig, targets, ) -> tuple[TrainingConfig, list[Prediction]]:
    """Fastest candidate that fits in memory over every cluster (else the smallest)."""
    preds = [predict(g, replace(c, gpu=cl.gpu.key, n_gpus=cl.n_gpus), cl, p)
             for cl, p in targets for c in candidates(cfg)]
    fits = [p for p in preds if p.fits_in_memory]
    best = (max(fits, key=lambda p: (p.samples_per_s / p.config.n_gpus, -p.step_time_s))
            if fits else min(preds, key=lambda p: p.peak_memory_bytes_per_gpu))
    return best.config, preds
