"""How many collectives one pass of ZeRO-3 / FSDP takes, each paying its own latency
(``engine.fsdp_comm.zero3_tensors``, ``cost.persistence.gather_calls`` / ``reduce_calls``):
torch FSDP issues one all-gather and one reduce-scatter per unit (FlatParamHandle /
FSDPParamGroup: a layer, plus the root); DeepSpeed ZeRO-3 coalesces the next partitioned
parameters of its module trace into one all-gather until it holds stage3_prefetch_bucket_size
elements, and reduce-scatters one ipg bucket of reduce_bucket_size at a time (DeepSpeed
0.19.8 partitioned_param_coordinator.py l.450-484, stage3.py l.1583-1585; HF's "auto":
0.9 x hidden^2 and hidden^2). Closed forms on presets, the greedy rules' properties, and the
pass's collective time as that many collectives of the parts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.cost.host import ParamLayout, param_tensors
from simulator.cost.layer import PassCost, group_collective
from simulator.cost.persistence import gather_calls, reduce_calls
from simulator.engine.fsdp_comm import add_fsdp_comm, zero3_tensors
from simulator.engine.stage_work import build_chunks, layer_shape, place_groups
from simulator.network.collectives import Collective
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset
from simulator.workload.ops import embedding_ops, head_ops, layer_ops


def _plan(fw: str, gpus: int = 8) -> Plan:
    return with_framework(Plan(dp=gpus, micro_batch=1, global_batch=gpus, precision="bf16",
                               zero_stage=3), fw, {"zero_stage"})


def test_deepspeed_gathers_each_weight_matrix_and_reduces_each_tensor_of_llama():
    """Llama-2 7B under DeepSpeed with HF's auto sizes: every weight matrix holds at least
    0.9 x hidden^2 elements, so each is an all-gather of its own (7 a layer, the embedding
    and the output layer: 226) and the 65 norms persist; the gradients come in the reverse
    order and any two neighbours overflow a hidden^2 bucket, so each of the 291 tensors is
    a reduce-scatter of its own."""
    m = get_preset("llama2-7b")
    plan = _plan("deepspeed")
    lay = ParamLayout.of(m, plan.memory.param_layout)
    sh = layer_shape(m, plan)
    lf, extra = layer_ops(m, sh), embedding_ops(m, sh) + head_ops(m, sh)
    tensors = 32 * param_tensors(lf, lay) + param_tensors(extra, lay)
    assert tensors == 291
    assert zero3_tensors(m, plan, lay, [(lf, 32), (extra, 1)], 33) == \
        (65, ((226, 291), (1, 1)))                       # no experts: one nominal call
    # the engine's chunk is priced so: its forward gathers are 226 of a 226th each
    cl = hardware_db.build_cluster("a100-sxm4-80gb", 8)
    prof = hardware_db.load_profile("a100-sxm4-80gb")
    groups = place_groups(cl, plan)
    (ch,) = build_chunks(m, plan, cl, prof, groups)[0]
    one = group_collective(Collective.ALL_GATHER, ch.params * 2 / 226, groups["dp"], prof)
    seg = next(x for x in ch.fwd.segments if x.name == "fsdp all-gather")
    assert ch.persistent_tensors == 65 and seg.comm_s == pytest.approx(226 * one.time_s,
                                                                       rel=1e-9)


def test_deepspeed_counts_the_experts_tensors_apart_from_the_dense_ones():
    """Mixtral 8x7B under DeepSpeed ZeRO-3, transformers 5's 3-D experts (a gate_up and a
    down tensor a layer, each far above the buckets): 2 expert gathers and 2 reduce-scatters
    a layer, never the dense part's count. The dense part a layer: q (hidden^2) fills a
    gather alone, k and v (GQA: a quarter each) wait for o; in backward the ipg bucket
    (hidden^2) is flushed as o, v, q and the first norm arrive (k joins v): 2 gathers and
    4 reduce-scatters a layer; the router (8 x hidden) persists with the 2 norms."""
    m = get_preset("mixtral-8x7b")
    plan = _plan("deepspeed")
    lay = ParamLayout.of(m, plan.memory.param_layout)
    sh = layer_shape(m, plan)
    lf, extra = layer_ops(m, sh), embedding_ops(m, sh) + head_ops(m, sh)
    got = {n: zero3_tensors(m, plan, lay, [(lf, n), (extra, 1)], n + 1) for n in (32, 33)}
    persistent, (dense, experts) = got[32]
    assert persistent == 32 * 3 + 1 and experts == (64, 64)
    assert got[33][1][0][0] - dense[0] == 2 and got[33][1][0][1] - dense[1] == 4
    assert dense[0] == 32 * 2 + 2                        # and the table and the head


def test_fsdp_takes_one_of_each_per_unit():
    """GPT-2 under FSDP: 12 layer units and the root, 13 all-gathers and reduce-scatters a
    pass, nothing persistent; the chunk's forward gathers cost 13 gathers of a 13th."""
    m = get_preset("gpt2-124m")
    cl = hardware_db.build_cluster("a100-sxm4-80gb", 64)
    prof = hardware_db.load_profile("a100-sxm4-80gb")
    plan = _plan("fsdp", 64)
    groups = place_groups(cl, plan)
    lay = ParamLayout.of(m, plan.memory.param_layout)
    sh = layer_shape(m, plan)
    runs = [(layer_ops(m, sh), 12), (embedding_ops(m, sh) + head_ops(m, sh), 1)]
    assert zero3_tensors(m, plan, lay, runs, 13) == (0, ((13, 13), (1, 1)))
    (ch,) = build_chunks(m, plan, cl, prof, groups)[0]
    assert ch.units == 13                   # what the engine passes as the units
    fwd, bwd = PassCost(), PassCost()
    add_fsdp_comm(fwd, bwd, ch.params, 12, plan, groups, prof, cl, calls=((13, 13), (1, 1)))
    one = group_collective(Collective.ALL_GATHER, ch.params * 2 / 13, groups["dp"], prof)
    assert fwd.segments[0].comm_s == pytest.approx(13 * one.time_s, rel=1e-9)
    whole = PassCost()
    add_fsdp_comm(whole, PassCost(), ch.params, 12, plan, groups, prof, cl)
    assert fwd.segments[0].comm_s > whole.segments[0].comm_s      # 12 more latencies


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.floats(1, 1e8), min_size=1, max_size=40),
       bucket=st.floats(1, 1e9), threshold=st.floats(0, 1e6))
def test_the_greedy_rules_stay_within_one_call_per_tensor_and_one_in_all(sizes, bucket,
                                                                         threshold):
    parted = [x for x in sizes if x > threshold]
    g = gather_calls(sizes, threshold, bucket)
    assert (g == 0) == (not parted) and g <= len(parted)
    assert gather_calls(sizes, threshold, 0.0) == len(parted)
    assert gather_calls(sizes, threshold, float("inf")) == (1 if parted else 0)
    r = reduce_calls(sizes, bucket)
    assert 1 <= r <= len(sizes)
    assert reduce_calls(sizes, 0.0) == len(sizes) and reduce_calls(sizes, float("inf")) == 1
    assert g <= gather_calls(sizes, threshold, bucket / 2)      # a smaller bucket: no fewer


def test_small_tensors_share_a_call():
    """Four quarter-buckets fill one all-gather; a reduce bucket of 1.0 takes two halves
    and leaves the third for the next."""
    assert gather_calls([0.25, 0.25, 0.25, 0.25, 2.0], 0.0, 0.9) == 2
    assert gather_calls([0.01, 0.25, 0.25, 0.25, 0.25], 0.05, 0.9) == 1   # 0.01 persists
    assert reduce_calls([0.5, 0.5, 0.5], 1.0) == 2


def test_deepspeed_s_step_gathers_its_persistent_tensors_again():
    """GPT-2 under DeepSpeed ZeRO-3 on 64 A100 (HF's auto threshold, 10 x 768): per layer
    4 biases and 2 LayerNorms' weight and bias persist, with the final LayerNorm's 2: 98;
    the step ends with an all-gather of 768 bf16 elements for each over the data-parallel
    group (cost.persistence.persistent_gather_s) in the optimizer phase's device time;
    nothing at ZeRO-2 or under FSDP (no persistence threshold)."""
    import dataclasses

    from simulator.engine import step
    m = get_preset("gpt2-124m")
    cl = hardware_db.build_cluster("a100-sxm4-80gb", 64)
    prof = hardware_db.load_profile("a100-sxm4-80gb")
    got = {}
    for fw, zero in (("deepspeed", 3), ("deepspeed", 2), ("fsdp", 3)):
        plan = dataclasses.replace(_plan(fw, 64), zero_stage=zero)
        groups = place_groups(cl, plan)
        (ch,) = build_chunks(m, plan, cl, prof, groups)[0]
        got[(fw, zero)] = (ch.persistent_tensors, ch.persistent_gather_s)
    dp = place_groups(cl, _plan("deepspeed", 64))["dp"]
    one = group_collective(Collective.ALL_GATHER, 768 * 2, dp, prof).time_s
    assert got[("deepspeed", 3)] == (98, pytest.approx(98 * one, rel=1e-9)) and one > 0
    assert got[("deepspeed", 2)] == (0, 0.0) == got[("fsdp", 3)]
    plan = _plan("deepspeed", 64)
    chunks = build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0]
    without = [dataclasses.replace(c, persistent_gather_s=0.0) for c in chunks]
    for mechs in ((), plan.host_mechanisms):          # after the host's step, not under it
        p = dataclasses.replace(plan, host_mechanisms=mechs)
        assert step.optimizer_time_s(chunks, p, cl, prof) - step.optimizer_time_s(
            without, p, cl, prof) == pytest.approx(98 * one, rel=1e-9)
