"""Megatron-Core's optimizer step without the distributed optimizer as host work
(frameworks.json "host" mechanism ``mcore_fp16_optimizer``: ``--zero-stage 0``,
``Float16OptimizerWithFloat16Params`` in a ``ChainedOptimizer``): each coefficient is the sum
of the medians of the CPU rows its source cites (``calibrate.bench_mcore_optimizer``, the inner
Adam priced as ``optimizer_fused``'s warm step); a megatron-core run charges it at ZeRO stage 0
and the distributed optimizer's ``mcore_dist_optimizer`` at stage 1, never both; every rank
steps every parameter tensor, so the host's issuing grows with the model's tensors and not
with the data-parallel size. Needs neither torch nor a GPU."""
from __future__ import annotations

import dataclasses

import pytest
from cited_rows import cited_median

import hardware_db
from simulator.cost.host import optimizer_host
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

OPT, DIST = "mcore_fp16_optimizer", "mcore_dist_optimizer"
FUSED = "optimizer_step_fused"
GPU = "GPU-path sum (no inner step, one-call norm)"


def test_coefficients_follow_the_cited_medians(host_mechanism_rows):
    rows = host_mechanism_rows
    o = HOST.mechanisms[OPT]
    gpu_fixed = cited_median(rows, o.why, OPT, f"{GPU}, per step, fixed")
    gpu_tensor = cited_median(rows, o.why, OPT, f"{GPU}, per model parameter tensor")
    loop = sum(cited_median(rows, o.why, OPT, m) for m in (
        "zero_grad_buffer, per step, fixed", "finalize, per step, fixed",
        "no_sync_enter, per step, fixed", "no_sync_exit, per step, fixed"))
    # the inner Adam: optimizer_fused's step in the warm protocol (fixed, per-tensor CUDA
    # estimate), as a GPU runs TE's / apex's FusedAdam; not this CPU's torch AdamW
    step_fixed = cited_median(rows, o.why, FUSED, "warm: per step, fixed")
    step_tensor = cited_median(rows, o.why, FUSED, "warm: per parameter tensor, step, CUDA estimate "
                         "(CPU slow path removed)")
    assert f"{step_fixed:.3f} + {step_tensor:.3f}" in o.why
    assert o.optimizer_fixed_eager_ops == pytest.approx(gpu_fixed + loop + step_fixed, abs=2e-3)
    assert o.optimizer_tensor_eager_ops == pytest.approx(gpu_tensor + step_tensor, abs=1e-3)
    assert o.optimizer_model_tensor_eager_ops == pytest.approx(
        cited_median(rows, o.why, OPT, "zero_grad_buffer, per model parameter tensor"), abs=1e-3)
    assert not o.optimizer_local_shards and o.zero_stages == (0,)
    for metric in (f"{GPU}, per step, fixed", f"{GPU}, per model parameter tensor"):
        assert all(float(r["eager_ops"]) > 0 for r in rows.values()
                   if r["mechanism"] == OPT and r["metric"] == metric)


def _setup(zero: int | None = None, model: str = "gpt2-124m", gpus: int = 8, **kw):
    m = get_preset(model)
    cl = hardware_db.build_cluster("h100-sxm", gpus)
    prof = hardware_db.load_profile("h100-sxm")
    fields = {} if zero is None else {"zero_stage": zero}
    plan = with_framework(Plan(dp=gpus, micro_batch=1, global_batch=8 * gpus,
                               precision="bf16", **fields, **kw), "megatron-core", set(fields))
    return m, plan, cl, prof


def test_zero_0_charges_it_and_zero_1_the_distributed_optimizer():
    _, zero0, _, _ = _setup(zero=0)
    assert OPT in zero0.host_mechanisms and DIST not in zero0.host_mechanisms
    for zero in (None, 1):                          # megatron-core's default is ZeRO-1
        _, plan, _, _ = _setup(zero=zero)
        assert plan.zero_stage == 1
        assert DIST in plan.host_mechanisms and OPT not in plan.host_mechanisms
    assert OPT in HOST.framework("megatron-core").mechanisms
    for other in ("megatron-lm", "fsdp2", "hf"):
        assert OPT not in with_framework(Plan(dp=8, micro_batch=1, global_batch=64,
                                              precision="bf16"), other).host_mechanisms


def test_host_time_grows_with_the_model_s_tensors_not_with_dp():
    o = HOST.mechanisms[OPT]
    prof = hardware_db.load_profile("h100-sxm")
    us = prof.host.op_fwd_us.value * 1e-6
    per = o.optimizer_tensor_eager_ops + o.optimizer_model_tensor_eager_ops
    small, sync = optimizer_host((OPT,), 100, 1, prof, local_tensors=13)
    big, _ = optimizer_host((OPT,), 300, 1, prof, local_tensors=38)
    assert not sync                                 # the local-shard counts are not used
    assert small.seconds == pytest.approx((o.optimizer_fixed_eager_ops + 100 * per) * us)
    assert big.seconds - small.seconds == pytest.approx(200 * per * us)


def test_the_optimizer_phase_is_the_host_s_over_every_tensor(monkeypatch):
    """engine.step.optimizer_time_s at ZeRO-0 (the device's passes set to nothing, so the
    phase is the host's): a deeper model's step costs the extra tensors' per-tensor work;
    8 data-parallel ranks cost what 1 does (each steps every tensor)."""
    from simulator.engine import step
    monkeypatch.setattr(step, "memory_time_s", lambda *a, **k: 0.0)
    o = HOST.mechanisms[OPT]
    got = {}
    for layers, gpus in ((12, 8), (24, 8), (12, 1)):
        m, plan, cl, prof = _setup(zero=0, gpus=gpus)
        m = dataclasses.replace(m, n_layers=layers)
        chunks = build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0]
        only = dataclasses.replace(plan, host_mechanisms=(OPT,))
        got[(layers, gpus)] = (step.optimizer_time_s(chunks, only, cl, prof),
                               sum(c.param_tensors for c in chunks))
    us = prof.host.op_fwd_us.value * 1e-6
    (t12, n12), (t24, n24) = got[(12, 8)], got[(24, 8)]
    assert n24 > n12
    assert t24 - t12 == pytest.approx((n24 - n12) * (o.optimizer_tensor_eager_ops
                                                     + o.optimizer_model_tensor_eager_ops) * us,
                                      rel=1e-6)
    assert got[(12, 1)][0] == pytest.approx(t12, rel=1e-9)
