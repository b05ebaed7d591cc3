"""Pipeline load balance (``engine.balance``): the step is never shorter than the busiest
stage's own work, and a report names that stage when it is not the one whose breakdown
is shown."""
from __future__ import annotations

import hardware_db
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.balance import imbalance, stage_work_s
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset

H100 = hardware_db.load_profile("h100-sxm")


def _chunks(model, plan, cluster):
    return build_chunks(model, plan, cluster, H100, place_groups(cluster, plan))


@settings(max_examples=12, deadline=None)
@given(pp=st.sampled_from([2, 4, 8]), layers=st.integers(8, 40), mbs=st.integers(1, 24))
def test_step_is_at_least_the_busiest_stages_work(pp, layers, mbs):
    model = get_preset("llama2-7b")
    model = type(model)(**{**model.__dict__, "n_layers": max(layers, pp)})
    cluster = hardware_db.build_cluster("h100-sxm", 8 * pp)
    plan = with_framework(Plan(tp=8, pp=pp, dp=1, micro_batch=1, global_batch=mbs,
                               precision="bf16"), "megatron-core")
    res = simulate(model, plan, cluster, H100)
    work = stage_work_s(_chunks(model, plan, cluster), plan)
    assert res.step_time_s >= max(work) * (1 - 1e-9)


def test_dense_first_stage_names_the_moe_stage_as_slowest():
    """DeepSeek-V3 at pp 16: stage 0 (three dense layers) finishes last in 1F1B, so its
    breakdown is shown and is mostly bubble; the MoE stages carry the work, and the report
    names the busiest one with its EP communication."""
    model = get_preset("deepseek-v3")
    cluster = hardware_db.build_cluster("h800", 2048)
    prof = hardware_db.load_profile("h800")
    plan = with_framework(Plan(pp=16, dp=128, ep=64, micro_batch=1, global_batch=3840,
                               precision="fp8", recompute="full"), "megatron-core")
    res = simulate(model, plan, cluster, prof)
    load = res.slowest_stage
    assert res.critical_stage == 0 and load is not None and load.stage != 0
    chunks = build_chunks(model, plan, cluster, prof, place_groups(cluster, plan))
    work = stage_work_s(chunks, plan)
    assert load.work_s == pytest.approx(max(work))
    assert load.critical_work_s == pytest.approx(work[0])
    assert load.comm_s.get("ep", 0) > 0
    assert load.compute_s + sum(load.comm_s.values()) + load.interference_s == \
        pytest.approx(load.work_s)
    assert any(n.startswith(f"pipeline imbalance: stage {load.stage}") for n in res.notes)
    assert res.step_time_s >= load.work_s


def test_balanced_pipeline_has_no_note():
    model = get_preset("llama2-70b")               # 80 layers over 4 stages: 20 each
    cluster = hardware_db.build_cluster("h100-sxm", 32)
    plan = with_framework(Plan(tp=8, pp=4, dp=1, micro_batch=1, global_batch=32,
                               precision="bf16"), "megatron-core")
    chunks = _chunks(model, plan, cluster)
    res = simulate(model, plan, cluster, H100)
    assert imbalance(chunks, plan, res.critical_stage) is None
    assert res.slowest_stage is None


@pytest.mark.parametrize("schedule", ["dualpipe", "zb-v", "interleaved", "zb-h1"])
def test_every_schedule_holds_the_bound(schedule):
    """DualPipe and ZB-V run each of a stage's two chunks for half the micro-batches
    (``chunk_share``): the stage's work counts them once."""
    model = get_preset("llama2-7b")
    cluster = hardware_db.build_cluster("h100-sxm", 32)
    vpp = 2 if schedule in ("dualpipe", "zb-v", "interleaved") else 1
    plan = with_framework(Plan(tp=8, pp=4, dp=1, vpp=vpp, micro_batch=1, global_batch=16,
                               precision="bf16", schedule=schedule), "megatron-core")
    res = simulate(model, plan, cluster, H100)
    work = stage_work_s(_chunks(model, plan, cluster), plan)
    assert max(work) <= res.step_time_s
    assert max(work) > 0.5 * res.step_time_s          # the work is counted, not halved away
