"""Sub-commands for any ``torch.nn.Module``: analyze, simulate-module, compression-whatif,
precision-whatif, validate-module, calibrate-loaded.

``MODULE`` is ``FILE.py:FACTORY``; ``FACTORY()`` returns ``(module, example_inputs)`` or
``(module, example_inputs, loss_fn)``. Tracing runs on the meta device (no weights are
allocated); a model that cannot be traced fails with one line naming the op or construct.
``simulate_module_cli(args)`` is the body of ``complexity simulate --module ...``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ..api.catalog import DEFAULT_GPU, resolve_device
from ..boundary import json_out
from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec, GPUSpec
from .registry import command

# ---- shared helpers ------------------------------------------------------------------------------


def make_module_cluster(a: argparse.Namespace, gpu: GPUSpec, prof: Profile) -> ClusterSpec:
    n = int(getattr(a, "gpus", None) or 1)
    if prof.device is not None and prof.node is not None and gpu.key == prof.device.key:
        return ClusterSpec(gpu=gpu, node=prof.node, n_gpus=n)
    from ..api.catalog import make_cluster
    return make_cluster(gpu.key, n, getattr(a, "gpus_per_node", None),
                        getattr(a, "nics_per_node", None), getattr(a, "nic_gbps", None),
                        getattr(a, "nic_kind", None), getattr(a, "scale_up", None))


def trace_spec(spec: str, fuse_attention: bool = True):
    from ..modules.run import load_factory
    from ..modules.trace_torch import trace_factory
    return trace_factory(load_factory(spec), name=spec.rpartition(":")[2],
                         fuse_attention=fuse_attention)


def _device_args(p: argparse.ArgumentParser, cluster: bool) -> None:
    p.add_argument("module", help="FILE.py:FACTORY returning (module, example_inputs[, loss_fn])")
    p.add_argument("--gpu", help=f"GPU key (default {DEFAULT_GPU}, or the device of --profile)")
    p.add_argument("--profile", help="calibration profile JSON (default: shipped reference)")
    p.add_argument("--json", action="store_true")
    if cluster:
        p.add_argument("--gpus", type=int, default=8, help="data-parallel ranks")
        p.add_argument("--gpus-per-node", type=int)
        p.add_argument("--nics-per-node", type=int)
        p.add_argument("--nic-gbps", type=float)
        p.add_argument("--nic-kind")
        p.add_argument("--scale-up")
        p.add_argument("--optimizer", default="adam", help="none, sgd, sgd-momentum, adam, adamw")


def _ddp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bucket-cap-mb", type=float, help="DDP bucket cap in MiB (torch default 25)")
    p.add_argument("--first-bucket-mb", type=float, help="first bucket cap in MiB")
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--static-graph", action="store_true")
    p.add_argument("--find-unused-parameters", action="store_true")
    p.add_argument("--no-overlap", action="store_true", help="all-reduce after backward")


def _print(obj: Any) -> None:
    print(json_out.dumps(obj, indent=2, sort_keys=True, default=str))


# ---- analyze -------------------------------------------------------------------------------------
@command("analyze", "Trace a torch.nn.Module (FILE.py:FACTORY) and report FLOPs and the per-op roofline.")
def _analyze_args(p: argparse.ArgumentParser) -> None:
    _device_args(p, cluster=False)
    p.add_argument("--top", type=int, default=15, help="ops listed in the table")
    p.add_argument("--plot", help="write the roofline picture here (.png, .svg or .pdf)")
    p.add_argument("--png", help=argparse.SUPPRESS)          # deprecated spelling of --plot
    p.add_argument("--no-fuse-attention", action="store_true",
                   help="keep scaled_dot_product_attention as its math ops")
    p.set_defaults(func=run_analyze)


def run_analyze(a: argparse.Namespace) -> int:
    from ..modules.op_report import format_report, op_report, write_roofline_png
    g = trace_spec(a.module, not a.no_fuse_attention)
    gpu, prof = resolve_device(a.gpu, a.profile, getattr(a, "allow_profile_mismatch", False))
    rep = op_report(g, gpu, prof)
    if a.png:
        print("complexity analyze: --png is deprecated; use --plot", file=sys.stderr)
        a.plot = a.plot or a.png
    if a.plot:
        write_roofline_png(rep, a.plot)
    if a.json:
        d = rep.to_dict()
        d.update({k: v for k, v in g.summary().items() if k not in d})
        _print(d)
    else:
        print(format_report(rep, a.top))
        if a.plot:
            print(f"roofline picture written to {a.plot}")
    return 0


# ---- simulate-module -----------------------------------------------------------------------------
@command("simulate-module", "Simulate DDP or FSDP training of a traced torch.nn.Module.")
def _simulate_args(p: argparse.ArgumentParser) -> None:
    _device_args(p, cluster=True)
    _ddp_args(p)
    p.add_argument("--strategy", default="ddp", help="ddp or fsdp")
    p.add_argument("--compression", default="none", help="none, fp16, bf16, powersgd")
    p.add_argument("--powersgd-rank", type=int, default=1)
    p.add_argument("--precision", default="fp32", help="fp32, tf32, bf16, fp16, fp8 (autocast)")
    p.add_argument("--wrap-depth", type=int, default=0, help="FSDP unit depth (0 = auto)")
    p.add_argument("--no-backward-prefetch", action="store_true")
    p.set_defaults(func=simulate_module_cli)


def _ddp_config(a: argparse.Namespace):
    from ..modules.compression import CompressionSpec
    from ..modules.ddp import DDPConfig
    return DDPConfig(bucket_cap_mib=getattr(a, "bucket_cap_mb", None),
                     first_bucket_mib=getattr(a, "first_bucket_mb", None),
                     gradient_as_bucket_view=bool(getattr(a, "gradient_as_bucket_view", False)),
                     static_graph=bool(getattr(a, "static_graph", False)),
                     find_unused_parameters=bool(getattr(a, "find_unused_parameters", False)),
                     overlap=not (getattr(a, "no_overlap", False) or getattr(a, "no_dp_overlap", False)),
                     compression=CompressionSpec(getattr(a, "compression", "none") or "none",
                                                 rank=int(getattr(a, "powersgd_rank", 1) or 1)))


def _precision_graph(g, precision: str):
    """The graph in ``precision``, as the Python API's ``analyze_model`` prices it."""
    from ..api.module_flow import with_precision
    return with_precision(g, precision)


def simulate_module_cli(a: argparse.Namespace) -> int:
    """``complexity simulate --module FILE.py:FACTORY`` (also ``simulate-module``)."""
    from ..modules.ddp import dp_comm, simulate_ddp
    from ..modules.fsdp import FSDPConfig, simulate_fsdp
    from ..modules.op_report import price_graph
    spec = getattr(a, "module", None)
    precision = getattr(a, "precision", "fp32") or "fp32"
    g = _precision_graph(trace_spec(spec), precision)
    gpu, prof = resolve_device(getattr(a, "gpu", None), getattr(a, "profile", None),
                               getattr(a, "allow_profile_mismatch", False))
    cluster = make_module_cluster(a, gpu, prof)
    comm, times = dp_comm(cluster, prof), price_graph(g, gpu, prof)
    optimizer = getattr(a, "optimizer", "adam") or "adam"
    strategy = "fsdp" if getattr(a, "zero_stage", 0) == 3 else (getattr(a, "strategy", "ddp") or "ddp")
    if strategy == "fsdp":
        half = 2 if precision in ("bf16", "fp16", "fp8") else None
        cfg = FSDPConfig(wrap_depth=int(getattr(a, "wrap_depth", 0) or 0),
                         backward_prefetch=not getattr(a, "no_backward_prefetch", False),
                         param_bytes=half, reduce_bytes=half)
        res = simulate_fsdp(g, times, comm, gpu, prof, cfg, optimizer).to_dict()
    elif strategy == "ddp":
        res = simulate_ddp(g, times, comm, _ddp_config(a), gpu, prof, optimizer).to_dict()
    else:
        raise InvalidInputError("strategy", strategy, "ddp or fsdp")
    res.update(model=g.name, gpu=gpu.key, profile=prof.name, ranks=comm.size, strategy=strategy,
               precision=precision, link=comm.describe())
    _print(res) if getattr(a, "json", False) else print(_format_sim(res))
    return 0


def _format_sim(r: dict) -> str:
    ms = lambda k: f"{r.get(k, 0.0) * 1e3:10.3f} ms"
    lines = [f"{r['model']}: {r['strategy'].upper()} on {r['ranks']} x {r['gpu']} ({r['link']}), "
             f"{r['precision']}, profile {r['profile']}",
             f"step time        {ms('step_time_s')}",
             f"forward compute  {ms('forward_s')}", f"backward compute {ms('backward_s')}",
             f"communication    {ms('comm_s')}   exposed {ms('exposed_comm_s')}",
             f"optimizer        {ms('optimizer_s')}"]
    for b in r.get("buckets", [])[:20]:
        lines.append(f"  bucket {b['index']:3d}: {b['params']:4d} params {b['nbytes'] / 2**20:8.2f} MiB "
                     f"ready {b['ready_s'] * 1e3:8.3f} ms  reduced {b['done_s'] * 1e3:8.3f} ms")
    for u in r.get("units", [])[:20]:
        lines.append(f"  unit {u['unit']:24s} {u['params'] / 1e6:7.2f} M params  all-gather "
                     f"{u['all_gather_s'] * 1e3:7.3f} ms  reduce-scatter {u['reduce_scatter_s'] * 1e3:7.3f} ms")
    lines.append("memory per rank  " + ", ".join(f"{k.removesuffix('_bytes')} {v / 1e9:.3f} GB"
                                                 for k, v in r["memory"].items()))
    return "\n".join(lines)


# ---- what-ifs ------------------------------------------------------------------------------------
@command("compression-whatif", "DDP gradient compression (fp16, bf16, PowerSGD) for a traced module.")
def _compression_args(p: argparse.ArgumentParser) -> None:
    _device_args(p, cluster=True)
    _ddp_args(p)
    p.add_argument("--ranks", default="1,4,16", help="PowerSGD ranks to try, comma-separated")
    p.add_argument("--bandwidth-scale", type=float, default=1.0,
                   help="multiply the DP group's link bandwidth (what-if)")
    p.set_defaults(func=run_compression)


def run_compression(a: argparse.Namespace) -> int:
    from ..modules.compression import CompressionSpec
    from ..modules.compression_whatif import compression_whatif
    from ..modules.ddp import dp_comm
    from ..modules.op_report import price_graph
    g = trace_spec(a.module)
    gpu, prof = resolve_device(a.gpu, a.profile, getattr(a, "allow_profile_mismatch", False))
    comm = dp_comm(make_module_cluster(a, gpu, prof), prof).scaled(a.bandwidth_scale)
    ranks = [int(x) for x in str(a.ranks).split(",") if x.strip()]
    opts = [CompressionSpec(h) for h in ("none", "fp16", "bf16")] + \
        [CompressionSpec("powersgd", rank=r) for r in ranks]
    rep = compression_whatif(g, price_graph(g, gpu, prof), comm, _ddp_config(a), gpu, prof,
                             opts, a.optimizer)
    if a.json:
        _print(rep.to_dict())
        return 0
    print(f"{rep.model}: DDP over {rep.dp} ranks ({rep.bandwidth_note})")
    print(f"  {'option':14s} {'messages MB':>12s} {'comm ms':>9s} {'extra ms':>9s} "
          f"{'exposed ms':>11s} {'step ms':>9s} {'speedup':>8s} {'pays off below':>15s}")
    for r in rep.rows:
        be = r.pays_off_below_gbytes_per_s
        be_s = "-" if be is None else ("always" if be == float("inf") else
                                       "never" if be == 0 else f"{be:.3g} GB/s")
        print(f"  {r.option:14s} {r.message_bytes / 1e6:12.3f} {r.comm_s * 1e3:9.3f} "
              f"{r.extra_compute_s * 1e3:9.3f} {r.exposed_comm_s * 1e3:11.3f} "
              f"{r.step_s * 1e3:9.3f} {r.speedup:7.2f}x {be_s:>15s}")
    for v in rep.verdicts:
        print("  " + v)
    return 0


@command("precision-whatif", "fp32 vs TF32 vs bf16/fp16 AMP vs fp8 for a traced module.")
def _precision_args(p: argparse.ArgumentParser) -> None:
    _device_args(p, cluster=False)
    p.add_argument("--optimizer", default="adam")
    p.set_defaults(func=run_precision)


def run_precision(a: argparse.Namespace) -> int:
    from ..modules.precision_whatif import format_precision, precision_whatif
    g = trace_spec(a.module)
    gpu, prof = resolve_device(a.gpu, a.profile, getattr(a, "allow_profile_mismatch", False))
    rep = precision_whatif(g, gpu, prof, optimizer=a.optimizer)
    _print(rep.to_dict()) if a.json else print(format_precision(rep))
    return 0


# ---- real runs -----------------------------------------------------------------------------------
@command("validate-module", "Run real DDP steps of a module on this CPU (gloo) and compare with the prediction.")
def _validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("module", nargs="+", help="FILE.py:FACTORY (one or more)")
    p.add_argument("--profile", required=True, help="measured CPU profile JSON "
                   "(`complexity calibrate --quick --out DIR` or `complexity calibrate-loaded`)")
    p.add_argument("--bucket-cap-mb", type=float, nargs="+", default=[1.0, 25.0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds; each configuration reports its least-disturbed one")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_validate)


def run_validate(a: argparse.Namespace) -> int:
    from ..modules.run import RunConfig, format_rows, rows_to_dicts, validate
    prof = Profile.read_json(a.profile)
    rows = []
    for spec in a.module:
        base = RunConfig(spec, world=a.world, steps=a.steps, warmup=a.warmup, optimizer=a.optimizer)
        rows += validate(spec, prof, a.bucket_cap_mb, base, rounds=a.rounds)
    _print(rows_to_dicts(rows)) if a.json else print(format_rows(rows))
    return 0


@command("calibrate-loaded", "Measure a CPU profile with every DDP rank busy at once (gloo).")
def _loaded_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="passes; each point keeps its fastest")
    p.set_defaults(func=run_loaded)


def run_loaded(a: argparse.Namespace) -> int:
    from ..modules.calib import loaded_profile
    prof = loaded_profile(a.world, a.threads, repeat=a.repeat)
    prof.write_json(a.out)
    print(f"wrote {a.out}: {prof.notes}")
    return 0
