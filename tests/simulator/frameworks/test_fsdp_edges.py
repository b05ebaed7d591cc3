"""FSDP's edges cannot hide behind compute: the step's first collective is the gather of the
unit that holds the embedding (FSDP2: the root's or the embedding unit's pre-forward
unshard, torch/distributed/fsdp/_fully_shard/_fsdp_state.py _pre_forward), followed by the
first layer's; and the embedding's gradient is reduced in the final post-backward callback
(its input, token ids, needs no gradient, so it has no post-backward hook:
_fsdp_param_group.py _register_post_backward_hook, _fsdp_state.py
_root_post_backward_final_callback), which makes the step wait for it. ``engine.fsdp_comm.add_fsdp_comm``
charges these, and no more than the whole lane."""
from __future__ import annotations

import pytest

import hardware_db
from simulator.cost.layer import group_collective_s
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.network.collectives import Collective
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset


def _first_chunk(gpus: int, framework: str = "torchtitan", model: str = "llama3-8b"):
    m = get_preset(model)
    cl, prof = hardware_db.build_cluster("h100-sxm", gpus), hardware_db.load_profile("h100-sxm")
    plan = with_framework(Plan(dp=gpus, micro_batch=1, global_batch=gpus, precision="bf16"),
                          framework)
    groups = place_groups(cl, plan)
    ch = build_chunks(m, plan, cl, prof, groups)[0][0]
    return m, plan, prof, groups, ch


def _lane(pc):
    return next(s for s in pc.segments if s.name.startswith("fsdp"))


@pytest.mark.parametrize("framework, units", [("torchtitan", 1), ("fsdp2", 2),
                                              ("llm-foundry", 2)])
def test_the_embeddings_gather_leads_and_its_reduce_scatter_trails(framework, units):
    """torchtitan shards the embedding as its own unit; plain FSDP / FSDP2 / llm-foundry
    leave it in the root with the (untied) output layer: the edge is 1 or 2 embeddings."""
    m, plan, prof, groups, ch = _first_chunk(64, framework)
    assert not m.tied_embeddings
    g = groups["dp"]
    edge = units * m.vocab * m.hidden
    layer = (ch.params - edge) / len(ch.layers)
    c, r = 2, (4 if plan.memory.fsdp_reduce_fp32 else 2)
    lead = (group_collective_s(Collective.ALL_GATHER, edge * c, g, prof)
            + group_collective_s(Collective.ALL_GATHER, layer * c, g, prof))
    tail = group_collective_s(Collective.REDUCE_SCATTER, edge * r, g, prof)
    fwd, bwd = _lane(ch.fwd), _lane(ch.bwd)
    assert fwd.exposed_s >= lead * (1 - 1e-9)
    assert bwd.exposed_s >= tail * (1 - 1e-9)
    # never more than the whole lane: what is exposed is at most what the lane carries
    assert fwd.exposed_s <= fwd.comm_s * (1 + 1e-9) and bwd.exposed_s <= bwd.comm_s * (1 + 1e-9)


def test_a_larger_vocabulary_adds_its_whole_reduce_scatter_to_the_tail():
    """Doubling the vocabulary, the same layers: the backward's exposure grows by at least
    the extra embedding's reduce-scatter (the lane's tail), not by a layer's share of it."""
    from dataclasses import replace
    m, plan, prof, groups, ch = _first_chunk(64)
    cl = hardware_db.build_cluster("h100-sxm", 64)
    big = build_chunks(replace(m, vocab=2 * m.vocab), plan, cl, prof, groups)[0][0]
    g, e = groups["dp"], m.vocab * m.hidden
    extra_rs = (group_collective_s(Collective.REDUCE_SCATTER, 2 * e * 4, g, prof)
                - group_collective_s(Collective.REDUCE_SCATTER, e * 4, g, prof))
    assert _lane(big.bwd).exposed_s - _lane(ch.bwd).exposed_s >= extra_rs * (1 - 1e-6)


@pytest.mark.parametrize("layers", [1, 2])
def test_a_short_chunk_never_exposes_more_than_its_lane(layers):
    """Priced one unit at a time, the edges can sum to more than the chunk's one gather;
    what is exposed is capped by the lane."""
    from dataclasses import replace
    m = replace(get_preset("llama3-8b"), n_layers=layers)
    cl, prof = hardware_db.build_cluster("h100-sxm", 64), hardware_db.load_profile("h100-sxm")
    plan = with_framework(Plan(dp=64, micro_batch=1, global_batch=64, precision="bf16"),
                          "fsdp2")
    ch = build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0][0]
    for pc in (ch.fwd, ch.bwd):
        assert _lane(pc).exposed_s <= _lane(pc).comm_s * (1 + 1e-9)


@pytest.mark.parametrize("framework, units", [("fsdp2", 1), ("torchtitan", 3)])
def test_the_edge_units_pay_a_units_hooks(framework, units):
    """Besides one unit per layer, FSDP runs the root's hooks (and, in torchtitan, those of
    the embedding and [norm, output] units): with one chunk, 1 or 3 more units' host work
    than the layers alone (each priced as a layer unit's hooks, assumed)."""
    import dataclasses

    from simulator.cost.host import mechanisms_host
    from simulator.frameworks import HOST
    m, plan, prof, groups, ch = _first_chunk(8, framework, "llama3-8b")
    mech = HOST.mechanisms["fsdp2_unit"]
    layers = len(ch.layers)
    f0, b0 = mechanisms_host(("fsdp2_unit",), layers, 0, prof)
    f1, b1 = mechanisms_host(("fsdp2_unit",), layers, 0, prof, edge_units=units)
    assert f1.ops - f0.ops == pytest.approx(units * mech.layer_fwd_eager_ops)
    assert b1.ops - b0.ops == pytest.approx(units * mech.layer_bwd_eager_ops)
    bare = dataclasses.replace(plan, host_mechanisms=tuple(
        x for x in plan.host_mechanisms if x != "fsdp2_unit"))
    cl = hardware_db.build_cluster("h100-sxm", 8)
    plain = build_chunks(m, bare, cl, prof, groups)[0][0]
    extra_ops = ch.fwd.host_ops - plain.fwd.host_ops
    assert extra_ops == pytest.approx((layers + units) * mech.layer_fwd_eager_ops, rel=1e-6)
