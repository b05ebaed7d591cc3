"""Megatron-LM's training loop around the model (frameworks.json "host" mechanism
``mcore_train_loop``): each coefficient is the arithmetic its source states on the medians
of the CPU rows it cites (``calibrate.bench_mcore_loop``), charged where the loop runs it
(the schedule on every chunk, get_batch on the embedding's, the loss on the output layer's,
the per-step part with the optimizer step). Needs neither torch nor a GPU."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

import hardware_db
from simulator.cost.host import loop_lead_host, model_host, optimizer_host
from simulator.engine.simulate import simulate
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

LOOP = "mcore_train_loop"


def _cited(rows, why: str, metric: str) -> float:
    runs = [(line, float(r["eager_ops"])) for line, r in rows.items()
            if r["mechanism"] == LOOP and r["metric"] == metric]
    assert len(runs) == 3, metric
    assert f"{runs[0][0]}, {runs[1][0]}, {runs[2][0]}" in why, metric
    return statistics.median(v for _, v in runs)


def test_coefficients_follow_the_cited_medians(host_mechanism_rows):
    m = HOST.mechanisms[LOOP]
    rows, why = host_mechanism_rows, m.why
    schedule = next(k for k in {r["metric"] for r in rows.values() if r["mechanism"] == LOOP}
                    if k.startswith("schedule (forward_backward_no_pipelining"))
    assert m.model_every_fwd_eager_ops == pytest.approx(_cited(rows, why, schedule), abs=1e-3)
    get_batch = _cited(rows, why, "get_batch alone, TP source rank, num_workers 0 "
                                  "(next + 5 copies + 5 broadcasts)")
    step = _cited(rows, why, "forward_step + get_batch (workers 0) + loss_func fwd and bwd "
                             "beyond a trivial step, in the schedule, per micro-batch")
    average_mb = _cited(rows, why, "train_step loss averaging (last stage), per micro-batch")
    real = _cited(rows, why, "check: script's step over trivial per micro-batch with the real "
                             "model (4)")
    # the real model's excess over the stand-in forward is get_batch's (its source says why)
    assert m.mb_lead_fwd_eager_ops == pytest.approx(get_batch + real - step, abs=2e-3)
    assert m.model_first_fwd_eager_ops == 0.0
    assert m.model_fwd_eager_ops == pytest.approx(step - get_batch + average_mb, abs=2e-3)
    per_step = _cited(rows, why, "schedule, per step (finalize_model_grads and no_sync "
                                 "excluded)") \
        + _cited(rows, why, "train_step loss averaging (last stage), per step")
    assert m.optimizer_fixed_eager_ops == pytest.approx(per_step, abs=2e-3)


def test_where_the_loop_is_charged():
    prof = hardware_db.load_profile("h100-sxm")
    m = HOST.mechanisms[LOOP]
    us = prof.host.op_fwd_us.value * 1e-6
    f = {(first, last): model_host((LOOP,), prof, "eager", first, last)[0].seconds
         for first in (False, True) for last in (False, True)}
    assert f[(False, False)] == pytest.approx(m.model_every_fwd_eager_ops * us)
    assert f[(True, False)] == pytest.approx(f[(False, False)])    # get_batch is lead work
    assert loop_lead_host((LOOP,), prof, 12).seconds == pytest.approx(
        m.mb_lead_fwd_eager_ops * us)
    compiled = model_host((LOOP,), prof, "compiled", False, False)[0].seconds
    assert compiled < f[(False, False)]                     # scaled; the lead is not
    assert f[(False, True)] - f[(False, False)] == pytest.approx(m.model_fwd_eager_ops * us)
    assert optimizer_host((LOOP,), 100, 1, prof)[0].seconds == pytest.approx(
        m.optimizer_fixed_eager_ops * us)
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=64, precision="bf16"),
                          "megatron-core")
    assert LOOP in plan.host_mechanisms
    for other in ("nemo", "megatron-lm", "torchtitan"):
        assert LOOP not in with_framework(plan, other).host_mechanisms, other


def test_a_host_bound_step_slows():
    m = get_preset("gpt2-124m")
    cl = hardware_db.build_cluster("h100-sxm", 8)
    prof = hardware_db.load_profile("h100-sxm")
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=64, precision="bf16"),
                          "megatron-core")
    bare = dataclasses.replace(plan, host_mechanisms=tuple(
        n for n in plan.host_mechanisms if n != LOOP))
    a, b = simulate(m, plan, cl, prof), simulate(m, bare, cl, prof)
    assert a.step_time_s > b.step_time_s
