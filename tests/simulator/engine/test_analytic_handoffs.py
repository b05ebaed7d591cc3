"""The analytic engine prices pipeline hand-offs and each stage's gradient-reduction tail
as the event engine plays them (``engine.handoff``, ``simulate._stage_tail``)."""
from __future__ import annotations

import dataclasses

import hardware_db
import pytest

from simulator.engine.handoff import handoffs_per_mb
from simulator.engine.simulate import simulate
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset


@pytest.mark.parametrize("pp, vpp, expect", [
    (4, 1, [(1, 1), (2, 2), (2, 2), (1, 1)]),
    # interleaved: the first virtual stage's backward and the last one's forward stay home
    (4, 2, [(3, 3), (4, 4), (4, 4), (3, 3)]),
    (1, 1, [(0, 0)])])
def test_handoffs_per_micro_batch(pp, vpp, expect):
    plan = Plan(pp=pp, vpp=vpp, global_batch=8, schedule="interleaved" if vpp > 1 else "1f1b")
    assert [handoffs_per_mb(plan, s) for s in range(pp)] == expect


PROF = hardware_db.load_profile("h100-sxm")


@pytest.mark.parametrize("framework, blocking", [
    ("megatron-core", True), ("megatron-core", False), ("megatron-deepspeed", True)])
def test_analytic_matches_the_event_engine_on_pipelines(framework, blocking):
    """Llama-2-13B, TP 8 x PP 4 x DP 12 on 384 H100s over InfiniBand: blocking sends
    (Megatron without virtual stages), overlapped ones, DeepSpeed's rendezvous. Before the
    hand-offs and the per-stage tails were priced, the analytic step was 7.6 % short of the
    event engine's on the Megatron-Core H100 rows with blocking sends."""
    model = get_preset("llama2-13b")
    cluster = hardware_db.build_cluster("h100-sxm", 384)
    plan = with_framework(Plan(tp=8, pp=4, dp=12, micro_batch=1, global_batch=192,
                               precision="bf16"), framework)
    plan = dataclasses.replace(plan, pp_blocking_p2p=blocking)
    ev = simulate(model, plan, cluster, PROF, engine="event").step_time_s
    an = simulate(model, plan, cluster, PROF, engine="analytic").step_time_s
    assert an == pytest.approx(ev, rel=0.03)


def test_blocking_sends_cost_the_analytic_step_their_stream_time():
    model = get_preset("llama2-13b")
    cluster = hardware_db.build_cluster("h100-sxm", 32)
    plan = with_framework(Plan(tp=8, pp=4, dp=1, micro_batch=1, global_batch=32,
                               precision="bf16"), "megatron-core")
    free = simulate(model, dataclasses.replace(plan, pp_blocking_p2p=False), cluster, PROF,
                    engine="analytic")
    held = simulate(model, dataclasses.replace(plan, pp_blocking_p2p=True), cluster, PROF,
                    engine="analytic")
    assert held.step_time_s > free.step_time_s
    assert held.breakdown.pp_comm_s > 0 and free.breakdown.pp_comm_s == 0


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-deepspeed", "megatron-lm"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_unequal_stages_and_few_micro_batches(framework, schedule):
    """Llama-2-7B cut to 8 layers over 8 stages with 8 micro-batches: the last stage holds
    the output layer, so the stages are unequal and the fill and drain run through each at
    its own pace, sum_s (F_s + B_s) + (m - 1) t_slowest. The earlier closed form,
    (m + pp - 1) t_slowest, was 23 % above the event engine here."""
    model = dataclasses.replace(get_preset("llama2-7b"), n_layers=8)
    cluster = hardware_db.build_cluster("h100-sxm", 32)
    plan = with_framework(Plan(tp=2, pp=8, dp=2, micro_batch=1, global_batch=16,
                               precision="bf16", schedule=schedule), framework)
    ev = simulate(model, plan, cluster, PROF, engine="event")
    an = simulate(model, plan, cluster, PROF, engine="analytic")
    # DeepSpeed runs neither GPipe's nor ZB-H1's order with its rendezvous exactly as the
    # closed form assumes; ZB-H1's W passes fill the drain only approximately
    tol = {("megatron-deepspeed", "gpipe"): 0.08, ("megatron-deepspeed", "zb-h1"): 0.10}.get(
        (framework, schedule), 0.05 if schedule == "zb-h1" else 0.015)
    assert an.step_time_s == pytest.approx(ev.step_time_s, rel=tol)
    assert sum(an.breakdown.as_dict().values()) == pytest.approx(an.step_time_s)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_zb_h1_with_fewer_micro_batches_than_stages(m):
    """ZB-H1 defers one W per later micro-batch into the drain: with m < pp only m - 1 of
    them (a review found -41 % at m = 1 when pp - 1 were credited)."""
    model = dataclasses.replace(get_preset("llama2-7b"), n_layers=8)
    cluster = hardware_db.build_cluster("h100-sxm", 8)
    plan = with_framework(Plan(tp=1, pp=8, dp=1, micro_batch=1, global_batch=m,
                               precision="bf16", schedule="zb-h1"), "megatron-core")
    ev = simulate(model, plan, cluster, PROF, engine="event").step_time_s
    an = simulate(model, plan, cluster, PROF, engine="analytic").step_time_s
    assert an == pytest.approx(ev, rel=0.03)
