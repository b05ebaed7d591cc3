"""Unfused optimizer steps (frameworks.json memory 'optimizer_step_passes'): torch's foreach
AdamW with foreach gradient clipping (fsdp, fsdp2, hf, pytorch) and Composer's DecoupledAdamW
per-tensor loop with norm clipping (llm-foundry), counted on this CPU by a TorchDispatchMode:
every tensor an op reads is one pass, every tensor it writes (in place or new) another; the
step's bytes per parameter are what ``optimizer_bytes_per_param`` charges, within 5 %."""
from __future__ import annotations

import pytest

from simulator.engine.step import optimizer_bytes_per_param
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan

pytestmark = pytest.mark.torch


def _decoupled_adamw(params, state, beta1=0.9, beta2=0.95, eps=1e-8, lr=1e-4):
    """Composer's DecoupledAdamW.adamw loop body as written (composer/optim/
    decoupled_weight_decay.py @ 64051888 L268-295), weight_decay 0 as MPT's yamls set it."""
    import math

    import torch
    with torch.no_grad():
        for p in params:
            if p not in state:
                state[p] = (torch.zeros_like(p), torch.zeros_like(p))
            exp_avg, exp_avg_sq = state[p]
            exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2)).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1))


def _counted_bytes_per_param(n_tensors: int = 8, size: int = 4096,
                             composer: bool = False, fused: bool = False) -> float:
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    params = [torch.nn.Parameter(torch.randn(size)) for _ in range(n_tensors)]
    state: dict = {}
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1,
                            **({"fused": True} if fused else {"foreach": True}))

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=not composer)
        _decoupled_adamw(params, state) if composer else opt.step()
    for p in params:
        p.grad = torch.randn(size)
    step()                                           # state allocated outside the count

    class Count(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            schema = func._schema.arguments
            for a, arg in zip(schema, args):
                ts = arg if isinstance(arg, (list, tuple)) else [arg]
                ts = [t for t in ts if isinstance(t, torch.Tensor) and t.numel() > 1]
                n = sum(t.numel() * t.element_size() for t in ts)
                writes = a.alias_info is not None and a.alias_info.is_write
                # the fused kernel writes the gradients only to unscale them by grad_scale
                if func._schema.name == "aten::_fused_adamw_" and a.name == "grads" and \
                        (kwargs or {}).get("grad_scale") is None:
                    writes = False
                Count.moved += n * (2 if writes else 1)
            outs = out if isinstance(out, (list, tuple)) else [out]
            fresh = [t for t in outs if isinstance(t, torch.Tensor) and t.numel() > 1
                     and not any(t is x for x in args if isinstance(x, torch.Tensor))]
            if not func._schema.name.endswith("_"):
                Count.moved += sum(t.numel() * t.element_size() for t in fresh)
            return out
    for p in params:
        p.grad = torch.randn(size)
    with Count():
        step()
    return Count.moved / (n_tensors * size)


@pytest.mark.parametrize("framework", ["fsdp", "fsdp2"])
def test_foreach_adamw_and_clip_bytes_per_parameter(framework):
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"),
                          framework)
    assert plan.memory.optimizer_step_temp_bytes_per_param == 4.0       # fp32 moments
    charged = optimizer_bytes_per_param(plan)
    assert charged == pytest.approx(_counted_bytes_per_param(), rel=0.05)
    assert charged == pytest.approx(24 * 4.0)


def test_composers_decoupled_adamw_loop_and_clip_bytes_per_parameter():
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"),
                          "llm-foundry")
    assert plan.memory.optimizer_step_temp_bytes_per_param == 0.0     # one tensor at a time
    assert optimizer_bytes_per_param(plan) == pytest.approx(
        _counted_bytes_per_param(composer=True), rel=0.05)


def test_foreach_adamw_on_16_bit_parameters_moves_half():
    """pytorch trains 16-bit parameters with moments in their dtype (frameworks.json
    memory): the same 24 passes over 2-byte tensors."""
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"),
                          "pytorch")
    assert plan.memory.optimizer_step_temp_bytes_per_param == 2.0
    assert optimizer_bytes_per_param(plan) == pytest.approx(24 * 2.0)   # 2-byte moments


def test_hf_trainers_fused_adamw_and_clip_bytes_per_parameter():
    """hf: HF Trainer 5.x's default fused AdamW (one kernel: parameter, gradient and moments
    read, parameter and moments written) with foreach clipping: 10 passes, no temporary."""
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"), "hf")
    assert plan.memory.optimizer_step_temp_bytes_per_param == 0.0
    charged = optimizer_bytes_per_param(plan)
    assert charged == pytest.approx(10 * 2.0)                           # 2-byte moments
    assert 2 * charged == pytest.approx(_counted_bytes_per_param(fused=True), rel=0.05)


def test_fused_frameworks_keep_the_fused_count():
    plan = with_framework(Plan(tp=2, dp=4, micro_batch=1, global_batch=8, precision="bf16"),
                          "megatron-core")
    assert optimizer_bytes_per_param(plan) == 38.0
