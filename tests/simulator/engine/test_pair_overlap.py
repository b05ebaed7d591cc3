"""DualPipe's forward&backward pairs hide each pass's EP all-to-all beside the other pass's
compute (DeepSeek-V3 report, sec. 3.2.1; ``engine.pair_overlap``): the closed form, its
properties, and both engines playing it."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.cost.layer import PassCost
from simulator.engine import pair_overlap
from simulator.engine.pair_overlap import pair_saving_s, pair_times, pass_times
from simulator.engine.simulate import simulate
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan, Schedule
from simulator.parallel.units import Unit
from simulator.workload import get_preset

PROF = hardware_db.load_profile("h100-sxm")
SLOW = PROF.overlap_slowdown.value


def _pc(compute: float, ep: float = 0.0, tp: float = 0.0) -> PassCost:
    comm = {k: v for k, v in (("ep", ep), ("tp", tp)) if v}
    return PassCost(compute_s=compute, comm_s=comm)


def test_each_pass_hides_its_all_to_all_behind_the_other_pass_compute():
    """a: 10 s compute + 4 s EP; b: 20 s + 6 s EP. a's 4 s fit beside b's 20 s, b's 6 s beside
    a's 10 s; each compute runs slower while the other's all-to-all is beside it."""
    a, b = pair_times(_pc(10.0, 4.0), _pc(20.0, 6.0), PROF)
    assert a.hidden_s == {"ep": pytest.approx(4.0)} and b.hidden_s == {"ep": pytest.approx(6.0)}
    assert a.duration_s == pytest.approx(10.0 + (SLOW - 1) * 6.0)
    assert b.duration_s == pytest.approx(20.0 + (SLOW - 1) * 4.0)
    # hidden only up to the other pass's compute: a forward with 30 s of all-to-all
    a, b = pair_times(_pc(10.0, 30.0), _pc(20.0, 6.0), PROF)
    assert a.hidden_s["ep"] == pytest.approx(20.0)
    assert a.duration_s == pytest.approx(10.0 + 10.0 + (SLOW - 1) * 6.0)


def test_only_expert_parallel_communication_is_overlapped():
    """TP collectives stay in their pass (the report claims EP and PP); no EP, no change."""
    a, b = pair_times(_pc(10.0, tp=3.0), _pc(20.0, tp=2.0), PROF)
    assert (a.duration_s, b.duration_s) == (13.0, 22.0)
    assert not a.hidden_s and not b.hidden_s and a.interference_s == b.interference_s == 0.0


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10), st.floats(0, 10),
       st.floats(0, 5), st.floats(0, 5))
def test_a_pair_is_never_slower_and_never_below_its_compute(ca, xa, cb, xb, ta, tb):
    """With a slowdown below 2x (hiding a second of communication costs less than a
    second), the pair is never longer than its passes in a row, each pass is at least its
    own compute, and the saving is the closed form the analytic engine uses."""
    a_pc, b_pc = _pc(ca, xa, ta), _pc(cb, xb, tb)
    a, b = pair_times(a_pc, b_pc, PROF)
    assert SLOW < 2.0
    assert a.duration_s + b.duration_s <= a_pc.total_s + b_pc.total_s + 1e-9
    assert a.duration_s >= ca - 1e-12 and b.duration_s >= cb - 1e-12
    saved = a_pc.total_s + b_pc.total_s - a.duration_s - b.duration_s
    assert saved == pytest.approx(pair_saving_s(ca, xa, cb, xb, PROF), abs=1e-9)


def test_only_marked_pairs_overlap():
    units = [Unit(True, 0, 0, paired=True), Unit(False, 1, 1), Unit(True, 2, 0),
             Unit(False, 3, 1)]
    costs = [_pc(10.0, 4.0), _pc(20.0, 6.0), _pc(10.0, 4.0), _pc(20.0, 6.0)]
    t = pass_times(units, costs, PROF)
    assert t[0].hidden_s and t[1].hidden_s
    assert [x.duration_s for x in t[2:]] == [14.0, 26.0]


def _moe_dualpipe(global_batch: int = 256):
    m = get_preset("qwen3-30b-a3b")
    cl = make_cluster("h100-sxm", 64, nic_gbps=400)
    p = with_framework(Plan(pp=4, ep=8, dp=16, micro_batch=1, global_batch=global_batch,
                            schedule=Schedule.DUALPIPE, vpp=2), "megatron-core")
    return m, p, cl


def test_dualpipe_moe_step_shrinks_and_both_engines_account_for_it(monkeypatch):
    """An MoE model under DualPipe: with the overlap the step is shorter, the event
    engine's parts account for the whole step (no unexplained overhead), the exposed EP time
    falls, and the analytic engine (same durations, the pair in the closed-form bubble)
    stays within 5 %."""
    m, p, cl = _moe_dualpipe()
    on = simulate(m, p, cl, PROF, periodic=False)
    analytic = simulate(m, p, cl, PROF, engine="analytic")
    monkeypatch.setattr(pair_overlap, "OVERLAPPED_GROUPS", ())
    off = simulate(m, p, cl, PROF, periodic=False)
    assert on.step_time_s < off.step_time_s
    assert on.breakdown.ep_comm_s < off.breakdown.ep_comm_s
    assert on.breakdown.interference_s > off.breakdown.interference_s
    assert abs(on.breakdown.overhead_s) < 1e-9 * on.step_time_s
    assert abs(analytic.breakdown.overhead_s) < 1e-9 * analytic.step_time_s
    assert analytic.step_time_s == pytest.approx(on.step_time_s, rel=0.05)


def test_the_fast_path_plays_the_pairs_as_the_full_play():
    """128 micro-batches: long enough for the periodic fast path, which must give the full
    play's step and breakdown."""
    from simulator.engine.periodic import long_enough
    m, p, cl = _moe_dualpipe(2048)
    assert long_enough(p)
    fast, full = simulate(m, p, cl, PROF), simulate(m, p, cl, PROF, periodic=False)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert fast.breakdown.ep_comm_s == pytest.approx(full.breakdown.ep_comm_s, rel=1e-9)


def test_the_middle_ranks_first_pair_is_not_overlapped():
    """DualPipe.step phase 4: 'We don't overlap these two chunks' for the two middle ranks'
    first pair (deepseek-ai/DualPipe dualpipe/dualpipe.py); its sends still follow the
    pair."""
    from simulator.parallel.zero_bubble import dualpipe
    pp, m = 8, 32
    for rank in range(pp):
        order = dualpipe(rank, pp, m)
        plain = [u for u in order if u.paired and not u.overlapped]
        assert len(plain) == (1 if rank in (pp // 2 - 1, pp // 2) else 0), rank
        if plain:
            first_pair = next(u for u in order if u.paired)
            assert plain == [first_pair]


def test_timeline_collectives_stay_inside_their_pass():
    """The timeline lays a pair's passes out with the hidden seconds taken out of their EP
    segments and the slowdown in their compute: every EP collective of a pass ends by the
    end of its task."""
    m, p, cl = _moe_dualpipe()
    tl = simulate(m, p, cl, PROF, keep_timeline=True).timeline
    ends = {x["tid"]: x["end_s"] for x in tl if "tid" in x}
    paired = {x["tid"] for x in tl if "tid" in x and x.get("hidden_s")}
    eps = [x for x in tl if x.get("kind") == "collective" and x.get("group") == "ep"
           and x.get("task") in paired]
    assert eps
    assert all(x["end_s"] <= ends[x["task"]] + 1e-12 for x in eps)


def test_closed_form_pairs_each_chunks_forward_with_the_other_chunks_backward():
    """A stage whose two chunks differ (DeepSeek-V3's first stage: dense layers in one
    chunk, MoE in the other): the closed form averages the two kinds of pair, not the
    averaged passes."""
    from types import SimpleNamespace

    from simulator.engine.simulate import _pair_saving
    dense = SimpleNamespace(fwd=_pc(10.0), bwd=_pc(20.0))
    moe = SimpleNamespace(fwd=_pc(10.0, 8.0), bwd=_pc(20.0, 16.0))
    want = 0.5 * (pair_saving_s(10.0, 0.0, 20.0, 16.0, PROF)
                  + pair_saving_s(10.0, 8.0, 20.0, 0.0, PROF))
    assert _pair_saving([dense, moe], 0.5, PROF) == pytest.approx(want)
    assert _pair_saving([dense, moe], 0.5, PROF) != pytest.approx(
        pair_saving_s(10.0, 4.0, 20.0, 8.0, PROF))


def test_tp_collectives_stay_in_their_pass_unless_asked(monkeypatch):
    """A dense TP model under DualPipe: the default (EP only) plays it as without the
    overlap; listing TP among the overlapped groups would shorten it (so the test can
    tell). 1F1B has no pairs at all."""
    dense = get_preset("llama3-8b")
    cl = make_cluster("h100-sxm", 32)
    p = with_framework(Plan(tp=2, pp=4, dp=4, micro_batch=1, global_batch=64,
                            schedule=Schedule.DUALPIPE, vpp=2), "megatron-core")
    default = simulate(dense, p, cl, PROF).step_time_s
    monkeypatch.setattr(pair_overlap, "OVERLAPPED_GROUPS", ())
    assert simulate(dense, p, cl, PROF).step_time_s == default
    monkeypatch.setattr(pair_overlap, "OVERLAPPED_GROUPS", ("ep", "tp"))
    assert simulate(dense, p, cl, PROF).step_time_s < default
    m, moe_plan, mcl = _moe_dualpipe()
    one = replace(moe_plan, schedule=Schedule.ONE_F_ONE_B, vpp=1)
    with_tp = simulate(m, one, mcl, PROF).step_time_s
    monkeypatch.setattr(pair_overlap, "OVERLAPPED_GROUPS", ())
    assert simulate(m, one, mcl, PROF).step_time_s == with_tp
