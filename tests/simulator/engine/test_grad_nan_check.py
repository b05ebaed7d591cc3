"""Megatron-Core's gradient NaN check (``Plan.grad_nan_check``): before each bucket's reduction
``start_grad_sync`` takes the bucket's norm, so every step reads the whole gradient buffer
once more. Expected values from that count (bytes = local parameters x gradient bytes, one
norm kernel per bucket, at the profile's memory bandwidth), not from the engine's code."""
from __future__ import annotations

import dataclasses
import math

import pytest

import hardware_db
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec

MODEL = TransformerSpec("check-gpt", n_layers=4, hidden=1024, ffn_hidden=4096, n_heads=8,
                        n_kv_heads=8, vocab=32000, seq_len=1024)
PROF = hardware_db.load_profile("h100-sxm")


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("engine", ["event", "analytic"])
def test_the_check_reads_the_gradient_buffer_once(pp, engine):
    cl = hardware_db.build_cluster("h100-sxm", 8)
    plan = with_framework(Plan(pp=pp, dp=8 // pp, micro_batch=1, global_batch=4 * 8 // pp,
                               precision="bf16"), "megatron-core")
    assert plan.grad_nan_check                  # the buffer holds plan.grad_bytes a gradient
    # the device's read only: the optimizer's host issuing (mcore_dist_optimizer) is longer
    # than its device passes at this size and would hide it (optimizer_time_s takes the max)
    plan = dataclasses.replace(plan, host_mechanisms=tuple(
        n for n in plan.host_mechanisms if n != "mcore_dist_optimizer"))
    off = dataclasses.replace(plan, grad_nan_check=False)
    on_r = simulate(MODEL, plan, cl, PROF, engine=engine)
    off_r = simulate(MODEL, off, cl, PROF, engine=engine)
    chunks = build_chunks(MODEL, plan, cl, PROF, place_groups(cl, plan))[on_r.critical_stage]
    params = sum(c.params for c in chunks)
    # Megatron-Core buckets only the first stage's first chunk, and only with an overlapped
    # reduction (distributed_data_parallel.py core_r0.8.0 L66-74, training.py core_v0.15.0
    # L988-1000); every other buffer is one bucket
    buckets = sum(math.ceil(c.params / plan.bucket_params())
                  if plan.dp_overlap and c.stage == 0 and c.chunk == 0 else 1 for c in chunks)
    bw = cl.gpu.mem_bw_gbytes_per_s * 1e9 * PROF.memory.eff("")
    expected = params * plan.grad_bytes / bw + buckets * PROF.memory.launch_us.value * 1e-6
    assert on_r.breakdown.optimizer_s - off_r.breakdown.optimizer_s == pytest.approx(expected)
    assert on_r.step_time_s >= off_r.step_time_s


def test_no_check_under_fp16_dynamic_loss_scaling():
    """Megatron-LM turns its NaN checks off under fp16 with dynamic loss scaling (NaNs are
    the scaler's signal: arguments.py core_r0.8.0 L289-297)."""
    fp16 = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="fp16"),
                          "megatron-core")
    assert not fp16.grad_nan_check


def test_only_megatron_core_checks():
    base = Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16")
    on = {fw for fw in ("megatron-core", "nemo", "megatron-lm", "megatron-deepspeed",
                        "deepspeed", "hf", "llm-foundry") if with_framework(base, fw).grad_nan_check}
    assert on == {"megatron-core"}
    fsdp = with_framework(dataclasses.replace(base, zero_stage=3), "megatron-core", {"zero_stage"})
    cl = hardware_db.build_cluster("h100-sxm", 8)
    a = simulate(MODEL, fsdp, cl, PROF).breakdown.optimizer_s
    b = simulate(MODEL, dataclasses.replace(fsdp, grad_nan_check=False), cl, PROF).breakdown.optimizer_s
    assert a == b                          # no bucketed DDP buffer under FSDP: nothing read
