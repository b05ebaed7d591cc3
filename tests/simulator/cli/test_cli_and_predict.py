"""The `complexity` command: simulate, predict, report, and one-line errors."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli.main import main

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RUNS = REPO / "validation" / "published_runs.csv"
SIM = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "64",
       "--tp", "8", "--pp", "8", "--micro-batch", "1", "--global-batch", "64"]


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_simulate_json_has_the_documented_keys(capsys):
    rc, out, _ = run(SIM + ["--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    for key in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_bytes",
                "breakdown", "sim_wall_s"):
        assert key in d
    assert len(d["peak_memory_bytes"]) == 8          # one per pipeline stage
    assert 0 < d["mfu"] < 1 and d["step_time_s"] > 0


def test_simulate_table_and_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    rc, out, _ = run(SIM + ["--recompute", "full", "--trace", str(trace)], capsys)
    assert rc == 0 and "step time" in out and "MFU" in out
    t = json.loads(trace.read_text())
    xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)
    assert {e["pid"] for e in xs} == set(range(8))       # one process per stage


@pytest.mark.parametrize("args, needle", [
    (["--model", "nope"], "model"),
    (["--gpu", "tpu-v9"], "gpu"),
    (["--tp", "7"], "tp"),
    (["--global-batch", "63", "--micro-batch", "2"], "global_batch"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    argv = list(SIM)
    for i in range(0, len(args), 2):
        argv[argv.index(args[i]) + 1] = args[i + 1]
    rc, out, err = run(argv, capsys)
    assert rc == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_host_flags(tmp_path, capsys):
    """--host-mode / --host-mechanisms reach the plan; a host-bound small model shows the
    host in the breakdown, and a bad name is a one-line error naming the field."""
    small = ["simulate", "--model", "tiny-2l-128", "--gpu", "h100-sxm", "--gpus", "1",
             "--micro-batch", "1", "--global-batch", "2", "--json"]
    rc, out, _ = run(small, capsys)
    eager = json.loads(out)
    assert rc == 0 and eager["breakdown"]["host_s"] > 0.5 * eager["step_time_s"]
    rc, out, _ = run(small + ["--host-mode", "cuda_graphs"], capsys)
    assert rc == 0 and json.loads(out)["step_time_s"] < eager["step_time_s"]
    trace = tmp_path / "t.json"
    rc, _, _ = run(small + ["--trace", str(trace)], capsys)
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    assert rc == 0 and any(n.startswith("host F") for n in names)
    for bad, field in ((["--host-mode", "warp"], "host_mode"),
                       (["--host-mechanisms", "magic"], "host_mechanisms")):
        rc, _, err = run(small + bad, capsys)
        assert rc == 2 and field in err and err.count("\n") == 1


def test_missing_profile_file_is_one_line(capsys):
    rc, _, err = run(SIM + ["--profile", "/nonexistent/profile.json"], capsys)
    assert rc == 2 and "profile" in err and err.count("\n") == 1


def test_profile_of_another_schema_version_is_refused(tmp_path, capsys):
    import hardware_db
    d = hardware_db.load_profile("a100-sxm-80gb").to_dict()
    d["schema_version"] = 999
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    rc, _, err = run(SIM + ["--profile", str(f)], capsys)
    assert rc == 2 and "schema_version" in err


def test_predict_writes_rows_plus_columns(tmp_path, capsys):
    rows = list(csv.DictReader(RUNS.open()))
    sub = tmp_path / "sub.csv"
    keep = [r for r in rows if r["id"].startswith(("korthikanti22_t5_22b", "nemo2407_h100_05",
                                                    "mpt_foundry_14"))]
    with sub.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "out.csv"
    rc, stdout, _ = run(["predict", "--runs", str(sub), "--out", str(out)], capsys)
    assert rc == 0 and "MAPE" in stdout
    got = list(csv.DictReader(out.open()))
    assert len(got) == len(keep)
    for r in got:
        assert r["status"] == "ok"
        for col in ("predicted_step_time_s", "predicted_tokens_per_s_per_gpu", "error_pct", "chosen"):
            assert col in r
        assert abs(float(r["error_pct"])) < 50


def test_predict_marks_unmodellable_rows_instead_of_crashing(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    rows = list(csv.DictReader(RUNS.open()))
    r = dict(rows[0], id="bad_gpu", gpu="tpu-v9")
    r2 = dict(rows[0], id="bad_tp", tp="5")
    with bad.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([r, r2])
    out = tmp_path / "o.csv"
    rc, _, _ = run(["predict", "--runs", str(bad), "--out", str(out)], capsys)
    assert rc == 0
    statuses = [x["status"] for x in csv.DictReader(out.open())]
    assert all(s.startswith(("unsupported:", "infeasible:")) for s in statuses)


def test_core_imports_without_torch_hardware_db_or_calibrate():
    """The simulator core must not import torch, pynvml, hardware_db or calibrate."""
    code = ("import sys; import simulator.engine.simulate, simulator.validation.predict, simulator.workload; "
            "bad = [m for m in ('torch', 'pynvml', 'hardware_db', 'calibrate') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_direction_in_source():
    """Walk the simulator's imports (ast): only CLI modules may import hardware_db; nothing
    imports calibrate; torch / pynvml only inside functions (lazily)."""
    import ast
    for path in (REPO / "simulator").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:                      # module level only
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                root = name.split(".")[0]
                assert root not in ("calibrate", "torch", "pynvml"), (path, name)
                if root == "hardware_db":
                    assert path.name.startswith("cli"), (path, name)
