"""Predicting a runs file row by row, so that an interrupted run loses nothing.

``predict_rows(rows, predict_one, out)`` writes each finished row to ``OUT.partial`` (one
CSV line, flushed) as soon as it is predicted, and at the end writes ``OUT`` in input
order and removes the partial file. If the run is stopped (Ctrl-C, SIGTERM, a crash), the
partial file keeps every finished row; the same command run again reuses those rows,
predicts only the rest, and then writes ``OUT``. A partial row is reused only when its
input columns equal an input row's exactly; a finished ``OUT`` is never read back (a new
run after a code or data change predicts everything again).

Resumed rows keep the columns as written (``predicted_step_time_s`` to 4 significant
digits, ``error_pct`` to 0.01 %), so a resumed run's summary MAPE can differ from an
uninterrupted run's in its last printed digit.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .. import progress
from .predict import OUT_COLUMNS, RowOutcome, outcome_columns, write_rows


def partial_path(out: str | Path) -> Path:
    p = Path(out)
    return p.with_name(p.name + ".partial")


def _key(row: Mapping[str, str], inputs: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(row.get(c, "")) for c in inputs)


def _resumed(path: Path, inputs: Sequence[str]) -> dict[tuple[str, ...], RowOutcome]:
    """Finished rows of an earlier, interrupted run (empty if none or unreadable)."""
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if list(reader.fieldnames or []) != list(inputs) + list(OUT_COLUMNS):
            return {}
        done = {}
        for rec in reader:
            if rec.get("status") is None:              # a line cut short by the interrupt
                continue
            row = {c: rec[c] for c in inputs}
            saved = {c: rec[c] for c in OUT_COLUMNS}
            err = _float_signed(saved["error_pct"])
            done[_key(row, inputs)] = RowOutcome(row, None, saved["chosen"], saved["status"],
                                                 err, saved=saved)
    return done


def _float_signed(text: str) -> float | None:
    try:
        return float(text) if text.strip() else None
    except ValueError:
        return None


def predict_rows(rows: Sequence[Mapping[str, str]], predict_one: Callable[[Mapping[str, str]], RowOutcome],
                 out: str | Path | None = None) -> list[RowOutcome]:
    """Outcomes of ``rows`` in input order; with ``out``, resumable (see module doc)."""
    if out is None:
        return [predict_one(r) for r in progress.track(rows, "predict: rows", describe=_row_id)]
    inputs = [c for c in rows[0].keys() if c not in OUT_COLUMNS]
    part = partial_path(out)
    done = _resumed(part, inputs)
    todo = [r for r in rows if _key(r, inputs) not in done]
    new: dict[tuple[str, ...], RowOutcome] = {}
    fresh = not done
    with part.open("w" if fresh else "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=inputs + list(OUT_COLUMNS), extrasaction="ignore")
        if fresh:
            w.writeheader()
        try:
            for r in progress.track(todo, f"predict: rows ({len(done)} resumed)" if done
                                    else "predict: rows", describe=_row_id):
                o = predict_one(r)
                new[_key(r, inputs)] = o
                w.writerow({**o.row, **outcome_columns(o)})
                f.flush()
        except BaseException as exc:                 # Ctrl-C, SIGTERM: say what is kept
            if not isinstance(exc, Exception):
                exc.args = (f"{len(done) + len(new)} of {len(rows)} rows kept in {part}; "
                            "run the same command again to resume",)
            raise
    outcomes = [done.get(_key(r, inputs)) or new[_key(r, inputs)] for r in rows]
    write_rows(out, outcomes)
    part.unlink()
    return outcomes


def _row_id(row: Mapping[str, str]) -> str:
    return str(row.get("id", ""))[:32]

