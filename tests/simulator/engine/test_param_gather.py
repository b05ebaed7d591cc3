"""The ZeRO-1/2 parameter all-gather moves the updated parameters in their dtype, and linear
weights kept as FP8 primary weights in FP8: Megatron's --fp8-param-gather "performs the
param all-gather in fp8" (arguments.py L2016-2018 @ d98e8a64), which NeMo's FP8 recipes set
(frameworks.json memory.nemo). Expected bytes from the chunk's parameter counts."""
from __future__ import annotations

import dataclasses

import pytest

import hardware_db
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.engine.step import chunk_params, param_gather_bytes, param_gather_time_s
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

MODEL = get_preset("llama3-8b")
PROF = hardware_db.load_profile("h100-sxm")
CL = hardware_db.build_cluster("h100-sxm", 16)


def _chunks(framework: str, precision: str):
    plan = with_framework(Plan(pp=2, dp=8, micro_batch=1, global_batch=64, precision=precision,
                               zero_stage=1), framework, {"zero_stage"})
    groups = place_groups(CL, plan)
    return plan, groups, build_chunks(MODEL, plan, CL, PROF, groups)


@pytest.mark.parametrize("framework, precision, fp8_linear", [
    ("megatron-core", "bf16", False), ("megatron-core", "fp8", False), ("nemo", "bf16", False),
    ("nemo", "fp8", True)])
def test_gathered_bytes(framework, precision, fp8_linear):
    plan, _, stages = _chunks(framework, precision)
    assert plan.memory.fp8_primary_weights == (framework == "nemo")
    for chunks in stages:
        dense, expert = chunk_params(chunks)
        linear = sum(c.memory.linear_params for c in chunks)
        assert 0 < linear < dense and expert == 0
        want = (dense - linear) * 2 + linear * 1 if fp8_linear else dense * 2
        assert param_gather_bytes(chunks, plan) == (pytest.approx(want), 0.0)


def test_fp8_gather_is_faster_where_it_is_exposed():
    plan, groups, stages = _chunks("nemo", "fp8")
    cached = dataclasses.replace(plan, memory=dataclasses.replace(plan.memory,
                                                                   fp8_primary_weights=False))
    for chunks in stages:
        assert param_gather_time_s(chunks, plan, groups, PROF) < \
            param_gather_time_s(chunks, cached, groups, PROF)
