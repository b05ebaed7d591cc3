"""FSDP's transient at a layer's reduce-scatter: the unsharded gradients in the compute
dtype are still alive when their copy in the reduce dtype is made (FSDP1 grad.to(), FSDP2
_chunk_cat), so a 16-bit run reducing in fp32 holds 2 + 4 B per parameter of the layer
there, one reducing in 16 bits 2 + 2 (or the layer's parameters and gradients before the
free, also 2 + 2)."""
from __future__ import annotations

import dataclasses

import pytest

import hardware_db
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.memory.accounting import fsdp_transient_bytes
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset


def _end(reduce_fp32: bool) -> tuple[float, float]:
    model = get_preset("llama2-7b")
    cl = hardware_db.build_cluster("h100-sxm", 8)
    pl = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"),
                        "llm-foundry")
    pl = dataclasses.replace(pl, memory=dataclasses.replace(pl.memory,
                                                            fsdp_reduce_fp32=reduce_fp32))
    ch = build_chunks(model, pl, cl, hardware_db.load_profile("h100-sxm"),
                      place_groups(cl, pl))[0][0]
    at_loss, at_start, at_end = fsdp_transient_bytes([ch.memory], pl)
    return at_end - (at_start - ch.memory.max_layer_params * 2), ch.memory.max_layer_params


@pytest.mark.parametrize("reduce_fp32, per_param", [(True, 2 + 4), (False, 2 + 2)])
def test_the_reduce_copy_coexists_with_the_16bit_gradients(reduce_fp32, per_param):
    extra, layer = _end(reduce_fp32)
    # at the end: root + prefetched layer (as at the start, less the running layer's
    # 2 B parameters, freed) + the layer's gradients and their reduce copy
    assert extra == pytest.approx(layer * per_param)
