"""Cost models: GEMM roofline, collectives per algorithm."""
from __future__ import annotations

import pytest

import hardware_db
from simulator.cost.kernels import gemm_time_s, wave_efficiency
from simulator.network.collectives import (
    Algorithm,
    Collective,
    LinkUse,
    collective_time_s,
)

H100 = hardware_db.load_gpu("h100-sxm")
A100 = hardware_db.load_gpu("a100-sxm-80gb")
PH = hardware_db.load_profile("h100-sxm")
PA = hardware_db.load_profile("a100-sxm-80gb")
NVL = LinkUse("nvlink", 450.0, 0.6)
IB = LinkUse("infiniband", 50.0, 2.7)


def test_tree_wins_small_messages_ring_wins_large():
    n = 256
    small_ring = collective_time_s(Collective.ALL_REDUCE, n, 64e3, IB, PH, algorithm=Algorithm.RING)
    small_tree = collective_time_s(Collective.ALL_REDUCE, n, 64e3, IB, PH, algorithm=Algorithm.TREE)
    # large messages on a modest ring: ring moves 2(n-1)/n of the buffer, the tree 2x
    big_ring = collective_time_s(Collective.ALL_REDUCE, 16, 4e9, IB, PH, algorithm=Algorithm.RING)
    big_tree = collective_time_s(Collective.ALL_REDUCE, 16, 4e9, IB, PH, algorithm=Algorithm.TREE)
    assert small_tree < small_ring
    assert big_ring < big_tree
    auto = collective_time_s(Collective.ALL_REDUCE, n, 64e3, IB, PH)
    assert auto == pytest.approx(min(small_ring, small_tree))


def test_in_switch_reduction_speeds_up_large_all_reduce_only_where_available():
    ring = collective_time_s(Collective.ALL_REDUCE, 8, 1e9, NVL, PH, algorithm=Algorithm.RING)
    nvls = collective_time_s(Collective.ALL_REDUCE, 8, 1e9, NVL, PH, in_switch=True)
    assert nvls < ring
    no_switch = collective_time_s(Collective.ALL_REDUCE, 8, 1e9, NVL, PH, in_switch=False)
    assert no_switch == pytest.approx(ring)


def test_a100_nccl_sweep_band_is_reproduced_within_15_percent():
    """The shipped A100 NVLink coefficients against the nccl-tests rows they came from
    (16 MiB .. 1 GiB band, collectives.csv): a regression check of the fit, not new data."""
    rows = [(16777216, 276.6), (33554432, 424.0), (67108864, 684.6), (134217728, 1327.6),
            (268435456, 2420.6), (536870912, 4218.4), (1073741824, 8203.9)]
    link = LinkUse("nvlink", 300.0, 0.6)
    for size, t_us in rows:
        t = collective_time_s(Collective.ALL_REDUCE, 8, size, link, PA, algorithm=Algorithm.RING)
        assert t * 1e6 == pytest.approx(t_us, rel=0.15)


def test_wave_quantization_penalises_a_partial_last_wave():
    assert wave_efficiency(128 * 108, 128, 128, 128, 108) == pytest.approx(1.0)
    assert wave_efficiency(128 * 109, 128, 128, 128, 108) == pytest.approx(109 / 216)
    assert wave_efficiency(1000, 1000, 0, 0, 132) == 1.0      # persistent kernels: off


def test_gemm_time_scales_with_flops_and_respects_peak():
    t1 = gemm_time_s(8192, 8192, 8192, "bf16", H100, PH)
    t2 = gemm_time_s(8192, 8192, 16384, "bf16", H100, PH)
    assert 1.9 < t2 / t1 < 2.1
    assert 2 * 8192 ** 3 / t1 < H100.peak("bf16") * 1e12
    assert gemm_time_s(8192, 8192, 8192, "fp8", H100, PH) < t1
