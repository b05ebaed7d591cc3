"""`complexity validate-run --device cuda`: train the decoder on this host's GPUs, predict the
same step with a reference or GPU-calibrated profile, report the signed error.

The run: ``calibrate.torch_model`` builds the decoder the simulator prices, one rank per GPU
(``nproc`` ranks, spawned; each ``torch.cuda.set_device(LOCAL_RANK)``), the model on
``cuda:LOCAL_RANK`` in fp32 with bf16 autocast (as PyTorch mixed precision trains), fused
AdamW, synthetic tokens. ``strategy`` "ddp": ``DistributedDataParallel`` over NCCL with
25 MiB buckets; "fsdp": FSDP2 ``fully_shard`` per block and at the root, bf16 parameters
gathered and fp32 gradients reduced (``MixedPrecisionPolicy``), AdamW over the sharded
parameters with ``foreach`` kernels. Each step's time is taken
with CUDA events around the step (``calibrate.device.CudaEventTimer``: the device finished
the step before the time is read), the slowest rank's, after ``warmup`` untimed steps.

The prediction: ``simulate`` with ``Plan(dp=nproc, precision=bf16, attention=flash,
zero_stage=0 (ddp) / 3 (fsdp), dp_overlap)`` on ``hardware_db.build_cluster(gpu, nproc)``
with the profile given: ``reference`` (the shipped one for this GPU), a reference JSON, or
``complexity calibrate --device cuda``'s ``profile.json``. A profile measured on a CPU is
refused. The same step function runs on a CPU (bf16 autocast on CPU) in the tests.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from simulator.errors import InvalidInputError, ProfileError
from simulator.hardware.profile import Profile
from simulator.parallel.plan import Plan
from simulator.workload import resolve_model
from simulator.workload.spec import TransformerSpec

from .validate_run import (
    CLEAN_PRESSURE_DDP,
    DDP_BUCKET_MB,
    LR,
    RunError,
    ValidationResult,
    _optimizer,
    _positive,
    summarize,
)

STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class GpuRunSpec:
    model: TransformerSpec
    nproc: int
    micro_batch: int
    steps: int
    warmup: int
    strategy: str
    gpu_key: str


def gpu_run_spec(model: str, nproc: int, micro_batch: int, seq_len: int, steps: int,
                 warmup: int, strategy: str, gpu_key: str, gpus_here: int) -> GpuRunSpec:
    for name, v, least in (("nproc", nproc, 1), ("micro_batch", micro_batch, 1),
                           ("seq_len", seq_len, 1), ("steps", steps, 1), ("warmup", warmup, 0)):
        _positive(name, v, least)
    if strategy not in STRATEGIES:
        raise InvalidInputError("strategy", strategy, f"one of {', '.join(STRATEGIES)}")
    if nproc > gpus_here:
        raise InvalidInputError("nproc", nproc, f"at most the {gpus_here} GPU(s) visible here "
                                "(one rank per GPU)")
    spec = resolve_model(model, seq_len=seq_len)
    if spec.moe is not None:
        raise InvalidInputError("model", model, "a dense decoder (validate-run does not build MoE)")
    return GpuRunSpec(spec, nproc, micro_batch, steps, warmup, strategy, gpu_key)


def load_gpu_profile(profile: str, gpu_key: str) -> tuple[Profile, str, list[str]]:
    """(profile, label, notes): ``reference`` = the shipped profile of ``gpu_key``."""
    import hardware_db
    if profile == "reference":
        return hardware_db.load_profile(gpu_key), f"reference:{gpu_key}", []
    prof = Profile.read_json(profile)
    if prof.fingerprint.get("builder") == "calibrate.cpu_profile" or \
            prof.device_key.startswith("cpu-"):
        raise ProfileError("profile", profile, "a GPU profile (a reference one, or `complexity "
                           "calibrate --device cuda`'s)", "this one was measured on a CPU")
    notes = []
    if hardware_db.resolve_gpu_key(prof.device_key) != gpu_key:
        notes.append(f"profile {prof.name!r} is for {prof.device_key}, the run is on {gpu_key}")
    return prof, profile, notes


def plan_for_gpu(rs: GpuRunSpec) -> Plan:
    ddp = rs.strategy == "ddp"
    return Plan(dp=rs.nproc, micro_batch=rs.micro_batch, global_batch=rs.micro_batch * rs.nproc,
                precision="bf16", attention="flash", zero_stage=0 if ddp else 3,
                dp_overlap=True, dp_bucket_bytes=DDP_BUCKET_MB * 1024 * 1024 if ddp else 0,
                schedule="1f1b")


def predict_gpu(rs: GpuRunSpec, prof: Profile):
    import hardware_db
    from simulator.engine.simulate import simulate
    cluster = hardware_db.build_cluster(rs.gpu_key, rs.nproc)
    return simulate(rs.model, plan_for_gpu(rs), cluster, prof)


# ---- the run ---------------------------------------------------------------------------------
def wrap(model: Any, strategy: str, device: Any, distributed: bool) -> Any:
    """DDP or FSDP2 around ``model`` (unchanged on one rank)."""
    if not distributed:
        return model
    import torch
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=DDP_BUCKET_MB)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    return fully_shard(model, mp_policy=mp)


def make_step(rs: GpuRunSpec, device: Any, rank: int = 0, distributed: bool = False):
    """(step callable returning the loss, optimizer name): zero_grad, forward under bf16
    autocast, backward, AdamW step, on ``device`` (a GPU, or the CPU in tests)."""
    import torch

    from .torch_model import build_model, synthetic_batch
    with device:                                  # parameters created on the device
        model = build_model(rs.model)
    model = wrap(model, rs.strategy, device, distributed)
    if distributed and rs.strategy == "fsdp":     # sharded (DTensor) parameters
        opt, name = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True), \
            "AdamW(foreach=True)"
    else:
        opt, name = _optimizer(model.parameters())
    tokens, targets = (t.to(device) for t in synthetic_batch(rs.model, rs.micro_batch,
                                                            seed=1000 + rank))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        opt.step()
        return loss
    return step, name


def timed_steps(rs: GpuRunSpec, step, timer, distributed: bool, device: Any) -> dict[str, Any]:
    """Warm-up, then ``rs.steps`` steps timed by ``timer``; with several ranks each step's
    time is the slowest rank's (exchanged outside the timed window)."""
    import torch

    from .store import PressureMeter
    for _ in range(rs.warmup):
        step()
    timer.sync()
    out: dict[str, list] = {"times": [], "pressure": [], "losses": []}
    for _ in range(rs.steps):
        meter, held = PressureMeter().start(), []
        dt = timer.sample(lambda: held.append(step()))
        pr = meter.stop()
        if distributed:
            import torch.distributed as dist
            v = torch.tensor([dt, pr], dtype=torch.float64, device=device)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            dt, pr = float(v[0]), float(v[1])
        out["times"].append(dt)
        out["pressure"].append(pr)
        out["losses"].append(float(held[0].detach()))
    return out


def _gpu_worker(rank: int, rs: GpuRunSpec, port: int, out_dir: str) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    from .device import cuda_device
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank),
                       "WORLD_SIZE": str(rs.nproc)})
    dev = cuda_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=rs.nproc, timeout=timedelta(seconds=600))
    try:
        step, name = make_step(rs, dev.torch(), rank, distributed=True)
        rec = timed_steps(rs, step, dev.timer, True, dev.torch())
        if rank == 0:
            Path(out_dir, "rank0.json").write_text(json.dumps({**rec, "optimizer": name}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.cuda.synchronize()


def measure_gpu_run(rs: GpuRunSpec) -> dict[str, Any]:
    """One rank in this process, several spawned (NCCL)."""
    if rs.nproc == 1:
        from .device import cuda_device
        dev = cuda_device(0)
        step, name = make_step(rs, dev.torch())
        return {**timed_steps(rs, step, dev.timer, False, dev.torch()), "optimizer": name}
    import torch.multiprocessing as mp

    from .bench_comm import free_port
    with tempfile.TemporaryDirectory(prefix="validate-run-gpu-") as tmp:
        try:
            mp.start_processes(_gpu_worker, args=(rs, free_port(), tmp), nprocs=rs.nproc,
                               join=True, start_method="spawn")
        except Exception as exc:   # noqa: BLE001 - one line, never a traceback
            lines = str(exc).strip().splitlines()
            raise RunError(f"{rs.strategy.upper()} training run failed: "
                           f"{lines[-1] if lines else type(exc).__name__}") from None
        return json.loads(Path(tmp, "rank0.json").read_text())


def validate_run_cuda(model: str, profile: str, nproc: int = 1, micro_batch: int = 1,
                      seq_len: int = 1024, steps: int = 10, warmup: int = 3,
                      strategy: str = "ddp", gpu: str | None = None) -> ValidationResult:
    """Measure and predict one training step on this host's GPUs."""
    import torch

    from .gpu_run import require_cuda, resolve_gpu
    info = require_cuda("run validate-run with --device cpu and a profile from `complexity "
                        "calibrate --device cpu`")
    key = resolve_gpu(info, gpu)
    rs = gpu_run_spec(model, nproc, micro_batch, seq_len, steps, warmup, strategy, key,
                      torch.cuda.device_count())
    prof, label, notes = load_gpu_profile(profile, key)
    res = predict_gpu(rs, prof)                  # before the run: bad input fails fast
    meas = summarize(measure_gpu_run(rs), CLEAN_PRESSURE_DDP)
    err = 100.0 * (res.step_time_s - meas.median_s) / meas.median_s
    notes += run_notes(rs)
    return ValidationResult(
        model=rs.model.name, nproc=nproc, micro_batch=micro_batch, seq_len=rs.model.seq_len,
        steps=steps, warmup=warmup, threads_per_process=torch.get_num_threads(),
        profile=label, measured_step_time_s=meas.median_s,
        predicted_step_time_s=res.step_time_s, error_pct=err, measured=meas,
        predicted_breakdown_s=res.breakdown.as_dict(), params=rs.model.total_params(),
        notes=notes)


def run_notes(rs: GpuRunSpec) -> list[str]:
    out = [f"{rs.nproc} x {rs.gpu_key}, {rs.strategy.upper()} over NCCL, fp32 weights with bf16 "
           "autocast (the simulator prices bf16 GEMMs and mixed-precision AdamW; autocast's "
           "per-step weight casts are not in its op graph); step timed with CUDA events"]
    if rs.strategy == "fsdp":
        out.append("FSDP2 fully_shard per block: bf16 parameter all-gathers, fp32 gradient "
                   "reduce-scatters; simulated as ZeRO-3")
    return out
