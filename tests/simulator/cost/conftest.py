"""Shared helpers for the host-mechanism tests."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

CSV = Path(__file__).resolve().parents[3] / "hardware_db" / "data" / "measurements" \
    / "host_mechanisms.csv"


@pytest.fixture
def mechanism_runs():
    """``runs(mechanism)``: its rows in host_mechanisms.csv, one dict per bench run (a run
    starts at its "per layer, fwd (whole layer)" row): metric -> (eager ops, us, probe us
    per forward op in the same run)."""
    def runs(mechanism: str) -> list[dict[str, tuple[float, float, float]]]:
        out: list[dict[str, tuple[float, float, float]]] = []
        with CSV.open() as fh:
            for r in csv.DictReader(fh):
                if r["mechanism"] != mechanism:
                    continue
                if r["metric"] == "per layer, fwd (whole layer)":
                    out.append({})
                out[-1][r["metric"]] = (float(r["eager_ops"]), float(r["value_us"]),
                                        float(r["op_fwd_us_same_run"]))
        return out
    return runs
