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
