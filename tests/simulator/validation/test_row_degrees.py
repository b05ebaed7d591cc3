"""A runs row may leave ``dp`` or ``n_gpus`` empty: the other follows from the parallel
degrees (``predict.fill_degrees``), the fill is noted in ``chosen``, and the prediction is
the one of the complete row. With both empty the row is invalid, naming ``n_gpus``."""
from __future__ import annotations

import csv
from pathlib import Path

import hardware_db
import pytest

from simulator.api.catalog import cluster_from_row
from simulator.validation.predict import predict_row

RUNS = Path(__file__).resolve().parents[3] / "validation" / "published_runs.csv"


def _row(rid: str) -> dict[str, str]:
    with RUNS.open(newline="") as f:
        return next(r for r in csv.DictReader(f) if r["id"] == rid)


def _predict(row):
    return predict_row(row, cluster_from_row, hardware_db.load_profile)


@pytest.mark.parametrize("blank, note", [("dp", "dp=2 (n_gpus / (tp x pp x cp))"),
                                         ("n_gpus", "n_gpus=64 (tp x pp x dp x cp)")])
def test_an_empty_degree_is_derived(blank, note):
    row = _row("nemo2407_h100_12")              # 64 GPUs: tp 4, pp 4, dp 2, cp 2
    full = _predict(row)
    part = _predict(dict(row, **{blank: ""}))
    assert part.status == "ok" and note in part.chosen
    assert part.result.step_time_s == full.result.step_time_s


def test_both_empty_is_invalid_naming_n_gpus():
    o = _predict(dict(_row("nemo2407_h100_12"), dp="", n_gpus=""))
    assert o.status.startswith("invalid: n_gpus")


def test_degrees_that_do_not_divide_are_still_refused():
    o = _predict(dict(_row("nemo2407_h100_12"), dp="4"))
    assert o.status.startswith("invalid: dp")
