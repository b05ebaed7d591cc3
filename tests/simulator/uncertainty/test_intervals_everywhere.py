"""Intervals where decisions are made: simulate, predict, report, search, plan, compare."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from simulator.api.catalog import HardwareDbCatalog
from simulator.cli.main import main
from simulator.planning.capacity import HardwareChoice, time_on
from simulator.search.driver import Objective, SearchOptions, make_context, search
from simulator.search.risk import pessimistic_tokens_per_s
from simulator.workload import resolve_model

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RUNS = REPO / "validation" / "published_runs.csv"
SIM = ["simulate", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "2",
       "--pp", "2", "--global-batch", "64", "--sequence-parallel"]
CAT = HardwareDbCatalog()
FIELDS = [f"{q}_{p}{u}" for q, u in (("step_time", "_s"), ("tokens_per_s_per_gpu", ""), ("mfu", ""))
          for p in ("p10", "p50", "p90")]


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_simulate_json_carries_p10_p50_p90(capsys):
    rc, out, _ = run(SIM + ["--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and all(k in d for k in FIELDS)
    for q, point in (("step_time", "step_time_s"), ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
                     ("mfu", "mfu")):
        u = "_s" if q == "step_time" else ""
        lo, mid, hi = (d[f"{q}_{p}{u}"] for p in ("p10", "p50", "p90"))
        assert lo < mid < hi
        assert mid == d[point]                       # the interval never shifts the point
    assert d["uncertainty"]["coefficient"]["n_simulations"] <= 24


def test_same_inputs_same_interval_bytes(capsys):
    outs = []
    for _ in range(2):
        _, out, _ = run(SIM + ["--json"], capsys)
        d = json.loads(out)
        outs.append(json.dumps({k: d[k] for k in FIELDS + ["uncertainty"]}, sort_keys=True))
    assert outs[0] == outs[1]


def test_a_gpu_no_row_validates_widens_the_interval_and_says_so(capsys):
    """b200 is a GPU family no published row has: the model-form part carries the learned
    GPU-family novelty, the JSON lists it and the table line names it."""
    b200 = ["simulate", "--model", "llama2-7b", "--gpu", "b200", "--gpus", "16", "--tp", "2",
            "--pp", "2", "--global-batch", "64", "--sequence-parallel",
            "--framework", "megatron-core"]
    _, out, _ = run(b200 + ["--json"], capsys)
    u = json.loads(out)["uncertainty"]
    assert list(u["unvalidated_novelty_var"]) == ["gpu=b200"]
    assert u["unvalidated_novelty_var"]["gpu=b200"] > 0
    _, out, _ = run(b200, capsys)
    assert "not validated: gpu=b200" in out
    _, out, _ = run(SIM + ["--json", "--framework", "megatron-core"], capsys)
    assert json.loads(out)["uncertainty"]["unvalidated_novelty_var"] == {}


def test_simulate_table_prints_the_interval_line(capsys):
    _, out, _ = run(SIM, capsys)
    assert re.search(r"step time [\d.]+ s \(80%: [\d.]+–[\d.]+ s\)", out)
    assert re.search(r"MFU [\d.]+ % \(80%: [\d.]+–[\d.]+ %\)", out)
    _, out, _ = run(SIM + ["--json", "--no-interval"], capsys)
    assert "step_time_p10_s" not in json.loads(out)


def _subset(tmp_path, prefixes) -> Path:
    rows = list(csv.DictReader(RUNS.open()))
    keep = [r for r in rows if r["id"].startswith(prefixes)]
    p = tmp_path / "sub.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    return p


def test_predict_writes_p10_p90_per_row(tmp_path, capsys):
    sub = _subset(tmp_path, ("korthikanti22_t5_22b", "nemo2407_h100_05", "mpt_foundry_14"))
    out = tmp_path / "o.csv"
    assert run(["predict", "--runs", str(sub), "--out", str(out), "--quiet"], capsys)[0] == 0
    got = list(csv.DictReader(out.open()))
    assert len(got) == 4
    for r in got:
        assert float(r["predicted_step_time_p10_s"]) < float(r["predicted_step_time_s"]) \
            < float(r["predicted_step_time_p90_s"])


def test_report_learns_checks_and_ships_the_table(tmp_path, capsys, monkeypatch):
    import simulator.cli.commands as commands
    shipped = tmp_path / "shipped" / "model_form.json"
    monkeypatch.setattr(commands, "SHIPPED_TABLE", shipped)
    sub = _subset(tmp_path, ("korthikanti22_t5_22b", "megatron_sc21_01", "megatron_sc21_02",
                             "nemo2407_h100_05", "nemo2407_h100_11", "mpt_foundry_04",
                             "mpt_foundry_14"))
    out = tmp_path / "rep"
    rc, stdout, _ = run(["report", "--runs", str(sub), "--out-dir", str(out),
                         "--ship-uncertainty"], capsys)
    assert rc == 0 and "leave one source out" in stdout
    table = json.loads((out / "uncertainty_table.json").read_text())
    assert table == json.loads(shipped.read_text())
    prov = table["provenance"]
    assert prov["rows"] == 8 and set(prov["sources"]) == {"korthikanti", "megatron", "nemo", "mpt"}
    assert prov["leave_one_source_out"]["rows"] == 8
    md = (out / "report.md").read_text()
    assert "## 80 % intervals: do they hold?" in md and "| nominal % |" in md
    for src in ("korthikanti", "megatron", "nemo", "mpt"):
        assert re.search(rf"\| {src} \| \d+ \| \d+ \| \d+ \| \d+ \|", md)
    # the novelty table: every feature, moe assumed (one value in these rows)
    assert "novelty variance" in md
    assert re.search(r"\| moe \| [\d.]+ \| [\d.]+ \| (assumed|nothing learned)", md)


def test_search_lists_intervals_and_ranks_risk_averse():
    model = resolve_model("llama2-7b", None)
    cluster = CAT.cluster(HardwareChoice("h100-sxm", 16))
    ctx = make_context(model, cluster, CAT.profile("h100-sxm"), 64)
    opts = SearchOptions(workers=1, event_top=2, top_k=4, objective=Objective.TIME_TO_TRAIN_P90)
    rep = search([ctx], opts)
    assert rep.ranked and all(r.step_time_interval is not None for r in rep.ranked)
    pess = [pessimistic_tokens_per_s(r.tokens_per_s, r.step_time_interval) for r in rep.ranked]
    assert pess == sorted(pess, reverse=True)
    d = rep.to_dict()
    assert all(p["step_time_p10_s"] < p["step_time_p50_s"] < p["step_time_p90_s"] for p in d["plans"])
    assert isinstance(d["indistinguishable_from_best"], list)


def test_plan_gives_time_and_cost_as_p10_p50_p90():
    model = resolve_model("llama2-7b", None)
    opts = SearchOptions(workers=1, event_top=1, top_k=1)
    est, _ = time_on(model, 1e11, HardwareChoice("h100-sxm", 16), 64, CAT, opts)
    d = est.to_dict()
    assert d["days_p50"] == pytest.approx(est.days)
    assert d["days_p10"] < d["days_p50"] < d["days_p90"]
    assert d["cost_usd_p10"] < d["cost_usd_p50"] < d["cost_usd_p90"]
    assert d["days_p90"] / d["days_p50"] == pytest.approx(d["cost_usd_p90"] / d["cost_usd_p50"])


def test_compare_says_which_options_it_cannot_tell_apart(capsys):
    rc, out, _ = run(["compare", "--model", "llama2-7b", "--tokens", "100B", "--gpu-list",
                      "h100-sxm,h200-sxm", "--gpus-list", "16", "--global-batch", "64",
                      "--workers", "1"], capsys)
    assert rc == 0 and "80% days" in out
    assert re.search(r"(not distinguishable from the fastest|fastest: .* distinguishable)", out)
