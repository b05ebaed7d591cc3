"""Calibrating on a shared host: which measured points a fit may use, and marking what the
host's other load contaminated.

The benchmarks flag a point ``suspect`` when other load competed for the CPU during its
timing and did not stop after re-measuring with backoff (``calibrate.bench.BusyRetry``,
``calibrate.bench_comm``). Here, per benchmark and thread count:

- enough clean points (at least ``MIN_CLEAN`` and at least half of the group): the fit uses
  only those;
- too few: by default the fit uses every point of the group, and each coefficient fitted from
  it is marked ``contaminated`` in the profile (with a one-line warning), because a profile
  measured on a busy host is still more useful than none; with ``strict`` the calibration
  refuses instead, as it did before.

A benchmark that failed outright (gloo could not run after its retries) leaves no file: the
collectives give no host link and the interference leaves the overlap slowdown at an assumed
1.0, both marked contaminated, unless ``strict``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.errors import InvalidInputError
from simulator.hardware.profile import Coefficient

MIN_CLEAN = 3
COMPUTE_BENCHES = ("gemm", "memory", "attention")       # in-process: always required
OPTIONAL_BENCHES = ("collectives", "interference")      # multi-process: may fail on a host
Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Selected:
    """Rows a benchmark's fit uses, and which of its groups had to use suspect points."""

    rows: Rows
    contaminated_threads: frozenset[int | None]    # thread counts (None: the bench as a whole)


def _group_key(bench: str, r: Mapping[str, Any]) -> int | None:
    per_thread = bench in COMPUTE_BENCHES or bench == "host"
    return int(r["threads"]) if per_thread and "threads" in r else None


def _fit_group(bench: str, r: Mapping[str, Any]) -> tuple:
    """The rows one fit uses together: a memory-bound kernel and pass has its own fit
    (``cpu_profile._memory``), so it needs its own quorum of clean points; else the
    thread count."""
    sub = (r.get("kernel"), r.get("pass")) if bench == "memory" else ()
    return (_group_key(bench, r), *sub)


def select_rows(bench: str, rows: Sequence[Mapping[str, Any]], path: Path,
                strict: bool = False) -> Selected:
    """Clean rows where there are enough; all rows of a group (marked) where not."""
    groups: dict[tuple, Rows] = {}
    for r in rows:
        groups.setdefault(_fit_group(bench, r), []).append(dict(r))
    out: Rows = []
    dirty: set[int | None] = set()
    for (key, *_), group in groups.items():
        clean = [r for r in group if not r.get("suspect")]
        if len(clean) >= min(len(group), MIN_CLEAN) and 2 * len(clean) >= len(group):
            out += clean
            continue
        if strict:
            raise InvalidInputError(
                "measurements", str(path), "enough points measured on a quiet host",
                f"{len(group) - len(clean)} of {len(group)} points"
                f"{'' if key is None else f' at {key} thread(s)'} were taken while other load "
                "held the CPU; re-run when the host is quiet, or without --strict to accept a "
                "profile with these coefficients marked contaminated")
        out += group
        dirty.add(key)
    if not out:
        raise InvalidInputError("measurements", str(path), "at least one measured point")
    return Selected(out, frozenset(dirty))


def mark(coef: Any) -> Any:
    """A copy of a Coefficient, or of a dataclass / mapping of them, marked contaminated."""
    if isinstance(coef, Coefficient):
        return replace(coef, contaminated=True)
    if isinstance(coef, Mapping):
        return {k: mark(v) for k, v in coef.items()}
    if is_dataclass(coef) and not isinstance(coef, type):
        return replace(coef, **{f.name: mark(getattr(coef, f.name)) for f in fields(coef)
                                if _holds_coefficients(getattr(coef, f.name))})
    return coef


def _holds_coefficients(v: Any) -> bool:
    if isinstance(v, Coefficient):
        return True
    if isinstance(v, Mapping):
        return any(_holds_coefficients(x) for x in v.values())
    return is_dataclass(v) and not isinstance(v, type)


def assumed_overlap(reason: str) -> Coefficient:
    """The overlap slowdown when the interference benchmark could not run."""
    return Coefficient(1.0, "multiplier", f"assumed: no slowdown, the interference benchmark "
                       f"did not complete ({reason})", contaminated=True)


def warning_line(name: str, paths: Sequence[str], failed: Sequence[str]) -> str:
    """One line for stderr about a profile built on a busy or failing host."""
    parts = []
    if paths:
        parts.append(f"{len(paths)} coefficient(s) marked contaminated (host busy while "
                     f"measuring: {', '.join(sorted({p.split('.')[1] for p in paths}))})")
    if failed:
        parts.append(f"benchmark(s) that failed: {', '.join(failed)}")
    return (f"warning: {name}: " + "; ".join(parts) + "; re-run on a quiet host for a clean "
            "profile (--strict refuses instead)")
