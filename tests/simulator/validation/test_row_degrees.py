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


def test_not_used_counts_are_zero_not_the_default():
    """'none' in zero_stage means no ZeRO, not the framework's stage (llm-foundry: 3)."""
    row = _row("mpt_foundry_04")
    assert _predict(dict(row, zero_stage="none")).inputs.plan.zero_stage == 0
    assert _predict(dict(row, zero_stage="")).inputs.plan.zero_stage == 3


def test_a_derived_gpu_count_is_held_to_the_limits():
    row = dict(_row("nemo2407_h100_12"), n_gpus="", dp="1048576")
    assert _predict(row).status.startswith("invalid: n_gpus")


def test_the_outcome_keeps_the_cells_as_read():
    """Output rows and resumed runs match the input's cells, not the filled ones."""
    row = dict(_row("nemo2407_h100_12"), dp="", vpp="none", cp="2")
    o = _predict(row)
    assert o.status == "ok" and o.row == row
