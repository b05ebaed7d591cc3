"""Attention kernels under the GPU's power limit (simulator.cost.kernels.attention_time_s):
the curves are fitted to boost-clock benchmark timings, and a training loop holds them to the
16-bit GEMM's measured sustained ceiling (MSMF), a ceiling, never a factor."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.cost.kernels import attention_time_s

GPUS = ("a100-sxm-80gb", "h100-sxm", "h200-sxm", "b200", "gb200")


def _uncapped_s(flops, bwd, gpu, prof, kernel, seq, hd, causal):
    eff = prof.attn_eff("bf16", bwd, kernel, seq, hd, causal)
    return prof.memory.launch_us.value * 1e-6 + flops / (gpu.peak("bf16") * 1e12 * eff)


@settings(max_examples=60, deadline=None)
@given(g=st.sampled_from(GPUS), kernel=st.sampled_from(["flash", "flash3"]),
       seq=st.sampled_from([512, 2048, 8192, 32768, 131072]), hd=st.sampled_from([64, 128]),
       bwd=st.booleans(), causal=st.booleans())
def test_attention_never_beats_the_sustained_gemm_rate(g, kernel, seq, hd, bwd, causal):
    gpu, prof = make_cluster(g, 8).gpu, hardware_db.load_profile(g)
    flops = 4.0 * seq * seq * hd * 16
    t = attention_time_s(flops, "bf16", bwd, gpu, prof, kernel, seq, hd, causal)
    cap = gpu.peak("bf16") * 1e12 * prof.gemm.sustained_for("bf16")
    assert flops / (t - prof.memory.launch_us.value * 1e-6) <= cap * (1 + 1e-9)
    # a ceiling: the time is the boost-clock curve's or the ceiling's, whichever is longer
    free = _uncapped_s(flops, bwd, gpu, prof, kernel, seq, hd, causal)
    assert t == pytest.approx(max(free, prof.memory.launch_us.value * 1e-6 + flops / cap))


@pytest.mark.parametrize("g", ["h100-sxm", "h200-sxm", "a100-sxm-80gb"])
def test_hopper_and_ampere_curves_sit_below_their_ceiling(g):
    """Where the measured attention rates stay below the GEMM's sustained rate, nothing
    changes (every curve point of the shipped profiles, 512-131072 keys)."""
    gpu, prof = make_cluster(g, 8).gpu, hardware_db.load_profile(g)
    for kernel in ("flash", "flash3", "flash1"):
        for seq in (512, 4096, 16384, 131072):
            for bwd in (False, True):
                f = 4.0 * seq * seq * 128 * 16
                t = attention_time_s(f, "bf16", bwd, gpu, prof, kernel, seq, 128, True)
                assert t == pytest.approx(_uncapped_s(f, bwd, gpu, prof, kernel, seq, 128,
                                                      True))


def test_blackwell_cudnn_attention_is_held_to_the_b200_msmf():
    """B200's cuDNN curve runs above 1424.5 TF (its MSMF) at long keys: there the
    ceiling binds, and lifting the ceiling gives back the curve."""
    gpu, prof = make_cluster("b200", 8).gpu, hardware_db.load_profile("b200")
    f = 4.0 * 32768 ** 2 * 128 * 16
    t = attention_time_s(f, "bf16", False, gpu, prof, "flash3", 32768, 128, False)
    assert f / t / 1e12 == pytest.approx(1424.5, rel=0.01)
    free = _uncapped_s(f, False, gpu, prof, "flash3", 32768, 128, False)
    assert free < 0.9 * t
    lifted = replace(prof, gemm=replace(prof.gemm, sustained_eff={}))
    assert attention_time_s(f, "bf16", False, gpu, lifted, "flash3", 32768, 128,
                            False) == pytest.approx(free)
