"""Fused attention kernels run one CTA per SM over (micro-batch x local heads) x row blocks
(FlashAttention-3 hopper/tile_size.h and flash_bwd_launch_template.h): a grid that cannot
fill the GPU once leaves SMs idle, and under a causal mask the kernel lasts as long as its
longest CTA (``cost.kernels.attention_grid_fill``). Expected values from that count."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hardware_db
from simulator.cost.kernels import attention_grid_fill, attention_time_s

H100 = hardware_db.load_gpu("h100-sxm")
PROF = hardware_db.load_profile("h100-sxm")


def test_every_benchmark_grid_fills_the_gpu():
    """The efficiency curves were fitted to 16k tokens per call, 16 heads of 128 (32 of 64):
    over 2000 CTAs at every sequence length, so the fill leaves the fitted rates alone."""
    for s in (512, 1024, 2048, 4096, 8192, 16384):
        batch = 16384 // s
        for heads, d in ((16, 128), (32, 64)):
            for bwd in (False, True):
                for causal in (False, True):
                    assert attention_grid_fill(batch * heads, s, s, d, bwd, causal, "flash3",
                                               H100.sm_count) == 1.0


def test_a_short_ring_step_with_few_heads_fills_part_of_the_gpu():
    """4 query heads per GPU (32 heads, TP 8), a ring step of 2048 queries against 1024 keys:
    forward 4 x 16 = 64 CTAs, backward 4 x 8 = 32 on 132 SMs; the causal first step of 2048
    x 2048 keeps 4 x (16 + 1) / 2 = 34 SMs' worth of work against its longest CTA."""
    sm = H100.sm_count
    assert attention_grid_fill(4, 2048, 1024, 128, False, False, "flash3", sm) == \
        pytest.approx(64 / sm)
    assert attention_grid_fill(4, 2048, 1024, 128, True, False, "flash3", sm) == \
        pytest.approx(32 / sm)
    assert attention_grid_fill(4, 2048, 2048, 128, False, True, "flash3", sm) == \
        pytest.approx(4 * 17 / 2 / sm)
    flops = 2.0 * 4 * 2048 * 1024 * 256
    full = attention_time_s(flops, "bf16", False, H100, PROF, "flash3", 1024, 128)
    part = attention_time_s(flops, "bf16", False, H100, PROF, "flash3", 1024, 128,
                            seq_q=2048, batch=4)
    launch = PROF.memory.launch_us.value * 1e-6
    assert (part - launch) == pytest.approx((full - launch) * sm / 64)


def test_materialized_attention_and_unknown_sms_are_left_alone():
    assert attention_grid_fill(1, 128, 128, 128, False, False, "materialized", 132) == 1.0
    assert attention_grid_fill(1, 128, 128, 128, False, False, "flash3", 0) == 1.0


@given(batch=st.integers(1, 64), s=st.integers(1, 1 << 17), d=st.sampled_from([64, 128, 256]),
       bwd=st.booleans(), causal=st.booleans(), more=st.integers(1, 64))
def test_more_heads_or_tokens_never_fill_less(batch, s, d, bwd, causal, more):
    f = attention_grid_fill(batch, s, s, d, bwd, causal, "flash3", 132)
    assert 0.0 < f <= 1.0
    assert attention_grid_fill(batch + more, s, s, d, bwd, causal, "flash3", 132) >= f
    assert attention_grid_fill(batch, s + more * 128, s + more * 128, d, bwd, causal,
                               "flash3", 132) >= f - 1e-12
    assert math.isclose(attention_grid_fill(batch, s, s, d, bwd, False, "flash3", 132),
                        min(1.0, batch * math.ceil(s / (192 if d <= 64 and not bwd else 128))
                            / 132))
