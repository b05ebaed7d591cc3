"""Fused attention kernels run one CTA per SM over (micro-batch x local heads) x row blocks
(FlashAttention-3 hopper/tile_size.h and flash_bwd_launch_template.h): a grid that cannot
fill the GPU once leaves SMs idle, and under a causal mask the kernel lasts as long as its
longest CTA (``cost.kernels.attention_grid_fill``). Expected values from that count."""
from __future__ import annotations


import pytest
from hypothesis import given
from hypothesis import strategies as st

import hardware_db
from simulator.cost.kernels import attention_grid_fill, attention_time_s

H100 = hardware_db.load_gpu("h100-sxm")
PROF = hardware_db.load_profile("h100-sxm")


def test_every_benchmark_grid_fills_the_gpu():
    """The FA2/FA3 paper sweeps the H100/A100 curves were fitted to run 16k tokens per call,
    16 heads of 128 (32 of 64, 8 of 256): at least 1024 CTAs at every sequence length, so
    the fill leaves the fitted rates alone."""
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
       bwd=st.booleans(), causal=st.booleans(), more=st.integers(1, 4096))
def test_more_heads_or_tokens_never_fill_less_nor_take_less_time(batch, s, d, bwd, causal, more):
    f = attention_grid_fill(batch, s, s, d, bwd, causal, "flash3", 132)
    assert 0.0 < f <= 1.0
    assert attention_grid_fill(batch + 1, s, s, d, bwd, causal, "flash3", 132) >= f
    assert attention_grid_fill(batch, s + more, s + more, d, bwd, causal, "flash3", 132) >= f
    # the kernel's time: FLOPs ~ s x s (x 1/2 causal) at fill x rate
    t = lambda n: n * n / attention_grid_fill(batch, n, n, d, bwd, causal, "flash3", 132)
    assert t(s + more) >= t(s)


def test_flashattention2_forward_splits_keys_instead():
    """FlashAttention-2's forward splits the keys across CTAs when its grid is short
    (flash_api.cpp set_params_splitkv): only its backward is held to its grid."""
    assert attention_grid_fill(4, 2048, 1024, 128, False, False, "flash", 132) == 1.0
    assert attention_grid_fill(4, 2048, 1024, 128, True, False, "flash", 132) == \
        pytest.approx(4 * 8 / 132)


def test_tile_rows_follow_flashattention3():
    """kBlockM 192 up to head dim 96, else 128 (forward); kBlockN 128 up to 128, 96 at 192
    (MLA), 80 at 256 (backward)."""
    assert attention_grid_fill(1, 1920, 1920, 96, False, False, "flash3", 1000) == 10 / 1000
    assert attention_grid_fill(1, 1280, 1280, 128, False, False, "flash3", 1000) == 10 / 1000
    assert attention_grid_fill(1, 960, 960, 192, True, False, "flash3", 1000) == 10 / 1000
    assert attention_grid_fill(1, 800, 800, 256, True, False, "flash3", 1000) == 10 / 1000


def test_a_causal_ring_step_is_held_to_its_slower_shape():
    """After the first step of a load-balanced causal ring, half the ranks run 2c queries
    against c keys and half c queries against 2c keys (TE AttnFuncWithCPAndKVP2P); the ring
    waits for the slower, whose grid is c rows in either direction."""
    from dataclasses import replace

    from simulator.workload import get_preset
    from simulator.workload.op_types import LayerShape
    from simulator.workload.ops import backward_ops, core_attention_ops
    m = replace(get_preset("llama2-7b"), seq_len=65536)
    sh = LayerShape(micro_batch=1, seq_len=65536, tp=8, cp=16, sequence_parallel=True,
                    attention_kernel="flash3")
    fwd = [o for o in core_attention_ops(m, sh) if o.name.startswith("core_attn_cp")
           and not o.name.endswith("correction")]
    c = 65536 // 16 // 2
    assert fwd[0].grid_rows == 0 and fwd[0].causal
    assert all(o.grid_rows == c and (o.m, o.n) == (2 * c, c) for o in fwd[1:])
    assert all(o.grid_rows == c for o in backward_ops(fwd[1:]))
    assert attention_grid_fill(4, 2 * c, c, 128, False, False, "flash3", 132, c) == \
        pytest.approx(min(1.0, 4 * c / 128 / 132))


def test_every_shipped_gpu_with_a_profile_knows_its_sm_count():
    """The fill needs the SM count: every GPU with a shipped profile has one (GB300 from its
    B300 die)."""
    for key in hardware_db.list_profiles():
        if key in hardware_db.list_gpus():
            assert hardware_db.load_gpu(key).sm_count > 0, key
