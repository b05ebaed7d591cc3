"""The sweep (``engine.sweep``) against the event engine it stands in for: random small
plans (hypothesis) over the schedules it takes, each host model (asynchronous GPU host,
synchronous CPU host, none; FSDP's one-layer lead, Megatron's sync at pipeline hand-offs),
blocking and overlapped pipeline sends, DP overlap on and off, ZeRO stages, MoE. Where the
sweep answers, the step and its critical stage are the event engine's to rounding and every
part of the breakdown agrees; where it declines, a link really carried two flows at once
on the event engine."""
from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.engine.events import Engine
from simulator.engine.step import build_tasks
from simulator.engine.sweep import sweep_step
from simulator.errors import ComplexityError
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.plan import Plan, validate
from simulator.workload import TransformerSpec
from simulator.workload.spec import MoESpec

SIM = importlib.import_module("simulator.engine.simulate")
_MODELS = (
    TransformerSpec("gpt-small", n_layers=8, hidden=1024, ffn_hidden=4096, n_heads=16,
                    n_kv_heads=16, vocab=32000, seq_len=1024),
    TransformerSpec("moe-small", n_layers=8, hidden=512, ffn_hidden=1408, n_heads=8,
                    n_kv_heads=8, vocab=32000, seq_len=1024, mlp="swiglu",
                    moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=1408)),
)
_BASE = hardware_db.load_profile("h100-sxm")


def _profile(host: str):
    """The H100 profile with its host model as shipped, a synchronous (CPU-like) host
    slow enough to matter, or none."""
    if host == "shipped":
        return _BASE
    if host == "none":
        return dataclasses.replace(_BASE, host=None)
    c = lambda v: Coefficient(v, "us", "test")  # noqa: E731
    return dataclasses.replace(_BASE, host=HostModel(c(40.0), c(60.0), host == "sync"))


def _both(model, plan, cluster, prof):
    groups = SIM.place_groups(cluster, plan)
    stages = SIM.build_chunks(model, plan, cluster, prof, groups)
    work_s: dict[str, float] = {}
    swept = sweep_step(stages, model, plan, cluster, prof, groups, work_s)
    ref_work: dict[str, float] = {}
    eng = SIM._event_step(stages, model, plan, cluster, prof, groups, work=ref_work)
    return swept, work_s, eng, ref_work


def _agree(swept, work_s, eng, ref_work) -> None:
    step, crit, parts, busy = swept
    assert step == pytest.approx(eng[0], rel=1e-12, abs=1e-15)
    assert crit == eng[1]
    assert busy == pytest.approx(eng[3], rel=1e-12)
    for key, v in eng[2].items():
        assert parts[key] == pytest.approx(v, rel=1e-9, abs=1e-9 * step), key
    ref = {r: w for r, w in ref_work.items() if w > 0}
    assert {r: w for r, w in work_s.items() if w > 0} == pytest.approx(ref, rel=1e-9)


def _links_overlap(model, plan, cluster, prof) -> bool:
    """Whether two flows shared a link when the event engine played the plan."""
    groups = SIM.place_groups(cluster, plan)
    stages = SIM.build_chunks(model, plan, cluster, prof, groups)
    eng = Engine()
    build_tasks(eng, stages, model, plan, cluster, prof, groups)
    eng.run()
    by_link: dict[str, list[tuple[float, float]]] = {}
    for t in eng.tasks:
        if eng._kinds[t.resource] == "link" and t.end_s > t.start_s:
            by_link.setdefault(t.resource, []).append((t.start_s, t.end_s))
    return any(b[0] < a[1] - 1e-12 for fl in by_link.values()
               for a, b in zip(sorted(fl), sorted(fl)[1:], strict=False))


@st.composite
def _cases(draw):
    model = draw(st.sampled_from(_MODELS))
    pp = draw(st.sampled_from((1, 2, 4)))
    vpp = draw(st.sampled_from((1, 2)))
    tp, dp = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    mech = draw(st.sampled_from(((), ("fsdp1_unit",), ("megatron_p2p_sync",))))
    plan = Plan(tp=tp, pp=pp, dp=dp, ep=min(dp, 2) if model.moe else 1, vpp=vpp,
                global_batch=draw(st.integers(1, 6)) * pp * dp, sequence_parallel=tp > 1,
                schedule="interleaved" if vpp > 1 else draw(st.sampled_from(("1f1b", "gpipe"))),
                recompute=draw(st.sampled_from(("none", "full"))),
                zero_stage=draw(st.sampled_from((0, 1, 2))), dp_overlap=draw(st.booleans()),
                pp_blocking_p2p=draw(st.booleans()), host_mechanisms=mech)
    n = plan.world_size
    cluster = make_cluster("h100-sxm", n, min(n, draw(st.sampled_from((2, 8)))), None, None,
                           None, None, None, 1.0)
    try:
        validate(plan, model, cluster)
    except ComplexityError:
        assume(False)
    return model, plan, cluster, _profile(draw(st.sampled_from(("shipped", "sync", "none"))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_the_sweep_is_the_event_engine_or_declines(case):
    swept, work_s, eng, ref_work = _both(*case)
    if swept is None:
        assert case[1].schedule.value not in ("1f1b", "gpipe", "interleaved") \
            or _links_overlap(*case)
        return
    _agree(swept, work_s, eng, ref_work)


@pytest.mark.parametrize("host", ["shipped", "sync", "none"])
@pytest.mark.parametrize("mech", [(), ("fsdp1_unit",), ("megatron_p2p_sync",)])
@pytest.mark.parametrize("vpp", [1, 2])
def test_the_sweep_answers_megatron_like_plans(host, mech, vpp):
    """Blocking sends, buckets chained on their link: nothing shares a link, so the sweep
    must answer (a sweep that always declined would pass the property test above)."""
    model = _MODELS[0]
    plan = Plan(tp=2, pp=4, dp=2, vpp=vpp, global_batch=2 * 4 * 3,
                schedule="interleaved" if vpp > 1 else "1f1b", sequence_parallel=True,
                zero_stage=1, recompute="full", host_mechanisms=mech)
    cluster = make_cluster("h100-sxm", 16, 8, None, None, None, None, None, 1.0)
    swept, work_s, eng, ref_work = _both(model, plan, cluster, _profile(host))
    assert swept is not None
    _agree(swept, work_s, eng, ref_work)
    assert sum(swept[2].values()) == pytest.approx(swept[0], rel=1e-9)


def test_split_backward_schedules_are_left_to_the_event_engine():
    model = _MODELS[0]
    plan = Plan(pp=4, dp=1, global_batch=8, schedule="zb-h1")
    cluster = make_cluster("h100-sxm", 4, 4, None, None, None, None, None, 1.0)
    assert _both(model, plan, cluster, _BASE)[0] is None


def test_simulate_takes_the_sweep_and_keeps_the_reference_numbers():
    model = _MODELS[1]
    plan = Plan(tp=2, pp=2, dp=2, ep=2, vpp=2, global_batch=16, sequence_parallel=True,
                schedule="interleaved", zero_stage=1)
    cluster = make_cluster("h100-sxm", 8, 8, None, None, None, None, None, 1.0)
    fast = SIM.simulate(model, plan, cluster, _BASE)
    ref = SIM.simulate(model, plan, cluster, _BASE, periodic=False)
    assert fast.step_time_s == ref.step_time_s
    assert fast.breakdown.as_dict() == pytest.approx(ref.breakdown.as_dict(), rel=1e-9, abs=1e-12)
    assert math.isfinite(fast.mfu) and fast.peak_memory_bytes == ref.peak_memory_bytes
