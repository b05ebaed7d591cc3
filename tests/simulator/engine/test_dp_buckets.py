"""Gradient buckets as Megatron-Core's DDP makes them (``Plan.dp_bucket_first_chunk_only``):
only the first pipeline stage's first model chunk splits its gradient buffer into buckets
(distributed_data_parallel.py @ d98e8a64 L160-171: bucket_size None on pipeline ranks > 0;
training.py L2504-2514 and NeMo's megatron_parallel.py L639: disable_bucketing for model
chunks after the first). Every other buffer is one bucket, whose reduction starts when the
chunk's last backward pass ends, so it slows none of that pass. Expected values from the
rule and the closed form, not from the engine's code."""
from __future__ import annotations

import dataclasses
import math

import pytest

import hardware_db
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.engine.step import (bucket_times_s, dp_interference_s, dp_reduce_time_s,
                                   grad_buffer_buckets)
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec

MODEL = TransformerSpec("bucket-gpt", n_layers=8, hidden=4096, ffn_hidden=16384, n_heads=32,
                        n_kv_heads=32, vocab=32000, seq_len=1024)
PROF = hardware_db.load_profile("h100-sxm")
CL = hardware_db.build_cluster("h100-sxm", 16)


def _plan(framework: str) -> Plan:
    base = Plan(pp=2, dp=8, vpp=2, micro_batch=1, global_batch=64, precision="bf16",
                schedule="interleaved", zero_stage=1)
    return with_framework(base, framework, {"zero_stage"})


def _chunks(plan: Plan):
    return [c for stage in build_chunks(MODEL, plan, CL, PROF, place_groups(CL, plan))
            for c in stage]


@pytest.mark.parametrize("framework, first_only", [("megatron-core", True), ("nemo", True),
                                                   ("hf", False), ("pytorch", False)])
def test_which_buffers_are_bucketed(framework, first_only):
    plan = _plan(framework)
    assert plan.dp_overlap and plan.dp_bucket_first_chunk_only == first_only
    chunks = _chunks(plan)
    assert {(c.stage, c.chunk) for c in chunks} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for c in chunks:
        split = math.ceil(c.params / plan.bucket_params())
        assert split > 1                              # each buffer would make several
        want = split if (not first_only or (c.stage, c.chunk) == (0, 0)) else 1
        assert grad_buffer_buckets(c, plan) == want
        assert len(bucket_times_s(c, plan, place_groups(CL, plan), PROF)) == want


def test_one_bucket_is_one_reduction_of_the_whole_buffer():
    plan = _plan("megatron-core")
    groups = place_groups(CL, plan)
    later = [c for c in _chunks(plan) if (c.stage, c.chunk) != (0, 0)]
    for c in later:
        dense = c.dense_params
        assert bucket_times_s(c, plan, groups, PROF) == [
            pytest.approx(dp_reduce_time_s(dense, c.params - dense, plan, groups, PROF))]


def test_interference_covers_the_backward_after_the_first_bucket_only():
    """Bucket j of n is released at (j + 1) / n of the last backward, so reductions run
    beside the last (n - 1) / n of it and beside the last backward passes of the chunks that
    finish later (lower chunk index): a one-bucket buffer of a stage's only chunk slows
    nothing, one of an interleaved stage's later chunk slows its earlier chunks' passes."""
    plan = _plan("megatron-core")
    groups = place_groups(CL, plan)
    slow = PROF.overlap_slowdown.value - 1.0
    last_b = {0: 0.05, 1: 0.04}                       # seconds of each chunk's last backward
    for c in _chunks(plan):
        times = bucket_times_s(c, plan, groups, PROF)
        n = len(times)
        later = last_b[0] if c.chunk == 1 else 0.0
        got = dp_interference_s(last_b, [c], plan, PROF, groups)
        assert got == pytest.approx(slow * min(sum(times), last_b[c.chunk] * (n - 1) / n + later))
        if (c.stage, c.chunk) == (1, 0):
            assert n == 1 and got == 0.0               # nothing runs after its backward
        if c.chunk == 1:
            assert n == 1 and got > 0.0                # chunk 0's last backward runs beside it


@pytest.mark.parametrize("engine", ["event", "analytic"])
def test_overlapping_the_first_chunk_is_never_slower_than_no_overlap(engine):
    """Bucketing the first stage's first chunk only never makes the step slower than
    reducing every buffer in one piece after the whole backward (no overlap at all)."""
    plan = _plan("megatron-core")
    unbucketed = dataclasses.replace(plan, dp_overlap=False)
    first_only = simulate(MODEL, plan, CL, PROF, engine=engine).step_time_s
    none = simulate(MODEL, unbucketed, CL, PROF, engine=engine).step_time_s
    assert first_only <= none * (1 + 1e-9)


def test_a_stage_counts_the_compute_beside_its_reductions_once():
    """The windows of a stage's chunks nest (chunk 1's holds chunk 0's), so the overlapped
    compute is the shorter of the stage's whole reduction and the largest window, never
    their sum: at most the backward passes that run after the first release."""
    plan = _plan("megatron-core")
    groups = place_groups(CL, plan)
    slow = PROF.overlap_slowdown.value - 1.0
    last_b = {0: 0.05, 1: 0.04}
    stage0 = [c for c in _chunks(plan) if c.stage == 0]
    times = {c.chunk: bucket_times_s(c, plan, groups, PROF) for c in stage0}
    windows = [last_b[0] * (len(times[0]) - 1) / len(times[0]),
               last_b[1] * (len(times[1]) - 1) / len(times[1]) + last_b[0]]
    want = slow * min(sum(sum(t) for t in times.values()), max(windows))
    got = dp_interference_s(last_b, stage0, plan, PROF, groups)
    assert got == pytest.approx(want)
    assert got <= slow * (last_b[0] + last_b[1])


def test_each_chunk_reduces_as_its_last_backward_ends():
    """Megatron-Core launches a chunk's gradient reduction after its last micro-batch's
    backward (grad_sync_func), so on an interleaved stage chunk 1, which finishes first,
    reduces first: the event engine starts its one bucket when its last backward ends,
    before any of chunk 0's."""
    plan = _plan("megatron-core")
    r = simulate(MODEL, plan, CL, PROF, keep_timeline=True)
    ev = [e for e in r.timeline if e.get("stage") == 0 and "start_s" in e and "name" in e]
    last_b = {c: max(e["end_s"] for e in ev if e["name"].startswith("B ") and e.get("chunk") == c)
              for c in (0, 1)}
    first = {c: min(e["start_s"] for e in ev if e["name"].startswith(f"dp reduce c{c} "))
             for c in (0, 1)}
    assert last_b[1] < last_b[0]
    assert first[1] == pytest.approx(last_b[1])
    assert first[1] < first[0]


def test_the_analytic_engine_prices_the_reduction_as_the_event_engine_plays_it():
    """The closed form hides a stage's gradient reduction beside the backward after the
    first bucket's release (dp_overlap_s), beside the interference it causes and beside the
    pipeline's drain, and charges the same interference: without a pipeline it equals the
    event engine's play; with one it stays close (the drain is estimated)."""
    flat = with_framework(Plan(dp=16, micro_batch=1, global_batch=64, precision="bf16",
                               zero_stage=1), "megatron-core", {"zero_stage"})
    e = simulate(MODEL, flat, CL, PROF)
    a = simulate(MODEL, flat, CL, PROF, engine="analytic")
    assert e.breakdown.dp_comm_s > 0 and e.breakdown.interference_s > 0
    assert a.breakdown.interference_s == pytest.approx(e.breakdown.interference_s, rel=1e-6)
    assert a.step_time_s == pytest.approx(e.step_time_s, rel=1e-3)
    for plan in (_plan("megatron-core"),
                 with_framework(Plan(pp=2, dp=8, micro_batch=1, global_batch=64,
                                     precision="bf16", zero_stage=1), "megatron-core",
                                {"zero_stage"})):
        e = simulate(MODEL, plan, CL, PROF)
        a = simulate(MODEL, plan, CL, PROF, engine="analytic")
        assert a.step_time_s == pytest.approx(e.step_time_s, rel=0.05)
