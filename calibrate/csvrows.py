"""Measurement CSV rows with their line numbers, for citing exactly which rows a fit used."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

MEAS_DIR = Path(__file__).resolve().parent.parent / "hardware_db" / "data" / "measurements"


@dataclass(frozen=True)
class Row:
    """One CSV row and its line number in the file (header = line 1)."""

    file: str
    line: int
    data: Mapping[str, str]


def load_rows(name: str, directory: Path = MEAS_DIR) -> list[Row]:
    with open(directory / name, newline="") as fh:
        return [Row(name, i, r) for i, r in enumerate(csv.DictReader(fh), start=2)]


def select(rows: Sequence[Row], pred: Callable[[Mapping[str, str]], bool]) -> list[Row]:
    out = [r for r in rows if pred(r.data)]
    if not out:
        raise LookupError("no measurement row matched; the measurements CSV changed")
    return out


def cite(rows: Sequence[Row]) -> str:
    """``kernels.csv lines 15-30`` (contiguous runs collapsed)."""
    lines = sorted(r.line for r in rows)
    runs, start, prev = [], lines[0], lines[0]
    for ln in lines[1:] + [None]:
        if ln is not None and ln == prev + 1:
            prev = ln
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        if ln is not None:
            start = prev = ln
    word = "line" if len(lines) == 1 else "lines"
    return f"{rows[0].file} {word} {', '.join(runs)}"


