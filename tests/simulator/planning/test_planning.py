"""Capacity planning, hardware comparison, scaling, bottlenecks, what-if, analyzer, plots."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator.api.analyzer import (
    ComplexityAnalyzer,
    ExperimentLedger,
    model_flops_per_token,
)
from simulator.api.catalog import HardwareDbCatalog
from simulator.cli.main import main
from simulator.engine.simulate import simulate
from simulator.errors import InvalidInputError
from simulator.parallel.plan import Plan
from simulator.planning.capacity import (
    DEFAULT_PUE,
    HardwareChoice,
    LimitingResource,
    compare,
    gpus_for_deadline,
    time_on,
    training_estimate,
    window_plan,
)
from simulator.planning.scaling import (
    EfficiencyClass,
    ScalingKind,
    amdahl_speedup,
    efficiency_class,
    fit_serial_fraction,
    scaling_curve,
)
from simulator.planning.whatif import (
    RooflineClass,
    bottleneck_report,
    rank_knobs,
    sensitivity,
)
from simulator.search.driver import SearchOptions
from simulator.workload import resolve_model

CAT = HardwareDbCatalog()
OPTS = SearchOptions(workers=1, event_top=1, top_k=2)
SMALL = resolve_model("small-6l-512")
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


# ---- arithmetic ----------------------------------------------------------------------------
def test_training_estimate_arithmetic_is_exact():
    e = training_estimate(tokens=1e12, tokens_per_s=2.5e6, n_gpus=1024, gpu="h100-sxm",
                          tdp_w=700.0, price_usd_per_gpu_hour=3.0, pue=1.25)
    seconds = 1e12 / 2.5e6
    assert e.seconds == seconds and e.hours == seconds / 3600 and e.days == seconds / 86400
    assert e.gpu_hours == 1024 * seconds / 3600
    assert e.cost_usd == e.gpu_hours * 3.0
    assert e.energy_mwh == 1024 * 700.0 * (seconds / 3600) * 1.25 / 1e6
    free = training_estimate(1e9, 1e5, 8, "x", 300.0, 0.0)
    assert free.cost_usd is None and free.pue == DEFAULT_PUE
    for bad in ({"pue": 0.9}, {"tokens": 0}, {"tokens_per_s": -1.0}):
        kw = {**dict(tokens=1e9, tokens_per_s=1e5, n_gpus=8, gpu="x", tdp_w=300.0,
                     price_usd_per_gpu_hour=1.0), **bad}
        with pytest.raises(InvalidInputError):
            training_estimate(**kw)


def test_time_on_uses_the_best_plan_and_hardware_price():
    est, rep = time_on(SMALL, 1e11, HardwareChoice("h100-sxm", 16), 64, CAT, OPTS)
    w = rep.winner
    assert est.tokens_per_s == w.tokens_per_s
    assert est.seconds == 1e11 / w.tokens_per_s
    assert est.cost_usd == pytest.approx(16 * est.seconds / 3600 * 3.0, rel=1e-12)   # $3/GPU-h
    assert est.energy_mwh == pytest.approx(16 * 700 * est.seconds / 3600 * DEFAULT_PUE / 1e6, rel=1e-12)
    over, _ = time_on(SMALL, 1e11, HardwareChoice("h100-sxm", 16), 64, CAT, OPTS, price=1.5)
    assert over.cost_usd == pytest.approx(est.cost_usd / 2, rel=1e-12)


def test_gpus_for_deadline_meets_it_and_smaller_misses():
    tokens = 5e12
    ans = gpus_for_deadline(SMALL, tokens, 2 * 86400, "h100-sxm", 256, CAT, OPTS, 8, max_gpus=256)
    assert ans.estimate is not None
    n = ans.estimate.n_gpus
    assert ans.estimate.seconds <= 2 * 86400
    smaller = [d for k, d in ans.tried if k < n]
    assert smaller and all(d is None or d > 2 for d in smaller)
    never = gpus_for_deadline(SMALL, 1e20, 86400, "h100-sxm", 256, CAT, OPTS, 8, max_gpus=16)
    assert never.estimate is None


def test_short_window_counts_whole_steps():
    ans = window_plan(SMALL, 600.0, HardwareChoice("h100-sxm", 32), [32, 64, 128], CAT, OPTS)
    b = ans.best
    assert ans.steps == math.floor(600.0 / b.step_time_s)
    assert ans.tokens == ans.steps * b.plan.global_batch * SMALL.seq_len
    assert ans.tokens == max(t for _, t in ans.by_batch)


def test_compare_rows_have_arithmetic_and_limits():
    choices = [HardwareChoice(g, 16) for g in ("h100-sxm", "h200-sxm", "v100-sxm-32gb")]
    rows = compare(SMALL, 1e11, choices, 64, CAT, OPTS, prices={"h200-sxm": 10.0})
    by = {r.choice.gpu: r for r in rows}
    for r in rows:
        e = r.estimate
        assert e.seconds == 1e11 / e.tokens_per_s
        assert e.gpu_hours == 16 * e.seconds / 3600
        assert isinstance(r.limiting, LimitingResource)
    assert by["h200-sxm"].estimate.cost_usd == pytest.approx(by["h200-sxm"].estimate.gpu_hours * 10.0)
    assert by["h100-sxm"].estimate.cost_usd == pytest.approx(by["h100-sxm"].estimate.gpu_hours * 3.0)
    assert by["v100-sxm-32gb"].estimate.cost_usd is None and "price" in by["v100-sxm-32gb"].note


def test_compare_nic_bandwidth_shapes():
    rows = compare(SMALL, 1e11, [HardwareChoice("h100-sxm", 64, nic) for nic in (100.0, 800.0)],
                   256, CAT, OPTS)
    slow, fast = (r.estimate.tokens_per_s for r in rows)
    assert fast >= slow


# ---- scaling -------------------------------------------------------------------------------
def test_efficiency_classes_and_amdahl_fit():
    assert efficiency_class(0.85) == EfficiencyClass.GOOD
    assert efficiency_class(0.7) == EfficiencyClass.ACCEPTABLE
    assert efficiency_class(0.69) == EfficiencyClass.POOR
    ps = [1, 2, 4, 8, 16]
    f = fit_serial_fraction(ps, [amdahl_speedup(p, 0.05) for p in ps])
    assert f == pytest.approx(0.05, abs=1e-6)
    assert fit_serial_fraction([1], [1.0]) is None


def test_strong_and_weak_scaling_curves():
    strong = scaling_curve(SMALL, "h100-sxm", [8, 16, 32], 256, ScalingKind.STRONG, CAT, OPTS)
    p0 = strong.points[0]
    assert p0.efficiency == pytest.approx(1.0) and p0.speedup == pytest.approx(1.0)
    for p in strong.points:
        assert p.efficiency == pytest.approx(p.speedup / (p.n_gpus / 8))
        assert p.efficiency_class == efficiency_class(p.efficiency)
    assert strong.serial_fraction is not None and 0 <= strong.serial_fraction <= 1
    weak = scaling_curve(SMALL, "h100-sxm", [8, 16], 64, ScalingKind.WEAK, CAT, OPTS)
    assert [p.global_batch for p in weak.points] == [64, 128]
    w1 = weak.points[1]
    assert w1.efficiency == pytest.approx(w1.tokens_per_s_per_gpu / weak.points[0].tokens_per_s_per_gpu)


# ---- bottlenecks and what-if ---------------------------------------------------------------
def _llama_plan():
    m = resolve_model("llama2-7b")
    cluster = CAT.cluster(HardwareChoice("h100-sxm", 16))
    plan = Plan(tp=2, dp=8, micro_batch=1, global_batch=64, sequence_parallel=True)
    return m, cluster, CAT.profile(cluster.gpu.key), plan


def test_bottleneck_report_roofline():
    m, cluster, prof, plan = _llama_plan()
    rep = bottleneck_report(m, plan, cluster, prof)
    assert rep.ridge_flop_per_byte == pytest.approx(
        cluster.gpu.peak("bf16") * 1e12 / (cluster.gpu.mem_bw_gbytes_per_s * 1e9))
    by = {(o.name, o.phase): o for o in rep.ops}
    assert by[("mlp_fc1", "forward")].roofline == RooflineClass.COMPUTE_BOUND
    assert by[("ln1", "forward")].roofline == RooflineClass.MEMORY_BOUND
    assert any(o.roofline == RooflineClass.COMMUNICATION for o in rep.ops)
    for o in rep.ops:
        if o.flops:
            assert o.intensity_flop_per_byte == pytest.approx(o.flops / o.bytes_moved)
    res = simulate(m, plan, cluster, prof, engine="analytic")
    assert rep.step_time_s == res.step_time_s and rep.bubble_s == res.breakdown.bubble_s


def test_sensitivity_one_variable_at_a_time():
    m, cluster, prof, plan = _llama_plan()

    def rebuild(gbps, nics):
        return CAT.cluster(HardwareChoice("h100-sxm", 16, gbps, nics))
    rows = sensitivity(m, plan, cluster, prof, rebuild)
    base = rows[0]
    assert base.knob == "baseline" and base.throughput_change_pct == 0.0
    knobs = {r.knob for r in rows}
    assert {"micro_batch", "recompute", "precision", "nic_bandwidth", "nic_count"} <= knobs
    for r in rows[1:]:
        if r.step_time_s is not None:
            assert r.throughput_change_pct == pytest.approx(100 * (base.step_time_s / r.step_time_s - 1))
    full = next(r for r in rows if r.change == "none -> full")
    assert full.throughput_change_pct < 0            # recompute costs time
    ranked = rank_knobs(rows)
    assert [r.throughput_change_pct for r in ranked] == sorted((r.throughput_change_pct for r in ranked),
                                                                reverse=True)


# ---- analyzer and ledger -------------------------------------------------------------------
def test_analyzer_calls_are_logged(tmp_path):
    az = ComplexityAnalyzer(ledger=tmp_path / "ledger", catalog=CAT, options=OPTS)
    a = az.analyze_model("gpt2-124m", {"gpu": "h100-sxm", "micro_batch": 1})
    m = resolve_model("gpt2-124m")
    six_n = 6 * m.total_params()
    assert six_n < a.flops_per_token < 1.5 * six_n      # 6N plus attention
    best = az.auto_tune({"gpu": "h100-sxm", "n_gpus": 16}, model="small-6l-512", global_batch=64)
    assert best.n_gpus == 16 and best.global_batch == 64
    pred = az.predict_performance({"model": "small-6l-512", "gpu": "h100-sxm", "n_gpus": 16,
                                   "global_batch": 64, "tp": 2})
    assert pred.step_time_s > 0 and pred.config.dp == 8
    rows = ExperimentLedger(tmp_path / "ledger").read()
    assert [r["method"] for r in rows] == ["analyze_model", "auto_tune", "predict_performance"]
    assert json.loads(rows[2]["inputs_json"])["config"]["tp"] == 2
    assert rows[2]["step_time_s"] == pytest.approx(pred.step_time_s)
    assert model_flops_per_token(m) == a.flops_per_token


# ---- CLI + pictures ------------------------------------------------------------------------
def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_plan_json_and_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")          # the PNG needs the optional plot extra
    png = tmp_path / "plan.png"
    rc, out, _ = _run(capsys, "plan", "--model", "small-6l-512", "--gpu", "h100-sxm",
                      "--tokens", "100B", "--gpus", "16", "--global-batch", "64", "--price", "2",
                      "--pue", "1.1", "--workers", "1", "--json", "--plot", str(png))
    assert rc == 0 and png.stat().st_size > 1000
    e = json.loads(out)["time_on_gpus"]
    assert e["seconds"] == pytest.approx(100e9 / e["tokens_per_s"], rel=1e-12)
    assert e["cost_usd"] == pytest.approx(e["gpu_hours"] * 2.0, rel=1e-12)
    assert e["energy_mwh"] == pytest.approx(16 * 700 * e["hours"] * 1.1 / 1e6, rel=1e-12)


def test_cli_plan_window(capsys):
    rc, out, _ = _run(capsys, "plan", "--model", "small-6l-512", "--gpu", "h100-sxm",
                      "--gpus", "32", "--window-min", "10", "--global-batch", "64,128",
                      "--workers", "1", "--json")
    assert rc == 0
    w = json.loads(out)["window"]
    assert w["tokens"] == w["steps"] * w["plan"]["global_batch"] * 512


def test_cli_compare_table_and_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")          # the PNG needs the optional plot extra
    png = tmp_path / "compare.png"
    rc, out, _ = _run(capsys, "compare", "--model", "small-6l-512", "--tokens", "1e11",
                      "--gpu-list", "h100-sxm,h200-sxm", "--gpus-list", "16",
                      "--nic-gbps", "400,800", "--global-batch", "64", "--workers", "1",
                      "--plot", str(png))
    assert rc == 0 and png.stat().st_size > 1000
    assert out.count("x h100-sxm@") == 0 and "16xh100-sxm@400G" in out and "16xh200-sxm@800G" in out


def test_cli_scaling_whatif_bottleneck(capsys, tmp_path):
    pytest.importorskip("matplotlib")          # the PNG needs the optional plot extra
    rc, out, _ = _run(capsys, "scaling", "--model", "small-6l-512", "--gpu", "h100-sxm",
                      "--gpus", "8..32", "--global-batch", "64", "--workers", "1", "--json",
                      "--plot", str(tmp_path / "s.png"))
    assert rc == 0 and {c["kind"] for c in json.loads(out)["curves"]} == {"strong", "weak"}
    rc, out, _ = _run(capsys, "whatif", "--model", "small-6l-512", "--gpu", "h100-sxm",
                      "--gpus", "16", "--global-batch", "64", "--workers", "1")
    assert rc == 0 and "nic_bandwidth" in out
    rc, out, _ = _run(capsys, "bottleneck", "--model", "llama2-7b", "--gpu", "h100-sxm",
                      "--gpus", "16", "--global-batch", "64", "--tp", "2", "--workers", "1",
                      "--plot", str(tmp_path / "roof.png"))
    assert rc == 0 and "compute-bound" in out and (tmp_path / "roof.png").is_file()


def test_cli_plan_bad_input(capsys):
    rc, out, err = _run(capsys, "plan", "--model", "small-6l-512", "--gpu", "h100-sxm",
                        "--tokens", "abc", "--gpus", "16")
    assert rc == 2 and "tokens" in err and len(err.strip().splitlines()) == 1


# ---- BLOOM topology ranking ----------------------------------------------------------------
def test_bloom_topology_rank_script():
    runs = ROOT.parent / "shared" / "validation" / "published_runs.csv"
    if not runs.is_file():
        pytest.skip("shared/validation/published_runs.csv not present")
    import importlib.util
    spec = importlib.util.spec_from_file_location("bloom_rank", ROOT / "benchmarks" / "bloom_topology_rank.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.rank_agreement(runs)
    assert res["n"] == 6 and -1.0 <= res["kendall_tau"] <= 1.0
