"""`complexity doctor`: measured vs predicted per family, exposed communication named as the
largest gap when a run reduces its gradients after backward, JSON keys, Perfetto tracks,
one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.profile_io import write_profile
from calibrate.validate_run import plan_for, run_spec

from kineto_synth import Trace
from test_validate_run import cpu_profile

EXPOSED_US = 400_000.0      # a gradient all-reduce after backward, far longer than the compute


def ddp_no_overlap_trace(path: Path, exposed_us: float = EXPOSED_US, bwd_us: float = 280.0
                         ) -> Path:
    """Two ranks over gloo: forward and backward operators, then one all-reduce of every
    gradient that starts only after backward (the main thread blocks in it)."""
    tr = Trace(dist={"backend": "gloo", "rank": 0, "world_size": 2},
               meta={"model": "tiny-2l-128", "micro_batch": 2, "seq_len": 64, "nproc": 2,
                     "bucket_cap_mb": 1000})
    for i in range(1, 4):
        start = tr.t
        tr.leaf("aten::mm", 300.0, [(128, 128), (128, 384)], gap=10.0,
                wrappers=("aten::linear", "aten::matmul"))
        tr.leaf("aten::native_layer_norm", 50.0, [(128, 128), (), (128,)], gap=10.0)
        for _ in range(2):
            tr.leaf("aten::mm", bwd_us, [(384, 128), (128, 128)], gap=10.0,
                    wrappers=("autograd::engine::evaluate_function: MmBackward0",))
        t = tr.t + 5.0
        tr.x("c10d::allreduce_", t, exposed_us + 20.0, **{"Input Dims": [[[656000]], [], []]})
        tr.x("gloo:all_reduce", t + 10.0, exposed_us, tid=300,
             **{"Input Dims": [[656000]], "Input type": ["float"]})
        tr.t = t + exposed_us + 25.0
        tr.x("Optimizer.step#AdamW.step", tr.t, 40.0, cat="user_annotation")
        tr.x("aten::_fused_adamw_", tr.t + 2.0, 35.0, **{"Input Dims": [[656000]]})
        tr.t += 45.0
        tr.step(i, start, tr.t)
    return tr.write(path)


@pytest.fixture
def prof_path(tmp_path: Path) -> Path:
    p = tmp_path / "profile.json"
    write_profile(cpu_profile(1), p)
    return p


def test_exposed_gradient_allreduce_is_the_top_gap(tmp_path: Path, prof_path: Path):
    from calibrate.doctor import doctor
    from calibrate.validate_run import load_profile
    from simulator.hardware.specs import ClusterSpec
    trace = ddp_no_overlap_trace(tmp_path / "t.json")
    rs = run_spec("tiny-2l-128", 2, 2, 64, 1, 0, None, 1000)
    prof, _, _ = load_profile(prof_path, 1)
    cl = ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=2)
    d, tr, res, ops = doctor(trace, rs.model, plan_for(rs), prof, cl)
    top = d.gaps[0]
    assert top.what == "comm exposed"
    assert top.gap_s == pytest.approx(EXPOSED_US * 1e-6, rel=0.01)
    assert "micro-batch" in top.whatif and "all-reduce" in top.explanation   # cannot hide
    assert d.comm["measured_overlapped_s"] == 0.0
    assert d.measured_step_s > EXPOSED_US * 1e-6
    # the table accounts for the step: priced families + host + exposed comm (+ unpriced)
    rows = sum(r.measured_s for r in d.rows)
    assert rows == pytest.approx(d.measured_step_s, rel=1e-6)
    assert d.explained_fraction == pytest.approx(1.0, abs=1e-6)


def test_hideable_allreduce_asks_for_buckets(tmp_path: Path, prof_path: Path):
    """3 ms all-reduced after 20 ms of backward compute: overlap would hide all of it."""
    from calibrate.doctor import doctor
    from calibrate.validate_run import load_profile
    from simulator.hardware.specs import ClusterSpec
    trace = ddp_no_overlap_trace(tmp_path / "t.json", exposed_us=3000.0, bwd_us=10_000.0)
    rs = run_spec("tiny-2l-128", 2, 2, 64, 1, 0, None, 1000)
    prof, _, _ = load_profile(prof_path, 1)
    cl = ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=2)
    d, _, _, _ = doctor(trace, rs.model, plan_for(rs), prof, cl)
    comm = next(g for g in d.gaps if g.what == "comm exposed")
    assert comm.gap_s == pytest.approx(3e-3, rel=0.01) and "bucket_cap_mb=1" in comm.whatif
    assert d.comm["measured_overlap_possible_s"] == pytest.approx(3e-3, rel=0.01)


def test_cli_json_and_perfetto(tmp_path: Path, prof_path: Path, capsys):
    from simulator.cli.main import main
    trace = ddp_no_overlap_trace(tmp_path / "t.json.gz")
    pf = tmp_path / "side_by_side.json"
    rc = main(["doctor", "--trace", str(trace), "--profile", str(prof_path), "--json",
               "--perfetto", str(pf)])
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    for key in ("measured_step_s", "predicted_step_s", "explained_fraction", "gaps"):
        assert key in d
    assert d["gaps"][0]["what"] == "comm exposed" and d["gaps"][0]["whatif"]
    ev = json.loads(pf.read_text())["traceEvents"]
    procs = {e["args"]["name"].split(":")[0] for e in ev if e.get("name") == "process_name"}
    assert procs == {"measured", "simulated"}
    assert any(e.get("cat") == "gemm" and e["pid"] == 1 for e in ev)
    assert any(e.get("cat") == "gemm" and e["pid"] == 2 for e in ev)
    rc = main(["doctor", "--trace", str(trace), "--profile", str(prof_path)])
    table = capsys.readouterr().out
    assert rc == 0 and "largest gaps:" in table and "1. comm exposed" in table


def test_doctor_fits_its_own_profile_when_none_is_given(tmp_path: Path, capsys):
    from simulator.cli.main import main
    trace = ddp_no_overlap_trace(tmp_path / "t.json")
    rc = main(["doctor", "--trace", str(trace), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["gaps"][0]["what"] == "comm exposed"


def test_one_line_errors(tmp_path: Path, capsys):
    from simulator.cli.main import main
    rc = main(["doctor", "--trace", str(tmp_path / "nope.json"), "--model", "tiny-2l-128"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "trace" in err
    t = Trace()
    t.leaf("aten::mm", 5.0, [(4, 4), (4, 4)])
    p = t.write(tmp_path / "nomodel.json")
    rc = main(["doctor", "--trace", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--model" in err
    rc = main(["calibrate", "--from-trace", str(tmp_path / "nope.json"), "--out",
               str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1


def test_gpu_trace_device_idle_is_the_host_row(tmp_path: Path, capsys):
    """Kernels on stream 7 with a 500 us hole while the host dispatches: the doctor's host
    row is the device's idle time, streams are listed, the shipped H100 profile predicts."""
    from simulator.cli.main import main
    tr = Trace(gpu_name="NVIDIA H100 80GB HBM3")
    start = tr.t
    tr.leaf("aten::mm", 5.0, [(1024, 128), (128, 384)], kernel_us=200.0, dtype="c10::BFloat16")
    tr.t = max(tr.t, tr.gpu_t) + 500.0           # host busy, no kernel queued
    tr.leaf("aten::native_layer_norm", 5.0, [(1024, 128)], kernel_us=30.0,
            dtype="c10::BFloat16")
    tr.t = max(tr.t, tr.gpu_t) + 1.0
    tr.step(1, start, tr.t)
    p = tr.write(tmp_path / "g.json")
    rc = main(["doctor", "--trace", str(p), "--model", "tiny-2l-128", "--micro-batch", "8",
               "--seq-len", "128", "--precision", "bf16", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["streams_s"] == {"stream 7": pytest.approx(230e-6)}
    host = next(r for r in d["rows"] if r["what"] == "host")
    busy = 230e-6
    assert host["measured_s"] == pytest.approx(d["measured_step_s"] - busy)
    assert any(g["what"] == "host" and "GPU idle" in g["explanation"] for g in d["gaps"])


def test_synchronous_host_model_predicts_the_host_row(tmp_path: Path):
    """A CPU profile with a host model (``calibrate``'s host probe) prices the host's
    dispatch time on the compute stream: the doctor's predicted host row is the engine's
    ``Breakdown.host_s``, the per-op cost times the ops the step issues."""
    from dataclasses import replace

    from calibrate.doctor import doctor
    from calibrate.validate_run import load_profile
    from simulator.hardware.profile import Coefficient, HostModel
    from simulator.hardware.specs import ClusterSpec
    p = tmp_path / "host.json"
    host = HostModel(Coefficient(20.0, "us", "test"), Coefficient(30.0, "us", "test"),
                     synchronous=True)
    write_profile(replace(cpu_profile(1), host=host), p)
    trace = ddp_no_overlap_trace(tmp_path / "t.json")
    rs = run_spec("tiny-2l-128", 2, 2, 64, 1, 0, None, 1000)
    prof, _, _ = load_profile(p, 1)
    cl = ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=2)
    d, _, res, _ = doctor(trace, rs.model, plan_for(rs), prof, cl)
    row = next(r for r in d.rows if r.what == "host")
    assert res.breakdown.host_s > 0
    assert row.predicted_s == pytest.approx(res.breakdown.host_s, rel=1e-12)
