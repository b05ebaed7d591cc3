"""Megatron-Core's DDP hooks, parameter-gather pre-hooks and distributed optimizer step as
host work (frameworks.json "host" mechanisms ``mcore_ddp_hooks``,
``mcore_param_gather_hooks``, ``mcore_dist_optimizer``): each coefficient is the arithmetic
its source states on the medians of the CPU rows it cites (``calibrate.bench_mcore_ddp``);
a rank's optimizer counts the tensors overlapping its slice of each bucket; the hooks exist
only where Megatron-Core runs them (the pre-hooks with the distributed optimizer and the
overlapped reduction); a Linear's weight skips the gradient add that norms and biases pay.
Needs neither torch nor a GPU."""
from __future__ import annotations

import dataclasses
import math

import pytest
from cited_rows import cited_median, median_of_runs

import hardware_db
from simulator.cost.host import mechanisms_host, optimizer_host
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.engine.step import grad_buffer_buckets, local_shard_tensors
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

DDP, OPT = "mcore_ddp_hooks", "mcore_dist_optimizer"
READY = "mcore_grad_ready_hooks"
MCORE = ("mcore_ddp_hooks", READY, "mcore_param_gather_hooks", "mcore_dist_optimizer")
TENSORS_PER_LAYER = 8            # the bench's local-spec layer: 2 LayerNorms (w, b), 4 weights


def test_hook_coefficients_follow_the_cited_medians(host_mechanism_rows):
    rows = host_mechanism_rows
    d = HOST.mechanisms[DDP]
    beyond = cited_median(rows, d.why, DDP, "per parameter tensor, bwd hook beyond main_grad.add_")
    add = cited_median(rows, d.why, DDP, "main_grad.add_ in the bwd hook, per tensor")
    last_layer = cited_median(rows, d.why, DDP, "last micro-batch, bwd, extra over steady, per layer")
    last_fixed = cited_median(rows, d.why, DDP, "last micro-batch, bwd, extra over steady, fixed")
    model_bwd = cited_median(rows, d.why, DDP, "per model pass, bwd, steady micro-batch, fixed")
    fused = cited_median(rows, d.why, DDP,
                   "per layer, bwd, steady micro-batch, TE grad-accumulation fusion emulated")
    assert d.param_tensor_bwd_eager_ops == pytest.approx(beyond, abs=1e-3)
    assert d.nonweight_tensor_bwd_eager_ops == pytest.approx(add, abs=1e-3)
    assert d.model_bwd_eager_ops == pytest.approx(model_bwd, abs=1e-3)
    r = HOST.mechanisms[READY]            # the last micro-batch's extras, with the overlap
    for metric in ("last micro-batch, bwd, extra over steady, per layer",
                   "last micro-batch, bwd, extra over steady, fixed"):
        cited_median(rows, r.why, DDP, metric)
    assert r.param_tensor_bwd_eager_ops == pytest.approx(last_layer / TENSORS_PER_LAYER,
                                                         abs=1e-3)
    assert r.model_bwd_eager_ops == pytest.approx(last_fixed, abs=1e-3)
    assert r.param_tensor_bwd_eager_ops_accumulating == 0.0
    assert r.model_bwd_eager_ops_accumulating == 0.0 and r.only_with_dp_overlap
    # the split reproduces the direct measurement of a fused layer (4 weights, 4 norm tensors)
    assert 4 * beyond + 4 * (beyond + add) == pytest.approx(fused, rel=0.05)
    g = HOST.mechanisms["mcore_param_gather_hooks"]
    per_layer = cited_median(rows, g.why, DDP, "per layer, fwd, steady micro-batch (forward pre-hooks)")
    assert g.layer_module_fwd_eager_ops == pytest.approx(per_layer * 16 / 17, abs=1e-3)
    assert g.model_fwd_eager_ops == pytest.approx(
        median_of_runs(rows, DDP, "per model pass, fwd, steady micro-batch, fixed")[0], abs=1e-3)
    assert g.zero_stages == (1,) and g.only_with_dp_overlap


def test_optimizer_coefficients_follow_the_cited_medians(host_mechanism_rows):
    rows = host_mechanism_rows
    o = HOST.mechanisms[OPT]
    fused = HOST.mechanisms["optimizer_fused"]
    gpu_fixed = cited_median(rows, o.why, OPT,
                       "GPU-path sum (no inner step, one-call norm), per step, fixed")
    gpu_tensor = cited_median(rows, o.why, OPT,
                        "GPU-path sum (no inner step, one-call norm), per local parameter tensor")
    loop = sum(cited_median(rows, o.why, OPT, m) for m in (
        "zero_grad_buffer, per step, fixed", "finalize, per step, fixed",
        "no_sync_enter, per step, fixed", "no_sync_exit, per step, fixed"))
    # optimizer_fused's step in the warm protocol (fixed and per-tensor CUDA estimate, no clip)
    step_fixed = cited_median(rows, o.why, "optimizer_step_fused", "warm: per step, fixed")
    step_tensor = cited_median(rows, o.why, "optimizer_step_fused", "warm: per parameter tensor, "
                         "step, CUDA estimate (CPU slow path removed)")
    assert f"{step_fixed:.3f} + {step_tensor:.3f}" in o.why
    assert fused.optimizer_fixed_eager_ops > step_fixed     # optimizer_fused adds the clip
    assert o.optimizer_fixed_eager_ops == pytest.approx(gpu_fixed + loop + step_fixed, abs=2e-3)
    assert o.optimizer_tensor_eager_ops == pytest.approx(gpu_tensor + step_tensor, abs=1e-3)
    assert o.optimizer_model_tensor_eager_ops == pytest.approx(
        cited_median(rows, o.why, OPT, "zero_grad_buffer, per model parameter tensor"), abs=1e-3)
    assert o.optimizer_local_shards and o.zero_stages == (1,)


def _setup(framework="megatron-core", model="gpt2-124m", gpus=8, mb=1, **plan_kw):
    m = get_preset(model)
    cl = hardware_db.build_cluster("h100-sxm", gpus)
    prof = hardware_db.load_profile("h100-sxm")
    plan = with_framework(Plan(dp=gpus, micro_batch=mb, global_batch=8 * gpus,
                               precision="bf16", **plan_kw), framework, set(plan_kw))
    return m, plan, cl, prof


def test_where_megatron_core_runs_them():
    _, plan, _, _ = _setup()
    assert all(n in plan.host_mechanisms for n in MCORE)
    _, zero0, _, _ = _setup(zero_stage=0)            # no distributed optimizer
    assert DDP in zero0.host_mechanisms
    assert not {"mcore_param_gather_hooks", OPT} & set(zero0.host_mechanisms)
    _, serial, _, _ = _setup(dp_overlap=False)       # no overlapped reduction or gather
    assert "mcore_param_gather_hooks" not in serial.host_mechanisms
    assert READY not in serial.host_mechanisms and DDP in serial.host_mechanisms
    assert OPT in serial.host_mechanisms
    for other in ("megatron-lm", "fsdp2", "hf"):
        assert not set(MCORE) & set(_setup(other)[1].host_mechanisms), other


def test_a_rank_steps_the_tensors_of_its_bucket_slices():
    m, plan, cl, prof = _setup()
    ch = build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0][0]
    n, buckets = ch.param_tensors, grad_buffer_buckets(ch, plan)
    assert local_shard_tensors(ch, plan, 1) == n
    assert local_shard_tensors(ch, plan, 8) == min(n, math.ceil(n / 8) + buckets)
    assert local_shard_tensors(ch, plan, 8) < n
    assert local_shard_tensors(ch, plan, 10_000) == 1 + buckets
    o = HOST.mechanisms[OPT]
    us = prof.host.op_fwd_us.value * 1e-6
    h, sync = optimizer_host((OPT,), n, 1, prof, 5)
    assert h.seconds == pytest.approx((o.optimizer_fixed_eager_ops + 5 * o.optimizer_tensor_eager_ops
                                       + n * o.optimizer_model_tensor_eager_ops) * us)
    assert not sync


def test_norms_and_biases_pay_the_gradient_add_weights_do_not():
    """Per backward: tensors less GEMM weights pay ``nonweight_tensor_bwd_eager_ops``."""
    prof = hardware_db.load_profile("h100-sxm")
    d = HOST.mechanisms[DDP]
    us = prof.host.op_fwd_us.value * 1e-6
    _, b_weights_only = mechanisms_host((DDP,), 1, 4, prof, calls=4)
    _, b_with_norms = mechanisms_host((DDP,), 1, 8, prof, calls=4)
    assert b_with_norms.seconds - b_weights_only.seconds == pytest.approx(
        4 * (d.param_tensor_bwd_eager_ops + d.nonweight_tensor_bwd_eager_ops) * us)
    _, fused = mechanisms_host((DDP,), 1, 8, prof, calls=1, weights=4)
    _, unfused = mechanisms_host((DDP,), 1, 8, prof, calls=1, weights=0)
    assert unfused.seconds - fused.seconds == pytest.approx(
        4 * d.nonweight_tensor_bwd_eager_ops * us)


@pytest.mark.parametrize("ep, experts_per_rank", [(1, 8), (8, 1)])
def test_every_expert_weight_is_a_gemm_weight(ep, experts_per_rank):
    """Mixtral 8x7B: a grouped expert GEMM is one call but one weight per local expert, each
    accumulated by the GEMM; what pays the add per MoE layer is its two norms and the
    router, whatever the expert parallelism."""
    from simulator.cost.host import ParamLayout, linear_weights, param_tensors
    from simulator.engine.stage_work import layer_shape
    from simulator.workload.ops import layer_ops
    m = get_preset("mixtral-8x7b")
    plan = with_framework(Plan(dp=8, ep=ep, micro_batch=1, global_batch=8, precision="bf16"),
                          "megatron-core")
    ops = layer_ops(m, layer_shape(m, plan), m.first_layer(True))
    layout = ParamLayout.of(m, plan.memory.param_layout)
    experts = [o for o in ops if o.name in ("experts_fc1", "experts_fc2")]
    assert {o.batch for o in experts} == {experts_per_rank}
    assert param_tensors(ops, layout) - linear_weights(ops, layout) == 3


def test_the_optimizer_phase_counts_the_rank_s_shard(monkeypatch):
    """engine.step.optimizer_time_s hands the local-shard count to the optimizer's host time:
    at dp 8 the host issues fewer per-tensor updates than at dp 1 by the count's drop (the
    device's passes set to nothing, so the phase is the host's)."""
    from simulator.engine import step
    monkeypatch.setattr(step, "memory_time_s", lambda *a, **k: 0.0)
    o = HOST.mechanisms[OPT]
    got = {}
    for gpus in (1, 8):
        m, plan, cl, prof = _setup(gpus=gpus)
        chunks = build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0]
        only = dataclasses.replace(plan, host_mechanisms=(OPT,))
        got[gpus] = (step.optimizer_time_s(chunks, only, cl, prof),
                     sum(local_shard_tensors(c, plan, plan.shard_ranks) for c in chunks))
    us = prof.host.op_fwd_us.value * 1e-6
    assert got[1][1] > got[8][1]
    assert got[1][0] - got[8][0] == pytest.approx(
        (got[1][1] - got[8][1]) * o.optimizer_tensor_eager_ops * us, rel=1e-6)


def test_a_host_bound_step_slows_and_a_large_one_does_not():
    """GPT-2 124M at micro-batch 1 on 8 H100 is host-bound: the hooks and the optimizer's
    Python lengthen it; Llama 3 8B's device work hides them."""
    for model, slower in (("gpt2-124m", True), ("llama3-8b", False)):
        m, plan, cl, prof = _setup(model=model)
        bare = dataclasses.replace(plan, host_mechanisms=tuple(
            n for n in plan.host_mechanisms if n not in MCORE))
        a, b = simulate(m, plan, cl, prof), simulate(m, bare, cl, prof)
        if slower:
            assert a.step_time_s > 1.2 * b.step_time_s
            assert a.breakdown.optimizer_s > b.breakdown.optimizer_s
        else:
            assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-3)


def test_each_extra_bucket_is_dispatched_once_per_step(host_mechanism_rows):
    """Since stop 39: the last backward's reduce-scatter dispatch and the first forward's
    all-gather dispatch per gradient bucket beyond a chunk's first (the cited rows'
    medians), charged as a 1/micro-batches share of every pass; a chunk's buckets are
    Plan.gradient_buckets (the engine's count)."""
    rows = host_mechanism_rows
    r, g = HOST.mechanisms[READY], HOST.mechanisms["mcore_param_gather_hooks"]
    assert r.bucket_bwd_eager_ops == pytest.approx(cited_median(
        rows, r.why, DDP, "last micro-batch, bwd, extra over steady, per extra bucket"), abs=1e-3)
    assert g.bucket_fwd_eager_ops == pytest.approx(cited_median(
        rows, g.why, DDP, "first micro-batch, fwd, extra over steady, per extra bucket"), abs=1e-3)
    prof = hardware_db.load_profile("h100-sxm")
    us = prof.host.op_fwd_us.value * 1e-6
    names = (READY, "mcore_param_gather_hooks")
    f0, b0 = mechanisms_host(names, 2, 16, prof, boundary_share=0.25)
    f5, b5 = mechanisms_host(names, 2, 16, prof, boundary_share=0.25, extra_buckets=5)
    assert f5.seconds - f0.seconds == pytest.approx(5 * 0.25 * g.bucket_fwd_eager_ops * us)
    assert b5.seconds - b0.seconds == pytest.approx(5 * 0.25 * r.bucket_bwd_eager_ops * us)
    m, plan, cl, prof = _setup(model="llama3-8b")
    ch = build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0][0]
    assert grad_buffer_buckets(ch, plan) == plan.gradient_buckets(ch.params, 0, 0) > 100
    assert dataclasses.replace(plan, dp_overlap=False).gradient_buckets(ch.params, 0, 0) == 1
    assert plan.gradient_buckets(ch.params, 1, 0) == 1          # Megatron-Core: first stage only
    # in the step: a host-bound GPT-2 on 8 H100 (4 buckets) pays 3 extra buckets each way
    m, plan, cl, prof = _setup()
    bare = dataclasses.replace(plan, dp_bucket_bytes=10**12)    # one bucket
    a, b = simulate(m, plan, cl, prof), simulate(m, bare, cl, prof)
    assert a.step_time_s > b.step_time_s
