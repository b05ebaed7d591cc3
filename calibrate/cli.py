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

from simulator.errors import ComplexityError, InvalidInputError

from .discover import describe, discover
from .profile_io import write_profile


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


def run_calibrate(out_dir: str | Path, quick: bool = False, quiet: bool = False,
                  strict: bool = False) -> CalibrationResult:
    """Discover the device, run every microbenchmark (resuming points already in
    ``OUT/measurements``), fit, and write ``OUT/profile.json`` (+ per-thread variants).

    On a busy host points are re-measured with backoff; what never settled is used and
    marked ``contaminated`` in the profile (``strict``: refuse instead). A benchmark that
    fails after its retries (gloo) is reported and skipped unless ``strict``."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ComplexityError("calibration needs torch (pip install 'complexity-framework[torch]')"
                              ) from None
    from .bench import bench_attention, bench_gemm, default_plan, quick_plan
    from .bench_comm import BenchmarkError, bench_comm
    from .bench_host import bench_host
    from .bench_mem import bench_memory
    from .store import environment
    t0 = time.perf_counter()
    out = _out_dir(out_dir, create=True)
    info = discover()
    if not quiet:
        print(describe(info), file=sys.stderr)
    env, plan = environment(info.key), quick_plan() if quick else default_plan()
    try:
        for bench in (bench_host, bench_gemm, bench_memory, bench_attention):
            bench(out, env, plan, quiet)
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


def run_fit(out_dir: str | Path, info=None, quiet: bool = False, strict: bool = False
            ) -> CalibrationResult:
    """Refit ``OUT/profile*.json`` from the stored ``OUT/measurements/*.parquet``."""
    from .cpu_profile import fit_profiles
    from .hygiene import warning_line
    t0 = time.perf_counter()
    out = _out_dir(out_dir, create=False)
    profiles = fit_profiles(out, info, strict=strict)
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
    d = prof.device
    host = prof.node.scale_up.bandwidth_gbytes_per_s if prof.node else 0.0
    return (f"fp32 {d.peak('fp32') * 1e3:.1f} GFLOP/s, memory {d.mem_bw_gbytes_per_s:.1f} GB/s, "
            f"host link {host:.2f} GB/s, overlap x{prof.overlap_slowdown.value:.2f}")


# ---- argparse hook -----------------------------------------------------------------------
def add_subcommands(subparsers) -> argparse.ArgumentParser:
    """Add ``calibrate [fit] [--quick] --out DIR`` and ``validate-run`` to the main CLI's
    subparsers."""
    p = subparsers.add_parser("calibrate", help="measure this machine and fit a profile "
                              "(`calibrate fit` refits from stored measurements)")
    p.add_argument("action", nargs="?", choices=["fit"], help="refit only")
    p.add_argument("--quick", action="store_true", help="short sweep (well under a minute)")
    p.add_argument("--out", default="calibration", help="output directory (default: "
                   "./calibration): DIR/profile.json, DIR/measurements/*.parquet")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--strict", action="store_true", help="refuse to write a profile when "
                   "other load on this host contaminated the measurements or a benchmark "
                   "failed (default: write it, mark the affected coefficients "
                   "'contaminated' and warn)")
    p.set_defaults(func=main_calibrate)
    add_validate_run(subparsers)
    return p


def add_validate_run(subparsers) -> argparse.ArgumentParser:
    """``validate-run``: train a real model here, predict it, print the signed error."""
    p = subparsers.add_parser("validate-run", help="train a real PyTorch decoder for a few "
                              "steps here and compare its step time with the prediction")
    p.add_argument("--model", required=True, help="preset name or HuggingFace config.json")
    p.add_argument("--profile", required=True, help="profile JSON from `complexity calibrate`")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel processes (DDP, gloo)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per process per step")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the "
                   "model's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps")
    p.add_argument("--wait-quiet", type=float, default=60.0, metavar="S",
                   help="wait up to S seconds for other load on this host to stop before "
                   "the run (default 60; 0 = do not wait)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=main_validate_run)
    return p


def main_validate_run(args: argparse.Namespace) -> int:
    """Entry for the parsed ``validate-run`` subcommand; one-line errors."""
    import json

    from .validate_run import validate_run
    try:
        seq = args.seq_len
        if seq is None:
            from simulator.workload import resolve_model
            seq = resolve_model(args.model).seq_len
        res = validate_run(args.model, args.profile, nproc=args.nproc,
                           micro_batch=args.micro_batch, seq_len=seq, steps=args.steps,
                           warmup=args.warmup, wait_quiet_s=args.wait_quiet)
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
    try:
        if args.action == "fit":
            res = run_fit(args.out, quiet=args.quiet, strict=args.strict)
        else:
            res = run_calibrate(args.out, quick=args.quick, quiet=args.quiet,
                                strict=args.strict)
    except ComplexityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in res.profiles.items():
        print(path)
    print(f"calibration done in {res.wall_s:.1f} s", file=sys.stderr)
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
