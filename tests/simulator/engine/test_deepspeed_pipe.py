"""DeepSpeed's pipeline engine: TrainSchedule's instruction stream and its rendezvous p2p.

Checked against (1) DeepSpeed's own schedule as its source writes it (the step -> micro-batch
map and the per-step command order, ``deepspeed/runtime/pipe/schedule.py`` @ edaa7221), by
properties: the passes come in Megatron's 1F1B order, every send has exactly one matching
receive on the neighbour, a stage never receives a micro-batch's input after running it;
and (2) an independent interpreter of those instruction lists (each stage runs its list in
order, a send and its receive start together once both stages have reached them), which
the event engine must reproduce to the last digit.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.pipeline import PassTimes, play_schedule
from simulator.parallel.deepspeed_pipe import (BACKWARD, FORWARD, RECV_ACT, RECV_GRAD,
                                               SEND_ACT, SEND_GRAD, train_commands)
from simulator.parallel.plan import Schedule
from simulator.parallel.schedule import pass_order

PARTNER = {SEND_ACT: (RECV_ACT, +1), RECV_ACT: (SEND_ACT, -1),
           SEND_GRAD: (RECV_GRAD, -1), RECV_GRAD: (SEND_GRAD, +1)}


@given(pp=st.integers(2, 12), m=st.integers(1, 40))
@settings(max_examples=80, deadline=None)
def test_passes_in_1f1b_order_and_sends_match_receives(pp, m):
    progs = [train_commands(s, pp, m) for s in range(pp)]
    for s, prog in enumerate(progs):
        passes = [(c.kind == FORWARD, c.mb, 0) for c in prog if c.kind in (FORWARD, BACKWARD)]
        assert passes == pass_order(Schedule.ONE_F_ONE_B, s, pp, m)
        for c in prog:
            if c.kind in PARTNER:
                want, step = PARTNER[c.kind]
                matches = [x for x in progs[s + step] if x.kind == want and x.mb == c.mb]
                assert len(matches) == 1, (s, c)
        # every micro-batch's activation arrives before its forward, its gradient before
        # its backward; every output leaves after the pass that made it
        pos = {(c.kind, c.mb): i for i, c in enumerate(prog)}
        for mb in range(m):
            if s > 0:
                assert pos[(RECV_ACT, mb)] < pos[(FORWARD, mb)] < pos[(SEND_GRAD, mb)]
            if s < pp - 1:
                assert pos[(FORWARD, mb)] < pos[(SEND_ACT, mb)]
                assert pos[(RECV_GRAD, mb)] < pos[(BACKWARD, mb)]


def test_sends_wait_for_the_next_step():
    """TrainSchedule sends a forward's activation only on the stage's next step, after that
    (backward) step's gradient receive: stage 1 of 4, micro-batch 2."""
    kinds = [(c.kind, c.mb) for c in train_commands(1, 4, 4)]
    i = kinds.index((FORWARD, 2))
    assert kinds[i + 1:i + 4] == [(RECV_GRAD, 0), (SEND_ACT, 2), (BACKWARD, 0)]


def _reference(pp: int, m: int, f: float, b: float, c: float) -> float:
    """Makespan by interpreting the instruction lists directly (no event engine)."""
    progs = [train_commands(s, pp, m) for s in range(pp)]
    pc, clock = [0] * pp, [0.0] * pp
    while any(pc[s] < len(progs[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while pc[s] < len(progs[s]):
                cmd = progs[s][pc[s]]
                if cmd.kind in (FORWARD, BACKWARD):
                    clock[s] += f if cmd.kind == FORWARD else b
                    pc[s] += 1
                    moved = True
                    continue
                want, step = PARTNER[cmd.kind]
                peer = s + step
                if pc[peer] < len(progs[peer]) and (progs[peer][pc[peer]].kind, progs[peer][
                        pc[peer]].mb) == (want, cmd.mb):
                    clock[s] = clock[peer] = max(clock[s], clock[peer]) + c
                    pc[s] += 1
                    pc[peer] += 1
                    moved = True
                    continue
                break
        assert moved, "the instruction lists deadlock"
    return max(clock)


@pytest.mark.parametrize("pp,m,f,b,c", [(2, 1, 1.0, 2.0, 0.1), (4, 8, 1.0, 2.0, 0.1),
                                        (4, 3, 1.0, 3.0, 0.5), (8, 16, 0.7, 2.1, 0.05),
                                        (12, 24, 1.0, 2.0, 0.2)])
def test_engine_plays_the_instruction_lists(pp, m, f, b, c):
    run = play_schedule("1f1b", pp, m, PassTimes(f, b, 0.0), send_s=c, rendezvous=True)
    assert run.makespan_s == pytest.approx(_reference(pp, m, f, b, c), rel=1e-12)


@given(pp=st.integers(2, 8), m=st.integers(1, 24), c=st.floats(0.0, 0.5))
@settings(max_examples=40, deadline=None)
def test_rendezvous_costs_at_least_the_buffered_sends(pp, m, c):
    """With no transfer time DeepSpeed's order is 1F1B's closed form ``(m + pp - 1)(F + B)``;
    a blocking receive on top of the blocking send is never faster than the send alone, and
    more transfer time is never faster."""
    t = PassTimes(1.0, 2.0, 0.0)
    ds = play_schedule("1f1b", pp, m, t, send_s=c, rendezvous=True).makespan_s
    if c == 0.0:
        assert ds == pytest.approx((m + pp - 1) * 3.0)
    buffered = play_schedule("1f1b", pp, m, t, send_s=c).makespan_s
    assert ds >= buffered - 1e-9
    assert play_schedule("1f1b", pp, m, t, send_s=c + 0.1, rendezvous=True).makespan_s >= ds - 1e-9


def test_steady_state_pays_four_transfers_per_micro_batch():
    """Closed form of the long-pipeline limit: each stage's cycle per micro-batch is
    F + B plus its four blocking calls (receive and send of an activation and of a
    gradient), against two sends when receives are buffered."""
    pp, m, c = 4, 400, 0.1
    t = PassTimes(1.0, 2.0, 0.0)
    a = play_schedule("1f1b", pp, m, t, send_s=c, rendezvous=True).makespan_s
    b = play_schedule("1f1b", pp, 2 * m, t, send_s=c, rendezvous=True).makespan_s
    assert (b - a) / m == pytest.approx(3.0 + 4 * c, rel=1e-6)


def _ds_plan(**kw):
    from simulator.parallel.framework_plan import with_framework
    from simulator.parallel.plan import Plan
    base = dict(tp=2, pp=4, dp=2, micro_batch=1, global_batch=32, precision="bf16")
    base.update(kw)
    return with_framework(Plan(**base), "deepspeed")


def test_waiting_for_a_neighbour_is_bubble_not_host_time():
    """A send or receive that waits for its partner's stage is pipeline bubble, even when
    the task before the partner is a host-issue marker (a review found an asynchronous
    host's wait named host time: 19 % of this step)."""
    import hardware_db
    from simulator.engine.simulate import simulate
    from simulator.workload import get_preset
    model, cl = get_preset("llama2-13b"), hardware_db.build_cluster("a100-sxm-80gb", 16)
    r = simulate(model, _ds_plan(), cl, hardware_db.load_profile("a100-sxm-80gb"))
    bd = r.breakdown
    assert bd.host_s < 0.01 * r.step_time_s
    assert bd.bubble_s > 0.1 * r.step_time_s
    assert sum(bd.as_dict().values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_what_deepspeed_cannot_run_is_refused_or_noted():
    """ZeRO-2/3 with pipeline stages is refused (DeepSpeed's PipelineEngine asserts it);
    schedules other than TrainSchedule's 1F1B are priced the Megatron way, with a note, and
    the assumptions line says which p2p the plan got."""
    import hardware_db
    from simulator.engine.simulate import simulate
    from simulator.errors import InvalidInputError
    from simulator.report.assumptions import assumption_lines, assumptions
    from simulator.workload import get_preset
    model, cl = get_preset("llama2-13b"), hardware_db.build_cluster("a100-sxm-80gb", 16)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    with pytest.raises(InvalidInputError, match="zero_stage"):
        simulate(model, dataclasses.replace(_ds_plan(), zero_stage=3), cl, prof)
    inter = _ds_plan(vpp=2, schedule="interleaved")
    r = simulate(model, inter, cl, prof)
    assert any("does not implement schedule interleaved" in n for n in r.notes)
    lines = lambda p: " ".join(assumption_lines(assumptions(model, p, cl, prof)))  # noqa: E731
    assert "DeepSpeed's pipeline engine order" in lines(_ds_plan())
    assert "DeepSpeed's pipeline engine order" not in lines(inter)
