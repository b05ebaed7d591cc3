"""Model states per parameter against the published formulas: Megatron-LM's theoretical
memory and distributed-optimizer table, the ZeRO paper's 2 + 2 + K, PyTorch FSDP2's 16 B
per sharded parameter. Expected values are written from the sources, not the code."""
from __future__ import annotations

import pytest

from simulator.memory.accounting import (
    fp8_weight_copy_bytes,
    optimizer_step_bytes,
    state_bytes,
)
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan

P = 1e9            # parameters on the rank before sharding


def states(framework: str, precision: str, zero: int, dp: int, grad_dtype=None) -> float:
    plan = with_framework(Plan(dp=dp, global_batch=dp, precision=precision, zero_stage=zero),
                          framework, keep={"zero_stage"}, grad_dtype=grad_dtype)
    return sum(state_bytes(P, plan, dp)) / P


def step_peak(framework: str, precision: str, zero: int, dp: int) -> float:
    """Model states at the optimizer step (plus its fp32 gradient copy), per parameter."""
    plan = with_framework(Plan(dp=dp, global_batch=dp, precision=precision, zero_stage=zero),
                          framework, keep={"zero_stage"})
    return states(framework, precision, zero, dp) + optimizer_step_bytes(P, plan, dp) / P


@pytest.mark.parametrize("dp", [1, 8, 64])
def test_megatron_theoretical_memory_bf16(dp):
    """megatron/training/theoretical_memory_usage.py L293-296: 18 bytes per parameter, or
    6 + 12/dp with the distributed optimizer (bf16 params, fp32 main grads, fp32 Adam)."""
    assert states("megatron-lm", "bf16", 0, dp) == pytest.approx(18)
    assert states("megatron-lm", "bf16", 1, dp) == pytest.approx(6 + 12 / dp)


@pytest.mark.parametrize("dp", [2, 16])
def test_megatron_distributed_optimizer_table(dp):
    """docs/user-guide/features/dist_optimizer.md: fp16 params + fp16 grads 20 / 4 + 16/d
    (the optimizer's fp32 grad copy counted), fp32 params + grads 16 / 8 + 8/d."""
    assert step_peak("megatron-lm", "fp16", 0, dp) == pytest.approx(20)
    assert step_peak("megatron-lm", "fp16", 1, dp) == pytest.approx(4 + 16 / dp)
    assert step_peak("megatron-lm", "fp32", 0, dp) == pytest.approx(16)
    assert step_peak("megatron-lm", "fp32", 1, dp) == pytest.approx(8 + 8 / dp)


def test_zero_paper_model_states_7_5b_on_64_gpus():
    """Rajbhandari et al. 2020, Fig. 1: Psi = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB,
    16.6 GB, 1.9 GB for baseline, P_os, P_os+g, P_os+g+p; i.e. (2 + 2 + K), 4 + K/N,
    2 + (2 + K)/N, (2 + 2 + K)/N bytes per parameter."""
    n, k = 64, 12
    want = [2 + 2 + k, 4 + k / n, 2 + (2 + k) / n, (2 + 2 + k) / n]
    got = [states("deepspeed", "fp16", z, n) for z in range(4)]
    assert got == pytest.approx(want, rel=1e-12)
    gb = [7.5e9 * g / 1e9 for g in got]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)


@pytest.mark.parametrize("fw", ["fsdp2", "torchtitan", "llm-foundry"])
def test_fsdp_keeps_16_bytes_per_sharded_parameter(fw):
    """PyTorch FSDP2 with fp32 sharded parameters and MixedPrecisionPolicy(bf16): sharded
    param 4 + sharded grad 4 + AdamW m, v 8 = 16/N, no master copy (MixedPrecisionPolicy
    docstring; FSDPMemTracker: 4, 4, 8 B per shard)."""
    assert states(fw, "bf16", 3, 8) == pytest.approx(16 / 8)


def test_grad_buffer_dtype_follows_the_framework_and_the_explicit_flag():
    """Megatron-LM's training loop reduces bf16 runs' gradients in fp32 (arguments.py forces
    accumulate_allreduce_grads_in_fp32): 2 + 4 + 12/d; --grad-dtype bf16 (Megatron-LM's
    --grad-reduce-in-bf16) gives 2 + 2 + 12/d."""
    assert states("megatron-core", "bf16", 1, 8) == pytest.approx(6 + 12 / 8)
    assert states("megatron-core", "fp8", 1, 8) == pytest.approx(6 + 12 / 8)
    assert states("megatron-core", "bf16", 1, 8, grad_dtype="bf16") == pytest.approx(4 + 12 / 8)
    assert states("nemo", "fp8", 1, 8) == pytest.approx(4 + 12 / 8)
    assert states("nemo", "bf16", 1, 8) == pytest.approx(6 + 12 / 8)   # bf16_mixed plugin


def test_bf16_optimizer_keeps_fp32_and_bf16_gradients_unsharded():
    """DeepSpeed BF16_Optimizer (Megatron-DeepSpeed, BLOOM): fp32 gradient copy of every
    parameter (bf16_optimizer.py L162) beside the bf16 .grad, master + Adam partitioned:
    2 + 4 + 2 + 12/N."""
    assert states("megatron-deepspeed", "bf16", 1, 8) == pytest.approx(2 + 4 + 2 + 12 / 8)


def test_fp8_weight_cache_and_fp8_primary_weights():
    """Transformer Engine keeps an FP8 copy of each linear weight across micro-batches,
    rowwise + transpose on Hopper (2 B per linear parameter) beside the bf16 weight;
    FP8 primary weights (fp8_param_gather) are those 2 B instead of the bf16 2 B."""
    lin = 7e9
    cached = with_framework(Plan(precision="fp8"), "megatron-lm")
    primary = with_framework(Plan(precision="fp8"), "nemo")
    assert fp8_weight_copy_bytes(lin, cached) == pytest.approx(2 * lin)
    assert fp8_weight_copy_bytes(lin, primary) == pytest.approx(0.0)
    assert fp8_weight_copy_bytes(lin, with_framework(Plan(precision="bf16"), "megatron-lm")) == 0
