"""Physical properties every prediction must satisfy, checked over many plans."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.engine.simulate import simulate
from simulator.errors import InvalidInputError
from simulator.network.collectives import Collective, ring_steps_and_traffic
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec

MODEL = TransformerSpec("prop-gpt", n_layers=8, hidden=1024, ffn_hidden=4096, n_heads=16,
                        n_kv_heads=16, vocab=32000, seq_len=1024)
PROFILE = hardware_db.load_profile("h100-sxm")
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def plans(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4]))
    mb = draw(st.sampled_from([1, 2]))
    m = draw(st.sampled_from([1, 2, 4, 8]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 and m % pp == 0 else 1
    return Plan(tp=tp, pp=pp, dp=dp, micro_batch=mb, global_batch=mb * dp * m, vpp=vpp,
                schedule="interleaved" if vpp > 1 else "1f1b",
                sequence_parallel=draw(st.booleans()) and tp > 1,
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                zero_stage=draw(st.sampled_from([0, 1, 3])),
                dp_overlap=draw(st.booleans()))


def cluster(n, nic_gbps=None, gpu="h100-sxm"):
    return hardware_db.build_cluster(gpu, n, nic_gbits_per_s=nic_gbps)


def with_peak(cl, factor):
    gpu = dataclasses.replace(cl.gpu, peak_tflops={k: v * factor for k, v in cl.gpu.peak_tflops.items()})
    return dataclasses.replace(cl, gpu=gpu)


def with_scale_up_bw(cl, factor):
    su = dataclasses.replace(cl.node.scale_up,
                             bandwidth_gbytes_per_s=cl.node.scale_up.bandwidth_gbytes_per_s * factor)
    return dataclasses.replace(cl, node=dataclasses.replace(cl.node, scale_up=su))


@SETTINGS
@given(plans())
def test_more_network_bandwidth_is_never_slower(p):
    n = p.world_size
    if n < 16:                            # make sure the NIC matters: more than one node
        p = dataclasses.replace(p, dp=p.dp * (16 // n), global_batch=p.global_batch * (16 // n))
        n = 16
    slow = simulate(MODEL, p, cluster(n, 200), PROFILE).step_time_s
    fast = simulate(MODEL, p, cluster(n, 800), PROFILE).step_time_s
    assert fast <= slow * (1 + 1e-9)


@SETTINGS
@given(plans())
def test_more_scale_up_bandwidth_is_never_slower(p):
    cl = cluster(p.world_size)
    slow = simulate(MODEL, p, cl, PROFILE).step_time_s
    fast = simulate(MODEL, p, with_scale_up_bw(cl, 2.0), PROFILE).step_time_s
    assert fast <= slow * (1 + 1e-9)


@SETTINGS
@given(plans())
def test_more_peak_flops_is_never_slower(p):
    cl = cluster(p.world_size)
    slow = simulate(MODEL, p, cl, PROFILE).step_time_s
    fast = simulate(MODEL, p, with_peak(cl, 1.5), PROFILE).step_time_s
    assert fast <= slow * (1 + 1e-9)


@SETTINGS
@given(plans())
def test_step_is_at_least_the_per_rank_compute(p):
    """Lower bound: the busiest stage must at least run all its micro-batches' compute."""
    r = simulate(MODEL, p, cluster(p.world_size), PROFILE)
    assert r.step_time_s >= r.breakdown.compute_s * (1 - 1e-9)
    parts = r.breakdown.as_dict()
    assert sum(parts.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert all(v >= -1e-9 for v in parts.values())


@SETTINGS
@given(plans())
def test_memory_grows_with_micro_batch(p):
    cl = cluster(p.world_size)
    small = simulate(MODEL, dataclasses.replace(p, micro_batch=1, global_batch=p.dp * 8),
                     cl, PROFILE)
    big = simulate(MODEL, dataclasses.replace(p, micro_batch=4, global_batch=p.dp * 32),
                   cl, PROFILE)
    assert max(big.peak_memory_bytes) > max(small.peak_memory_bytes)


@SETTINGS
@given(plans())
def test_deterministic_same_bytes_out(p):
    cl = cluster(p.world_size)
    a = json.dumps(simulate(MODEL, p, cl, PROFILE).to_dict() | {"sim_wall_s": 0}, sort_keys=True)
    b = json.dumps(simulate(MODEL, p, cl, PROFILE).to_dict() | {"sim_wall_s": 0}, sort_keys=True)
    assert a == b


@given(st.sampled_from(list(Collective)), st.integers(2, 64), st.floats(1.0, 1e10))
def test_ring_bytes_sent_equal_bytes_received(op, n, size):
    """Every rank of a ring sends what its neighbour receives: the per-rank traffic times the
    ranks equals the total the collective must move (all-reduce: 2(n-1)/n of the buffer
    per rank; gather/scatter: (n-1)/n)."""
    steps, per_rank = ring_steps_and_traffic(op, n, size)
    if op == Collective.SEND_RECV:
        assert per_rank == size
        return
    sent = per_rank * n
    received = {Collective.ALL_REDUCE: 2 * (n - 1) * size, Collective.ALL_GATHER: (n - 1) * size,
                Collective.REDUCE_SCATTER: (n - 1) * size, Collective.ALL_TO_ALL: (n - 1) * size}[op]
    assert sent == pytest.approx(received)
    assert steps >= 1


def test_event_and_analytic_engines_agree_without_contention():
    """No pipeline, no data parallelism: nothing contends, the two engines must agree."""
    p = Plan(tp=2, pp=1, dp=1, micro_batch=2, global_batch=8)
    cl = cluster(2)
    ev = simulate(MODEL, p, cl, PROFILE, engine="event").step_time_s
    an = simulate(MODEL, p, cl, PROFILE, engine="analytic").step_time_s
    assert ev == pytest.approx(an, rel=1e-9)


def test_pipeline_bubble_emerges_from_the_schedule():
    """With equal stages 1F1B takes (m + p - 1) slots; the event engine must reproduce it."""
    p = Plan(tp=1, pp=4, dp=1, micro_batch=1, global_batch=8)
    r = simulate(MODEL, p, cluster(4), PROFILE)
    m, pp = 8, 4
    assert r.breakdown.bubble_s > 0
    ideal = r.breakdown.compute_s * (m + pp - 1) / m
    assert r.step_time_s >= ideal * 0.95


@pytest.mark.parametrize("kw, field", [
    (dict(tp=3), "tp"),                                   # 16 heads not divisible by 3
    (dict(pp=16, dp=1, tp=1), "pp"),                      # 16 stages > 8 layers
    (dict(dp=2, global_batch=3), "global_batch"),         # 3 not a multiple of mb*dp
    (dict(tp=2, dp=1, vpp=2), "vpp"),                     # vpp without interleaved schedule
    (dict(ep=2, dp=2, global_batch=2), "ep"),             # experts on a dense model
    (dict(zero_stage=5), "zero_stage"),
    (dict(precision="int4"), "precision"),
])
def test_invalid_plans_raise_one_typed_error_naming_the_field(kw, field):
    base = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=4)
    base.update(kw)
    with pytest.raises(InvalidInputError) as exc:
        p = Plan(**base)
        simulate(MODEL, p, cluster(p.world_size), PROFILE)
    assert exc.value.field == field
    assert field in str(exc.value)


def test_plan_that_does_not_match_gpu_count_names_dp():
    with pytest.raises(InvalidInputError) as exc:
        simulate(MODEL, Plan(tp=2, dp=1, global_batch=4), cluster(8), PROFILE)
    assert exc.value.field == "dp"


@SETTINGS
@given(plans(), st.floats(1.0, 24.0))
def test_gradient_accumulation_pass_is_never_faster(p, bytes_per_param):
    """An extra per-micro-batch accumulation pass (DeepSpeed BF16_Optimizer) only adds
    time."""
    cl = cluster(p.world_size)
    base = simulate(MODEL, p, cl, PROFILE)
    slow = simulate(MODEL, dataclasses.replace(p, grad_accum_bytes_per_param=bytes_per_param),
                    cl, PROFILE)
    assert slow.step_time_s >= base.step_time_s * (1 - 1e-12)


def test_zero1_as_allreduce_moves_more_bytes_than_reduce_scatter():
    p = Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, zero_stage=1, dp_overlap=False)
    cl = cluster(8)
    rs = simulate(MODEL, p, cl, PROFILE)
    ar = simulate(MODEL, dataclasses.replace(p, zero1_allreduce=True), cl, PROFILE)
    assert ar.breakdown.dp_comm_s > rs.breakdown.dp_comm_s
    assert ar.step_time_s > rs.step_time_s


def test_negative_grad_accumulation_bytes_name_the_field():
    with pytest.raises(InvalidInputError) as exc:
        Plan(grad_accum_bytes_per_param=-1.0)
    assert exc.value.field == "grad_accum_bytes_per_param"
