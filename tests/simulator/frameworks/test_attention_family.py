"""Which attention kernel family a framework's runs get, and that the step prices it.

llm-foundry's 2023 benchmark ran MPT with attn_impl 'triton' (its default), the pre-MLIR
Triton port of FlashAttention-1 (frameworks.json "llm-foundry-fsdp"): the 'flash1' family,
whose measured fwd+bwd rate on A100/H100 is ~2.3x below FlashAttention-2's
(tests/calibrate/test_attention_curves.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.engine.simulate import simulate
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import AttentionImpl, Plan
from simulator.cost.layer import compute_time_s
from simulator.workload import get_preset
from simulator.workload.ops import LayerShape, OpKind, backward_ops, layer_ops


def test_llm_foundry_runs_the_flash_attention_1_class_kernel():
    assert with_framework(Plan(), "llm-foundry-fsdp").attention == AttentionImpl.FLASH1
    assert with_framework(Plan(), "megatron-core").attention == AttentionImpl.FLASH3
    kept = with_framework(Plan(attention=AttentionImpl.FLASH), "llm-foundry-fsdp",
                          keep={"attention"})
    assert kept.attention == AttentionImpl.FLASH


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "h100-sxm"])
def test_flash1_step_grows_by_the_attention_kernels_time(gpu):
    """Same plan, only the kernel family changed: the step grows by what the attention
    kernels (forward and backward, every layer, every micro-batch) take longer, and by
    nothing else (2 % for what overlaps beside them)."""
    model = get_preset("llama2-7b")
    cl = make_cluster(gpu, 8)
    prof = hardware_db.load_profile(gpu)
    base = with_framework(Plan(dp=8, micro_batch=2, global_batch=32), "llm-foundry-fsdp")
    fa2_plan = replace(base, attention=AttentionImpl.FLASH)
    fa1 = simulate(model, base, cl, prof)
    fa2 = simulate(model, fa2_plan, cl, prof)

    def attention_s(kernel: str) -> float:
        sh = LayerShape(2, model.seq_len, attention_kernel=kernel, dropout=False)
        fwd = [o for o in layer_ops(model, sh) if o.kind == OpKind.ATTENTION]
        ops = fwd + [o for o in backward_ops(fwd) if o.kind == OpKind.ATTENTION]
        return sum(compute_time_s(o, cl.gpu, prof) for o in ops)
    per_step = (attention_s("flash1") - attention_s("flash")) * model.n_layers * fa1.num_microbatches
    assert per_step > 0
    assert fa1.step_time_s - fa2.step_time_s == pytest.approx(per_step, rel=0.02)


def test_launch_args_say_megatron_has_no_flash_attention_1_backend():
    """The Megatron arguments of a plan priced with flash1 name no attention backend and a
    note says the run would use a faster kernel than the one priced."""
    from simulator.planning.launch_args import launch_args
    model = get_preset("llama2-7b")
    fa1 = launch_args(model, with_framework(Plan(dp=8), "llm-foundry-fsdp"), 8, 8)
    fa2 = launch_args(model, Plan(dp=8), 8, 8)
    assert not any(a.startswith("--attention-backend") for a in fa1.megatron)
    assert "--attention-backend flash" in fa2.megatron
    assert any("FlashAttention-1" in n for n in fa1.notes)
    assert not any("FlashAttention-1" in n for n in fa2.notes)


def test_a_schedule_the_framework_lacks_is_priced_but_noted():
    """Megatron-Core @ d98e8a64 has no DualPipe (frameworks.json "schedules_missing"):
    a megatron-core plan with DualPipe is priced as DeepSeek runs it, with a note saying so;
    1F1B carries no such note."""
    import hardware_db
    from simulator.api.catalog import make_cluster
    from simulator.engine.simulate import simulate
    from simulator.parallel.framework_plan import with_framework
    from simulator.parallel.plan import Plan, Schedule
    from simulator.workload import get_preset
    m = get_preset("llama3-8b")
    cl = make_cluster("h100-sxm", 16)
    prof = hardware_db.load_profile("h100-sxm")
    base = dict(pp=4, dp=4, micro_batch=1, global_batch=64)
    dual = simulate(m, with_framework(Plan(schedule=Schedule.DUALPIPE, vpp=2, **base),
                                      "megatron-core"), cl, prof)
    assert any("does not implement schedule dualpipe" in n for n in dual.notes)
    plain = simulate(m, with_framework(Plan(**base), "megatron-core"), cl, prof)
    assert not any("does not implement" in n for n in plain.notes)
