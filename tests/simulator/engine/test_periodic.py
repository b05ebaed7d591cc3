"""The periodic fast path of the event engine (``engine.periodic``) against the reference
path that plays every micro-batch: random small plans (hypothesis) with every schedule,
blocking and overlapped pipeline sends sharing links with gradient buckets (contention),
DP overlap on and off, ZeRO stages and MoE; every reported number within 0.1 % (in practice
the plays are exact to rounding), and the fast path taken where the schedule repeats."""
from __future__ import annotations

from dataclasses import replace

import dataclasses
import importlib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.engine import periodic
from simulator.engine.simulate import simulate
from simulator.errors import ComplexityError
from simulator.parallel.plan import Plan, validate
from simulator.workload import TransformerSpec
from simulator.workload.spec import MoESpec

_MODELS = (
    TransformerSpec("gpt-small", n_layers=12, hidden=1024, ffn_hidden=4096, n_heads=16,
                    n_kv_heads=16, vocab=32000, seq_len=1024),
    TransformerSpec("moe-small", n_layers=8, hidden=512, ffn_hidden=1408, n_heads=8,
                    n_kv_heads=8, vocab=32000, seq_len=1024, mlp="swiglu",
                    moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=1408)),
)
_PROFILES = {g: hardware_db.load_profile(g) for g in ("a100-sxm-80gb", "h100-sxm")}
REL = 1e-3


@pytest.fixture(autouse=True)
def _every_plan_long_enough(monkeypatch):
    """Small plans take the periodic path too (the thresholds only save time), rather than
    one sweep of the whole plan (``simulate.SWEEP_ROUNDS``)."""
    monkeypatch.setattr(periodic, "MIN_PASSES", 0)
    monkeypatch.setattr(importlib.import_module("simulator.engine.simulate"), "SWEEP_ROUNDS", 0)


def _numbers(r) -> dict[str, float]:
    out = {"step_time_s": r.step_time_s, "mfu": r.mfu, "busy_s": r.stages[r.critical_stage].busy_s,
           "critical_stage": r.critical_stage}
    out.update(r.breakdown.as_dict())
    return out


def _agree(fast, ref) -> None:
    a, b = _numbers(fast), _numbers(ref)
    scale = ref.step_time_s
    for k in a:
        assert abs(a[k] - b[k]) <= REL * max(abs(b[k]), scale if k.endswith("_s") else 0), k
    assert fast.peak_memory_bytes == ref.peak_memory_bytes


@st.composite
def _cases(draw):
    model = draw(st.sampled_from(_MODELS))
    gpu = draw(st.sampled_from(sorted(_PROFILES)))
    pp = draw(st.sampled_from((1, 2, 4)))
    vpp = draw(st.sampled_from((1, 2)))
    tp, dp = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    rounds = draw(st.integers(periodic.MIN_ROUNDS, periodic.MIN_ROUNDS + 6))
    plan = Plan(tp=tp, pp=pp, dp=dp, ep=min(dp, 2) if model.moe else 1, vpp=vpp,
                global_batch=rounds * pp * dp, sequence_parallel=tp > 1,
                schedule="interleaved" if vpp > 1 else draw(st.sampled_from(("1f1b", "gpipe"))),
                recompute=draw(st.sampled_from(("none", "full"))),
                zero_stage=draw(st.sampled_from((0, 1))), dp_overlap=draw(st.booleans()),
                pp_blocking_p2p=draw(st.booleans()), tp_overlap=draw(st.booleans()))
    n = plan.world_size
    cluster = make_cluster(gpu, n, min(n, draw(st.sampled_from((2, 8)))), None, None, None,
                           None, None, 1.0)
    try:
        validate(plan, model, cluster)
    except ComplexityError:
        assume(False)
    return model, plan, cluster, _PROFILES[gpu]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_fast_path_agrees_with_the_reference(case):
    model, plan, cluster, prof = case
    _agree(simulate(model, plan, cluster, prof), simulate(model, plan, cluster, prof, periodic=False))


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("vpp", [1, 2])
def test_fast_path_is_taken_and_exact_where_the_schedule_repeats(blocking, vpp, monkeypatch):
    model = _MODELS[0]
    plan = Plan(tp=2, pp=4, dp=2, vpp=vpp, global_batch=2 * 4 * periodic.MIN_ROUNDS,
                schedule="interleaved" if vpp > 1 else "1f1b", pp_blocking_p2p=blocking,
                sequence_parallel=True, zero_stage=1)
    cluster = make_cluster("h100-sxm", 16, 8, None, None, None, None, None, 1.0)
    prof = _PROFILES["h100-sxm"]
    calls = []
    real = periodic.periodic_event_step
    monkeypatch.setattr(importlib.import_module("simulator.engine.simulate"), "periodic_event_step",
                        lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    fast = simulate(model, plan, cluster, prof)
    assert calls and calls[0] is not None
    ref = simulate(model, plan, cluster, prof, periodic=False)
    assert fast.step_time_s == pytest.approx(ref.step_time_s, rel=1e-9)
    _agree(fast, ref)


def test_a_line_below_a_resource_s_work_is_not_extended():
    """A host slower than the device (a100 profile's host model, MoE, overlapped sends): the
    step grows along the device's line up to 8 micro-batches, then by the host's own work
    per 2 micro-batches. Three affine plays at 4, 6, 8 must not be extended (their slope is
    below the host stream's work per period). The heads and the expert width are chosen so
    that the device line holds to 8 micro-batches (re-pick them when the MoE or attention
    ops change: the attention grid fill moved the line, and so did the dispatcher's TP
    collectives becoming exposed; expert width 768 with 16 heads holds it now)."""
    model, prof = _MODELS[1], _PROFILES["a100-sxm-80gb"]
    model = replace(model, n_heads=16, n_kv_heads=16, head_dim=0,
                    moe=replace(model.moe, expert_ffn_hidden=768))
    cluster = make_cluster("a100-sxm-80gb", 8, 2, None, None, None, None, None, 1.0)
    plan = Plan(tp=2, pp=2, dp=2, ep=2, vpp=2, global_batch=48, sequence_parallel=True,
                recompute="full", schedule="interleaved", dp_overlap=False, tp_overlap=True,
                pp_blocking_p2p=False)
    _agree(simulate(model, plan, cluster, prof), simulate(model, plan, cluster, prof, periodic=False))
    sim = importlib.import_module("simulator.engine.simulate")
    works = []
    for m in (4, 6, 8):
        work: dict = {}
        p = periodic.truncated(plan, m)
        groups = sim.place_groups(cluster, p)
        stages = sim.build_chunks(model, p, cluster, prof, groups)
        works.append(sim._event_step(stages, model, p, cluster, prof, groups, work=work)[:4] + (work,))
    assert periodic._on_a_line(works) and not periodic._saturated(works[-2:])


def test_short_or_timeline_plans_play_in_full():
    model = _MODELS[0]
    plan = Plan(pp=4, dp=1, global_batch=4 * (periodic.MIN_ROUNDS - 1))
    assert periodic.periodic_event_step(plan, model, None, lambda p: 1 / 0) is None
    periodic.MIN_PASSES = 10 ** 9                # (restored by the fixture)
    long = dataclasses.replace(plan, global_batch=4 * periodic.MIN_ROUNDS)
    assert periodic.periodic_event_step(long, model, None, lambda p: 1 / 0) is None
    cluster = make_cluster("h100-sxm", 4, 4, None, None, None, None, None, 1.0)
    r = simulate(model, long, cluster, _PROFILES["h100-sxm"], keep_timeline=True)
    assert r.timeline                       # the whole step was played
