"""CLI for the trace loop: ``calibrate --from-trace`` flags and the ``doctor`` command.

Model and plan: ``--model`` (preset or HuggingFace config.json), ``--micro-batch``,
``--seq-len``, ``--nproc`` (data-parallel ranks), ``--bucket-cap-mb`` and ``--precision``,
as validate-run runs them (fused SDPA attention, AdamW, DDP over the ranks, one pipeline
stage, no tensor parallelism); each defaults to what a trace recorded by
``validate-run --trace-out`` says about its run.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Mapping

from simulator.errors import ComplexityError, InvalidInputError


def add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="preset name or HuggingFace config.json "
                   "(default: the model a validate-run trace names)")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length")
    p.add_argument("--nproc", type=int, default=None, help="data-parallel ranks")
    p.add_argument("--bucket-cap-mb", type=int, default=None, help="DDP bucket_cap_mb")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16", "fp8"],
                   help="training precision (default fp32, as validate-run trains)")


def run_from(args: argparse.Namespace, meta: Mapping[str, Any], required: bool):
    """(RunSpec, Plan) from the flags, falling back to the trace's own record; None when the
    model is unknown and not ``required``."""
    from .validate_run import (
        DDP_BUCKET_MB,
        RunSpec,
        _positive,
        plan_for,
        threads_per_process,
    )
    model = args.model or meta.get("model")
    if not model:
        if required:
            raise InvalidInputError("model", None, "--model NAME (the trace does not say "
                                    "which model it ran)")
        return None
    mb = args.micro_batch or int(meta.get("micro_batch", 1))
    seq = args.seq_len or meta.get("seq_len")
    if seq is None:
        from simulator.workload import resolve_model
        seq = resolve_model(model).seq_len
    nproc = args.nproc or int(meta.get("nproc", 1))
    bucket = args.bucket_cap_mb or int(meta.get("bucket_cap_mb", DDP_BUCKET_MB))
    for name, v in (("micro_batch", mb), ("seq_len", int(seq)), ("nproc", nproc),
                    ("bucket_cap_mb", bucket)):
        _positive(name, v)
    from simulator.workload import resolve_model
    # not run_spec: the trace may come from more ranks than this host has cores
    rs = RunSpec(resolve_model(model, seq_len=int(seq)), nproc, mb, 1, 0,
                 threads_per_process(nproc), "", bucket)
    plan = plan_for(rs)
    if getattr(args, "precision", None):
        from dataclasses import replace
        plan = replace(plan, precision=args.precision)
    return rs, plan


def _meta(path: str) -> Mapping[str, Any]:
    from .trace_import import read_json
    m = read_json(path).get("complexity")
    return m if isinstance(m, Mapping) else {}


def main_calibrate_from_trace(args: argparse.Namespace) -> int:
    from .trace_profile import calibrate_from_trace
    try:
        run = run_from(args, _meta(args.from_trace), required=False)
        res = calibrate_from_trace(args.from_trace, args.out, run[0].model if run else None,
                                   run[1] if run else None, args.profile, args.gpu)
    except ComplexityError as exc:
        print(f"complexity calibrate: error: {exc}", file=sys.stderr)
        return 2
    print(res.path)
    fits = res.fitted.fits
    print(f"fitted from {res.trace.path}: " + ", ".join(
        f"{k} (held-out {'n/a' if f.heldout_mape_pct is None else f'{f.heldout_mape_pct:.1f}%'})"
        for k, f in sorted(fits.items())), file=sys.stderr)
    if res.fitted.host_note:
        print(res.fitted.host_note, file=sys.stderr)
    if res.kept:
        print(f"kept from the base profile (not informed by the trace): {len(res.kept)} "
              "coefficients (see trace_fit.json)", file=sys.stderr)
    return 0


def add_doctor(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("doctor", help="compare a Kineto trace of a real step with the "
                              "simulator's prediction of the same step, per op family, and "
                              "rank the gaps")
    p.add_argument("--trace", required=True, help="Kineto trace (JSON or JSON.gz) of one rank")
    p.add_argument("--profile", default=None, help="profile JSON (default: fitted from the "
                   "trace itself with `calibrate --from-trace`)")
    p.add_argument("--gpu", default=None, help="GPU key of a GPU trace (default: from the trace)")
    add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--perfetto", default=None, metavar="FILE",
                   help="write measured and simulated tracks side by side (ui.perfetto.dev)")
    p.set_defaults(func=main_doctor)
    return p


def _profile_for(args: argparse.Namespace, rs, plan):
    from simulator.hardware.profile import Profile
    if args.profile:
        from .validate_run import load_profile
        prof = Profile.read_json(args.profile)
        if prof.device is not None and prof.node is not None:
            prof, _, _ = load_profile(args.profile, rs.threads)
        return prof
    import tempfile

    from .trace_profile import calibrate_from_trace
    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        return calibrate_from_trace(args.trace, tmp, rs.model, plan, None, args.gpu).profile


def _cluster(prof, rs, gpu_key):
    from simulator.hardware.specs import ClusterSpec
    if prof.device is not None and prof.node is not None:
        return ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=rs.nproc)
    import hardware_db
    return hardware_db.build_cluster(gpu_key or prof.device_key, rs.nproc)


def main_doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor
    from .doctor_report import table, write_perfetto
    try:
        rs, plan = run_from(args, _meta(args.trace), required=True)
        prof = _profile_for(args, rs, plan)
        cluster = _cluster(prof, rs, args.gpu)
        diag, tr, res, ops = doctor(args.trace, rs.model, plan, prof, cluster)
        if args.perfetto:
            write_perfetto(args.perfetto, diag, tr, diag.step_index, res, ops, cluster.gpu, prof)
    except ComplexityError as exc:
        print(f"complexity doctor: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(diag.to_dict(), indent=2, sort_keys=True))
    else:
        print(table(diag))
    return 0
