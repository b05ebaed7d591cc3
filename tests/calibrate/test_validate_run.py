"""`complexity validate-run`: the real model matches the spec the simulator prices, a short
run produces measured / predicted / error, bad input gives one-line errors. The byte
accounting of the memory-bound microbenchmarks matches the op graph's."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from calibrate.reference import write_profile
from simulator.errors import InvalidInputError, ProfileError
from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    LinkCoefficients,
    MemoryModel,
    Profile,
)
from simulator.hardware.specs import GPUSpec, LinkKind, LinkSpec, NodeSpec
from simulator.workload.spec import MLP, TransformerSpec


def _c(v: float, unit: str = "") -> Coefficient:
    return Coefficient(v, unit, "test")


def cpu_profile(threads: int | None) -> Profile:
    """A plausible measured-CPU profile (100 GFLOP/s, 50 GB/s, 1.5 GB/s host link)."""
    dev = GPUSpec(key="cpu-test", name="Test CPU", vendor="Test", peak_tflops={"fp32": 0.1},
                  mem_bytes=8e9, mem_bw_gbytes_per_s=50.0, tdp_w=0.0, sm_count=0)
    host = LinkSpec("host-gloo", LinkKind.HOST, 1.5, 0.0)
    nic = LinkSpec("none", LinkKind.ETHERNET, 0.0, 0.0)
    node = NodeSpec("cpu-test-host", "cpu-test", max(2, os.cpu_count() or 1), host,
                    max(2, os.cpu_count() or 1), False, 0, nic)
    fp = {"threads": str(threads)} if threads else {}
    return Profile(
        name="cpu-test", device_key="cpu-test",
        gemm=GemmModel({"fp32": _c(1.0)}, _c(10.0), _c(10.0), 0, 0),
        memory=MemoryModel(_c(1.0), _c(5.0), {"norm": _c(0.4), "optimizer": _c(0.6)}),
        attention=AttentionModel({"fp32": _c(0.5)}, {"fp32": _c(0.5)}),
        links={"host": LinkCoefficients(_c(100.0), _c(0.5), _c(300.0), _c(1.0))},
        overlap_slowdown=_c(1.5), step_overhead_s=_c(0.0), fingerprint=fp, device=dev,
        node=node)


@pytest.fixture
def prof_path(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    write_profile(cpu_profile(None), path)
    return path


# ---- no torch needed -------------------------------------------------------------------------
def test_bad_inputs_are_one_line_errors(tmp_path: Path, prof_path: Path):
    from calibrate.validate_run import validate_run
    cases = [
        (dict(model="tiny-2l-128", profile=tmp_path / "missing.json"), ProfileError),
        (dict(model="no-such-model", profile=prof_path), InvalidInputError),
        (dict(model="tiny-2l-128", profile=prof_path, nproc=0), InvalidInputError),
        (dict(model="tiny-2l-128", profile=prof_path, nproc=10 ** 4), InvalidInputError),
        (dict(model="tiny-2l-128", profile=prof_path, steps=0), InvalidInputError),
        (dict(model="tiny-moe-2l-128", profile=prof_path), InvalidInputError),
    ]
    for kwargs, err in cases:
        with pytest.raises(err) as e:
            validate_run(**kwargs, wait_quiet_s=0)
        assert "\n" not in str(e.value)
    old = json.loads(prof_path.read_text())
    old["schema_version"] = 999
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps(old))
    with pytest.raises(ProfileError) as e:
        validate_run("tiny-2l-128", bad, wait_quiet_s=0)
    assert "schema_version" in str(e.value) and "\n" not in str(e.value)


def test_profile_without_device_is_refused(tmp_path: Path):
    from dataclasses import replace

    from calibrate.validate_run import load_profile
    path = tmp_path / "ref.json"
    write_profile(replace(cpu_profile(None), device=None, node=None), path)
    with pytest.raises(ProfileError) as e:
        load_profile(path, 1)
    assert "calibrate" in str(e.value)


def test_profile_is_picked_by_threads_per_process(tmp_path: Path):
    from calibrate.validate_run import load_profile
    write_profile(cpu_profile(2), tmp_path / "profile.json")
    prof, path, notes = load_profile(tmp_path / "profile.json", 2)
    assert path.name == "profile.json" and not notes
    with pytest.raises(ProfileError) as e:            # no 1-thread sibling yet
        load_profile(tmp_path / "profile.json", 1)
    assert "1 thread" in str(e.value) and "\n" not in str(e.value)
    write_profile(cpu_profile(1), tmp_path / "profile_1thread.json")
    prof, path, notes = load_profile(tmp_path / "profile.json", 1)
    assert path.name == "profile_1thread.json" and notes
    assert prof.fingerprint["threads"] == "1"


def test_prediction_uses_fp32_adamw_and_ddp_buckets(prof_path: Path):
    from calibrate.validate_run import load_profile, plan_for, predict, run_spec
    from simulator.engine.step import optimizer_bytes_per_param
    # fp32 AdamW per parameter: read param, grad, m, v (4 x 4 B), write param, m, v (3 x 4 B)
    FP32_OPTIMIZER_BYTES_PER_PARAM = 4 * 4 + 3 * 4
    rs = run_spec("tiny-2l-128", 1, 4, 128, 3, 1)
    plan = plan_for(rs)
    assert plan.precision.value == "fp32" and plan.dp_bucket_bytes == 25 * 1024 * 1024
    assert optimizer_bytes_per_param(plan) == FP32_OPTIMIZER_BYTES_PER_PARAM
    prof, _, _ = load_profile(prof_path, rs.threads)
    res = predict(rs, prof)
    assert res.step_time_s > 0 and res.breakdown.optimizer_s > 0
    # the optimizer is priced with the profile's "optimizer" family efficiency
    params = rs.model.total_params()
    want = 4 * 5e-6 + params * FP32_OPTIMIZER_BYTES_PER_PARAM / (50e9 * 0.6)
    assert res.breakdown.optimizer_s == pytest.approx(want, rel=1e-3)   # final norm not counted
    # one process: no DDP; two: torch DDP's per-parameter hooks and bucket copies
    assert plan.host_mechanisms == ()
    assert plan_for(run_spec("tiny-2l-128", 2, 4, 128, 3, 1)).host_mechanisms == \
        ("ddp_param_hooks",)


def test_memory_bench_accounting_matches_op_graph():
    """Bytes per element the microbenchmarks assign each family equal simulator/workload/ops.py."""
    from calibrate.bench_mem import FAMILY_MIX, MEM_KERNELS
    from simulator.workload.ops import (
        LayerShape,
        OpKind,
        backward_ops,
        head_ops,
        layer_ops,
    )
    spec = TransformerSpec("t", n_layers=1, hidden=64, ffn_hidden=256, n_heads=4, n_kv_heads=4,
                           vocab=512, seq_len=32)
    sh = LayerShape(micro_batch=2, seq_len=32, dtype="fp32", dropout=False)
    T, h, f = 64, 64, 256
    fwd = {o.name: o for o in layer_ops(spec, sh) + head_ops(spec, sh)}
    bwd = {o.name: o for o in backward_ops(list(fwd.values()))}
    per = lambda name, elems, d: d[name].bytes_moved / elems
    assert per("ln1", T * h, fwd) == MEM_KERNELS["layernorm"][1]
    assert per("ln1_bwd", T * h, bwd) == MEM_KERNELS["layernorm"][2]
    assert per("mlp_act", T * f, fwd) == MEM_KERNELS["gelu"][1]
    assert per("mlp_act_bwd", T * f, bwd) == MEM_KERNELS["gelu"][2]
    assert per("attn_residual", T * h, fwd) == MEM_KERNELS["add"][1]
    assert per("attn_residual_bwd", T * h, bwd) == MEM_KERNELS["add"][2]
    ce = fwd["cross_entropy"]
    assert per("cross_entropy", T * 512, fwd) == MEM_KERNELS["cross_entropy"][1]
    assert per("cross_entropy_bwd", T * 512, bwd) == MEM_KERNELS["cross_entropy"][2]
    assert ce.kernels == MEM_KERNELS["cross_entropy"][3]
    for name, kind in (("ln1", "norm"), ("mlp_act", "elementwise"), ("attn_residual",
                                                                        "elementwise"),
                       ("cross_entropy", "softmax")):
        assert fwd[name].mem_kind == kind and fwd[name].kind == OpKind.MEMORY
    # FAMILY_MIX weights: bytes per token per hidden unit of one 4h GELU layer
    mix = dict(FAMILY_MIX["elementwise"])
    assert mix["gelu:fwd"] == MEM_KERNELS["gelu"][1] * f // h
    assert mix["add:fwd"] == 2 * MEM_KERNELS["add"][1]


# ---- torch -----------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.parametrize("spec", [
    TransformerSpec("gelu", n_layers=2, hidden=64, ffn_hidden=256, n_heads=4, n_kv_heads=4,
                    vocab=128, seq_len=16),
    TransformerSpec("swiglu-gqa", n_layers=1, hidden=64, ffn_hidden=96, n_heads=4,
                    n_kv_heads=2, vocab=128, seq_len=16, mlp=MLP.SWIGLU),
    TransformerSpec("relu2-tied", n_layers=1, hidden=32, ffn_hidden=64, n_heads=2,
                    n_kv_heads=1, vocab=64, seq_len=8, mlp=MLP.RELU2, tied_embeddings=True),
])
def test_real_model_matches_spec(spec):
    torch = pytest.importorskip("torch")
    from calibrate.torch_model import build_model, param_count, synthetic_batch
    model = build_model(spec)
    assert param_count(model) == spec.total_params()
    x, y = synthetic_batch(spec, 2)
    loss = model(x, y)
    assert loss.dim() == 0 and math.isfinite(float(loss.detach()))
    assert abs(float(loss.detach()) - math.log(spec.vocab)) < 1.0     # near-uniform at init
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.bias is None for m in linears)


@pytest.mark.torch
def test_quick_validate_run_single_process(prof_path: Path, capsys):
    pytest.importorskip("torch")
    from simulator.cli.main import main
    rc = main(["validate-run", "--model", "tiny-2l-128", "--profile", str(prof_path),
               "--micro-batch", "2", "--seq-len", "64", "--steps", "3", "--warmup", "1",
               "--wait-quiet", "0", "--json"])
    out = capsys.readouterr()
    assert rc == 0
    d = json.loads(out.out)
    for k in ("measured_step_time_s", "predicted_step_time_s", "error_pct"):
        assert math.isfinite(d[k])
    assert d["measured_step_time_s"] > 0 and d["predicted_step_time_s"] > 0
    assert d["error_pct"] == pytest.approx(100 * (d["predicted_step_time_s"]
                                                  / d["measured_step_time_s"] - 1), rel=1e-9)
    assert d["nproc"] == 1 and d["seq_len"] == 64 and d["params"] > 0
    assert 3 <= len(d["measured_step_times_s"]) <= 12
    assert "measured" in out.err and "predicted" in out.err     # the human line


@pytest.mark.torch
def test_cli_errors_are_one_line(tmp_path: Path, capsys):
    pytest.importorskip("torch")
    from simulator.cli.main import main
    rc = main(["validate-run", "--model", "tiny-2l-128", "--profile",
               str(tmp_path / "nope.json"), "--wait-quiet", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "error" in err


@pytest.mark.torch
@pytest.mark.slow
def test_validate_run_two_ddp_ranks(tmp_path: Path):
    pytest.importorskip("torch")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores")
    from calibrate.validate_run import validate_run
    write_profile(cpu_profile(max(1, (os.cpu_count() or 1) // 2)), tmp_path / "profile.json")
    res = validate_run("tiny-2l-128", tmp_path / "profile.json", nproc=2, micro_batch=2,
                       seq_len=64, steps=3, warmup=1, wait_quiet_s=0)
    assert res.nproc == 2 and res.measured_step_time_s > 0
    assert res.predicted_breakdown_s["dp_comm_s"] >= 0
    assert any("DDP buckets" in n for n in res.notes)
