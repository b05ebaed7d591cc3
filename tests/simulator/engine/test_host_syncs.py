"""The training script's device reads: the host waits for the device before a forward pass
(Megatron-LM's legacy get_batch copies the batch sizes back: ``megatron_batch_sync``) or after
the forward that computes the loss (Megatron's NaN check in loss_func: ``mcore_loss_check``).

Expected values come from the two-machine flow shop written out here (the host issues
passes back to back unless it must wait for the device; the device starts a pass once its
first op is issued), not from the engines' code; the event engine, the sweep and the
analytic recursion must give the same step.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.parallel.schedule import is_loss_pass
from simulator.parallel.units import Unit

from test_host import MODEL, one_gpu, pass_op_counts, with_host


def _passes(plan, prof):
    ch = build_chunks(MODEL, plan, one_gpu(), prof, place_groups(one_gpu(), plan))[0][0]
    return ch.fwd.total_s, ch.bwd.total_s, ch.fwd.host_s, ch.bwd.host_s


def _flow_shop(m, g_f, g_b, h_f, h_b, n_f, n_b, wait_before_fwd, wait_after_loss):
    """One stage, ``m`` micro-batches F B F B ...: host start ``hs`` is when it is free, or
    (a wait) when the device has finished everything issued so far."""
    h = d = 0.0
    prev_fwd = None
    for fwd in [True, False] * m:
        g, hh, n = (g_f, h_f, n_f) if fwd else (g_b, h_b, n_b)
        hs = h
        if prev_fwd is not None and ((wait_before_fwd and fwd) or (wait_after_loss and prev_fwd)):
            hs = max(hs, d)
        he = hs + hh
        ds = max(d, hs + hh / n)
        d, h = max(ds + g, he), he
        prev_fwd = fwd
    return d


@pytest.mark.parametrize("mech,before,after,host_us", [
    ("megatron_batch_sync", True, False, (60.0, 0.5)),
    ("torchtitan_batch_copy", True, False, (60.0, 0.5)),
    ("mcore_loss_check", False, True, (0.5, 60.0))])
def test_waits_follow_the_flow_shop(mech, before, after, host_us):
    """The mixed regimes where a free host banks lead in one pass kind and spends it in the
    other: forward host-bound (waiting before each forward loses the lead banked during
    backward), backward host-bound (waiting after the loss loses the lead banked during
    forward). With the wait the step is the recursion with the host's start reset to the
    device's end, and slower than without."""
    prof = with_host(*host_us)
    free = Plan(micro_batch=1, global_batch=4)
    synced = dataclasses.replace(free, host_mechanisms=(mech,))
    g_f, g_b, h_f, h_b = _passes(free, prof)
    n_f, n_b = pass_op_counts(MODEL, 1)
    assert (h_f > g_f and h_b < g_b) if before else (h_f < g_f and h_b > g_b)
    r = simulate(MODEL, synced, one_gpu(), prof)
    expected = _flow_shop(4, g_f, g_b, h_f, h_b, n_f, n_b, before, after)
    assert r.step_time_s == pytest.approx(expected + r.breakdown.optimizer_s, rel=1e-9)
    t_free = simulate(MODEL, free, one_gpu(), prof).step_time_s
    assert r.step_time_s > t_free


@settings(max_examples=25, deadline=None)
@given(st.floats(0.2, 400.0), st.floats(0.2, 400.0), st.sampled_from([1, 2, 5]),
       st.sampled_from(["megatron_batch_sync", "mcore_loss_check"]),
       st.sampled_from([(1, 1), (2, 1), (2, 2)]))
def test_engines_agree_and_waiting_is_never_faster(hf, hb, m, mech, pp_vpp):
    """Event engine (every task), its sweep, and (one stage) the analytic recursion give the
    same step; a host that waits is never faster than one that does not."""
    pp, vpp = pp_vpp
    cl = hardware_db.build_cluster("h100-sxm", pp)
    prof = with_host(hf, hb)
    free = Plan(pp=pp, vpp=vpp, micro_batch=1, global_batch=m * pp,
                schedule="interleaved" if vpp > 1 else "1f1b")
    synced = dataclasses.replace(free, host_mechanisms=(mech,))
    swept = simulate(MODEL, synced, cl, prof).step_time_s
    played = simulate(MODEL, synced, cl, prof, periodic=False).step_time_s
    assert swept == pytest.approx(played, rel=1e-9)
    if pp == 1:
        an = simulate(MODEL, synced, cl, prof, engine="analytic").step_time_s
        assert an == pytest.approx(played, rel=1e-9)
    assert played >= simulate(MODEL, free, cl, prof, periodic=False).step_time_s * (1 - 1e-12)


def test_the_loss_pass_is_the_last_position():
    """The forward that ends in the loss: the last stage's last chunk (Megatron placement),
    the first stage's second chunk for a V-shaped placement."""
    assert is_loss_pass(Unit(True, 3, 0), 3, 4, 1)
    assert not is_loss_pass(Unit(True, 3, 0), 2, 4, 1)
    assert not is_loss_pass(Unit(False, 3, 0), 3, 4, 1)
    assert is_loss_pass(Unit(True, 0, 1), 3, 4, 2) and not is_loss_pass(Unit(True, 0, 0), 3, 4, 2)
    assert is_loss_pass(Unit(True, 0, 1), 0, 4, 2, "zb-v")


def test_frameworks_carry_the_waits_their_scripts_have():
    """Megatron-LM (legacy get_batch), HF's Trainer (its loss check) and DeepSpeed's engine
    (its synchronising throughput timer, stop 39) wait before each forward, Megatron-Core's
    script after the loss; frameworks without such reads (NeMo, FSDP) do neither."""
    plan = Plan(micro_batch=1, global_batch=2)
    mechs = {fw: with_framework(plan, fw).host_mechanisms for fw in
             ("megatron-lm", "megatron-core", "nemo", "hf", "llm-foundry", "deepspeed")}
    assert "megatron_batch_sync" in mechs["megatron-lm"]
    assert "mcore_loss_check" in mechs["megatron-core"]
    assert "hf_trainer_loop" in mechs["hf"]
    assert "deepspeed_throughput_timer" in mechs["deepspeed"]
    for fw in ("nemo", "llm-foundry"):
        assert not any(HOST.mechanisms[n].sync_before_fwd or HOST.mechanisms[n].sync_after_loss
                       for n in mechs[fw]), fw


def test_torchtitan_waits_before_each_accumulated_micro_batch_only_without_pp():
    """torchtitan copies each gradient-accumulation micro-batch to the GPU (a blocking copy:
    cudaStreamSynchronize) right before its forward; under pipeline parallelism it copies
    them all before the schedule runs, so no wait inside the step."""
    flat = with_framework(Plan(dp=8, micro_batch=1, global_batch=32, precision="bf16"),
                          "torchtitan")
    piped = with_framework(Plan(pp=2, dp=4, micro_batch=1, global_batch=32,
                                precision="bf16"), "torchtitan")
    assert "torchtitan_batch_copy" in flat.host_mechanisms
    assert "torchtitan_batch_copy" not in piped.host_mechanisms
    assert HOST.mechanisms["torchtitan_batch_copy"].sync_before_fwd


def test_megatron_core_and_nemo_sync_at_hand_offs_only_without_virtual_stages():
    """Megatron-LM forces overlap_p2p_comm off for the non-interleaved schedule, so its
    hand-offs are batched with batch_p2p_sync's torch.cuda.synchronize(); NeMo's config keeps
    batched, synchronised p2p there too. Interleaved plans overlap p2p (no sync)."""
    one = Plan(pp=4, dp=2, micro_batch=1, global_batch=8, precision="bf16")
    inter = dataclasses.replace(one, vpp=2, schedule="interleaved")
    for fw in ("megatron-core", "nemo"):
        assert "mcore_p2p_sync" in with_framework(one, fw).host_mechanisms
        assert "mcore_p2p_sync" not in with_framework(inter, fw).host_mechanisms
        assert HOST.mechanisms["mcore_p2p_sync"].sync_at_p2p
        # batched p2p waits on the compute stream (req.wait()); interleaved p2p overlaps
        assert with_framework(one, fw).pp_blocking_p2p
        assert not with_framework(inter, fw).pp_blocking_p2p


@settings(max_examples=20, deadline=None)
@given(st.floats(0.2, 400.0), st.floats(0.2, 400.0),
       st.sampled_from(["megatron_batch_sync", "mcore_loss_check"]),
       st.sampled_from([(1, 1, 1), (2, 1, 1), (2, 2, 2), (4, 2, 4)]))
def test_long_plans_extend_three_short_plays_exactly(hf, hb, mech, shape):
    """Past warm-up the analytic recursion with waits is three plays of a short plan
    extended along their line; each stage's span must equal the full walk."""
    from simulator.engine import host_span
    pp, vpp, period = shape
    plan = Plan(pp=pp, vpp=vpp, micro_batch=1, global_batch=period * 60,
                schedule="interleaved" if vpp > 1 else "1f1b", host_mechanisms=(mech,))
    prof = with_host(hf, hb)
    cl = hardware_db.build_cluster("h100-sxm", pp)
    stages = build_chunks(MODEL, plan, cl, prof, place_groups(cl, plan))
    syncs = host_span.pass_syncs(plan.host_mechanisms)
    for s, chunks in enumerate(stages):
        kinds = {(f, ch.chunk): host_span.pass_numbers(ch.fwd if f else ch.bwd, ch)
                 for ch in chunks for f in (True, False)}
        if not (syncs[0] or (syncs[1] and s == pp - 1)):
            continue
        full = host_span._play_order(kinds, plan, s, syncs, plan.num_microbatches)
        fast = host_span._plain_waits_span(kinds, plan, s, syncs, plan.num_microbatches)
        assert fast == pytest.approx(full, rel=1e-9)


@pytest.mark.parametrize("vpp", [1, 2])
def test_the_analytic_engine_waits_at_every_pass_under_batched_p2p_sync(vpp):
    """Megatron's batch_p2p_sync makes the host wait for the device before every pass of a
    pipelined stage (``step._host_deps``); the analytic recursion plays the same waits: a
    stage's span equals the pass-by-pass walk with a wait before each pass, and the step is
    never faster than without the sync."""
    from simulator.engine import host_span
    from simulator.parallel.schedule import iter_pass_order
    prof = with_host(30.0, 5.0)
    plan = Plan(pp=2, vpp=vpp, micro_batch=1, global_batch=40,
                schedule="interleaved" if vpp > 1 else "1f1b",
                host_mechanisms=("megatron_p2p_sync",))
    cl = hardware_db.build_cluster("h100-sxm", 2)
    stages = build_chunks(MODEL, plan, cl, prof, place_groups(cl, plan))
    for s, chunks in enumerate(stages):
        kinds = {(f, ch.chunk): host_span.pass_numbers(ch.fwd if f else ch.bwd, ch)
                 for ch in chunks for f in (True, False)}
        order = list(iter_pass_order(plan.schedule, s, 2, plan.num_microbatches, vpp))
        passes = [kinds[(f, c)] for f, _, c in order]
        walk = host_span._asynchronous(passes, -1, 0.0, 0.0, float("inf"),
                                       [i > 0 for i in range(len(passes))])
        span = host_span.stage_span(chunks, plan, prof, s)
        assert span.span_s == pytest.approx(walk.span_s, rel=1e-9)
    free = dataclasses.replace(plan, host_mechanisms=())
    a = simulate(MODEL, plan, cl, prof, engine="analytic").step_time_s
    b = simulate(MODEL, free, cl, prof, engine="analytic").step_time_s
    assert a >= b * (1 - 1e-12)
