"""Megatron-Core's flex dispatcher on DeepEP (Plan.moe_dispatcher = "flex"): one copy of a
token per destination rank over NVLink and per destination node over RDMA
(simulator.cost.moe_comm), checked against sampling, DeepEP's published internode
bandwidths and the all-to-all dispatcher it replaces."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

import hardware_db
from calibrate.csvrows import load_rows, select
from simulator.api.catalog import make_cluster
from simulator.cost.moe_comm import flex_leg_costs
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import place_groups
from simulator.errors import InvalidInputError
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset
from simulator.workload.moe_load import expected_distinct, flex_destinations
from simulator.workload.ops import LayerShape, layer_ops
from simulator.workload.op_types import FlexRouting


def _sampled(top_k, experts, groups, group_topk, ranks, nodes, n=4000, seed=7):
    """DeepEP's own benchmark routing (tests/legacy/test_internode.py): pick group_topk of
    the groups, then top_k experts among theirs, uniformly; count distinct ranks, nodes."""
    rng = random.Random(seed)
    per_g = experts // groups if groups else experts
    r_hit = n_hit = 0
    for _ in range(n):
        cand = ([e for g in rng.sample(range(groups), group_topk)
                 for e in range(g * per_g, (g + 1) * per_g)] if groups else range(experts))
        chosen = rng.sample(list(cand), top_k)
        r_hit += len({e // (experts // ranks) for e in chosen})
        n_hit += len({e // (experts // nodes) for e in chosen})
    return r_hit / n, n_hit / n


@pytest.mark.parametrize("bins, draws, pool", [(8, 8, 256), (32, 8, 128), (4, 2, 8), (64, 8, 256)])
def test_expected_distinct_matches_sampling(bins, draws, pool):
    rng = random.Random(1)
    per = pool // bins
    hits = [len({x // per for x in rng.sample(range(pool), draws)}) for _ in range(20000)]
    assert expected_distinct(bins, draws, pool) == pytest.approx(sum(hits) / len(hits),
                                                                  rel=0.01)


@pytest.mark.parametrize("top_k, experts, groups, group_topk, ranks, nodes", [
    (8, 256, 8, 4, 64, 8),      # DeepSeek-V3: node-limited to 4 of 8 nodes
    (8, 256, 4, 4, 32, 4),      # group limit covering every node (no limit)
    (8, 256, 2, 2, 16, 2),
    (8, 128, 0, 0, 64, 8),      # Qwen3-style, no group limit
    (6, 64, 8, 3, 32, 2),       # several groups per node
    (8, 256, 8, 4, 4, 1),       # several groups per rank (DeepSeek-V3 at EP4)
    (8, 256, 8, 4, 2, 1),       # ... and at EP2
    (6, 160, 8, 3, 80, 10),     # groups straddling nodes (DeepSeek-V2 shape, EP80)
    (6, 160, 8, 3, 40, 5),
])
def test_flex_destinations_match_sampled_routing(top_k, experts, groups, group_topk, ranks,
                                                 nodes):
    want = _sampled(top_k, experts, groups, group_topk, ranks, nodes)
    got = flex_destinations(top_k, experts, groups, group_topk, ranks, nodes)
    assert got[0] == pytest.approx(want[0], rel=0.015)     # sampling noise (4000 tokens)
    assert got[1] == pytest.approx(want[1], rel=0.015)


def test_rdma_leg_against_deepep_internode_benchmarks():
    """collectives_more.csv: DeepEP V1 normal kernels on 2, 4, 8 nodes of 8 H800 with one
    400 Gb/s CX7 per GPU, 4096 tokens of hidden 7168, top-8 of 256 experts, top-min(nodes,4)
    groups; FP8 dispatch, BF16 combine. Their RDMA 'bottleneck bandwidth' counts one copy
    per (token, node), the own node included; the measured time is those bytes over it.
    Modelled on the same NICs (an H100 cluster): within 25 % on every row (0.90, 0.90, 1.22,
    1.19, 1.08, 1.05 x the measured time when written)."""
    rows = select(load_rows("collectives_more.csv"),
                  lambda d: d["algorithm"].startswith("DeepEP V1 normal") and d["nodes"] != "1")
    assert len(rows) == 6
    prof = hardware_db.load_profile("h100-sxm")
    for row in rows:
        nodes, gpus = int(row.data["nodes"]), int(row.data["gpus"])
        fp8 = "FP8" in row.data["message_bytes"]
        tb = 7168 * ((1 + 4 / 128) if fp8 else 2.0)        # test_internode.py fp8_factor
        groups, gtop = nodes, min(nodes, 4)
        g = place_groups(make_cluster("h100-sxm", gpus, nic_gbps=400),
                         Plan(ep=gpus, dp=gpus))["ep"]
        _, rail = flex_leg_costs(FlexRouting(4096, tb, 8, 256, groups, gtop), g, prof)
        hit = flex_destinations(8, 256, groups, gtop, gpus, nodes)[1]
        measured = 4096 * hit * tb / (float(row.data["busbw_GBps"]) * 1e9)
        assert 0.8 < rail.time_s / measured < 1.25, (row.line, rail.time_s / measured)


def _dsv3_plan(dispatcher: str, gpus: int = 512) -> tuple:
    m = get_preset("deepseek-v3")
    cl = make_cluster("h100-sxm", gpus, nic_gbps=400)
    p = with_framework(Plan(pp=8, ep=64, dp=gpus // 8, global_batch=2 * gpus // 8,
                            moe_dispatcher=dispatcher), "megatron-core")
    return m, p, cl, hardware_db.load_profile("h100-sxm")


def test_flex_ops_and_the_step_it_saves_across_nodes():
    m, p, cl, prof = _dsv3_plan("flex")
    sh = LayerShape(1, m.seq_len, ep=64, moe_dispatcher="flex")
    names = {o.name: o for o in layer_ops(m, sh, m.n_layers - 1)}
    assert names["ep_dispatch"].routing is not None and names["ep_combine"].routing is not None
    assert "ep_dispatch_probs" not in names and "moe_sort_chunks" not in names
    flex = simulate(m, p, cl, prof)
    a2a = simulate(m, replace(p, moe_dispatcher="alltoall"), cl, prof)
    assert flex.step_time_s < a2a.step_time_s       # 3.6 node copies per token, not 7


def test_flex_needs_tp_1():
    with pytest.raises(InvalidInputError, match="moe_dispatcher"):
        Plan(tp=2, ep=8, dp=8, moe_dispatcher="flex")
    with pytest.raises(InvalidInputError, match="moe_dispatcher"):
        Plan(moe_dispatcher="deepep")
    Plan(tp=2, dp=4, moe_dispatcher="flex")        # no expert parallelism: nothing to refuse


def test_roofline_prices_flex_ops_as_the_step_does():
    """The bottleneck report's per-op rows (planning.whatif) go through the same pricing as
    the step (cost.layer.comm_op_cost), so a flex dispatch is not a plain all-to-all there."""
    from simulator.cost.layer import comm_op_cost
    from simulator.planning.whatif import roofline_ops
    m, p, cl, prof = _dsv3_plan("flex")
    rows = {r.name: r for r in roofline_ops(m, p, cl, prof) if r.where == "moe-layer"}
    groups = place_groups(cl, p)
    sh = LayerShape(1, m.seq_len, ep=64, moe_dispatcher="flex")
    op = next(o for o in layer_ops(m, sh, m.n_layers - 1) if o.name == "ep_dispatch")
    assert rows["ep_dispatch"].time_s == pytest.approx(comm_op_cost(op, groups, prof).time_s)


def test_flex_reaches_search_api_and_launch_files():
    """The dispatcher travels through the search space (no tp > 1 shape with ep > 1), the
    Python API's config and the launch files it writes."""
    from simulator.api.config import TrainingConfig
    from simulator.api.transformer_flow import config_of, plan_of
    from simulator.planning.launch_args import megatron_args
    from simulator.planning.launch_frameworks import nemo_recipe
    from simulator.search.space import SearchSpace, enumerate_shapes, make_plan, Knobs
    from simulator.parallel.plan import Recompute
    from simulator.hardware.specs import Dtype
    m = get_preset("qwen3-30b-a3b")
    space = SearchSpace(moe_dispatcher="flex")
    shapes = list(enumerate_shapes(m, 16, space))
    assert shapes and not [s for s in shapes if s.tp > 1 and s.ep > 1]
    assert any(s.tp > 1 for s in enumerate_shapes(m, 16, SearchSpace()) if s.ep > 1)
    plan = make_plan(shapes[-1], Knobs(1, 1, 0, Recompute.NONE, False, Dtype.BF16), 64, space)
    assert plan.moe_dispatcher == "flex"
    cfg = TrainingConfig(n_gpus=16, ep=8, moe_dispatcher="flex")
    assert plan_of(cfg).moe_dispatcher == "flex"
    assert config_of(plan_of(cfg), cfg, "h100-sxm", 16).moe_dispatcher == "flex"
    p = plan_of(cfg)
    assert "--moe-token-dispatcher-type flex" in " ".join(megatron_args(m, p))
    assert "moe_token_dispatcher_type='flex'" in nemo_recipe(m, p, 2, 8)        # GPTConfig
    dsv3 = nemo_recipe(get_preset("deepseek-v3"), replace(p, ep=16), 2, 8)    # its recipe
    assert "recipe.model.config.moe_token_dispatcher_type = 'flex'" in dsv3


def test_flex_needs_expert_parallelism_for_moe_and_tune_keeps_it(tmp_path):
    """Megatron's flex dispatcher asserts TP x EP > 1 and expert TP under it is not modelled:
    an MoE plan under flex needs ep > 1 and tp = 1 (the search enumerates only those), and
    the analyzer's auto_tune keeps the config's dispatcher (review of 4e81c14)."""
    from simulator.parallel.plan import validate
    from simulator.search.space import SearchSpace, enumerate_shapes
    m = get_preset("qwen3-30b-a3b")
    cl = make_cluster("h100-sxm", 16)
    for bad in (Plan(dp=16, global_batch=16, moe_dispatcher="flex"),
                Plan(tp=2, dp=8, global_batch=16, moe_dispatcher="flex")):
        with pytest.raises(InvalidInputError, match="moe_dispatcher"):
            validate(bad, m, cl)
    assert all(s.tp == 1 and s.ep > 1
               for s in enumerate_shapes(m, 16, SearchSpace(moe_dispatcher="flex")))
    validate(Plan(tp=2, dp=8, global_batch=16, moe_dispatcher="flex"), get_preset("llama3-8b"),
             cl)                                    # dense: the dispatcher does not apply
    from simulator.api.analyzer import ComplexityAnalyzer
    from simulator.search.driver import SearchOptions
    a = ComplexityAnalyzer(ledger=tmp_path / "ledger",
                           options=SearchOptions(workers=1, event_top=2, event_max=2))
    a.analyze_model("qwen3-30b-a3b", n_gpus=16, ep=4, global_batch=128, moe_dispatcher="flex")
    best = a.auto_tune({"gpu": "h100-sxm", "n_gpus": 16})
    assert best.moe_dispatcher == "flex" and best.tp == 1 and best.ep > 1
