"""DeepSpeed's engines as their source runs them (deepspeedai/DeepSpeed @ edaa7221;
frameworks.json "deepspeed" and "megatron-deepspeed"): gradient reduction overlaps backward
only under ZeRO-3 (overlap_comm's default), and the pipeline engine sends each TP rank's
1/tp slice, all-gathered on arrival (PartitionedTensor)."""
from __future__ import annotations

from dataclasses import replace

import pytest

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.engine.stage_work import place_groups
from simulator.engine.simulate import simulate
from simulator.engine.step import pipeline_send_costs
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset


@pytest.mark.parametrize("zero, overlap", [(0, False), (1, False), (2, False), (3, True)])
def test_deepspeed_overlaps_gradient_reduction_only_under_zero3(zero, overlap):
    p = with_framework(Plan(dp=8, zero_stage=zero), "deepspeed", keep={"zero_stage"})
    assert p.dp_overlap is overlap
    assert with_framework(Plan(dp=8), "deepspeed").dp_overlap is False     # its default: 0
    kept = with_framework(Plan(dp=8, dp_overlap=True), "deepspeed", keep={"dp_overlap"})
    assert kept.dp_overlap is True                                         # the user's word


def test_deepspeed_pipeline_sends_tp_slices_and_gathers_them():
    """One hand-off carries 1/tp of the activation plus a TP all-gather of the whole, as
    Megatron's scatter/gather does; the step is then no slower than with whole sends."""
    model = get_preset("llama2-13b")
    cl = make_cluster("a100-sxm-80gb", 32)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    for fw in ("deepspeed", "megatron-deepspeed"):
        p = with_framework(Plan(tp=4, pp=4, dp=2, micro_batch=1, global_batch=16), fw)
        assert p.pp_scatter_gather
        groups = place_groups(cl, p)
        sliced = pipeline_send_costs(model, p, cl, prof, groups)
        whole = pipeline_send_costs(model, replace(p, pp_scatter_gather=False), cl, prof,
                                    groups)
        full = p.micro_batch * model.seq_len * model.hidden * 2
        assert sliced[0].size_bytes == pytest.approx(full / p.tp)
        assert whole[0].size_bytes == pytest.approx(full) and len(whole) == 1
        assert len(sliced) == 2 and sliced[1].size_bytes == pytest.approx(full)
        t = simulate(model, p, cl, prof).step_time_s
        assert t <= simulate(model, replace(p, pp_scatter_gather=False), cl, prof).step_time_s


def test_deepspeed_reduction_after_backward_is_never_faster():
    """Exposed reduction (DeepSpeed's default below ZeRO-3) costs at least what the
    overlapped one does."""
    model = get_preset("llama2-7b")
    cl = make_cluster("a100-sxm-80gb", 16)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    p = with_framework(Plan(dp=16, micro_batch=2, global_batch=64), "deepspeed")
    assert not p.dp_overlap
    exposed = simulate(model, p, cl, prof)
    hidden = simulate(model, replace(p, dp_overlap=True), cl, prof)
    assert exposed.step_time_s > hidden.step_time_s
    assert exposed.breakdown.dp_comm_s > hidden.breakdown.dp_comm_s


def test_bloom_launch_blocking_makes_the_host_synchronous():
    """BLOOM's training script sets CUDA_LAUNCH_BLOCKING=1 (tr11-176B-ml.slurm): every
    launch waits for its kernel, so each pass costs its host time plus its device time,
    exactly as a synchronous-host profile prices it, in both engines; never faster than the
    asynchronous host."""
    model = get_preset("llama2-7b")
    cl = make_cluster("a100-sxm-80gb", 16)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    p = with_framework(Plan(tp=2, pp=2, dp=4, micro_batch=1, global_batch=16), "megatron-deepspeed")
    assert "cuda_launch_blocking" in p.host_mechanisms
    sync = replace(prof, host=replace(prof.host, synchronous=True))
    free = replace(p, host_mechanisms=tuple(m for m in p.host_mechanisms
                                            if m != "cuda_launch_blocking"))
    for engine in ("event", "analytic"):
        blocked = simulate(model, p, cl, prof, engine=engine).step_time_s
        assert blocked == pytest.approx(simulate(model, free, cl, sync, engine=engine).step_time_s)
        assert blocked > simulate(model, free, cl, prof, engine=engine).step_time_s
    assert not prof.host.synchronous                  # the shipped profile is not changed
