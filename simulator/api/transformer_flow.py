"""The analyzer's three calls for a transformer (``TransformerSpec``): baseline on one
configuration, strategy search, prediction of a configuration."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..engine.result import Result
from ..engine.simulate import simulate
from ..errors import InfeasiblePlanError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..planning.whatif import (
    RooflineClass,
    recomputed_share,
    ridge_flop_per_byte,
    roofline_ops,
)
from ..search.driver import Bottleneck, SearchOptions, SearchReport, main_bottleneck, make_context, search
from ..workload.ops import LayerShape, backward_ops, embedding_ops, head_ops, layer_ops
from ..workload.spec import TransformerSpec
from .config import TrainingConfig
from .results import BaselineMetrics, Prediction


def model_flops_per_token(model: TransformerSpec) -> float:
    """Forward + backward model FLOPs per token of the whole model (no parallelism)."""
    sh = LayerShape(micro_batch=1, seq_len=model.seq_len)
    per_kind: dict[tuple[bool, bool], float] = {}
    total = 0.0
    for layer in range(model.n_layers):
        kind = model.layer_kind(layer)
        if kind not in per_kind:
            fwd = layer_ops(model, sh, layer)
            per_kind[kind] = sum(o.model_flops for o in fwd + backward_ops(fwd))
        total += per_kind[kind]
    edge = embedding_ops(model, sh) + head_ops(model, sh)
    total += sum(o.model_flops for o in edge + backward_ops(edge))
    return total / model.seq_len


def plan_of(cfg: TrainingConfig) -> Plan:
    """The parallel plan a config describes (dp from the GPU count when not given)."""
    dp = cfg.dp or max(1, cfg.n_gpus // (cfg.tp * cfg.pp * cfg.cp))
    return Plan(tp=cfg.tp, pp=cfg.pp, dp=dp, cp=cfg.cp, ep=cfg.ep, vpp=cfg.vpp,
                micro_batch=cfg.micro_batch,
                global_batch=cfg.global_batch or dp * cfg.micro_batch,
                sequence_parallel=cfg.sequence_parallel, recompute=cfg.recompute,
                recompute_layers=cfg.recompute_layers,
                zero_stage=cfg.zero_stage, dp_shard=cfg.dp_shard,
                precision=cfg.precision or "bf16",
                schedule=cfg.schedule or ("interleaved" if cfg.vpp > 1 else "1f1b"),
                moe_dispatcher=cfg.moe_dispatcher)


def config_of(plan: Plan, base: TrainingConfig, gpu: str, n_gpus: int) -> TrainingConfig:
    """A searched plan written back as a config (hardware and sequence from ``base``)."""
    return replace(base, gpu=gpu, n_gpus=n_gpus, tp=plan.tp, pp=plan.pp, dp=plan.dp,
                   cp=plan.cp, ep=plan.ep, vpp=plan.vpp, micro_batch=plan.micro_batch,
                   global_batch=plan.global_batch, precision=plan.precision.value,
                   recompute=plan.recompute.value, recompute_layers=plan.recompute_layers,
                   zero_stage=plan.zero_stage,
                   dp_shard=plan.dp_shard, sequence_parallel=plan.sequence_parallel, moe_dispatcher=plan.moe_dispatcher,
                   schedule=None if plan.schedule.value in ("1f1b", "interleaved")
                   else plan.schedule.value)


def _weights(model: TransformerSpec) -> dict[str, int]:
    n_moe = model.n_moe_layers()
    return {"layer": model.n_layers, "dense-layer": model.n_layers - n_moe,
            "moe-layer": n_moe, "embedding": 1, "head": 1}


def _roofline(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
              prof: Profile) -> tuple[float, str]:
    """(FLOP per HBM byte of the step's kernels, class holding most kernel time)."""
    w = _weights(model)
    share = recomputed_share(model, plan)
    flops = moved = compute_s = memory_s = 0.0
    for o in roofline_ops(model, plan, cluster, prof):
        if o.roofline == RooflineClass.COMMUNICATION:
            continue
        k = w.get(o.where, 1) * (share if o.phase == "recompute" else 1.0)
        flops += k * o.flops
        moved += k * o.bytes_moved
        if o.roofline == RooflineClass.COMPUTE_BOUND:
            compute_s += k * o.time_s
        else:
            memory_s += k * o.time_s
    cls = RooflineClass.COMPUTE_BOUND if compute_s >= memory_s else RooflineClass.MEMORY_BOUND
    return (flops / moved if moved else 0.0), cls.value


def _bottleneck(res: Result, roofline_class: str) -> str:
    b = main_bottleneck(res.breakdown.as_dict())
    return roofline_class if b == Bottleneck.COMPUTE else b.value


def analyze(model: TransformerSpec, cfg: TrainingConfig, cluster: ClusterSpec,
            prof: Profile) -> BaselineMetrics:
    plan = plan_of(cfg)
    res = simulate(model, plan, cluster, prof, engine=cfg.engine)
    per_token = model_flops_per_token(model)
    intensity, cls = _roofline(model, plan, cluster, prof)
    return BaselineMetrics(
        model=model.name, kind="transformer", params_total=model.total_params(),
        params_active=model.active_params(), flops_per_step=per_token * plan.global_batch * model.seq_len,
        flops_per_token=per_token, peak_memory_bytes_per_gpu=max(res.peak_memory_bytes),
        memory_capacity_bytes=res.memory_capacity_bytes, fits_in_memory=res.fits_in_memory,
        arithmetic_intensity_flop_per_byte=intensity,
        ridge_flop_per_byte=ridge_flop_per_byte(cluster, plan.precision), roofline_class=cls,
        bottleneck=_bottleneck(res, cls), step_time_s=res.step_time_s,
        tokens_per_s_per_gpu=res.tokens_per_s_per_gpu,
        samples_per_s=plan.global_batch / res.step_time_s, mfu=res.mfu,
        config=config_of(plan, cfg, cluster.gpu.key, cluster.n_gpus),
        breakdown=res.breakdown.as_dict())


def tune(model: TransformerSpec, cfg: TrainingConfig, targets: Sequence[tuple[ClusterSpec, Profile]],
         options: SearchOptions) -> tuple[TrainingConfig, SearchReport]:
    """Best plan over every cluster given, at the config's global batch (default: 8
    sequences per GPU of the smallest cluster)."""
    gb = cfg.global_batch or 8 * min(c.n_gpus for c, _ in targets)
    rep = search([make_context(model, c, p, gb) for c, p in targets], options)
    w = rep.winner
    if w is None:
        raise InfeasiblePlanError("no_feasible_plan", "no plan fits; rejected plans by reason: "
                                  + rep.rejection_summary(), rep.rejected)
    return config_of(w.plan, replace(cfg, engine=w.engine), w.gpu, w.n_gpus), rep


def predict(model: TransformerSpec, cfg: TrainingConfig, cluster: ClusterSpec,
            prof: Profile) -> Prediction:
    plan = plan_of(cfg)
    res = simulate(model, plan, cluster, prof, engine=cfg.engine)
    bd = res.breakdown.as_dict()
    return Prediction(
        model=model.name, config=config_of(plan, cfg, cluster.gpu.key, cluster.n_gpus),
        step_time_s=res.step_time_s, samples_per_s=plan.global_batch / res.step_time_s,
        tokens_per_s_per_gpu=res.tokens_per_s_per_gpu, mfu=res.mfu,
        peak_memory_bytes_per_gpu=max(res.peak_memory_bytes),
        memory_capacity_bytes=res.memory_capacity_bytes, fits_in_memory=res.fits_in_memory,
        main_bottleneck=main_bottleneck(bd).value, breakdown=bd, engine=res.engine,
        details={"hfu": res.hfu, "num_microbatches": res.num_microbatches,
                 "critical_stage": res.critical_stage, "notes": list(res.notes),
                 "peak_memory_bytes_per_stage": list(res.peak_memory_bytes)})
