"""The budgeted GPU calibration plan: what it measures, that it fits the budget, that the
points it keeps are the informative ones, and the one-line refusals without a GPU."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.budget import (
    SAFETY,
    GpuPlan,
    candidate_points,
    make_plan,
    plan_lines,
    point_s,
    spread,
    target_for,
)
from simulator.cli.main import main as cli_main


@pytest.fixture(scope="module")
def h200x8():
    return target_for("h200-sxm", 8)


def test_spread_covers_the_ends_first_then_bisects():
    assert spread([1, 2, 3, 4, 5]) == [1, 5, 3, 2, 4]
    assert sorted(spread(list(range(14)))) == list(range(14))


def test_sweep_has_what_a_gpu_step_runs(h200x8):
    pts = candidate_points(h200x8)
    gemm = [p.p for p in pts if p.bench == "gemm"]
    assert {g["dtype"] for g in gemm} == {"bf16", "fp16", "tf32", "fp8"}
    assert {g["layout"] for g in gemm if g["dtype"] == "bf16"} == {"NT", "NN", "TN"}
    assert {g["layout"] for g in gemm if g["dtype"] == "fp8"} == {"NT"}    # _scaled_mm
    copies = [p.p["elems"] * 4 for p in pts if p.bench == "memory" and p.p["kernel"] == "copy"]
    assert max(copies) >= 2 ** 30                                   # HBM sweep reaches 1 GiB+
    att = [p.p for p in pts if p.bench == "attention" and p.p["backend"] == "flash"
           and p.p["dtype"] == "bf16"]
    assert {a["head_dim"] for a in att} == {64, 128} and max(a["seq"] for a in att) >= 8192
    coll = [p.p for p in pts if p.bench == "collectives"]
    assert min(c["size_bytes"] for c in coll) == 1024 and max(c["size_bytes"] for c in coll) == 2 ** 30
    assert {c["n_ranks"] for c in coll} == {8}
    assert any(c["algo"] == "ring" for c in coll)                  # NVLS node: ring sweep too
    assert len({p.key for p in pts}) == len(pts)


def test_one_gpu_plans_no_collectives():
    t = target_for("h200-sxm", 1)
    plan = make_plan(t, 300)
    assert not [p for p in plan.points if p.bench in ("collectives", "interference")]
    assert "skipped (1 GPU" in "\n".join(plan_lines(plan))


def test_budgeted_plan_fits_and_names_the_benchmarks(h200x8):
    plan = make_plan(h200x8, 300)
    assert plan.total_est_s <= 300
    text = "\n".join(plan_lines(plan))
    for name in ("gemm bf16", "gemm fp8", "hbm copy", "flash attention bf16", "nccl all_reduce"):
        assert name in text


def test_a_tight_budget_keeps_every_tier0_group_before_any_tier1(h200x8):
    full = make_plan(h200x8, None)
    tier0 = {p.key for p in full.points if p.tier == 0}
    plan = make_plan(h200x8, 75)
    assert plan.total_est_s <= 75 and plan.left_out
    assert tier0 <= {p.key for p in plan.points}                 # every tier-0 point kept
    assert all(p.tier > 0 for p in plan.left_out)
    one = make_plan(target_for("h200-sxm", 1), 12)               # tighter than tier 0
    kept = {p.group for p in one.points}
    assert {"gemm bf16", "gemm fp8", "hbm copy", "flash attention bf16"} <= kept
    assert any(p.tier == 0 for p in one.left_out)


def test_the_estimate_is_the_rooflines_of_the_timed_calls():
    # 1 ms calls, 0.1 ms flush: 3 warm-up + 20 repeats (0.25 s window holds more)
    per = 1e-3 + 1e-4 + 20e-6
    assert point_s(1e-3, 1e-4) == pytest.approx(0.05 + 23 * per)
    # a 100 ms call: warm-up + MIN_SAMPLES calls
    assert point_s(0.1, 0.0) == pytest.approx(0.05 + 8 * (0.1 + 20e-6))


def test_points_already_measured_are_free():
    t = target_for("h200-sxm", 1)
    small = make_plan(t, 15)
    done = {p.key for p in small.points}
    again = make_plan(t, 15, done=done)
    assert len(again.points) > len(small.points)          # the re-run goes further
    assert done <= {p.key for p in again.points}


@settings(max_examples=40, deadline=None)
@given(st.floats(10, 400), st.floats(0.5, 200), st.sampled_from([1, 2, 8]))
def test_more_budget_never_loses_a_tier0_point(budget, extra, gpus):
    t = target_for("h200-sxm", gpus)
    a, b = make_plan(t, budget), make_plan(t, budget + extra)
    tier0 = lambda plan: {p.key for p in plan.points if p.tier == 0}
    assert tier0(a) <= tier0(b)
    assert a.total_est_s <= SAFETY * budget + 1e-9
    assert b.total_est_s <= SAFETY * (budget + extra) + 1e-9


def test_the_nccl_spawn_is_taken_only_after_the_compute_tier0(h200x8):
    comm = ("collectives", "interference")
    compute = [p for p in candidate_points(h200x8) if p.bench not in comm]
    short = make_plan(h200x8, 48)             # the spawn does not fit: every compute point
    assert not [p for p in short.points if p.bench in comm]
    assert {p.key for p in short.points} == {p.key for p in compute}
    longer = make_plan(h200x8, 60)            # it fits: all of tier 0, collectives included
    tier0 = {p.key for p in candidate_points(h200x8) if p.tier == 0}
    assert tier0 <= {p.key for p in longer.points}
    assert any(p.bench == "collectives" for p in longer.points)


def test_plan_uses_safety_margin(h200x8):
    plan = make_plan(h200x8, 120)
    assert plan.total_est_s <= SAFETY * 120 + 1e-9
    assert isinstance(plan, GpuPlan)


# ---- CLI ---------------------------------------------------------------------------------------
def test_cli_dry_run_for_another_node(capsys, tmp_path):
    rc = cli_main(["calibrate", "--device", "cuda", "--dry-run", "--budget-s", "300",
                   "--gpu", "h200-sxm", "--gpus", "8", "--out", str(tmp_path / "none")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "8 x h200-sxm" in out and "of the 300 s budget" in out
    for name in ("gemm bf16", "gemm fp8", "hbm copy", "flash attention bf16", "nccl all_reduce"):
        assert name in out
    assert not (tmp_path / "none").exists()                       # a dry run writes nothing


def _cuda_here() -> bool:
    from calibrate.gpu_run import cuda_missing_reason
    return cuda_missing_reason() is None


@pytest.mark.skipif(_cuda_here(), reason="this host has a GPU")
@pytest.mark.parametrize("argv", [
    ["calibrate", "--device", "cuda"],
    ["calibrate", "--device", "cuda", "--dry-run"],
    ["validate-run", "--device", "cuda", "--model", "tiny-2l-128", "--profile", "reference"]])
def test_cuda_without_a_gpu_is_one_line_and_exit_2(argv, capsys, tmp_path):
    rc = cli_main([*argv, *(["--out", str(tmp_path)] if argv[0] == "calibrate" else [])])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "no CUDA GPU is visible" in err


@pytest.mark.parametrize("argv, field", [
    (["--device", "cpu", "--budget-s", "60"], "budget_s"),
    (["--device", "cpu", "--gpu", "h200-sxm"], "gpu"),
    (["--device", "cuda", "--dry-run", "--gpu", "h200-sxm", "--gpus", "0"], "gpus"),
    (["--device", "cuda", "--dry-run", "--gpu", "h200-sxm", "--gpus", "8", "--budget-s", "-5"],
     "budget_s"),
    (["--dry-run", "--gpu", "no-such-gpu", "--gpus", "8"], "gpu")])
def test_bad_gpu_options_are_one_line(argv, field, capsys, tmp_path):
    rc = cli_main(["calibrate", *argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and field in err
