"""The report's 'chosen' column lists what was picked for empty cells and never the
framework's reasons, even when those reasons contain ';' (frameworks.json sources do)."""
from __future__ import annotations

from simulator.validation.predict import RowOutcome
from simulator.validation.report import markdown


def test_chosen_column_drops_the_framework_reasons_whole():
    row = {"id": "r1", "gpu": "a100-sxm-80gb", "n_gpus": "8", "tp": "2",
           "measured_step_time_s": "1.0", "source": "x"}
    why = "engine.py partitions activations; gradients since 2021; both default on"
    chosen = f"micro_batch=2;vpp=1;framework defaults: {why}"
    o = RowOutcome(row, None, chosen, "ok", None, saved={"chosen": chosen})
    line = next(x for x in markdown([o]).splitlines() if x.startswith("| r1 "))
    assert line.rstrip().endswith("| micro_batch=2; vpp=1 |")
    assert "gradients since" not in line and "partitions" not in line
