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


MI250X_CELLS = dict(gpu="MI250X", scale_up="", nic_gbps="", nics_per_node="", tp="8", pp="1",
                    global_batch="16")


@pytest.mark.parametrize("cells, counted", [
    (dict(n_gpus="16", gpus_per_node="8", dp="2"), False),   # devices (GCDs) throughout
    (dict(n_gpus="16", gpus_per_node="", dp="2"), False),
    (dict(n_gpus="8", gpus_per_node="4", dp=""), True),      # 4 cards per node, dp derived
    (dict(n_gpus="8", gpus_per_node="4", dp="2"), True),     # cards, degrees in ranks
    (dict(n_gpus="8", gpus_per_node="", dp="2"), True),      # tp x dp = 2 x n_gpus
])
def test_a_row_that_counts_mi250x_cards_is_read_as_gcds(cells, counted):
    """An MI250X card is two devices (GCDs, each a rank; gpus.json devices_per_card). A row
    that counts cards (4 per node, or degrees multiplying to twice its n_gpus) is the same
    run as the row that counts GCDs: the same 16 ranks on two 8-GCD nodes, noted."""
    base = dict(_row("korthikanti22_t5_22b_selective"), **MI250X_CELLS)
    devices = _predict(dict(base, n_gpus="16", gpus_per_node="8", dp="2"))
    o = _predict(dict(base, **cells))
    assert o.status == "ok" and ("cards of 2 devices" in o.chosen) == counted
    assert (o.inputs.cluster.n_gpus, o.inputs.cluster.node.gpus_per_node) == (16, 8)
    assert (o.inputs.plan.tp, o.inputs.plan.dp) == (8, 2)
    assert o.result.step_time_s == devices.result.step_time_s


def test_a_one_device_card_is_never_recounted():
    row = dict(_row("korthikanti22_t5_22b_selective"), n_gpus="4", gpus_per_node="4",
               tp="4", dp="1")
    o = _predict(row)
    assert o.inputs.cluster.n_gpus == 4 and "devices:" not in o.chosen
