"""The medians of host_mechanisms.csv rows a frameworks.json mechanism cites (shared by the
tests that recompute a coefficient from its three measured runs)."""
from __future__ import annotations

import statistics


def median_of_runs(rows, mechanism: str, metric: str) -> tuple[float, list[int]]:
    """(median eager ops of ``mechanism``'s ``metric`` rows, their CSV line numbers); there
    must be exactly three runs."""
    runs = [(line, float(r["eager_ops"])) for line, r in rows.items()
            if r["mechanism"] == mechanism and r["metric"] == metric]
    assert len(runs) == 3, (mechanism, metric)
    return statistics.median(v for _, v in runs), [ln for ln, _ in runs]


def cited_median(rows, why: str, mechanism: str, metric: str) -> float:
    """``median_of_runs``'s value, after checking ``why`` cites its three lines."""
    v, lines = median_of_runs(rows, mechanism, metric)
    assert f"{lines[0]}, {lines[1]}, {lines[2]}" in why, metric
    return v
