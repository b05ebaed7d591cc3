"""``complexity describe`` and ``complexity ledger``."""
from __future__ import annotations

import json
from pathlib import Path

from simulator.api.catalog import HardwareDbCatalog
from simulator.api.analyzer import ComplexityAnalyzer
from simulator.cli.main import main
from simulator.search.driver import SearchOptions

HF = Path(__file__).resolve().parents[1] / "workload" / "data" / "hf"


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_describe_json_counts_of_a_real_config(capsys):
    rc, out, _ = _run(capsys, "describe", "--model", str(HF / "deepseek-v3.json"), "--json")
    d = json.loads(out)
    assert rc == 0 and d["params_total"] == 671_026_404_352
    assert d["params_embedding"] == 2 * 129280 * 7168
    assert d["params_active"] < d["params_total"] and d["attention"].startswith("MLA")
    assert d["flops_per_token"] == 3 * d["forward_flops_per_token"]


def test_describe_text_and_bad_model(capsys):
    rc, out, _ = _run(capsys, "describe", "--model", "gemma2-9b")
    assert rc == 0 and "9,241,705,984" in out and "sliding window 4096" in out
    rc, _, err = _run(capsys, "describe", "--model", "no-such-model")
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_ledger_command_names_the_single_change(capsys, tmp_path):
    az = ComplexityAnalyzer(ledger=tmp_path / "led", catalog=HardwareDbCatalog(),
                            options=SearchOptions(workers=1, event_top=0, top_k=1))
    cfg = {"gpu": "h100-sxm", "n_gpus": 8, "global_batch": 32}
    az.predict_performance(cfg, model="small-6l-512")
    az.predict_performance({**cfg, "tp": 2})
    rc, out, _ = _run(capsys, "ledger", str(tmp_path / "led"))
    assert rc == 0 and "[single change] config.tp: 1 -> 2" in out
    assert "single changes that moved the step time" in out
    rc, out, _ = _run(capsys, "ledger", str(tmp_path / "led"), "--json")
    d = json.loads(out)
    assert d["comparisons"][0]["single_change"] == "config.tp"
    rc, _, err = _run(capsys, "ledger", str(tmp_path / "empty"))
    assert rc == 2 and "directory" in err
