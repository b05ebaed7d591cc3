"""`complexity calibrate` plumbing: discovery + microbenchmarks + fit, or refit only.

The main CLI (simulator/cli/main.py) hooks these in with ``add_subcommands(subparsers)``, or
calls ``run_calibrate(out_dir, quick)`` / ``run_fit(out_dir)`` directly. Errors are
``simulator.errors`` types whose ``str`` is one line.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from simulator import progress
from simulator.errors import ComplexityError, InvalidInputError

from .discover import describe, discover, discover_cpu
from .profile_io import write_profile

DEVICES = ("auto", "cpu", "cuda")
QUICK_GPU_BUDGET_S = 60.0


@dataclass(frozen=True)
class CalibrationResult:
    """Where things were written and how long it took."""

    out_dir: Path
    profiles: Mapping[str, Path]
    measurements: tuple[Path, ...]
    wall_s: float
    # profile file name -> dotted paths of its coefficients marked contaminated
    contaminated: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    failed: tuple[str, ...] = ()          # benchmarks that could not run (after retries)


def _out_dir(out_dir: str | Path, create: bool) -> Path:
    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise InvalidInputError("out", str(p), "a directory (it is a file)")
    if not p.exists():
        if not create:
            raise InvalidInputError("out", str(p), "an existing calibration directory "
                                    "(run `complexity calibrate --out DIR` first)")
        p.mkdir(parents=True)
    return p


def resolve_device(device: str, gpu: str | None = None, dry_run: bool = False) -> str:
    """"cpu" or "cuda": ``auto`` is cuda where torch sees a GPU (or a dry run names one)."""
    if device not in DEVICES:
        raise InvalidInputError("device", device, f"one of {', '.join(DEVICES)}")
    if device != "auto":
        return device
    from .gpu_run import cuda_missing_reason
    return "cuda" if (dry_run and gpu) or cuda_missing_reason() is None else "cpu"


def _check_gpu_options(device: str, budget_s: float | None, gpu: str | None,
                       gpus: int | None, dry_run: bool) -> None:
    if device == "cpu":
        for name, v in (("budget_s", budget_s), ("gpu", gpu), ("gpus", gpus)):
            if v is not None:
                raise InvalidInputError(name, v, "only with --device cuda (the CPU sweep is "
                                        "sized by --quick)")
        if dry_run:
            raise InvalidInputError("dry_run", True, "only with --device cuda or --gpu KEY "
                                    "(it plans a GPU calibration)")
    if gpus is not None and not dry_run:
        raise InvalidInputError("gpus", gpus, "only with --dry-run (a calibration measures "
                                "the GPUs this host has)")


def run_calibrate(out_dir: str | Path, quick: bool = False, quiet: bool = False,
                  strict: bool = False, device: str = "auto", budget_s: float | None = None,
                  gpu: str | None = None) -> CalibrationResult:
    """Discover the device, run every microbenchmark (resuming points already in
    ``OUT/measurements``), fit, and write ``OUT/profile.json`` (+ per-thread variants on a
    CPU).

    ``device``: "cpu" measures this host's CPU (also on a GPU host; the profile names the
    CPU), "cuda" its GPUs (``calibrate.gpu_run``; one line and exit 2 where there are none),
    "auto" the GPUs where torch sees any. ``budget_s`` (GPU): the most informative points
    that fit that many seconds. On a busy host CPU points are re-measured with backoff; what
    never settled is used and marked ``contaminated`` in the profile (``strict``: refuse
    instead). A benchmark that fails after its retries (gloo) is reported and skipped
    unless ``strict``."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ComplexityError("calibration needs torch (pip install 'complexity-framework[torch]')"
                              ) from None
    device = resolve_device(device, gpu)
    _check_gpu_options(device, budget_s, gpu, None, False)
    if device == "cuda":
        return _run_gpu(out_dir, QUICK_GPU_BUDGET_S if quick and budget_s is None else budget_s,
                        gpu, quiet, strict)
    from .bench import bench_attention, bench_gemm, default_plan, quick_plan
    from .bench_comm import BenchmarkError, bench_comm
    from .bench_host import bench_host
    from .bench_mem import bench_memory
    from .store import environment
    t0 = time.perf_counter()
    out = _out_dir(out_dir, create=True)
    info = discover()
    if info.kind != "cpu":
        info = discover_cpu("--device cpu: ")
    if not quiet:
        print(describe(info), file=sys.stderr)
    env, plan = environment(info.key), quick_plan() if quick else default_plan()
    try:
        with progress.task("calibrate: benchmarks", 5) as bar:
            for bench in (bench_host, bench_gemm, bench_memory, bench_attention):
                bar.note(bench.__name__.removeprefix("bench_"))
                bench(out, env, plan, quiet)
                bar.update(1)
            bar.note("collectives")
            try:
                bench_comm(out, env, plan, quiet)
            except BenchmarkError as exc:
                if strict:
                    raise
                print(f"warning: {exc}; continuing without it", file=sys.stderr)
    except KeyboardInterrupt:
        raise ComplexityError(f"calibration interrupted; measurements taken so far are kept in "
                              f"{out / 'measurements'}; re-run the same command to resume") from None
    res = run_fit(out, info=info, quiet=quiet, strict=strict)
    return replace(res, wall_s=time.perf_counter() - t0)


def _run_gpu(out_dir: str | Path, budget_s: float | None, gpu: str | None, quiet: bool,
             strict: bool) -> CalibrationResult:
    from .gpu_run import measure_gpu
    t0 = time.perf_counter()
    out = _out_dir(out_dir, create=True)
    try:
        notes = measure_gpu(out, budget_s, gpu, quiet, strict)
    except KeyboardInterrupt:
        raise ComplexityError(f"calibration interrupted; measurements taken so far are kept in "
                              f"{out / 'measurements'}; re-run the same command to resume") from None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    res = run_fit(out, quiet=quiet, strict=strict)
    return replace(res, wall_s=time.perf_counter() - t0)


def run_fit(out_dir: str | Path, info=None, quiet: bool = False, strict: bool = False
            ) -> CalibrationResult:
    """Refit ``OUT/profile*.json`` from the stored ``OUT/measurements/*.parquet`` (a GPU
    calibration's rows give a GPU profile, ``calibrate.gpu_profile``)."""
    from .cpu_profile import fit_profiles
    from .gpu_profile import fit_gpu_profiles, is_gpu_calibration
    from .hygiene import warning_line
    t0 = time.perf_counter()
    out = _out_dir(out_dir, create=False)
    gpu = is_gpu_calibration(out)
    profiles = fit_gpu_profiles(out, strict) if gpu else fit_profiles(out, info, strict=strict)
    written, dirty, failed = {}, {}, ()
    for name, prof in profiles.items():
        write_profile(prof, out / name)
        written[name] = out / name
        dirty[name] = tuple(prof.contaminated_paths())
        failed = tuple(x for x in prof.fingerprint.get("failed_benchmarks", "").split(",") if x)
        if dirty[name] or failed:
            print(warning_line(name, dirty[name], failed), file=sys.stderr)
        if not quiet:
            print(f"wrote {out / name}: {_headline(prof)}", file=sys.stderr)
    meas = tuple(sorted((out / "measurements").glob("*.parquet")))
    return CalibrationResult(out, written, meas, time.perf_counter() - t0, dirty, failed)


def _headline(prof) -> str:
    if prof.fingerprint.get("builder") == "calibrate.gpu_profile":
        from .gpu_run import headline
        return headline(prof)
    d = prof.device
    host = prof.node.scale_up.bandwidth_gbytes_per_s if prof.node else 0.0
    return (f"fp32 {d.peak('fp32') * 1e3:.1f} GFLOP/s, memory {d.mem_bw_gbytes_per_s:.1f} GB/s, "
            f"host link {host:.2f} GB/s, overlap x{prof.overlap_slowdown.value:.2f}")


# ---- argparse hook -----------------------------------------------------------------------
def add_subcommands(subparsers) -> argparse.ArgumentParser:
    """Add ``calibrate [fit] [--quick] --out DIR``, ``validate-run`` and ``validate-memory``
    to the main CLI's subparsers."""
    p = subparsers.add_parser("calibrate", help="measure this machine and fit a profile "
                              "(`calibrate fit` refits from stored measurements)")
    p.add_argument("action", nargs="?", choices=["fit"], help="refit only")
    p.add_argument("--quick", action="store_true", help="short sweep (well under a minute; "
                   f"on a GPU: --budget-s {QUICK_GPU_BUDGET_S:g})")
    p.add_argument("--device", default="auto", choices=DEVICES, help="what to measure: "
                   "cuda (this host's GPUs), cpu (its CPU, also on a GPU host), auto (the GPUs "
                   "where torch sees any; default)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S", help="GPU: measure "
                   "the most informative points that fit S seconds (default: the whole sweep)")
    p.add_argument("--dry-run", action="store_true", help="GPU: print the plan (benchmarks, "
                   "points, estimated seconds) and measure nothing")
    p.add_argument("--gpu", default=None, metavar="KEY", help="GPU: the hardware_db key of "
                   "the GPU (default: named from what the driver reports); with --dry-run, "
                   "plan for that GPU instead of this host's; with --from-trace, the GPU of "
                   "the trace (default: from its deviceProperties)")
    p.add_argument("--gpus", type=int, default=None, metavar="N", help="with --dry-run "
                   "--gpu KEY: plan for a node of N such GPUs")
    p.add_argument("--out", default="calibration", help="output directory (default: "
                   "./calibration): DIR/profile.json, DIR/measurements/*.parquet")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--strict", action="store_true", help="refuse to write a profile when "
                   "other load on this host contaminated the measurements or a benchmark "
                   "failed (default: write it, mark the affected coefficients "
                   "'contaminated' and warn)")
    _add_from_trace(p)
    p.set_defaults(func=main_calibrate)
    add_validate_run(subparsers)
    from .memcheck_report import add_validate_memory
    add_validate_memory(subparsers)
    from .trace_cli import add_doctor
    add_doctor(subparsers)
    return p


def _add_from_trace(p: argparse.ArgumentParser) -> None:
    """``calibrate --from-trace TRACE [--model ... plan flags] [--profile BASE] --out DIR``."""
    from .trace_cli import add_run_flags
    p.add_argument("--from-trace", default=None, metavar="TRACE",
                   help="fit the profile from a Kineto trace of a real run (torch.profiler, "
                   "record_shapes=True; JSON or JSON.gz) instead of microbenchmarks")
    p.add_argument("--profile", default=None, help="with --from-trace: base profile whose "
                   "coefficients the trace cannot inform (default: the GPU's shipped "
                   "reference profile; none for a CPU trace)")
    add_run_flags(p)


def add_validate_run(subparsers) -> argparse.ArgumentParser:
    """``validate-run``: train a real model here, predict it, print the signed error."""
    p = subparsers.add_parser("validate-run", help="train a real PyTorch decoder for a few "
                              "steps here and compare its step time with the prediction")
    p.add_argument("--model", required=True, help="preset name or HuggingFace config.json")
    p.add_argument("--profile", required=True, help="profile JSON from `complexity calibrate` "
                   "(with --device cuda also 'reference': the shipped profile of this GPU)")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel processes (DDP, gloo; "
                   "with --device cuda: one per GPU)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per process per step")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the "
                   "model's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps")
    p.add_argument("--wait-quiet", type=float, default=60.0, metavar="S",
                   help="wait up to S seconds for other load on this host to stop before "
                   "the run (default 60; 0 = do not wait)")
    p.add_argument("--bucket-cap-mb", type=int, default=25, metavar="MB",
                   help="DDP bucket_cap_mb (default 25, torch's); a value larger than the "
                   "model's gradients leaves one bucket, reduced after backward (no overlap)")
    p.add_argument("--trace-out", default=None, metavar="FILE",
                   help="also write a Kineto (torch.profiler) trace of a few steps run after "
                   "the timed ones (FILE.gz: gzipped; one file per rank), for `complexity "
                   "calibrate --from-trace` and `complexity doctor`")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (default: "
                   "DDP over gloo, fp32, a profile from `complexity calibrate` on this host) "
                   "or cuda (one rank per GPU, bf16 autocast, DDP/FSDP over NCCL; --profile "
                   "'reference', a reference JSON or a GPU calibration's profile.json)")
    p.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"), help="with --device "
                   "cuda: DistributedDataParallel or FSDP2 (default ddp)")
    p.add_argument("--gpu", default=None, metavar="KEY", help="with --device cuda: the "
                   "hardware_db key of this host's GPU (default: named from the driver)")
    p.set_defaults(func=main_validate_run)
    return p


def quiet_deprecated_pynvml() -> None:
    """torch.cuda imports ``pynvml``; the old ``pynvml`` package (not ``nvidia-ml-py``, which
    this project's extra now installs) warns about itself on import: keep errors one line."""
    import warnings
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated",
                            category=FutureWarning)


def _refuse_gpu_profile_on_cpu(path: str) -> None:
    from simulator.errors import ProfileError
    from simulator.hardware.profile import Profile
    if Path(path).is_file() and \
            Profile.read_json(path).fingerprint.get("builder") == "calibrate.gpu_profile":
        raise ProfileError("profile", path, "a profile measured on this host's CPU",
                           "this one was measured on GPUs: add --device cuda")


def main_validate_run(args: argparse.Namespace) -> int:
    """Entry for the parsed ``validate-run`` subcommand; one-line errors."""
    import json
    quiet_deprecated_pynvml()

    from .validate_run import validate_run
    try:
        seq = args.seq_len
        if seq is None:
            from simulator.workload import resolve_model
            seq = resolve_model(args.model).seq_len
        if args.device == "cuda":
            from .validate_gpu import validate_run_cuda
            res = validate_run_cuda(args.model, args.profile, nproc=args.nproc,
                                    micro_batch=args.micro_batch, seq_len=seq,
                                    steps=args.steps, warmup=args.warmup,
                                    strategy=args.strategy, gpu=args.gpu)
        else:
            _refuse_gpu_profile_on_cpu(args.profile)
            res = validate_run(args.model, args.profile, nproc=args.nproc,
                               micro_batch=args.micro_batch, seq_len=seq, steps=args.steps,
                               warmup=args.warmup, wait_quiet_s=args.wait_quiet,
                               trace_out=args.trace_out, bucket_cap_mb=args.bucket_cap_mb)
    except ComplexityError as exc:
        print(f"complexity validate-run: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res.to_dict(), indent=2, sort_keys=True))
        print(res.line(), file=sys.stderr)
    else:
        print(res.line())
        for note in res.notes:
            print(f"  note: {note}")
    return 0


def main_calibrate(args: argparse.Namespace) -> int:
    """Entry for the parsed ``calibrate`` subcommand; prints a one-line error on failure."""
    quiet_deprecated_pynvml()
    if getattr(args, "from_trace", None):
        from .trace_cli import main_calibrate_from_trace
        return main_calibrate_from_trace(args)
    try:
        if args.dry_run:
            return _dry_run(args)
        if args.action == "fit":
            res = run_fit(args.out, quiet=args.quiet, strict=args.strict)
        else:
            res = run_calibrate(args.out, quick=args.quick, quiet=args.quiet,
                                strict=args.strict, device=args.device,
                                budget_s=args.budget_s, gpu=args.gpu)
    except ComplexityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in res.profiles.items():
        print(path)
    print(f"calibration done in {res.wall_s:.1f} s", file=sys.stderr)
    return 0


def _dry_run(args: argparse.Namespace) -> int:
    from .gpu_run import dry_run
    device = resolve_device(args.device, args.gpu, dry_run=True)
    _check_gpu_options(device, args.budget_s, args.gpu, args.gpus, True)
    budget = args.budget_s if args.budget_s is not None or not args.quick else QUICK_GPU_BUDGET_S
    print("\n".join(dry_run(Path(args.out), budget, args.gpu, args.gpus)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone ``python -m calibrate.cli [fit] [--quick] --out DIR``."""
    parser = argparse.ArgumentParser(prog="calibrate")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(["calibrate", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
