"""``ExperimentLedger``: every analyzer call as one Parquet row, with its diff.

A ledger is a directory of Parquet part files (one row each, written atomically), so
concurrent writers never clash and a later session reads every attempt back. Each row
holds the call's inputs and outputs as JSON, a few flat metrics, and ``diff_json``: the
inputs that changed since the previous attempt and how each metric moved.
``compare()`` lists those diffs; a row whose inputs differ in exactly one key says
which single change moved what.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

METRICS = ("step_time_s", "tokens_per_s_per_gpu", "samples_per_s", "mfu", "peak_memory_gb")


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"config": {"tp": 2}}`` -> ``{"config.tp": 2}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def diff(prev_inputs: Mapping[str, Any], inputs: Mapping[str, Any],
         prev_metrics: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Changed inputs (``key: [before, after]``) and metric moves (``key: [before, after,
    percent]``) between two attempts."""
    a, b = flatten(prev_inputs), flatten(inputs)
    changed = {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    moved = {}
    for k in METRICS:
        x, y = _num(prev_metrics.get(k)), _num(metrics.get(k))
        if x is not None and y is not None and x != y:
            moved[k] = [x, y, 100.0 * (y / x - 1.0) if x else None]
    return {"changed": changed, "moved": moved}


@dataclass(frozen=True)
class Comparison:
    """One attempt against the one before it."""

    entry_id: str
    method: str
    changed: dict[str, list]
    moved: dict[str, list]

    @property
    def single_change(self) -> str | None:
        return next(iter(self.changed)) if len(self.changed) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "method": self.method, "changed": self.changed,
                "moved": self.moved, "single_change": self.single_change}

    def line(self) -> str:
        what = ", ".join(f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in self.changed.items()) or "nothing"
        moved = ", ".join(f"{k} {v[2]:+.1f}%" for k, v in self.moved.items() if v[2] is not None)
        tag = "single change" if self.single_change else f"{len(self.changed)} changes"
        return f"{self.method:<20} [{tag}] {what}  =>  {moved or 'no metric moved'}"


class ExperimentLedger:
    """Append-only Parquet dataset: ``<dir>/part-<ns>-<pid>-<n>.parquet``, one row each."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._n = 0

    def append(self, method: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
               metrics: Mapping[str, float | None]) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq
        prev = self.last()
        d = diff(json.loads(prev["inputs_json"]), _jsonable(inputs),
                 json.loads(prev["metrics_json"]), metrics) if prev else {"changed": {}, "moved": {}}
        self.dir.mkdir(parents=True, exist_ok=True)
        self._n += 1
        stamp = f"{time.time_ns():020d}-{os.getpid()}-{self._n:06d}"
        row = {"entry_id": stamp, "created_utc": datetime.now(timezone.utc).isoformat(),
               "method": method, "model": str(inputs.get("model", "")),
               "gpu": str(flatten(inputs).get("config.gpu", inputs.get("gpu", ""))),
               "n_gpus": int(flatten(inputs).get("config.n_gpus", inputs.get("n_gpus")) or 0),
               "inputs_json": json.dumps(inputs, sort_keys=True, default=str),
               "outputs_json": json.dumps(outputs, sort_keys=True, default=str),
               "metrics_json": json.dumps({k: _num(v) for k, v in metrics.items()}, sort_keys=True),
               "diff_json": json.dumps(d, sort_keys=True, default=str)}
        for k in METRICS:
            v = _num(metrics.get(k))
            row[k] = v if v is not None else float("nan")
        tmp = self.dir / f".part-{stamp}.tmp"
        pq.write_table(pa.Table.from_pylist([row]), tmp)
        tmp.replace(self.dir / f"part-{stamp}.parquet")
        return row

    def _parts(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.parquet")) if self.dir.is_dir() else []

    def last(self) -> dict[str, Any] | None:
        import pyarrow.parquet as pq
        parts = self._parts()
        return pq.read_table(parts[-1]).to_pylist()[0] if parts else None

    def read(self) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq
        rows = []
        for part in self._parts():
            rows += pq.read_table(part).to_pylist()
        return sorted(rows, key=lambda r: r["entry_id"])

    def compare(self) -> list[Comparison]:
        """Every attempt after the first, against the one before it."""
        out = []
        for r in self.read()[1:]:
            d = json.loads(r.get("diff_json") or "{}")
            out.append(Comparison(r["entry_id"], r["method"], d.get("changed", {}),
                                  d.get("moved", {})))
        return out


def _jsonable(d: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, sort_keys=True, default=str))
