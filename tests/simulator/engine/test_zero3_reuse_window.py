"""DeepSpeed ZeRO-3 keeps a layer's gathered parameters from its forward into its backward
when fewer than stage3_max_reuse_distance (1e9) parameter elements are fetched between the
two uses (partitioned_param_coordinator.py __params_to_release): the last layers of the
chunk need no backward all-gather and stay in memory meanwhile
(``memory.accounting.zero3_kept_layers``; frameworks.json ``zero3_reuse_window_params``)."""
from __future__ import annotations

import dataclasses

import pytest

import hardware_db
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.memory.accounting import zero3_kept_layers
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset


def test_kept_layers_in_closed_form():
    # 2 k p + 2 H < W: TinyLlama-like layers of 44M, an output layer of 65.5M
    assert zero3_kept_layers(22, 44e6, 65.5e6, 1e9) == 10
    assert zero3_kept_layers(12, 7e6, 39e6, 1e9) == 12          # GPT-2 small: every layer
    assert zero3_kept_layers(32, 202e6, 131e6, 1e9) == 2        # Llama-2 7B: the last two
    assert zero3_kept_layers(32, 202e6, 131e6, 0) == 0          # FSDP: none
    assert zero3_kept_layers(80, 856e6, 1e9, 1e9) == 0          # the head alone fills it


def _chunk(window: float | None, model: str = "gpt2-124m"):
    m = get_preset(model)
    cl = hardware_db.build_cluster("a100-sxm-80gb", 16)
    plan = with_framework(Plan(dp=16, micro_batch=1, global_batch=16, precision="bf16",
                               zero_stage=3), "deepspeed", {"zero_stage"})
    if window is not None:
        plan = dataclasses.replace(plan, memory=dataclasses.replace(
            plan.memory, zero3_reuse_window_params=window))
    prof = hardware_db.load_profile("a100-sxm-80gb")
    return plan, build_chunks(m, plan, cl, prof, place_groups(cl, plan))[0][0]


def _bwd_gather_bytes(chunk) -> float:
    return sum(s.comm_bytes for s in chunk.bwd.segments if s.name.startswith("fsdp all-gather"))


def test_the_kept_layers_skip_their_backward_gather():
    plan, ds = _chunk(None)
    assert plan.memory.zero3_reuse_window_params == 1e9
    _, released = _chunk(0.0)
    weights = ds.params * 2
    # GPT-2 small fits the window whole: the backward moves only the reduce-scatter
    assert _bwd_gather_bytes(released) - _bwd_gather_bytes(ds) == pytest.approx(weights)
    assert ds.bwd.total_s <= released.bwd.total_s


def test_a_large_model_keeps_only_its_last_layers():
    _, ds = _chunk(None, "llama2-7b")
    _, released = _chunk(0.0, "llama2-7b")
    saved = _bwd_gather_bytes(released) - _bwd_gather_bytes(ds)
    assert saved == pytest.approx(2 / 32 * ds.params * 2, rel=0.02)


def test_the_kept_layers_stay_in_memory():
    """Beyond the one layer gathered anyway, every kept layer's 16-bit weights."""
    from simulator.memory.accounting import fsdp_transient_bytes
    plan, ds = _chunk(None)
    released_plan, released = _chunk(0.0)
    a = fsdp_transient_bytes([ds.memory], plan)
    b = fsdp_transient_bytes([released.memory], released_plan)
    extra = 11 * ds.memory.max_layer_params * 2                  # 12 kept, one counted before
    assert [x - y for x, y in zip(a, b)] == pytest.approx([extra] * 3)
