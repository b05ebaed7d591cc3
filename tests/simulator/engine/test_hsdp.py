"""HSDP (``Plan.dp_shard``): ZeRO-3 / FSDP sharded within groups of consecutive data-parallel
ranks, the reduced gradient shards all-reduced across the groups (FSDP2 ``foreach_reduce``
on the replicate group, FSDP1 HYBRID_SHARD)."""
from __future__ import annotations

from dataclasses import replace

import hardware_db
import pytest

from simulator.api.catalog import make_cluster
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import place_groups
from simulator.errors import InvalidInputError
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset

MODEL = get_preset("llama2-7b")


def _plan(shard: int, gpus: int = 16) -> Plan:
    p = with_framework(Plan(dp=gpus, micro_batch=1, global_batch=gpus, precision="bf16"),
                       "fsdp2")
    return replace(p, dp_shard=shard)


def _run(shard: int, gpus: int = 16):
    cl, prof = make_cluster("a100-sxm-80gb", gpus), hardware_db.load_profile("a100-sxm-80gb")
    return simulate(MODEL, _plan(shard, gpus), cl, prof)


@pytest.mark.parametrize("gpus", [8, 16])
def test_a_shard_group_of_all_ranks_is_plain_fsdp(gpus):
    a, b = _run(0, gpus), _run(gpus, gpus)
    assert a.step_time_s == b.step_time_s
    assert a.peak_memory_bytes == b.peak_memory_bytes


def test_state_is_sharded_over_the_group_only():
    """Weights, gradients and optimizer state per rank grow by dp / dp_shard."""
    full, hsdp = _run(0).stages[0], _run(8).stages[0]
    for f in ("weights_bytes", "grads_bytes", "optimizer_bytes"):
        assert getattr(hsdp, f) == pytest.approx(2 * getattr(full, f), rel=1e-6), f


def test_gathers_stay_in_the_node_and_shards_are_all_reduced_across_nodes():
    cl = make_cluster("a100-sxm-80gb", 16)
    g = place_groups(cl, _plan(8))
    assert g["dp_shard"].size == 8 and g["dp_shard"].domains == 1
    assert g["dp_rep"].size == 2 and g["dp_rep"].domains == 2
    full, hsdp = _run(0), _run(8)
    # the cross-node traffic: an all-reduce of 1/8 of the gradients, against a reduce-scatter
    # and two gathers of all of them across the nodes without HSDP
    busy = lambda r: r.link_busy_s.get("nic", 0.0)   # noqa: E731
    assert 0 < busy(hsdp) < busy(full)


@pytest.mark.parametrize("shard, zero, why", [(3, 3, "divisor"), (8, 1, "zero_stage=3")])
def test_bad_shard_groups_are_refused(shard, zero, why):
    with pytest.raises(InvalidInputError, match=why):
        Plan(dp=16, micro_batch=1, global_batch=16, zero_stage=zero, dp_shard=shard)


def test_the_command_line_sets_it(capsys):
    import json
    from simulator.cli.main import main
    args = ["simulate", "--model", "llama2-7b", "--gpu", "a100-sxm-80gb", "--gpus", "16",
            "--global-batch", "16", "--framework", "fsdp2", "--json"]
    assert main(args + ["--dp-shard", "8"]) == 0
    hsdp = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out)
    assert hsdp["step_time_s"] != full["step_time_s"]


def test_the_python_config_carries_it():
    """``TrainingConfig.dp_shard`` reaches the plan and comes back from a searched plan."""
    from simulator.api.config import TrainingConfig
    from simulator.api.transformer_flow import config_of, plan_of
    cfg = TrainingConfig(gpu="a100-sxm-80gb", n_gpus=16, global_batch=16, zero_stage=3,
                         dp_shard=8)
    plan = plan_of(cfg)
    assert plan.dp_shard == 8 and plan.replicas == 2
    assert config_of(plan, cfg, "a100-sxm-80gb", 16).dp_shard == 8
    with pytest.raises(InvalidInputError, match="dp_shard"):
        TrainingConfig(dp_shard=-1)


def _lane(plan: Plan, gpus: int, params: float, dense: float | None = None):
    """The backward FSDP segment of one pass over ``params`` on an empty pass."""
    from simulator.cost.layer import PassCost
    from simulator.engine.fsdp_comm import add_fsdp_comm
    cl, prof = make_cluster("h100-sxm", gpus), hardware_db.load_profile("h100-sxm")
    fwd, bwd = PassCost(), PassCost()
    add_fsdp_comm(fwd, bwd, params, 32, plan, place_groups(cl, plan), prof, cl,
                   dense=dense)
    return bwd.segments[0], place_groups(cl, plan), prof


def test_the_all_reduce_runs_beside_the_reduce_scatters():
    """FSDP2 runs HSDP's all-reduces on their own stream, concurrent with the following
    units' reduce-scatters: the backward lane is the longer chain, not their sum."""
    from simulator.cost.layer import group_collective
    from simulator.network.collectives import Collective as C
    plan = replace(_plan(8, 128), memory=replace(_plan(8, 128).memory, fsdp_reduce_fp32=True))
    params = 7e9
    seg, g, prof = _lane(plan, 128, params)
    ag = group_collective(C.ALL_GATHER, params * 2, g["dp_shard"], prof).time_s
    rs = group_collective(C.REDUCE_SCATTER, params * 4, g["dp_shard"], prof).time_s
    ar = group_collective(C.ALL_REDUCE, params * 4 / 8, g["dp_rep"], prof).time_s
    assert ar > 0 and seg.comm_s == pytest.approx(max(ag + rs, ar), rel=1e-6)
    assert "hsdp all-reduce" in seg.name and seg.links[-1] != seg.links[0]


def test_expert_shards_are_reduced_over_their_own_group():
    """With EP the experts are sharded over the shard group thinned by EP (torchtitan's
    dp_shard_mod_ep): each rank all-reduces expert bytes / (dp_shard / ep) across replicas."""
    from simulator.cost.layer import group_collective
    from simulator.network.collectives import Collective as C
    base = with_framework(Plan(dp=64, ep=8, micro_batch=1, global_batch=64, precision="bf16"),
                          "torchtitan")
    plan = replace(base, dp_shard=16)
    g = place_groups(make_cluster("h100-sxm", 64), plan)
    assert g["edp_shard"].size == 2 and g["dp_rep"].size == 4
    dense, expert = 1e9, 4e9
    seg, g, prof = _lane(plan, 64, dense + expert, dense)
    ar = (group_collective(C.ALL_REDUCE, dense * 4 / 16, g["dp_rep"], prof).time_s
          + group_collective(C.ALL_REDUCE, expert * 4 / 2, g["dp_rep"], prof).time_s)
    chain = (group_collective(C.ALL_GATHER, dense * 2, g["dp_shard"], prof).time_s
             + group_collective(C.ALL_GATHER, expert * 2, g["edp_shard"], prof).time_s
             + group_collective(C.REDUCE_SCATTER, dense * 4, g["dp_shard"], prof).time_s
             + group_collective(C.REDUCE_SCATTER, expert * 4, g["edp_shard"], prof).time_s)
    assert seg.comm_s == pytest.approx(max(chain, ar), rel=1e-6)


def test_optimizer_work_and_engines():
    """Each rank updates dp / dp_shard times the parameters; the analytic engine agrees
    with the event engine."""
    cl, prof = make_cluster("a100-sxm-80gb", 16), hardware_db.load_profile("a100-sxm-80gb")
    full, hsdp = _run(0), _run(8)
    assert hsdp.breakdown.optimizer_s == pytest.approx(2 * full.breakdown.optimizer_s, rel=0.02)
    ana = simulate(MODEL, _plan(8), cl, prof, engine="analytic")
    assert ana.step_time_s == pytest.approx(hsdp.step_time_s, rel=0.02)


def test_context_parallel_groups_are_kept_whole_and_launched_so():
    from simulator.planning.launch_frameworks import _dp_degrees
    with pytest.raises(InvalidInputError, match="multiple of cp=4"):
        Plan(dp=8, cp=4, micro_batch=1, global_batch=8, zero_stage=3, dp_shard=2)
    with pytest.raises(InvalidInputError, match="0 with zero_stage=1"):
        Plan(dp=32, micro_batch=1, global_batch=32, zero_stage=1, dp_shard=8)
    p = Plan(dp=16, cp=2, micro_batch=1, global_batch=16, zero_stage=3, dp_shard=8)
    assert _dp_degrees(p)[:2] == (4, 4)          # torchtitan: replicate 4, shard 4 (x cp 2)


def test_memory_remedies_offer_full_sharding():
    from simulator.engine.memory_fit import _candidates
    names = [n for n, _ in _candidates(_plan(8))]
    assert any(n.startswith("dp_shard=0") for n in names)
    assert any(n.startswith("tp=2") for n in names)


def test_the_search_tries_hsdp_groups_only_where_they_apply():
    """``SearchSpace.dp_shards`` adds HSDP groups beside full sharding for ZeRO-3 knobs, each
    a proper divisor of dp*cp and a multiple of cp and ep; nothing for ZeRO-0/1."""
    from simulator.search.space import SearchSpace, Shape, knob_options
    space = SearchSpace(zero_stages=(1, 3), dp_shards=(8, 3, 64), micro_batches=(1,),
                        recomputes=("none",))
    knobs = knob_options(MODEL, Shape(tp=1, cp=2, pp=1, dp=16, ep=1), space)
    assert sorted({(k.zero_stage, k.dp_shard) for k in knobs}) == [(1, 0), (3, 0), (3, 8)]
    with pytest.raises(InvalidInputError, match="dp_shards"):
        SearchSpace(dp_shards=(0,))
