"""Legacy Megatron-LM's local-DDP hooks and optimizer steps, and DeepSpeed's ZeRO-1/2
optimizer step, as host work (frameworks.json "host" mechanisms
``megatron_legacy_ddp_hooks``, ``megatron_legacy_optimizer``,
``megatron_legacy_dist_optimizer``, ``deepspeed_zero_optimizer``): each coefficient is the
arithmetic its source states on the CPU rows it cites (``calibrate.bench_megatron_legacy_step``,
``calibrate.bench_deepspeed_step``); each exists only at the ZeRO stages that run it; a
host-bound step pays them and a device-bound one hides them. Needs neither torch nor a GPU."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

import hardware_db
from simulator.cost.host import mechanisms_host, optimizer_host
from simulator.engine.simulate import simulate
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

DDP, OPT, DIST = ("megatron_legacy_ddp_hooks", "megatron_legacy_optimizer",
                  "megatron_legacy_dist_optimizer")
ZERO = "deepspeed_zero_optimizer"
LEGACY = (DDP, OPT, DIST)
RUN_OFFSETS = (0, 90, 180)            # the three legacy runs: lines 1123-1212, 1213-1302, 1303-1392
DS_OFFSETS = (0, 159, 318)            # the three DeepSpeed runs: lines 1393-1551, 1552-1710, ...


def _runs(rows, why: str, mechanism: str, metric: str) -> list[float]:
    """The values of ``metric`` on the three lines ``why`` cites for it (the first three
    of the CSV's rows with that label, as the source was written: later runs appended
    under the same label are not part of it)."""
    hits = [(line, float(r["eager_ops"])) for line, r in sorted(rows.items())
            if r["mechanism"] == mechanism and r["metric"] == metric][:3]
    assert len(hits) == 3, (mechanism, metric)
    cited = ", ".join(str(line) for line, _ in hits)
    assert cited in why, (metric, cited)
    return [v for _, v in hits]


def _median(rows, why, mechanism, metric) -> float:
    return statistics.median(_runs(rows, why, mechanism, metric))


def test_legacy_ddp_hook_coefficients_follow_the_cited_medians(host_mechanism_rows):
    rows, d = host_mechanism_rows, HOST.mechanisms[DDP]
    whole = _median(rows, d.why, DDP, "per parameter tensor, bwd (hook: main_grad.add_, grad = None)")
    add = _median(rows, d.why, DDP,
                  "per fused linear weight, bwd, saved under gradient-accumulation fusion")
    fused_layer = _median(rows, d.why, DDP,
                          "per layer, bwd, hooks under gradient-accumulation fusion")
    assert d.nonweight_tensor_bwd_eager_ops == pytest.approx(add, abs=1e-3)
    # the hook alone: the directly measured fused layer less its 8 adding tensors' adds,
    # over its 12 tensors; the difference of the medians agrees within the noise
    assert d.param_tensor_bwd_eager_ops == pytest.approx((fused_layer - 8 * add) / 12, abs=1e-3)
    assert d.param_tensor_bwd_eager_ops == pytest.approx(whole - add, abs=0.1)
    assert d.optimizer_fixed_eager_ops == pytest.approx(
        _median(rows, d.why, DDP, "zero_grad_buffer, per step, fixed"), abs=1e-3)
    # and the split still reproduces the unfused layer's hooks (every tensor adds)
    unfused = _median(rows, d.why, DDP, "per layer, bwd (hooks of its tensors)")
    split = 12 * (d.param_tensor_bwd_eager_ops + d.nonweight_tensor_bwd_eager_ops)
    assert split == pytest.approx(unfused, rel=0.1)
    assert d.model_bwd_eager_ops == 0.0 and not d.zero_stages


def test_legacy_optimizer_coefficients_follow_the_cited_medians(host_mechanism_rows):
    rows, o = host_mechanism_rows, HOST.mechanisms[OPT]
    total = "per step total, GPU estimate (one-op norm, inner step's CUDA estimate), "
    fixed = _median(rows, o.why, OPT, total + "per step, fixed")
    tensor = _median(rows, o.why, OPT, total + "per parameter tensor")
    reduce_fixed = _median(rows, o.why, DDP, "reduce_model_grads, per step, fixed")
    reduce_tensor = _median(rows, o.why, DDP, "reduce_model_grads, per model parameter tensor")
    assert o.optimizer_fixed_eager_ops == pytest.approx(fixed + reduce_fixed, abs=2e-3)
    assert o.optimizer_tensor_eager_ops == pytest.approx(tensor + reduce_tensor, abs=2e-3)
    assert o.zero_stages == (0,) and not o.optimizer_local_shards


def test_legacy_dist_optimizer_splits_local_and_model_tensors(host_mechanism_rows):
    """Per run: the pieces' per-local-tensor slopes with the GPU-path substitutions (one-call
    norm, the inner step's CUDA estimate), and the per-model-tensor copies; the medians."""
    rows, o = host_mechanism_rows, HOST.mechanisms[DIST]

    def run(metric):
        return _runs(rows, o.why, DIST, metric)

    local = [zg + st - (nm - one) - (inner - cuda) + sch for zg, st, nm, one, inner, cuda, sch in zip(
        run("zero_grad, per local parameter tensor"), run("step, per local parameter tensor"),
        run("clip_grad_norm, per local parameter tensor"),
        run("clip_grad_norm_onecall, per local parameter tensor"),
        run("inner_step, per local parameter tensor"),
        run("inner_step, CUDA estimate (CPU fused kernel's per-tensor work off), "
            "per local parameter tensor"),
        run("scheduler_step, per local parameter tensor"))]
    model = [g + r for g, r in zip(run("gather_model_params, per model parameter tensor"),
                                   run("reduce_model_grads, per model parameter tensor"))]
    both = run("per step total, GPU estimate (one-op norm, inner step's CUDA estimate), "
               "per local parameter tensor")
    assert o.optimizer_tensor_eager_ops == pytest.approx(statistics.median(local), abs=1e-3)
    assert o.optimizer_model_tensor_eager_ops == pytest.approx(statistics.median(model), abs=1e-3)
    # the committed one-slope rows hold both parts (the bench's rank steps every tensor it
    # has a shard of, here about all of them), the reason they are not used as such
    for a, b, c in zip(local, model, both):
        assert a + b == pytest.approx(c, abs=0.01)
    assert o.optimizer_fixed_eager_ops == pytest.approx(statistics.median(run(
        "per step total, GPU estimate (one-op norm, inner step's CUDA estimate), per step, fixed")),
        abs=1e-3)
    assert o.zero_stages == (1,) and o.optimizer_local_shards


def test_zero_optimizer_coefficients_follow_the_cited_medians(host_mechanism_rows):
    """The warm protocol's rows (each piece after the same engine's own backward), ZeRO-1
    bf16's pieces summed; ZeRO-2's within 5 %; the first protocol's colder rows differ."""
    rows, z = host_mechanism_rows, HOST.mechanisms[ZERO]
    pieces = "warm: ZeRO-1 bf16, torch AdamW(fused=True), pieces summed, "
    parts = (("per step, fixed", z.optimizer_fixed_eager_ops),
             ("per local parameter tensor (this rank's partition)", z.optimizer_tensor_eager_ops),
             ("per model parameter tensor", z.optimizer_model_tensor_eager_ops))
    for part, value in parts:
        assert value == pytest.approx(_median(rows, z.why, ZERO, pieces + part), abs=1e-3), part
        two = _median(rows, z.why, ZERO, pieces.replace("ZeRO-1", "ZeRO-2") + part)
        assert two == pytest.approx(value, rel=0.05), part
    whole = "warm: ZeRO-1 bf16, torch AdamW(fused=True), engine.step() at the boundary, "
    assert _median(rows, z.why, ZERO, whole + "per step, fixed") == pytest.approx(
        z.optimizer_fixed_eager_ops, rel=0.05)
    cold = "ZeRO-1 bf16, torch AdamW(fused=True), pieces summed, per step, fixed"
    assert statistics.median(float(r["eager_ops"]) for r in rows.values()
                             if r["metric"] == cold) > 1.1 * z.optimizer_fixed_eager_ops
    assert z.zero_stages == (1, 2) and z.optimizer_local_shards and z.only_without_pp


def _plan(framework, zero, gpus=8, **kw):
    return with_framework(Plan(dp=gpus, micro_batch=1, global_batch=gpus, precision="bf16",
                               zero_stage=zero, **kw), framework, {"zero_stage"})


@pytest.mark.parametrize("zero, present, absent", [(0, (DDP, OPT), (DIST,)),
                                                    (1, (DDP, DIST), (OPT,))])
def test_legacy_megatron_runs_one_optimizer_per_zero_stage(zero, present, absent):
    got = set(_plan("megatron", zero).host_mechanisms)
    assert set(present) <= got and not set(absent) & got
    for other in ("megatron-core", "megatron-deepspeed", "hf", "fsdp2"):
        assert not set(LEGACY) & set(_plan(other, zero).host_mechanisms), other


@pytest.mark.parametrize("zero, present", [(0, False), (1, True), (2, True), (3, False)])
def test_deepspeed_charges_its_zero_optimizer_at_stages_1_and_2(zero, present):
    """DeepSpeed's own engine and HF's Trainer on it (ZeRO 1/2: no torch DDP hooks, no
    torch optimizer of its own); not under DeepSpeed's pipeline engine, whose measured
    per-step instructions stand for the step; never Megatron-DeepSpeed's BF16_Optimizer."""
    for fw in ("deepspeed", "hf"):
        assert (ZERO in _plan(fw, zero).host_mechanisms) is present, fw
    hf = _plan("hf", zero).host_mechanisms
    assert ("deepspeed_zero1_grad_hooks" in hf) is (zero == 1)
    assert ("deepspeed_zero2_grad_hooks" in hf) is (zero == 2)
    assert ("ddp_param_hooks" in hf) is (zero == 0) and TIMER not in hf
    assert ZERO not in _plan("megatron-deepspeed", zero).host_mechanisms
    piped = with_framework(Plan(dp=4, pp=2, micro_batch=1, global_batch=8, precision="bf16",
                                zero_stage=zero), "deepspeed", {"zero_stage"}).host_mechanisms
    assert ZERO not in piped and "deepspeed_pipe_engine" in piped


def test_the_host_cost_is_the_stated_sum():
    prof = hardware_db.load_profile("a100-sxm-80gb")
    us = prof.host.op_fwd_us.value * 1e-6
    o, z = HOST.mechanisms[DIST], HOST.mechanisms[ZERO]
    h, sync = optimizer_host((DIST, ZERO), 100, 1, prof, 13)
    want = (o.optimizer_fixed_eager_ops + 13 * o.optimizer_tensor_eager_ops
            + 100 * o.optimizer_model_tensor_eager_ops + z.optimizer_fixed_eager_ops
            + 13 * z.optimizer_tensor_eager_ops + 100 * z.optimizer_model_tensor_eager_ops)
    assert h.seconds == pytest.approx(want * us) and not sync
    d = HOST.mechanisms[DDP]            # the hooks: per backward, GEMM weights skip the add
    _, fused = mechanisms_host((DDP,), 1, 12, prof, calls=1, weights=4)
    _, unfused = mechanisms_host((DDP,), 1, 12, prof, calls=1, weights=0)
    assert unfused.seconds - fused.seconds == pytest.approx(4 * d.nonweight_tensor_bwd_eager_ops * us)


@pytest.mark.parametrize("framework, zero, names", [
    ("megatron", 0, LEGACY), ("megatron", 1, LEGACY), ("deepspeed", 2, (ZERO,))])
def test_a_host_bound_step_slows_and_a_large_one_does_not(framework, zero, names):
    """A 4-layer 256-wide model at micro-batch 1 on 8 A100 is host-bound: the step grows by
    at least the optimizer's host time; Llama 2 7B's device work hides it."""
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    for model, host_bound in (("small-4l-256", True), ("llama2-7b", False)):
        m = get_preset(model)
        plan = _plan(framework, zero)
        bare = dataclasses.replace(plan, host_mechanisms=tuple(
            n for n in plan.host_mechanisms if n not in names))
        assert set(names) & set(plan.host_mechanisms) == set(names) - {
            OPT if zero else DIST}
        a, b = simulate(m, plan, cl, prof), simulate(m, bare, cl, prof)
        if host_bound:
            assert a.breakdown.optimizer_s > b.breakdown.optimizer_s
            assert a.step_time_s - b.step_time_s >= 0.9 * (a.breakdown.optimizer_s
                                                           - b.breakdown.optimizer_s)
        else:
            assert a.step_time_s == pytest.approx(b.step_time_s, rel=2e-3)


TIMER = "deepspeed_throughput_timer"


def test_deepspeed_s_throughput_timer_waits_before_every_forward():
    """The engine's synchronising throughput timer (a source reading): the host issues no
    micro-batch's forward before the device has finished the one before, so GPT-2 124M at
    micro-batch 1 on 8 A100, whose host and device times per pass are close, is slower with
    it over 4 micro-batches, by less than the host time it stops overlapping; not under
    DeepSpeed's pipeline engine, which loads its own batches."""
    t = HOST.mechanisms[TIMER]
    assert t.sync_before_fwd and t.only_without_pp
    for zero in (0, 1, 2, 3):
        assert TIMER in _plan("deepspeed", zero).host_mechanisms
    piped = with_framework(Plan(dp=4, pp=2, micro_batch=1, global_batch=8, precision="bf16"),
                           "deepspeed")
    assert TIMER not in piped.host_mechanisms
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    m = get_preset("gpt2-124m")
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=32, precision="bf16"),
                          "deepspeed")
    bare = dataclasses.replace(plan, host_mechanisms=tuple(
        n for n in plan.host_mechanisms if n != TIMER))
    a, b = simulate(m, plan, cl, prof), simulate(m, bare, cl, prof)
    assert a.step_time_s > 1.02 * b.step_time_s
    assert a.step_time_s - b.step_time_s < a.breakdown.host_s
