"""The CUDA entry points run end to end on this CPU with the GPU faked (a discovered H200
whose "device" is the CPU): `calibrate --device cuda` (plan, measure, write GPU-format rows,
fit a GPU profile) and `validate-run --device cuda` (train, time, predict). The numbers are a
CPU's against an H200 datasheet, so only the plumbing is checked, not the values."""
from __future__ import annotations

from pathlib import Path

import pytest

import calibrate.gpu_run as gpu_run
import calibrate.validate_gpu as vg
from calibrate.budget import GpuPlan, Point, point_s, target_for
from calibrate.device import cpu_device
from calibrate.discover import DeviceInfo, GpuInfo

H200 = GpuInfo(0, "NVIDIA H200", 143e9, 1980, 3201, 700.0, 5, 16, 18, 132)
INFO = DeviceInfo("cuda", "NVIDIA H200", 2, 2, 143e9, (H200,), (("X",),), "1 x NVIDIA H200",
                  driver="580.00")


def cpu_sized_plan(t, budget_s=None, done=()) -> GpuPlan:
    """A plan of the GPU plan's kinds of points, at sizes a CPU runs in milliseconds."""
    pts = []
    for s in (64, 128, 256, 512):
        pts.append(Point("gemm", f"{s}x{s}x{s}:bf16:NN:cold", (("m", s), ("n", s), ("k", s),
                         ("dtype", "bf16"), ("layout", "NN")), point_s(1e-3, 0), 0, "gemm bf16"))
    for e in (2 ** 14, 2 ** 15, 2 ** 16, 2 ** 17):
        pts.append(Point("memory", f"copy:{e}:fp32:fwd", (("kernel", "copy"), ("elems", e),
                         ("pass", "fwd"), ("dtype", "fp32")), point_s(1e-4, 0), 0, "hbm copy"))
    for s in (128, 256):
        for pas in ("fwd", "fwd_bwd"):
            pts.append(Point("attention", f"1x2x{s}x64:bf16:flash:{pas}", (
                ("batch", 1), ("heads", 2), ("seq", s), ("head_dim", 64), ("pass", pas),
                ("dtype", "bf16"), ("backend", "flash")), point_s(1e-3, 0), 0,
                "flash attention bf16"))
    return GpuPlan(t, budget_s, tuple(pts), (), {"clock settle": 0.0}, frozenset(done))


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(gpu_run, "require_cuda", lambda hint=None: INFO)
    monkeypatch.setattr(gpu_run, "make_plan", cpu_sized_plan)
    monkeypatch.setattr("calibrate.device.cuda_device", lambda index=0, timer=None: cpu_device())
    import calibrate.bench_gpu as bg
    monkeypatch.setattr(bg, "WARMUP", 1)
    monkeypatch.setattr(bg, "REPEATS", 3)
    monkeypatch.setattr(bg, "POINT_BUDGET_S", 0.02)


def test_calibrate_device_cuda_end_to_end(fake_gpu, tmp_path: Path, capsys):
    from calibrate.cli import run_calibrate
    res = run_calibrate(tmp_path, device="cuda", budget_s=600, quiet=True)
    prof_path = res.profiles["profile.json"]
    from simulator.hardware.profile import Profile
    prof = Profile.read_json(prof_path)
    assert prof.fingerprint["builder"] == "calibrate.gpu_profile"
    assert prof.fingerprint["gpu_key"] == "h200-sxm" and prof.fingerprint["driver"] == "580.00"
    assert prof.device.key == "h200-sxm" and prof.device.sm_count == 132
    assert prof.links["nvlink"].bw_eff.source.startswith("transferred")   # 1 GPU
    err = capsys.readouterr().err
    assert "1 GPU: NCCL collectives and interference skipped" in err
    # a re-run resumes: every planned point is already stored
    again = gpu_run.measure_gpu(tmp_path, 600, quiet=True)
    assert not any("budget" in n for n in again)


def test_validate_run_cuda_end_to_end(fake_gpu, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    res = vg.validate_run_cuda("tiny-2l-128", "reference", nproc=1, micro_batch=2, seq_len=64,
                               steps=3, warmup=1)
    assert res.profile == "reference:h200-sxm" and res.measured_step_time_s > 0
    assert res.predicted_step_time_s > 0 and len(res.measured.step_times_s) == 3
    assert any("bf16 autocast" in n for n in res.notes)
    assert res.to_dict()["loss_first_last"][0] > 0


def test_gpu_environment_without_nccl_is_complete():
    env = gpu_run.gpu_environment(INFO, "h200-sxm")
    assert env["gpu_key"] == "h200-sxm" and env["gpus"] == "1" and env["sm_count"] == "132"
    assert env["device"] == "cuda-nvidia-h200" and env["host"]
    from calibrate.gpu_profile import GPU_FINGERPRINT_KEYS
    assert set(GPU_FINGERPRINT_KEYS) <= set(env)


def test_dry_run_of_this_host_uses_its_gpus(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(gpu_run, "require_cuda", lambda hint=None: INFO)
    lines = gpu_run.dry_run(tmp_path, 300.0, None, None)
    assert lines[0].startswith("calibration plan for 1 x h200-sxm")
    assert target_for("h200-sxm", 1).gpus == 1
