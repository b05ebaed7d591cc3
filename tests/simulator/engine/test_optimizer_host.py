"""The host time of the optimizer step (frameworks.json "host" mechanisms
``optimizer_foreach``, ``optimizer_fused``, ``optimizer_dtensor_foreach``,
``optimizer_dtensor_fused`` (what DTensors add), ``optimizer_decoupled_adamw``;
``cost.host.optimizer_host``;
``engine.step.optimizer_time_s``): each coefficient is the sum of the medians of the CPU
rows its source cites (``calibrate.bench_optimizer_warm``: each piece timed after its own
model's backward, as a training loop runs it; the tight loop's rows are not used), the
count of tensors follows the optimizer's parameters (FSDP1's flat units), and the step's optimizer phase is the longer
of the device's passes and the host's issuing, or both in series where the host reads a
device scalar per tensor. Needs neither torch nor a GPU."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

import hardware_db
from simulator.cost.host import optimizer_host
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.engine.step import optimizer_time_s
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

STEP, FUSED, DT, DEC = ("optimizer_step_foreach", "optimizer_step_fused",
                        "optimizer_step_fsdp2_dtensor", "optimizer_step_decoupled_adamw")
W = "warm: "    # the warm protocol's rows (calibrate.bench_optimizer_warm): after a backward
CLIP_FIXED = (STEP, W + "per step, fixed, clip_grad_norm_")
CLIP_TENSOR = (STEP, W + "per parameter tensor, clip_grad_norm_, CUDA estimate "
                         "(CPU slow path removed)")
CUDA = W + "per parameter tensor, step, CUDA estimate (CPU slow path removed)"
# mechanism: (rows summed into the fixed cost, rows summed into the per-tensor cost)
PARTS = {
    "optimizer_foreach": ([(STEP, W + "per step, fixed"), CLIP_FIXED],
                          [(STEP, CUDA), CLIP_TENSOR]),
    "optimizer_fused": ([(FUSED, W + "per step, fixed"), CLIP_FIXED],
                        [(FUSED, CUDA), CLIP_TENSOR]),
    "optimizer_dtensor_foreach": (
        [(DT, W + "per step, fixed, step, DTensor minus plain"),
         (DT, W + "per step, fixed, clip_grad_norm_, DTensor minus plain")],
        [(DT, W + "per parameter tensor, step, DTensor minus plain"),
         (DT, W + "per parameter tensor, clip_grad_norm_, DTensor minus plain")]),
    "optimizer_dtensor_fused": (
        [(DT, W + "per step, fixed, fused step, DTensor minus plain"),
         (DT, W + "per step, fixed, clip_grad_norm_, DTensor minus plain")],
        [(DT, W + "per parameter tensor, fused step, DTensor minus plain"),
         (DT, W + "per parameter tensor, clip_grad_norm_, DTensor minus plain")]),
    "optimizer_decoupled_adamw": ([(DEC, W + "per step, fixed"), CLIP_FIXED],
                                  [(DEC, W + "per parameter tensor, step"), CLIP_TENSOR]),
}


def _median(rows: dict[int, dict[str, str]], mechanism: str,
            metric: str) -> tuple[float, list[int]]:
    """Median eager ops of the three runs' rows, and their CSV lines (header = line 1)."""
    runs = [(line, float(r["eager_ops"])) for line, r in rows.items()
            if r["mechanism"] == mechanism and r["metric"] == metric]
    assert len(runs) == 3, (mechanism, metric)
    return statistics.median(v for _, v in runs), [ln for ln, _ in runs]


@pytest.mark.parametrize("name", sorted(PARTS))
def test_coefficients_are_sums_of_the_medians_their_source_cites(name, host_mechanism_rows):
    m = HOST.mechanisms[name]
    for field, parts in zip(("optimizer_fixed_eager_ops", "optimizer_tensor_eager_ops"),
                            PARTS[name]):
        total = 0.0
        for mech, metric in parts:
            v, lines = _median(host_mechanism_rows, mech, metric)
            total += v
            assert f"{lines[0]}, {lines[1]}, {lines[2]}" in m.why, (name, metric)
        assert getattr(m, field) == pytest.approx(total, abs=0.002), (name, field)
    assert m.optimizer_sync_per_tensor == (name == "optimizer_decoupled_adamw")


def test_host_time_is_fixed_plus_per_tensor_and_fsdp1_counts_units():
    prof = hardware_db.load_profile("h100-sxm")
    us = prof.host.op_fwd_us.value * 1e-6
    m = HOST.mechanisms["optimizer_foreach"]
    h, sync = optimizer_host(("optimizer_foreach",), 100, 7, prof)
    assert h.seconds == pytest.approx((m.optimizer_fixed_eager_ops
                                       + 100 * m.optimizer_tensor_eager_ops) * us)
    assert not sync
    flat, _ = optimizer_host(("fsdp1_unit", "optimizer_foreach"), 100, 7, prof)
    assert flat.seconds == pytest.approx((m.optimizer_fixed_eager_ops
                                          + 7 * m.optimizer_tensor_eager_ops) * us)
    _, sync = optimizer_host(("fsdp1_unit", "optimizer_decoupled_adamw"), 100, 7, prof)
    assert sync
    assert optimizer_host((), 100, 7, prof)[0].seconds == 0.0


def _chunks(framework: str, model="small-6l-512", gpus=8):
    m = get_preset(model)
    cl = hardware_db.build_cluster("h100-sxm", gpus)
    prof = hardware_db.load_profile("h100-sxm")
    plan = with_framework(Plan(dp=gpus, micro_batch=4, global_batch=4 * gpus,
                               precision="bf16"), framework)
    groups = place_groups(cl, plan)
    stages = build_chunks(m, plan, cl, prof, groups)
    return m, plan, cl, prof, stages[0]


@pytest.mark.parametrize("framework, mechanism", [("fsdp2", "optimizer_dtensor_foreach"),
                                                  ("torchtitan", "optimizer_dtensor_fused"),
                                                  ("llm-foundry-fsdp",
                                                   "optimizer_decoupled_adamw")])
def test_the_optimizer_phase_takes_the_host_time(framework, mechanism):
    """A small model's step: the optimizer phase is max(device, host), or device + host
    where the host syncs per tensor; the optimizer sees the chunks' tensors, or FSDP1's
    units."""
    m, plan, cl, prof, chunks = _chunks(framework)
    assert mechanism in plan.host_mechanisms
    bare = dataclasses.replace(plan, host_mechanisms=tuple(
        n for n in plan.host_mechanisms if not n.startswith("optimizer_")))
    device = optimizer_time_s(chunks, bare, cl, prof)
    host, sync = optimizer_host(plan.host_mechanisms, sum(c.param_tensors for c in chunks),
                                sum(c.units for c in chunks), prof)
    assert host.seconds > device                      # host-bound at this size
    want = device + host.seconds if sync else host.seconds
    assert optimizer_time_s(chunks, plan, cl, prof) == pytest.approx(want)
    if framework == "llm-foundry-fsdp":       # one flat parameter per block and the root
        assert sum(c.units for c in chunks) == m.n_layers + 1
    else:                                     # every weight (and bias) of every layer
        assert sum(c.param_tensors for c in chunks) > 6 * m.n_layers
    a, b = simulate(m, plan, cl, prof), simulate(m, bare, cl, prof)
    assert a.step_time_s > b.step_time_s
    assert a.breakdown.optimizer_s == pytest.approx(want, rel=1e-6)


def test_a_large_model_hides_the_host_behind_the_device():
    """Llama-2 7B on 8 GPUs under FSDP2: the device's optimizer passes over its 1/8 of 6.7 B
    parameters take longer than issuing them, so the phase is the device's."""
    m, plan, cl, prof, chunks = _chunks("fsdp2", "llama2-7b")
    bare = dataclasses.replace(plan, host_mechanisms=())
    assert optimizer_time_s(chunks, plan, cl, prof) == optimizer_time_s(chunks, bare, cl, prof)


def test_zero_stages_and_synchronous_hosts():
    """DTensor's extra exists only under FSDP2 (ZeRO-3); at ZeRO-1/2 the optimizer is
    DeepSpeed's (none charged); a synchronous host (a CPU profile) runs the step's host work
    and its kernels in series."""
    base = Plan(dp=8, micro_batch=4, global_batch=32, precision="bf16")
    ddp = with_framework(dataclasses.replace(base, zero_stage=0), "torchtitan", {"zero_stage"})
    assert ddp.host_mechanisms == ("optimizer_fused", "torchtitan_batch_copy")
    for z in (1, 2):
        zero = with_framework(dataclasses.replace(base, zero_stage=z), "hf", {"zero_stage"})
        assert not any(n.startswith("optimizer_") for n in zero.host_mechanisms), z
    m, plan, cl, prof, chunks = _chunks("fsdp2")
    sync = dataclasses.replace(prof, host=dataclasses.replace(prof.host, synchronous=True))
    bare = dataclasses.replace(plan, host_mechanisms=())
    host, _ = optimizer_host(plan.host_mechanisms, sum(c.param_tensors for c in chunks),
                             sum(c.units for c in chunks), sync)
    assert optimizer_time_s(chunks, plan, cl, sync) == pytest.approx(
        optimizer_time_s(chunks, bare, cl, sync) + host.seconds)


def test_a_tied_or_shared_output_layer_is_one_tensor():
    """The optimizer sees a tied embedding / output layer once: GPT-2 (tied) holds one
    tensor fewer at its edges than the same model untied."""
    gpt2 = get_preset("gpt2-124m")
    assert gpt2.tied_embeddings
    cl = hardware_db.build_cluster("h100-sxm", 8)
    prof = hardware_db.load_profile("h100-sxm")
    plan = with_framework(Plan(dp=8, micro_batch=4, global_batch=32, precision="bf16"), "hf")
    groups = place_groups(cl, plan)

    def tensors(spec):
        return sum(c.param_tensors for c in build_chunks(spec, plan, cl, prof, groups)[0])
    assert tensors(dataclasses.replace(gpt2, tied_embeddings=False)) == tensors(gpt2) + 1
