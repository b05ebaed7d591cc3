"""Human-readable tables of a simulation result."""
from __future__ import annotations

from ..engine.result import Result
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec
from .assumptions import assumption_lines, assumptions


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e9:.1f} GB"


def _memory_notes(r: Result, plan: Plan) -> list[str]:
    """Capacity verdict; when it does not fit: where, which part, and what would fit."""
    v = r.memory_verdict
    c = plan.memory
    conv = (f"  conventions: {c.framework or 'default'}; grads {c.grad_dtype.value}, "
            f"zero {plan.zero_stage}, loss {c.loss.value}, buckets {c.dp_buckets.value}")
    if v is None or v.fits:
        verdict = "fits" if r.fits_in_memory else "DOES NOT FIT"
        return [f"  capacity {_fmt_bytes(r.memory_capacity_bytes)} per GPU: {verdict}", conv]
    parts = ", ".join(f"{k} {_fmt_bytes(b)}" for k, b in v.parts_bytes.items())
    out = [f"  capacity {_fmt_bytes(v.capacity_bytes)} per GPU: DOES NOT FIT: stage {v.stage} "
           f"is {_fmt_bytes(v.excess_bytes)} over; largest part: {v.largest_part}",
           f"  stage {v.stage} at its peak: {parts} (workspace: {v.workspace_source})", conv]
    fits = [x for x in v.remedies if x.fits]
    shown = fits or v.remedies[:3]
    out.append("  would fit with: " if fits else "  no single change fits; closest:")
    out += [f"    {x.change:28s} peak {_fmt_bytes(x.peak_memory_bytes)}" for x in shown]
    return out


def format_result_table(r: Result, model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                        prof: Profile) -> str:
    lines = [
        f"model      {model.name}: {model.total_params() / 1e9:.1f} B params, seq {model.seq_len}",
        f"cluster    {cluster.n_gpus} x {cluster.gpu.key} ({cluster.n_nodes} nodes of "
        f"{cluster.node.gpus_per_node}, {cluster.node.nics_per_node} x "
        f"{cluster.node.nic_gbits_per_s:.0f} Gb/s NICs)",
        f"plan       tp={plan.tp} pp={plan.pp} dp={plan.dp} cp={plan.cp} ep={plan.ep} vpp={plan.vpp} "
        f"mb={plan.micro_batch} gbs={plan.global_batch} sp={plan.sequence_parallel} "
        f"recompute={plan.recompute.value}"
        f"{f':{plan.recompute_layers}' if plan.recompute_layers else ''} zero={plan.zero_stage}"
        + (f" dp_shard={plan.dp_shard} (HSDP)" if plan.dp_shard else "") + f" {plan.precision.value} "
        f"{plan.schedule.value} attention={plan.attention.value}",
        *assumption_lines(assumptions(model, plan, cluster, prof)),
        "",
        f"step time            {r.step_time_s:10.3f} s   ({r.num_microbatches} micro-batches)",
        f"tokens/s             {r.tokens_per_s:10.0f}",
        f"tokens/s/GPU         {r.tokens_per_s_per_gpu:10.1f}",
        f"model TFLOP/s/GPU    {r.model_tflops_per_gpu:10.1f}   MFU {100 * r.mfu:5.1f} %",
        f"hardware TFLOP/s/GPU {r.hardware_tflops_per_gpu:10.1f}   HFU {100 * r.hfu:5.1f} %",
        "",
        "breakdown of the critical stage "
        f"(stage {r.critical_stage}):",
    ]
    for k, v in r.breakdown.as_dict().items():
        if abs(v) > 1e-9:
            lines.append(f"  {k:14s} {v:10.3f} s  {100 * v / r.step_time_s:5.1f} %")
    if r.busiest_link:
        busy = ", ".join(f"{k} {v:.3f} s" for k, v in r.link_busy_s.items())
        lines.append(f"  network: busiest link class {r.busiest_link} (busy per step, one rank: "
                     f"{busy})")
    lines += ["", "memory per stage (peak, one rank):",
              "  stage layers    weights      grads  optimizer activations  workspace      total"]
    for s in r.stages:
        lines.append(
            f"  {s.stage:5d} {s.layers:6d} {_fmt_bytes(s.weights_bytes):>10s} "
            f"{_fmt_bytes(s.grads_bytes):>10s} {_fmt_bytes(s.optimizer_bytes):>10s} "
            f"{_fmt_bytes(s.activations_bytes):>11s} {_fmt_bytes(s.workspace_bytes):>10s} "
            f"{_fmt_bytes(s.peak_memory_bytes):>10s}")
    lines += _memory_notes(r, plan)
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"\nsimulated in {r.sim_wall_s * 1e3:.0f} ms ({r.engine} engine)")
    return "\n".join(lines)
