"""The trace loop on real traces recorded here: `validate-run --trace-out` records the
training step (1 process; 2 gloo processes in the slow tests), the import maps its operators,
`calibrate --from-trace` fits a profile from it, and that profile predicts another shape
whose step validate-run measures (held-out error printed). Shapes are tiny so the default
suite stays fast; the loop's bound is a loose guard against breakage, checked only when
both runs were clean (the host is shared); the accuracy is measured in
validation/cpu_trace_loop.md."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from calibrate.profile_io import write_profile

from test_validate_run import cpu_profile

pytestmark = pytest.mark.torch


@pytest.fixture
def prof_path(tmp_path: Path) -> Path:
    p = tmp_path / "profile.json"
    write_profile(cpu_profile(None), p)
    return p


def record(tmp_path: Path, prof_path: Path, model: str, nproc: int, mb: int, seq: int,
           name: str, wait_quiet_s: float = 0.0, **kw):
    pytest.importorskip("torch")
    from calibrate.validate_run import validate_run
    trace = tmp_path / name
    res = validate_run(model, prof_path, nproc=nproc, micro_batch=mb, seq_len=seq, steps=3,
                       warmup=1, wait_quiet_s=wait_quiet_s, trace_out=trace, **kw)
    return res, trace


def test_recorded_step_maps_onto_the_simulators_families(tmp_path: Path, prof_path: Path):
    from calibrate.trace_import import load_trace
    from calibrate.trace_stats import clean_steps, measure_step, representative
    res, trace = record(tmp_path, prof_path, "tiny-2l-128", 1, 2, 32, "t.json.gz")
    assert any("Kineto trace" in n for n in res.notes)
    t = load_trace(trace)
    assert t.meta["model"] == "tiny-2l-128" and "profiler_s_per_event" in t.meta
    assert len(t.steps) == 3 and len(t.events_per_step) == 3
    fams = {o.family for o in t.ops}
    assert {"gemm", "attention", "norm", "softmax", "elementwise", "copy", "optimizer"} <= fams
    steps, _ = clean_steps(t)
    m = representative([measure_step(t, s) for s in steps])
    assert m.priced_s + m.unpriced_s + m.host_s == pytest.approx(m.wall_s, rel=1e-6)
    # operators the simulator does not price (the cat of the fused-QKV split backward) are
    # a small part of the step: the families cover the rest
    assert m.unpriced_s < 0.10 * m.wall_s
    # 2 layers x (qkv, attn_out, fc1, fc2) + logits: forward GEMMs, two per backward
    assert sum(1 for o in t.ops if o.step == m.step and o.family == "gemm") == 9 * 3


def test_calibrate_from_a_recorded_trace_and_doctor(tmp_path: Path, prof_path: Path, capsys):
    from simulator.cli.main import main
    from simulator.hardware.profile import Profile
    _, trace = record(tmp_path, prof_path, "tiny-2l-128", 1, 2, 32, "t.json")
    rc = main(["calibrate", "--from-trace", str(trace), "--out", str(tmp_path / "fit")])
    assert rc == 0
    p = Profile.read_json(tmp_path / "fit" / "profile.json")
    assert "fitted from trace t.json" in p.gemm.k_half.source
    assert float(p.fingerprint["host_us_per_op_folded"]) > 0
    assert set(p.memory.kind_eff) >= {"norm", "softmax", "elementwise", "optimizer"}
    capsys.readouterr()
    rc = main(["doctor", "--trace", str(trace), "--profile", str(tmp_path / "fit" / "profile.json"),
               "--json"])
    import json
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["explained_fraction"] >= 0.9
    assert d["predicted_step_s"] > 0 and {g["what"] for g in d["gaps"]} <= {
        r["what"] for r in d["rows"]}


@pytest.mark.slow
def test_ddp_trace_reduces_every_gradient(tmp_path: Path, prof_path: Path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores")
    from calibrate.trace_import import load_trace
    from simulator.workload import resolve_model
    _, trace = record(tmp_path, prof_path, "tiny-2l-128", 2, 2, 32, "d.json")
    assert (tmp_path / "d.rank1.json").is_file()
    t = load_trace(trace)
    assert (t.backend, t.world_size) == ("gloo", 2)
    params = resolve_model("tiny-2l-128", seq_len=32).total_params()
    for s in t.steps:
        dev = [c for c in t.comms if c.step == s.index and c.where == "device"]
        assert sum(c.size_bytes for c in dev) == 4 * params        # fp32 gradients, all of them


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_calibrate_on_one_shape_predict_another(tmp_path: Path, prof_path: Path, nproc: int):
    """Loop check: fit from tiny-2l-128's trace, predict small-4l-256 (another width, depth
    and vocabulary), compare with its measured step. Prints the held-out error."""
    if nproc > (os.cpu_count() or 1):
        pytest.skip("needs 2 cores")
    from calibrate.trace_profile import calibrate_from_trace
    from calibrate.validate_run import plan_for, predict, run_spec
    a, trace = record(tmp_path, prof_path, "tiny-2l-128", nproc, 4, 64, "a.json", 60.0)
    rs = run_spec("tiny-2l-128", nproc, 4, 64, 1, 0)
    fitted = calibrate_from_trace(trace, tmp_path / "fit", rs.model, plan_for(rs))
    other = run_spec("small-4l-256", nproc, 2, 128, 1, 0)
    pred = predict(other, fitted.profile).step_time_s
    meas, _ = record(tmp_path, prof_path, "small-4l-256", nproc, 2, 128, "b.json", 60.0)
    err = 100 * (pred / meas.measured_step_time_s - 1)
    print(f"nproc={nproc}: predicted {pred * 1e3:.2f} ms, measured "
          f"{meas.measured_step_time_s * 1e3:.2f} ms, held-out error {err:+.1f}%")
    if not (a.measured.clean and meas.measured.clean):
        pytest.skip(f"other load on this host: the runs were not clean (error {err:+.1f}%)")
    assert abs(err) < 35
