"""Plain-text tables for the search / planning commands."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..planning.capacity import indistinguishable_from_best
from ..search.driver import SearchReport
from ..search.risk import RISK_POOL
from ..workload.spec import TransformerSpec


def _plan_str(p: Plan) -> str:
    return (f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep} vpp={p.vpp} mb={p.micro_batch} "
            f"zero={_zero(p)} recompute={_recompute(p)} sp={str(p.sequence_parallel).lower()} "
            f"{p.precision.value}")


def _recompute(p: Plan) -> str:
    """The recompute mode, with a partial full recompute's layer count per chunk."""
    return f"full:{p.recompute_layers}" if p.recompute_layers else p.recompute.value


def _zero(p: Plan) -> str:
    """ZeRO stage, with HSDP's shard group after a slash (3/8: sharded within groups of 8)."""
    return f"{p.zero_stage}/{p.dp_shard}" if p.dp_shard else str(p.zero_stage)


def _money(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"${v / 1e6:,.2f} M" if v >= 1e6 else f"${v:,.0f}"


def format_search(r: SearchReport, model: TransformerSpec, launch: Mapping[str, Any] | None) -> str:
    t = r.targets
    gpus = sorted({x["n_gpus"] for x in t})
    gbs = sorted({x["global_batch"] for x in t})
    lines = [f"search  {model.name} on {','.join(map(str, gpus))} x {t[0]['gpu']}, global batch "
             f"{','.join(map(str, gbs))}, seq {model.seq_len}; objective {r.objective.value}; "
             f"profile {t[0]['profile']}",
             f"        {r.generated} candidate plans, {r.simulated.get('analytic', 0)} simulated "
             f"(analytic), {r.simulated.get('event', 0)} confirmed (event), {r.resumed} resumed; "
             f"{r.search_wall_s:.1f} s",
             f"rejected {r.rejection_summary()}", ""]
    if not r.ranked:
        lines.append("no feasible plan")
        return "\n".join(lines)
    lines.append(f"{'#':>3} {'gpus':>6} {'gbs':>5} {'tp':>3} {'pp':>3} {'dp':>5} {'cp':>3} {'ep':>3} "
                 f"{'vpp':>3} {'mb':>3} {'zero':>5} {'recompute':>9} {'sp':>3} {'step s':>8} "
                 f"{'80% step s':>15} {'tok/s/GPU':>10} {'MFU%':>5} {'mem GB':>7} {'free%':>6}  bottleneck")
    for x in r.ranked:
        p = x.plan
        lines.append(
            f"{x.rank:>3} {x.n_gpus:>6} {p.global_batch:>5} {p.tp:>3} {p.pp:>3} {p.dp:>5} {p.cp:>3} "
            f"{p.ep:>3} {p.vpp:>3} {p.micro_batch:>3} {_zero(p):>5} {_recompute(p):>9} "
            f"{'y' if p.sequence_parallel else 'n':>3} {x.step_time_s:8.4g} "
            f"{_span(x.step_time_interval):>15} {x.tokens_per_s_per_gpu:10.1f} {100 * x.mfu:5.1f} {x.peak_memory_bytes / 1e9:7.1f} "
            f"{x.memory_headroom_pct:6.1f}  {x.main_bottleneck.value} ({x.engine})")
    lines += _indistinguishable_lines(r)
    if any(x.plan.dp_shard for x in r.ranked):
        lines.append("zero 3/N: HSDP, ZeRO-3 sharded within groups of N ranks, all-reduced across")
    if launch:
        lines += ["", "winner, Megatron-LM arguments:", "  " + " ".join(launch["megatron_lm"]),
                  "winner, NeMo 2 recipe:", launch["nemo2_recipe"].rstrip(),
                  "winner, torchtitan job TOML:", launch["torchtitan_toml"].rstrip()]
        lines += [f"note: {n}" for n in launch["notes"]]
    return "\n".join(lines)


def _span(iv) -> str:
    return f"{iv.p10:.4g}-{iv.p90:.4g}" if iv is not None else "-"


def _indistinguishable_lines(r: SearchReport) -> list[str]:
    same = r.indistinguishable_from_best()
    if r.winner is None or r.winner.step_time_interval is None:
        return []
    if r.objective.risk_averse:
        head = f"ranked by the pessimistic end (P90) of the 80% interval, best {RISK_POOL} re-ranked"
    else:
        head = "80% intervals: coefficient uncertainty + model-form error (README 'Error bars')"
    verdict = (f"#{', #'.join(map(str, same))} not distinguishable from #1 (80% step-time "
               "intervals overlap by more than half)") if same else \
        "every listed plan is distinguishable from #1"
    return ["", head, verdict]


def _p(iv, fmt, unit: str = "") -> str:
    """``   P10/P50/P90 a / b / c unit`` for an interval, or nothing."""
    if iv is None:
        return ""
    return f"   P10/P50/P90 {fmt(iv.p10)} / {fmt(iv.p50)} / {fmt(iv.p90)}{unit}"


def _estimate_lines(label: str, e) -> list[str]:
    out = [f"{label}: {e.n_gpus} x {e.gpu}",
           f"  throughput     {e.tokens_per_s:,.0f} tokens/s",
           f"  time           {e.days:,.2f} days ({e.hours:,.1f} h)"
           + _p(e.interval(e.days), lambda v: f"{v:,.2f}", " days"),
           f"  GPU-hours      {e.gpu_hours:,.0f}",
           f"  cost           {_money(e.cost_usd)} at ${e.price_usd_per_gpu_hour:g}/GPU-hour"
           + (_p(e.interval(e.cost_usd), _money) if e.cost_usd is not None else ""),
           f"  energy         {e.energy_mwh:,.1f} MWh (TDP {e.tdp_w:g} W x GPUs x hours x PUE {e.pue:g})"
           + _p(e.interval(e.energy_mwh), lambda v: f"{v:,.1f}", " MWh")]
    if e.plan is not None:
        out.append(f"  plan           {_plan_str(e.plan.plan)} (MFU {100 * e.plan.mfu:.1f}%, "
                   f"{e.plan.memory_headroom_pct:.0f}% memory free)")
    return out


def format_plan_answer(answer: Mapping[str, Any], model: TransformerSpec) -> str:
    lines = [f"plan  {model.name} ({model.total_params() / 1e9:.1f} B params, seq {model.seq_len})"]
    if "assumptions" in answer:
        x = answer["assumptions"]
        if x["global_batch_sequences"]:
            lines.append(f"assumed: global batch {x['global_batch_sequences']} sequences "
                         f"({x['global_batch_source']}) x {x['seq_len']} tokens = "
                         f"{x['tokens_per_step']:,} tokens/step; profile {x['profile']}")
        if x.get("window_global_batches"):
            lines.append(f"assumed: short window: the best of global batches "
                         f"{','.join(map(str, x['window_global_batches']))} x {x['seq_len']} "
                         f"tokens; profile {x['profile']}")
    if "time_on_gpus" in answer:
        lines += [""] + _estimate_lines("time to train", answer["time_on_gpus"])
    if "deadline" in answer:
        d = answer["deadline"]
        lines += ["", f"GPUs for a {d.deadline_s / 86400:g}-day deadline:"]
        tried = ", ".join(f"{n}: {'-' if v is None else f'{v:.1f} d'}" for n, v in d.tried)
        lines.append(f"  tried          {tried}")
        if d.estimate is None:
            lines.append("  no GPU count tried meets the deadline")
        else:
            lines += _estimate_lines("  needed", d.estimate)
            iv = d.estimate.interval(d.estimate.seconds)
            if iv is not None and iv.p90 > d.deadline_s:
                lines.append(f"  note           the P90 time ({iv.p90 / 86400:,.2f} days) misses the "
                             "deadline: more GPUs for 90% confidence")
    if "window" in answer:
        w = answer["window"]
        lines += ["", f"best plan for a {w.window_s / 60:g}-minute window:",
                  f"  {w.steps} steps, {w.tokens:,} tokens "
                  f"(global batch {w.best.plan.global_batch}, step {w.best.step_time_s:.2f} s)",
                  f"  plan           {_plan_str(w.best.plan)}"]
    return "\n".join(lines)


def format_compare(rows: Sequence[Any], model: TransformerSpec, tokens: float, pue: float,
                   global_batch: int | None = None) -> str:
    lines = [f"compare  {model.name}, {tokens:.3g} tokens, PUE {pue:g}",
             f"assumed: global batch {global_batch} sequences x {model.seq_len} tokens" if global_batch
             else "", "",
             f"{'hardware':34s} {'tokens/s':>12} {'days':>8} {'80% days':>15} {'cost':>12} "
             f"{'80% cost':>21} {'MWh':>8} {'MFU%':>5} {'free%':>6}  limiting resource / plan"]
    for r in rows:
        if r.estimate is None:
            lines.append(f"{r.choice.label:34s} {r.note}")
            continue
        e, p = r.estimate, r.estimate.plan
        lines.append(f"{r.choice.label:34s} {e.tokens_per_s:12,.0f} {e.days:8.2f} "
                     f"{_span2(e.interval(e.days), lambda v: f'{v:.2f}'):>15} "
                     f"{_money(e.cost_usd):>12} "
                     f"{_span2(e.interval(e.cost_usd) if e.cost_usd else None, _money):>21} "
                     f"{e.energy_mwh:8.1f} {100 * p.mfu:5.1f} "
                     f"{p.memory_headroom_pct:6.1f}  {r.limiting.value}; {_plan_str(p.plan)}")
    return "\n".join(lines + compare_verdicts(rows))


def compare_verdicts(rows: Sequence[Any]) -> list[str]:
    """Which options the 80 % intervals cannot tell apart from the fastest / cheapest."""
    out = []
    for what, label in (("days", "fastest"), ("cost_usd", "cheapest")):
        best, same = indistinguishable_from_best(rows, what)
        if best is None or best.estimate.interval(getattr(best.estimate, what)) is None:
            continue
        if same:
            out.append(f"not distinguishable from the {label} ({best.choice.label}): "
                       + ", ".join(r.choice.label for r in same)
                       + " (80% intervals overlap by more than half)")
        else:
            out.append(f"{label}: {best.choice.label}, distinguishable from every other option")
    return [""] + out if out else []


def _span2(iv, fmt) -> str:
    return f"{fmt(iv.p10)}-{fmt(iv.p90)}" if iv is not None else "-"


def format_scaling(curves: Sequence[Any], model: TransformerSpec) -> str:
    lines = [f"scaling  {model.name}, seq {model.seq_len} (global batch per point below)"]
    for c in curves:
        f = c.serial_fraction
        amdahl = f"; Amdahl serial fraction {f:.4f} (max speedup {c.max_speedup:.0f}x)" \
            if f is not None and f > 0 else (f"; Amdahl serial fraction {f:.4f}" if f is not None else "")
        lines += ["", f"{c.kind.value} scaling on {c.gpu}{amdahl}",
                  f"{'gpus':>7} {'gbs':>6} {'tokens/s':>12} {'tok/s/GPU':>10} {'speedup':>8} "
                  f"{'eff%':>6}  class       plan"]
        for p in c.points:
            if p.plan is None:
                lines.append(f"{p.n_gpus:>7} {p.global_batch:>6}  {p.note}")
                continue
            lines.append(f"{p.n_gpus:>7} {p.global_batch:>6} {p.tokens_per_s:12,.0f} "
                         f"{p.tokens_per_s_per_gpu:10.1f} {p.speedup:8.2f} {100 * p.efficiency:6.1f}  "
                         f"{p.efficiency_class.value:11s} {_plan_str(p.plan.plan)}")
    return "\n".join(lines)


def format_sensitivity(rows: Sequence[Any], plan: Plan, model: TransformerSpec,
                       cluster: ClusterSpec) -> str:
    lines = [f"what-if  {model.name} on {cluster.n_gpus} x {cluster.gpu.key}: {_plan_str(plan)}", "",
             f"{'knob':14s} {'change':34s} {'step s':>9} {'throughput':>11}  note"]
    for r in rows:
        st = f"{r.step_time_s:9.3f}" if r.step_time_s is not None else f"{'-':>9}"
        pct = f"{r.throughput_change_pct:+10.1f}%" if r.throughput_change_pct is not None else f"{'-':>11}"
        lines.append(f"{r.knob:14s} {r.change:34s} {st} {pct}  {r.note}")
    return "\n".join(lines)


def format_bottleneck(rep, plan: Plan, model: TransformerSpec, cluster: ClusterSpec) -> str:
    s = rep.step_time_s
    lines = [f"bottleneck  {model.name} on {cluster.n_gpus} x {cluster.gpu.key}: {_plan_str(plan)}",
             f"step {s:.3f} s; main bottleneck: {rep.main.value}",
             f"roofline ridge {rep.ridge_flop_per_byte:.0f} FLOP/byte; per layer and micro-batch: "
             f"compute-bound ops {1e3 * rep.compute_bound_s:.2f} ms, memory-bound ops "
             f"{1e3 * rep.memory_bound_s:.2f} ms ({100 * rep.memory_bound_share:.0f}% of op time)", "",
             "exposed per step:"]
    for k, v in list(rep.exposed_comm_s.items()) + [("bubble", rep.bubble_s),
                                                    ("optimizer", rep.optimizer_s),
                                                    ("interference", rep.interference_s),
                                                    ("overhead", rep.overhead_s)]:
        lines.append(f"  {k:12s} {v:9.3f} s {100 * v / s:5.1f} %")
    lines += ["", f"{'op':24s} {'phase':9s} {'where':11s} {'GFLOP':>9} {'MB':>9} {'FLOP/B':>8} "
              f"{'ms':>8}  class"]
    for o in rep.ops:
        if o.phase != "forward":
            continue
        lines.append(f"{o.name:24s} {o.phase:9s} {o.where:11s} {o.flops / 1e9:9.2f} "
                     f"{o.bytes_moved / 1e6:9.2f} {o.intensity_flop_per_byte:8.1f} "
                     f"{1e3 * o.time_s:8.3f}  {o.roofline.value}")
    return "\n".join(lines)
