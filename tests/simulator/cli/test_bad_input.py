"""Every bad input gets one clear line (issue 15): the corpus in ``bad_input_corpus`` and
hypothesis properties over the same boundaries.

For every case: exit status 2, exactly one line on stderr, naming the field, no
traceback, no output file left behind (written or half-written). The CLI runs in-process
(``main(argv)``), so the whole suite takes seconds; flag and output-path cases never reach
the command (``_run`` is replaced by a function that fails the test if it is called).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from bad_input_corpus import (
    HF_BASE,
    ROW_BAD_CELLS,
    ROW_BAD_MEASURED,
    RUNS,
    Case,
    all_cases,
    flag_cases,
    subparsers,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.boundary.values import parse_float, parse_int
from simulator.cli import main as cli_main
from simulator.cli.checks import FLAG_BOUNDS, numeric_flags
from simulator.errors import ComplexityError, InvalidInputError

CASES = all_cases()


def _run_case(case: Case, tmp: Path, capsys, monkeypatch=None) -> tuple[int, str, str]:
    (tmp / "a-file").write_text("x")
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    if case.write is not None:
        argv += case.write(tmp)
    try:
        rc = cli_main.main(argv)
    except SystemExit as e:                 # argparse refused it (one line, see main.Parser)
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _assert_one_line(case: Case, rc: int, err: str, tmp: Path) -> None:
    lines = err.splitlines()
    assert rc == 2, (case.id, rc, err[-300:])
    assert len(lines) == 1, (case.id, err[-600:])
    assert "Traceback" not in err
    assert any(f in err for f in case.field.split("|")), (case.id, case.field, err)
    for rel in case.outputs:
        assert not (tmp / rel).exists(), (case.id, rel)
    leftovers = [p.name for p in tmp.iterdir() if p.name.endswith((".tmp", ".partial"))]
    assert not leftovers, (case.id, leftovers)


def test_the_corpus_is_big_enough_and_covers_every_category():
    cats = {c.category for c in CASES}
    assert cats >= {"flag", "output", "hf", "runs_file", "profile", "plan"}
    assert len(CASES) + len(ROW_BAD_CELLS) + len(ROW_BAD_MEASURED) >= 300
    assert len({c.id for c in CASES}) == len(CASES)


def test_every_numeric_flag_of_every_command_has_a_bound():
    """A flag added later without a range in ``checks.FLAG_BOUNDS`` fails here."""
    missing = sorted({(cmd, d) for cmd, p in subparsers().items() for d in numeric_flags(p)
                      if d not in FLAG_BOUNDS})
    assert not missing


@pytest.fixture
def never_runs(monkeypatch):
    """Flag and output checks happen before the command: running it is a failure."""
    def ran(args):
        raise AssertionError(f"{args.command} ran although its input is bad")
    monkeypatch.setattr(cli_main, "_run", ran)


@pytest.mark.parametrize("case", [c for c in CASES if c.category in ("flag", "output")],
                         ids=lambda c: c.id)
def test_bad_flag_or_output_path(case, tmp_path, capsys, never_runs):
    rc, _, err = _run_case(case, tmp_path, capsys)
    _assert_one_line(case, rc, err, tmp_path)


@pytest.mark.parametrize("case", [c for c in CASES if c.category not in ("flag", "output")],
                         ids=lambda c: f"{c.category}: {c.id}")
def test_bad_file_or_plan(case, tmp_path, capsys):
    rc, _, err = _run_case(case, tmp_path, capsys)
    _assert_one_line(case, rc, err, tmp_path)


# ---- rows are independent ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def predicted_rows(tmp_path_factory):
    """One predict run over two good rows and one row per bad cell."""
    tmp = tmp_path_factory.mktemp("rows")
    with open(RUNS) as f:
        rows = list(csv.DictReader(f))
    good = [dict(rows[0], id="good_0"), dict(rows[1], id="good_1")]
    bad = [dict(rows[0], id=f"bad_{i}", **{col: v}) for i, (col, v) in enumerate(ROW_BAD_CELLS)]
    meas = [dict(rows[0], id=f"meas_{i}", measured_step_time_s=v)
            for i, v in enumerate(ROW_BAD_MEASURED)]
    src = tmp / "runs.csv"
    with src.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([good[0], *bad, *meas, good[1]])
    with src.open("a") as f:              # ragged rows: too few and too many cells
        f.write("short_row,x\n")
        f.write(",".join(["long_row"] + ["1"] * (len(rows[0]) + 3)) + "\n")
    out = tmp / "out.csv"
    assert cli_main.main(["predict", "--runs", str(src), "--out", str(out), "--quiet"]) == 0
    return {r["id"]: r for r in csv.DictReader(out.open())}, len(bad) + len(meas) + 4


def test_good_rows_are_predicted_whatever_the_other_rows(predicted_rows):
    got, n = predicted_rows
    assert len(got) == n
    for rid in ("good_0", "good_1"):
        assert got[rid]["status"] == "ok" and float(got[rid]["predicted_step_time_s"]) > 0
        assert got[rid]["error_pct"] != ""


@pytest.mark.parametrize("i, col, value", [(i, c, v) for i, (c, v) in enumerate(ROW_BAD_CELLS)])
def test_a_bad_cell_marks_only_its_row_invalid_naming_the_column(predicted_rows, i, col, value):
    got, _ = predicted_rows
    status = got[f"bad_{i}"]["status"]
    assert status.startswith("invalid: "), status
    # the column itself, or the plan field it feeds (gpu key -> gpu, tp -> tp or dp)
    named = status.split(":")[1].strip()
    assert named == col or (col in ("tp", "pp", "cp", "n_gpus", "micro_batch", "global_batch",
                                    "moe_experts", "moe_topk", "vpp")
                            and named in ("dp", "tp", "pp", "cp", "ep", "global_batch",
                                          "moe_topk", "moe_experts", "vpp")), (col, status)
    assert got[f"bad_{i}"]["error_pct"] == ""


@pytest.mark.parametrize("i, value", list(enumerate(ROW_BAD_MEASURED)))
def test_a_bad_measured_value_is_predicted_but_has_no_error(predicted_rows, i, value):
    row = predicted_rows[0][f"meas_{i}"]
    assert row["status"].startswith("invalid: measured_step_time_s")
    assert row["error_pct"] == "" and float(row["predicted_step_time_s"]) > 0


def test_ragged_rows_are_invalid_rows_not_a_lost_file(predicted_rows):
    got, _ = predicted_rows
    assert got["short_row"]["status"].startswith("invalid: row")
    assert got["long_row"]["status"].startswith("invalid: row")


def test_interrupted_predict_with_bad_rows_resumes_without_losing_or_duplicating(
        tmp_path, monkeypatch, capsys):
    from simulator.validation import predict as predict_mod
    with open(RUNS) as f:
        rows = list(csv.DictReader(f))[:4]
    rows[1] = dict(rows[1], tp="abc")
    src, out = tmp_path / "runs.csv", tmp_path / "out.csv"
    with src.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    real, calls = predict_mod._predict, {"n": 0}

    def stop_at_third(row, *a):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(row, *a)
    monkeypatch.setattr(predict_mod, "_predict", stop_at_third)
    assert cli_main.main(["predict", "--runs", str(src), "--out", str(out), "--quiet"]) == 130
    assert not out.exists()
    monkeypatch.setattr(predict_mod, "_predict", real)
    assert cli_main.main(["predict", "--runs", str(src), "--out", str(out), "--quiet"]) == 0
    ids = [r["id"] for r in csv.DictReader(out.open())]
    assert ids == [r["id"] for r in rows]
    capsys.readouterr()


# ---- internal errors: one line, exit 1, --debug shows the traceback ----------------------------
def test_an_internal_error_is_one_line_exit_1_and_debug_shows_the_traceback(monkeypatch, capsys):
    def boom(args):
        raise TypeError("a bug")
    monkeypatch.setattr(cli_main, "_run", boom)
    assert cli_main.main(["describe", "--model", "llama2-7b"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "internal error: TypeError: a bug" in err
    assert "--debug" in err and "report" in err and "Traceback" not in err
    assert cli_main.main(["describe", "--model", "llama2-7b", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("complexity describe: internal")


def test_a_plain_value_error_is_a_bug_but_a_bad_json_file_is_bad_input(monkeypatch, capsys,
                                                                         tmp_path):
    """A ValueError from our own code (a math domain error, a bad unpack) is a bug: exit 1,
    "internal error". A file that is not JSON is the user's: exit 2."""
    def boom(args):
        raise ValueError("math domain error")
    monkeypatch.setattr(cli_main, "_run", boom)
    assert cli_main.main(["describe", "--model", "llama2-7b"]) == 1
    assert "internal error: ValueError" in capsys.readouterr().err
    monkeypatch.undo()
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert cli_main.main(["describe", "--model", str(bad)]) == 2
    assert "internal" not in capsys.readouterr().err


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main(["simulate", "--gpu", "h100-sxm"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--gpus" in err


# ---- properties --------------------------------------------------------------------------------
_FLAGS = sorted({(c.argv[0], c.argv[-2]) for c in flag_cases()})
_BASE = {c.argv[0]: c.argv[1:-2] for c in flag_cases()}
_DEST = {a.option_strings[0]: a for p in subparsers().values() for a in p._actions
         if a.option_strings}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(_FLAGS), st.one_of(st.integers(min_value=-10**15, max_value=10**15),
                                          st.floats(allow_nan=True, allow_infinity=True)))
def test_property_any_out_of_range_flag_value_is_refused_before_the_command(pair, value):
    cmd, flag = pair
    a = _DEST[flag]
    lo, hi, lo_open = FLAG_BOUNDS[a.dest]
    v = float(value)
    in_range = math.isfinite(v) and lo <= v <= hi and not (lo_open and v == lo)
    if in_range or (a.type is int and isinstance(value, float)):
        return                                  # only out-of-range numbers of the right type
    text = str(value)
    import contextlib
    import io
    err = io.StringIO()
    ran = []
    real = cli_main._run
    cli_main._run = lambda args: ran.append(args) or 0
    try:
        with contextlib.redirect_stderr(err):
            try:
                rc = cli_main.main([cmd, *_BASE[cmd], flag, text])
            except SystemExit as e:
                rc = e.code
    finally:
        cli_main._run = real
    assert rc == 2 and not ran and len(err.getvalue().splitlines()) == 1
    assert a.dest in err.getvalue() or flag in err.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.integers(min_value=-5, max_value=5),
       st.integers(min_value=0, max_value=10**6))
def test_property_parse_int_returns_in_range_or_names_the_field(text, lo, span):
    try:
        v = parse_int("f", text, lo, lo + span)
    except InvalidInputError as e:
        assert e.field == "f"
    else:
        assert isinstance(v, int) and lo <= v <= lo + span


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_property_parse_float_is_finite_or_names_the_field(text):
    try:
        v = parse_float("f", text, 0.0, lo_open=True)
    except InvalidInputError as e:
        assert e.field == "f"
    else:
        assert math.isfinite(v) and v > 0


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12)
                     | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                         max_size=3),
                     max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(__import__("simulator.workload.hf_schema",
                                         fromlist=["INT_KEYS"]).INT_KEYS)
                       + ["tie_word_embeddings", "mlp_only_layers", "rope_scaling",
                          "text_config", "model_type", "hidden_act", "layer_types"]), _JSON)
def test_property_any_value_at_any_config_key_is_a_spec_or_a_typed_error(key, value):
    from simulator.workload.hf import from_hf_config
    try:
        spec = from_hf_config({**HF_BASE, key: value})
    except ComplexityError:
        return
    assert spec.n_layers >= 1 and spec.hidden >= 1 and spec.head_dim >= 1


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["n_gpus", "tp", "pp", "dp", "global_batch", "gpu",
                                        "n_layers", "hidden", "nic_gbps", "vpp", "zero_stage",
                                        "seq_len", "moe_experts"]),
                       st.text(max_size=12), max_size=5))
def test_property_a_row_with_any_cells_is_checked_without_an_untyped_error(cells):
    from simulator.validation.runs_schema import check_row
    with open(RUNS) as f:
        row = dict(next(csv.DictReader(f)), **cells)
    try:
        check_row(row)
    except InvalidInputError as e:
        assert e.field in cells or e.field == "row"


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**6)
       | st.booleans() | st.text(max_size=4))
def test_property_a_profile_efficiency_outside_0_1_is_refused_naming_it(tmp_path_factory, v):
    import hardware_db
    from simulator.hardware.profile import Profile
    d = hardware_db.load_profile("h100-sxm").to_dict()
    d["gemm"]["eff_max"]["bf16"]["value"] = v
    p = tmp_path_factory.mktemp("prof") / "p.json"
    p.write_text(json.dumps(d))          # NaN / Infinity are written, and refused on reading
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        and 0 < v <= 1
    try:
        Profile.read_json(p)
    except ComplexityError as e:
        assert not ok and ("profile" in str(e))
    else:
        assert ok


# ---- --module factories ------------------------------------------------------------------------
_FACTORIES = "def bad():\n    return 5\ndef boom():\n    raise RuntimeError('x')\n" \
             "def pair():\n    return (1, 2)\n"


@pytest.mark.parametrize("spec", ["zoo:nope", "/no/such/file.py:f", "nocolon", "fac:bad",
                                  "fac:boom", "fac:pair"])
def test_a_bad_module_factory_is_one_line_naming_module(spec, tmp_path, capsys):
    pytest.importorskip("torch")
    from bad_input_corpus import ZOO
    fac = tmp_path / "fac.py"
    fac.write_text(_FACTORIES)
    spec = spec.replace("zoo", ZOO.rsplit(":", 1)[0]).replace("fac:", f"{fac}:")
    rc = cli_main.main(["simulate", "--module", spec, "--gpu", "h100-sxm", "--gpus", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "module" in err and "Traceback" not in err
