"""Sub-commands: simulate, predict, report, list."""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

from ..api.catalog import cluster_from_row, load_profile_for, make_cluster
from ..boundary import json_out
from ..engine.simulate import simulate
from ..errors import InvalidInputError
from ..frameworks import framework_for_hardware, framework_memory
from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..parallel.conventions import conventions_for
from ..parallel.framework_plan import with_framework
from ..parallel.plan import Plan, check_attention_supported
from ..report.assumptions import assumptions
from ..report.table import format_result_table
from ..report.trace import write_chrome_trace
from ..uncertainty.interval import estimate_uncertainty, format_interval_lines
from ..uncertainty.table import SHIPPED_TABLE, load_table
from ..validation.intervals import (
    attach_heldout,
    attach_intervals,
    coefficient_spreads,
    learn_from,
)
from ..validation.predict import (
    outcome_columns,
    predict_row,
    read_rows,
    summary_line,
)
from ..validation.rowfile import predict_rows
from ..workload import resolve_model
from .collective import add_fabric_args, fabric_kwargs
from .registry import command

# ---- hardware (the CLI is the one simulator module allowed to load hardware_db) -----------


def add_recompute_args(p) -> None:
    """--recompute and --recompute-layers (a parser or an argument group)."""
    p.add_argument("--recompute", default="none", help="none, selective, full")
    p.add_argument("--recompute-layers", type=int, default=0, metavar="N",
                   help="with --recompute full: recompute only the first N layers of each "
                   "model chunk and keep the rest's activations (Megatron --recompute-method "
                   "block --recompute-num-layers N; torchtitan's every-k-th layer is the same "
                   "count); 0 = every layer (default: 0)")


# ---- simulate -------------------------------------------------------------------------------
@command("simulate", "Simulate one training step of a model on a cluster under a plan.")
def _simulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="preset key or HuggingFace config.json")
    p.add_argument("--module", help="FILE.py:FACTORY returning (torch module, example inputs); "
                   "simulated under DDP or FSDP instead of a transformer preset")
    p.add_argument("--gpu", required=True, help="GPU key, e.g. h100-sxm (see `complexity list gpus`)")
    p.add_argument("--gpus", type=int, required=True, help="total GPU count")
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--nics-per-node", type=int)
    p.add_argument("--nic-gbps", type=float, help="NIC line rate in Gb/s (e.g. 400)")
    p.add_argument("--nic-kind", help="infiniband, roce, omnipath, ethernet")
    p.add_argument("--scale-up", help="intra-node link key, e.g. nvlink4, nvlink5-nvl72")
    p.add_argument("--node", help="node preset, e.g. dgx-h100, gb200-nvl72 (see `complexity list nodes`)")
    add_fabric_args(p)
    for k in ("tp", "pp", "dp", "cp", "ep", "vpp"):
        p.add_argument(f"--{k}", type=int, default=None if k == "dp" else 1)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step (transformers)")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--sequence-parallel", action="store_true")
    add_recompute_args(p)
    _sharding_args(p)
    p.add_argument("--precision", default=None,
                   help="fp32, fp16, bf16, fp8 (default bf16; fp32 for --module)")
    p.add_argument("--framework", default=None,
                   help="training framework whose defaults fill what you do not state: "
                   "ZeRO stage, gradient dtype, FP8 weight cache, loss, attention, overlaps "
                   "(megatron-lm, megatron-core, nemo, megatron-deepspeed, deepspeed, llm-foundry, "
                   "torchtitan, fsdp, fsdp2, hf, pytorch; megatron-lm on an FP8-capable GPU "
                   "or in fp8 gets megatron-core's, the code such runs used)")
    p.add_argument("--grad-dtype", default=None,
                   help="gradient buffer / reduction dtype fp32, bf16 or fp16 "
                   "(default: the framework's)")
    p.add_argument("--schedule", default=None, help="gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipe")
    p.add_argument("--attention", default=None, help="flash (FA2-class), flash1 (FA1 / its "
                   "Triton port, A100/H100/H200), flash3 (FA3/cuDNN, Hopper+) or materialized "
                   "(default: the framework's, else flash)")
    _overlap_args(p)
    add_moe_args(p)
    p.add_argument("--bucket-mb", type=float, default=0.0,
                   help="DP gradient bucket size in MB of gradients (0 = the framework's: torch DDP's 25 MiB for hf, else Megatron-Core's max(40M, 1M x dp) params)")
    _host_args(p)
    p.add_argument("--engine", default="event", help="event or analytic")
    p.add_argument("--profile", help="calibration profile JSON (default: shipped reference)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here (.json.gz: compressed)")
    p.add_argument("--plot", help="write the simulated step as a Gantt chart per stage and "
                   "track, with memory over time (.png, .svg or .pdf)")
    p.add_argument("--no-interval", action="store_true",
                   help="skip the 80%% interval (saves its extra analytic simulations)")
    m = p.add_argument_group("--module options (DDP / FSDP of a traced torch module)")
    m.add_argument("--strategy", default="ddp", help="ddp or fsdp")
    m.add_argument("--bucket-cap-mb", type=float, help="DDP bucket_cap_mb (MiB; default torch's)")
    m.add_argument("--gradient-as-bucket-view", action="store_true")
    m.add_argument("--static-graph", action="store_true")
    m.add_argument("--compression", default="none", help="none, fp16, bf16, powersgd")
    m.add_argument("--powersgd-rank", type=int, default=1)
    m.add_argument("--optimizer", default="adam", help="adam or sgd")
    p.set_defaults(func=run_simulate)


def _sharding_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zero-stage", type=int, default=None,
                   help="0-3 (default: the framework's, e.g. 1 for nemo's distributed "
                   "optimizer, 3 for fsdp2; 0 without --framework)")
    p.add_argument("--dp-shard", type=int, default=0,
                   help="HSDP: shard ZeRO-3 / FSDP within groups of this many of the dp x cp "
                   "ranks and all-reduce across the groups (FSDP HYBRID_SHARD; torchtitan "
                   "dp_shard x cp); 0 = shard over all of dp x cp")


def _overlap_args(p: argparse.ArgumentParser) -> None:
    ov = p.add_mutually_exclusive_group()
    ov.add_argument("--no-dp-overlap", action="store_true")
    ov.add_argument("--dp-overlap", action="store_true")
    p.add_argument("--tp-overlap", action="store_true")


def add_moe_args(p) -> None:
    """``--moe-dispatcher`` (on a parser or an argument group)."""
    p.add_argument("--moe-dispatcher", default="alltoall",
                   help="MoE token dispatcher: alltoall (NCCL all-to-all of every token-expert "
                   "pair) or flex (DeepEP: one copy per node over RDMA, forwarded over NVLink; "
                   "needs --tp 1 where --ep > 1) (default alltoall)")


def _host_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host-mode", default=None, help="how the host launches kernels: "
                   "eager, compiled (torch.compile per block) or cuda_graphs (per layer) "
                   "(default: the framework's, else eager)")
    p.add_argument("--host-mechanisms", default=None, help="comma-separated framework host "
                   "mechanisms (frameworks.json 'host'): megatron_p2p_sync, ddp_param_hooks, "
                   "fsdp1_unit, deepspeed_bf16_grad_loop (default: the framework's, else "
                   "none; '' for none)")


def plan_from_args(a: argparse.Namespace, n_gpus: int, gpu: GPUSpec | None = None) -> Plan:
    """The plan the flags describe; with ``gpu``, an attention kernel named on the command
    line must be one the GPU runs (a framework's default is not refused: its kernel falls
    back to the FA2-class coefficients where the GPU has none)."""
    if gpu is not None and getattr(a, "attention", None):
        check_attention_supported(a.attention, gpu)
    dp = a.dp
    if dp is None:
        denom = a.tp * a.pp * a.cp
        if n_gpus % denom:
            raise InvalidInputError("tp*pp*cp", denom, f"a divisor of --gpus {n_gpus}")
        dp = n_gpus // denom
    schedule = a.schedule or ("interleaved" if a.vpp > 1 else "1f1b")
    for k in ("framework", "grad_dtype", "attention", "tp_overlap", "no_dp_overlap",
              "dp_overlap", "host_mode", "host_mechanisms"):
        if not hasattr(a, k):               # commands that share these flags only in part
            setattr(a, k, None)
    if a.grad_dtype is not None and a.grad_dtype not in ("fp32", "bf16", "fp16"):
        raise InvalidInputError("grad_dtype", a.grad_dtype, "fp32, bf16 or fp16")
    plan = Plan(tp=a.tp, pp=a.pp, dp=dp, cp=a.cp, ep=a.ep, vpp=a.vpp, micro_batch=a.micro_batch,
                global_batch=a.global_batch, sequence_parallel=a.sequence_parallel,
                recompute=a.recompute, recompute_layers=getattr(a, "recompute_layers", 0) or 0,
                zero_stage=a.zero_stage or 0, precision=a.precision,
                schedule=schedule, attention=a.attention or "flash",
                dp_overlap=not a.no_dp_overlap, tp_overlap=bool(a.tp_overlap),
                dp_bucket_bytes=int(a.bucket_mb * 1e6), host_mode=a.host_mode or "eager",
                host_mechanisms=_mechanisms(a.host_mechanisms),
                moe_dispatcher=getattr(a, "moe_dispatcher", None) or "alltoall")
    plan = _framework_defaults(plan, a, gpu)
    shard = getattr(a, "dp_shard", 0) or 0
    return replace(plan, dp_shard=shard) if shard else plan


def _mechanisms(flag: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (flag or "").split(",") if x.strip())


def _framework_defaults(plan: Plan, a: argparse.Namespace, gpu: GPUSpec | None = None) -> Plan:
    """Fill what the command line leaves open from ``--framework`` (explicit flags win);
    on ``gpu``, a framework name may stand for its successor (``framework_for_hardware``)."""
    if not a.framework:
        return replace(plan, memory=conventions_for(framework_memory(""), plan.precision,
                                                    a.grad_dtype))
    keep = {k for k, given in (("zero_stage", a.zero_stage is not None),
                               ("attention", a.attention is not None),
                               ("dp_overlap", bool(a.no_dp_overlap or a.dp_overlap)),
                               ("tp_overlap", bool(a.tp_overlap)),
                               ("sequence_parallel", a.sequence_parallel),
                               ("host_mode", a.host_mode is not None),
                               ("host_mechanisms", a.host_mechanisms is not None)) if given}
    name = a.framework
    if gpu is not None:
        name = framework_for_hardware(name, "fp8" in gpu.peak_tflops, plan.precision.value)
    return with_framework(plan, name, keep, a.grad_dtype)


def run_simulate(a: argparse.Namespace) -> int:
    if a.module:
        if a.model:
            raise InvalidInputError("model", a.model, "no --model with --module (the module "
                                    "is the model)")
        if getattr(a, "dp_shard", 0):
            raise InvalidInputError("dp_shard", a.dp_shard, "0 with --module (its --strategy "
                                    "fsdp shards over every rank; HSDP is for --model)")
        from .module import simulate_module_cli
        a.precision = a.precision or "fp32"
        return simulate_module_cli(a)
    if not a.model or not a.global_batch:
        raise InvalidInputError("model" if not a.model else "global_batch", None,
                                "--model PRESET|CONFIG.json and --global-batch N (or --module FILE.py:FACTORY)")
    a.precision = a.precision or "bf16"
    model = resolve_model(a.model, a.seq_len)
    cluster = make_cluster(a.gpu, a.gpus, a.gpus_per_node, a.nics_per_node, a.nic_gbps,
                           a.nic_kind, a.scale_up, a.node, a.oversubscription, **fabric_kwargs(a))
    prof = load_profile_for(cluster.gpu.key, a.profile, a.allow_profile_mismatch)
    plan = plan_from_args(a, cluster.n_gpus, cluster.gpu)
    res = simulate(model, plan, cluster, prof, engine=a.engine,
                   keep_timeline=bool(a.trace or a.plot))
    unc = None if a.no_interval else estimate_uncertainty(
        model, plan, cluster, prof,
        # the framework whose defaults the plan got (megatron-lm on an H100: megatron-core)
        framework=plan.memory.framework if getattr(a, "framework", None) else None)
    if a.trace:
        write_chrome_trace(a.trace, res)
    if a.plot:
        from ..report.gantt import plot_timeline
        plot_timeline(res, a.plot, f"{model.name} on {cluster.n_gpus} x {cluster.gpu.key}")
    if a.json:
        out = res.to_dict()
        out.update(model=model.name, gpu=cluster.gpu.key, profile=prof.name,
                   zero_stage=plan.zero_stage, dp_shard=plan.dp_shard,
                   memory_conventions=asdict(plan.memory),
                   assumptions=assumptions(model, plan, cluster, prof))
        if unc is not None:
            out.update(unc.result_fields(res), uncertainty=unc.to_dict())
        print(json_out.dumps(out, indent=2, sort_keys=True))
    else:
        print(format_result_table(res, model, plan, cluster, prof))
        if unc is not None:
            print(format_interval_lines(res, unc))
        if a.trace:
            print(f"trace written to {a.trace} (open in https://ui.perfetto.dev)")
        if a.plot:
            print(f"timeline picture written to {a.plot}")
    return 0


# ---- predict --------------------------------------------------------------------------------
@command("predict", "Predict each row of a published-runs CSV and report the error.")
def _predict_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", required=True, help="CSV in the published_runs.csv schema")
    p.add_argument("--out", help="write the rows plus prediction columns here")
    p.add_argument("--quiet", action="store_true", help="only the summary line")
    p.set_defaults(func=run_predict)


def predict_file(runs: str, out: str | None = None, table=None):
    """Every row's outcome (with its interval when ``table`` is given); with ``out``, rows
    are written as they finish and an interrupted run resumes (``validation.rowfile``)."""
    from hardware_db import load_profile
    rows = read_rows(runs)
    cache: dict[str, Profile] = {}
    def prof(key: str) -> Profile:
        if key not in cache:
            cache[key] = load_profile(key)
        return cache[key]

    def one(row):
        o = predict_row(row, cluster_from_row, prof)
        if table is not None:
            attach_intervals([o], table)           # per row: each interval is its own
        return o
    return predict_rows(rows, one, out)


def run_predict(a: argparse.Namespace) -> int:
    outcomes = predict_file(a.runs, a.out, load_table())
    if not a.quiet:
        for o in outcomes:
            c = outcome_columns(o)
            print(f"{o.row.get('id') or '?':34s} measured={o.row.get('measured_step_time_s') or '':>8s} "
                  f"predicted={c['predicted_step_time_s']:>8s} err={c['error_pct']:>7s}  {o.status[:60]}")
    print(summary_line(outcomes))
    return 0


# ---- validation report ----------------------------------------------------------------------
@command("report", "Regenerate the validation report (Markdown + Parquet) from a runs CSV.")
def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="validation/published_runs.csv")
    p.add_argument("--out-dir", default="validation/report")
    p.add_argument("--html", action="store_true", help="also write OUT_DIR/report.html with "
                   "the validation plots (needs matplotlib)")
    p.add_argument("--ship-uncertainty", action="store_true",
                   help="also write the learned model-form table to the copy predictions "
                   f"read ({SHIPPED_TABLE.relative_to(SHIPPED_TABLE.parents[3])})")
    p.set_defaults(func=run_report)


def run_report(a: argparse.Namespace) -> int:
    from ..validation.report import TABLE_NAME, write_report
    outcomes = predict_file(a.runs)
    spreads = coefficient_spreads(outcomes)
    out_dir = Path(a.out_dir)
    command = f"complexity report --runs {a.runs} --out-dir {a.out_dir}" + \
        (" --ship-uncertainty" if a.ship_uncertainty else "")
    learned = learn_from(outcomes, spreads, a.runs, out_dir / "report.md", command)
    attach_heldout(outcomes, spreads, learned)
    md = write_report(outcomes, out_dir, learned)
    if a.ship_uncertainty:                      # written before any output: a closed pipe
        learned.table.write_json(SHIPPED_TABLE)   # on stdout must not lose it
    print(summary_line(outcomes))
    from ..uncertainty.calibration import coverage
    lo = coverage(learned.heldout)              # unrounded: the report prints the same figure
    print(f"80% intervals, leave one source out: {lo.covered}/{lo.rows} measured step "
          f"times inside, median width {100 * lo.median_width_frac:.1f}% of the prediction")
    print(f"report written to {md}; uncertainty table {out_dir / TABLE_NAME}")
    if a.ship_uncertainty:
        print(f"shipped uncertainty table updated: {SHIPPED_TABLE}")
    if a.html:
        from ..validation.report_html import write_html
        print(f"HTML page written to {write_html(outcomes, md.read_text(), out_dir)}")
    return 0


# ---- list -----------------------------------------------------------------------------------
@command("list", "List built-in GPUs, nodes, links, models or profiles.")
def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["gpus", "nodes", "links", "models", "profiles"])
    p.set_defaults(func=run_list)


def run_list(a: argparse.Namespace) -> int:
    import hardware_db

    from ..workload import list_presets
    items = {"gpus": hardware_db.list_gpus, "nodes": hardware_db.list_nodes,
             "links": hardware_db.list_links, "models": list_presets,
             "profiles": hardware_db.list_profiles}[a.what]()
    sys.stdout.write("\n".join(items) + "\n")
    return 0
