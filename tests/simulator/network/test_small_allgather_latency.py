"""The latency a small all-gather pays across nodes, which ZeRO-3's per-collective counts
lean on (``engine.fsdp_comm``; a 1.5 kB gather per persistent tensor, one per weight matrix
under DeepSpeed): no measurement here covers all-gathers over 2-64 nodes, so the model is
held against NCCL's own tuning model for a ring with the LL protocol (NVIDIA/nccl
src/graph/tuning.cc @ 01afd20a, ``ncclTopoTuneModel``: base 3.6 us + (nsteps - nInterSteps)
x NVLink hop 0.47 us x 1.8 off-node + nInterSteps x network hop 2.7 us, nsteps = ranks - 1,
nInterSteps = nodes - 1 for an all-gather). Both grow linearly with the ranks; held within
35 % of NCCL's estimate from 2 to 64 nodes of 8 A100s (today 13-29 % above it; newer NCCL
releases raise the base and the off-node NVLink hop, which narrows that)."""
from __future__ import annotations

import pytest

import hardware_db
from simulator.cost.layer import group_collective
from simulator.engine.stage_work import place_groups
from simulator.network.collectives import Collective
from simulator.parallel.plan import Plan


def _nccl_ring_ll_us(ranks: int, nodes: int) -> float:
    steps, inter = ranks - 1, nodes - 1
    return 3.6 + (steps - inter) * 0.47 * 1.8 + inter * 2.7


@pytest.mark.parametrize("gpus", [16, 64, 512])
def test_a_small_all_gather_across_nodes_tracks_nccl_s_own_latency_model(gpus):
    prof = hardware_db.load_profile("a100-sxm4-80gb")
    cl = hardware_db.build_cluster("a100-sxm4-80gb", gpus)
    plan = Plan(dp=gpus, micro_batch=1, global_batch=gpus, precision="bf16", zero_stage=3)
    c = group_collective(Collective.ALL_GATHER, 1536, place_groups(cl, plan)["dp"], prof)
    ratio = c.time_s * 1e6 / _nccl_ring_ll_us(gpus, gpus // 8)
    assert c.latency_bound and 0.75 <= ratio <= 1.35, ratio
