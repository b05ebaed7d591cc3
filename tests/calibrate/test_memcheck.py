"""`complexity validate-memory`: the simulator's memory against PyTorch's MemTracker /
FSDPMemTracker under FakeTensorMode (CPU, nothing allocated)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from calibrate.memcheck import CASES, QUICK, case_plan
from calibrate.memcheck_report import PARTS, run_case, select
from simulator.cli.main import main


def test_the_suite_covers_the_configurations_the_issue_names():
    """>= 8 cases over fp32/bf16, flash/materialized, GQA/MHA, SwiGLU/GELU, micro-batch
    1-4, with and without checkpointing, FSDP2 over 8 ranks, a MoE layer."""
    assert len(CASES) >= 8
    assert {c.dtype for c in CASES} == {"fp32", "bf16"}
    assert {c.flash for c in CASES} == {True, False}
    assert {c.spec.n_kv_heads < c.spec.n_heads for c in CASES} == {True, False}
    assert {c.spec.mlp.value for c in CASES} >= {"swiglu", "gelu"}
    assert {1, 4} <= {c.micro_batch for c in CASES}
    assert {c.checkpoint for c in CASES} == {True, False}
    assert any(c.fsdp_ranks == 8 for c in CASES) and any(c.spec.moe for c in CASES)


def test_materialized_case_within_tolerance():
    row = run_case(select([QUICK[1]], False)[0])
    bad = {p: round(row.ratio(p), 4) for p in PARTS if not row.within(p)}
    assert not bad, bad
    assert row.measured["peak"] > 0 and row.measured["params"] > 0


def test_fsdp_case_uses_the_fsdp2_conventions():
    case = next(c for c in CASES if c.fsdp_ranks)
    plan = case_plan(case)
    assert plan.zero_stage == 3 and plan.dp == 8 and plan.memory.weights_fp32
    row = run_case(case)
    assert row.ok, {p: row.ratio(p) for p in PARTS}


def test_cli_json_and_report(tmp_path, capsys):
    rc = main(["validate-memory", "--case", QUICK[0], "--json", "--out-dir", str(tmp_path)])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and rows[0]["ok"] and set(rows[0]["ratio"]) == set(PARTS)
    assert (tmp_path / "report.md").read_text().startswith("# Memory validation")
    assert (tmp_path / "report.parquet").stat().st_size > 0


def test_unknown_case_is_one_line_exit_2(capsys):
    rc = main(["validate-memory", "--case", "nope", "--no-write"])
    err = capsys.readouterr().err
    assert rc == 2 and "case" in err and err.count("\n") == 1


@pytest.mark.slow
def test_every_case_within_tolerance(tmp_path, capsys):
    assert main(["validate-memory", "--out-dir", str(tmp_path)]) == 0
    assert "NO" not in capsys.readouterr().out
