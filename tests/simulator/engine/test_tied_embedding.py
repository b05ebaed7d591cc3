"""Tied input/output embeddings under pipeline parallelism: the first stage's embedding and
the last stage's copy of it for the head are kept equal by all-reducing their gradients
between the two stages before the optimizer step (Megatron-LM/Core finalize_model_grads ->
_allreduce_word_embedding_grads; DeepSpeed's pipeline engine ReduceTiedGrads). Expected
values from that count (vocab x hidden / tp parameters in the gradients' dtype, one
all-reduce over a pair of ranks placed as a pipeline hand-off's), not from the engines."""
from __future__ import annotations

import dataclasses

import pytest

import hardware_db
from simulator.cost.layer import group_collective
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.network.collectives import Collective
from simulator.parallel.placement import place_group
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec

TIED = TransformerSpec("tied-gpt", n_layers=8, hidden=1024, ffn_hidden=4096, n_heads=16,
                       n_kv_heads=16, vocab=50000, seq_len=1024, tied_embeddings=True)
UNTIED = dataclasses.replace(TIED, tied_embeddings=False)
PROF = dataclasses.replace(hardware_db.load_profile("a100-sxm-80gb"), host=None)


def _allreduce_s(plan: Plan, cl) -> float:
    """Over the first and last stage's ranks of one model replica: ``pp - 1`` stages apart."""
    pair = place_group(cl, "pp", 2, (plan.pp - 1) * plan.tp * plan.cp * plan.dp,
                       place_groups(cl, plan)["pp"].fabric)
    size = TIED.vocab * TIED.hidden / plan.tp * plan.grad_bytes
    return group_collective(Collective.ALL_REDUCE, size, pair, PROF).time_s


@pytest.mark.parametrize("engine,periodic", [("event", True), ("event", False),
                                             ("analytic", True)])
def test_the_all_reduce_sits_before_the_optimizer_of_the_end_stages(engine, periodic):
    cl = hardware_db.build_cluster("a100-sxm-80gb", 16)
    plan = Plan(tp=8, pp=2, dp=1, micro_batch=1, global_batch=8, precision="bf16")
    chunks = build_chunks(TIED, plan, cl, PROF, place_groups(cl, plan))
    assert [c.tied_params for s in chunks for c in s] == [TIED.vocab * TIED.hidden / 8] * 2
    tied = simulate(TIED, plan, cl, PROF, engine=engine, periodic=periodic)
    untied = simulate(UNTIED, plan, cl, PROF, engine=engine, periodic=periodic)
    t = _allreduce_s(plan, cl)
    assert t > 0
    assert tied.step_time_s - untied.step_time_s == pytest.approx(t, rel=1e-6)
    assert tied.breakdown.dp_comm_s - untied.breakdown.dp_comm_s == pytest.approx(t, rel=1e-6)


def test_nothing_to_reduce_on_one_stage_or_untied():
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    one = Plan(tp=8, pp=1, micro_batch=1, global_batch=4, precision="bf16")
    assert all(c.tied_params == 0 for s in build_chunks(TIED, one, cl, PROF,
                                                        place_groups(cl, one)) for c in s)
    cl2 = hardware_db.build_cluster("a100-sxm-80gb", 16)
    two = Plan(tp=8, pp=2, micro_batch=1, global_batch=4, precision="bf16")
    assert all(c.tied_params == 0 for s in build_chunks(UNTIED, two, cl2, PROF,
                                                        place_groups(cl2, two)) for c in s)
    # a middle stage holds neither end of the model
    cl4 = hardware_db.build_cluster("a100-sxm-80gb", 32)
    four = Plan(tp=8, pp=4, micro_batch=1, global_batch=8, precision="bf16")
    held = [sum(c.tied_params for c in s) > 0
            for s in build_chunks(TIED, four, cl4, PROF, place_groups(cl4, four))]
    assert held == [True, False, False, True]


def test_the_pair_is_first_and_last_stage_not_neighbours():
    """tp4 pp4 on 8-GPU nodes: neighbouring stages share a node, the end stages do not; the
    all-reduce is priced across the nodes (a review found it priced as a hand-off)."""
    cl = hardware_db.build_cluster("a100-sxm-80gb", 16)
    plan = Plan(tp=4, pp=4, dp=1, micro_batch=1, global_batch=8, precision="bf16")
    tied = simulate(TIED, plan, cl, PROF, periodic=False)
    untied = simulate(UNTIED, plan, cl, PROF, periodic=False)
    far = _allreduce_s(plan, cl)
    near = group_collective(Collective.ALL_REDUCE, TIED.vocab * TIED.hidden / 4 * plan.grad_bytes,
                            place_group(cl, "pp", 2, 4, place_groups(cl, plan)["pp"].fabric),
                            PROF).time_s
    assert far > 2 * near
    assert tied.step_time_s - untied.step_time_s == pytest.approx(far, rel=1e-6)


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe"])
def test_nothing_to_exchange_where_one_rank_holds_both_ends(schedule):
    """ZB-V's V and DualPipe's two copies put the embedding and the head on one stage."""
    cl = hardware_db.build_cluster("a100-sxm-80gb", 32)
    plan = Plan(tp=8, pp=4, micro_batch=1, global_batch=16, precision="bf16", schedule=schedule)
    assert all(c.tied_params == 0 for s in build_chunks(TIED, plan, cl, PROF,
                                                        place_groups(cl, plan)) for c in s)


def test_engines_agree_with_overlapped_gradient_reduction():
    """The all-reduce starts after the whole backward, including the slowdown the
    overlapped gradient buckets cause (a review found the event engine starting it beside
    that slowdown, unlike the analytic form)."""
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    plan = Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, precision="bf16",
                zero_stage=1, dp_overlap=True)
    t = _allreduce_s(plan, cl)
    for engine, periodic in (("event", True), ("event", False), ("analytic", True)):
        a = simulate(TIED, plan, cl, PROF, engine=engine, periodic=periodic).step_time_s
        b = simulate(UNTIED, plan, cl, PROF, engine=engine, periodic=periodic).step_time_s
        assert a - b == pytest.approx(t, rel=1e-6), engine
