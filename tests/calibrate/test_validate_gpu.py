"""`validate-run --device cuda` without a GPU: inputs, profiles (reference and GPU-calibrated
accepted, CPU refused), the prediction, and the training step and its timing on a CPU
through the same functions the GPU run uses."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import hardware_db
from calibrate.cli import run_fit
from calibrate.validate_gpu import (
    GpuRunSpec,
    gpu_run_spec,
    load_gpu_profile,
    make_step,
    plan_for_gpu,
    predict_gpu,
    timed_steps,
)
from simulator.errors import InvalidInputError, ProfileError
from simulator.workload import get_preset


def spec(strategy: str = "ddp", nproc: int = 1, model: str = "gpt2-124m") -> GpuRunSpec:
    return gpu_run_spec(model, nproc, 4, 256, 3, 1, strategy, "h200-sxm", gpus_here=8)


def test_run_spec_checks_inputs():
    with pytest.raises(InvalidInputError, match="nproc"):
        gpu_run_spec("gpt2-124m", 9, 1, 128, 3, 1, "ddp", "h200-sxm", gpus_here=8)
    with pytest.raises(InvalidInputError, match="strategy"):
        gpu_run_spec("gpt2-124m", 1, 1, 128, 3, 1, "zero", "h200-sxm", gpus_here=8)
    with pytest.raises(InvalidInputError, match="model"):
        gpu_run_spec("tiny-moe-2l-128", 1, 1, 128, 3, 1, "ddp", "h200-sxm", gpus_here=8)
    assert spec().model.seq_len == 256


def test_plan_matches_the_run():
    ddp, fsdp = plan_for_gpu(spec("ddp", 8)), plan_for_gpu(spec("fsdp", 8))
    assert ddp.dp == 8 and ddp.global_batch == 32 and ddp.precision.value == "bf16"
    assert ddp.zero_stage == 0 and ddp.dp_bucket_bytes == 25 * 2 ** 20
    assert fsdp.zero_stage == 3


def test_reference_profile_accepted():
    prof, label, notes = load_gpu_profile("reference", "h200-sxm")
    assert prof.name == "h200-sxm-reference" and label == "reference:h200-sxm" and not notes
    res = predict_gpu(spec("ddp", 8), prof)
    assert res.step_time_s > 0


def test_gpu_calibrated_profile_accepted_and_cpu_profile_refused(gpu_calibration, tmp_path: Path):
    path = run_fit(gpu_calibration, quiet=True).profiles["profile.json"]
    prof, _, _ = load_gpu_profile(str(path), "h200-sxm")
    ref = hardware_db.load_profile("h200-sxm")
    for strategy in ("ddp", "fsdp"):
        got, base = predict_gpu(spec(strategy, 8), prof), predict_gpu(spec(strategy, 8), ref)
        assert 0.5 < got.step_time_s / base.step_time_s < 2.0
    _, _, notes = load_gpu_profile(str(path), "h100-sxm")
    assert notes and "h200-sxm" in notes[0]
    cpu = tmp_path / "cpu.json"
    text = path.read_text().replace('"calibrate.gpu_profile"', '"calibrate.cpu_profile"')
    cpu.write_text(text)
    with pytest.raises(ProfileError, match="measured on a CPU"):
        load_gpu_profile(str(cpu), "h200-sxm")


class CountingTimer:
    """A fake device timer: wall time, counts syncs (the GPU's CUDA-event timer stands in)."""

    kind = "fake"

    def __init__(self) -> None:
        self.syncs, self.samples = 0, 0

    def sample(self, fn):
        import time
        t0 = time.perf_counter()
        fn()
        self.samples += 1
        return time.perf_counter() - t0

    def sync(self):
        self.syncs += 1


def test_training_step_on_cpu_with_bf16_autocast():
    import torch
    rs = gpu_run_spec("tiny-2l-128", 1, 2, 64, 3, 2, "ddp", "h200-sxm", gpus_here=1)
    step, name = make_step(rs, torch.device("cpu"))
    timer = CountingTimer()
    rec = timed_steps(rs, step, timer, False, torch.device("cpu"))
    assert timer.samples == 3 and timer.syncs == 1             # warm-up excluded, then synced
    assert len(rec["times"]) == 3 and all(t > 0 for t in rec["times"])
    assert all(math.isfinite(x) and x > 0 for x in rec["losses"])
    assert name.startswith("AdamW")


def test_model_matches_the_spec_on_the_device():
    import torch

    from calibrate.torch_model import build_model, param_count
    m = get_preset("tiny-2l-128")
    assert param_count(build_model(m).to(torch.device("cpu"))) == m.total_params()


def _ddp_fsdp_worker(rank: int, port: int, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from calibrate.device import WallTimer
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        got = {}
        for strategy in ("ddp", "fsdp"):
            rs = gpu_run_spec("tiny-2l-128", 2, 2, 64, 2, 1, strategy, "h200-sxm", gpus_here=2)
            step, name = make_step(rs, torch.device("cpu"), rank, distributed=True)
            got[strategy] = {**timed_steps(rs, step, WallTimer(), True, torch.device("cpu")),
                             "optimizer": name}
        if rank == 0:
            Path(out).write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_and_fsdp_steps_run_over_gloo(tmp_path: Path):
    """The wrapping the GPU run uses (DDP; FSDP2 fully_shard with bf16 params), on 2 CPU ranks."""
    import json

    import torch.multiprocessing as mp

    from calibrate.bench_comm import free_port
    out = tmp_path / "rank0.json"
    mp.start_processes(_ddp_fsdp_worker, args=(free_port(), str(out)), nprocs=2,
                       start_method="spawn")
    got = json.loads(out.read_text())
    assert got["fsdp"]["optimizer"] == "AdamW(foreach=True)"
    for rec in got.values():
        assert len(rec["times"]) == 2 and all(t > 0 for t in rec["times"])
        assert rec["losses"][1] < rec["losses"][0]              # one AdamW step learned


def test_cpu_validate_run_refuses_a_gpu_profile_in_one_line(gpu_calibration, capsys):
    from simulator.cli.main import main as cli_main
    path = run_fit(gpu_calibration, quiet=True).profiles["profile.json"]
    rc = cli_main(["validate-run", "--model", "tiny-2l-128", "--profile", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--device cuda" in err
