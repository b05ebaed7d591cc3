"""The fitters recover known coefficients from synthetic measurements made with the very
simulator.cost and simulator.network functions the simulator uses (3% multiplicative noise), and report held-out error."""
from __future__ import annotations

import numpy as np
import pytest

from calibrate.fit import (
    AttnPoint,
    GemmPoint,
    InterferencePoint,
    LinkPoint,
    MemPoint,
    busbw_to_time_s,
    fit_attention,
    fit_gemm,
    fit_interference,
    fit_link,
    gemm_model,
    link_model,
    memory_model,
)
from simulator.cost.kernels import attention_time_s, memory_time_s
from simulator.errors import InvalidInputError
from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    MemoryModel,
    Profile,
)
from simulator.hardware.specs import GPUSpec
from simulator.network.collectives import Collective

RNG_SEED = 1234
NOISE = 0.03


def _noisy(t: float, rng: np.random.Generator) -> float:
    return t * float(np.exp(rng.normal(0.0, NOISE)))


def test_fit_gemm_recovers_coefficients():
    rng = np.random.default_rng(RNG_SEED)
    truth = {"eff_max": 0.85, "k_half": 400.0, "launch_us": 6.0}
    model = gemm_model(312.0, 108, 1500.0, 128, 128)
    shapes = [(s, s, s) for s in (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)]
    shapes += [(4096, 4096, k) for k in (64, 128, 256, 512, 1024, 2048)]
    shapes += [(m, 8192, 2048) for m in (128, 1024, 2048, 16384)]
    rows = []
    for m, n, k in shapes:
        p = GemmPoint(m, n, k, 1.0)
        rows.append(GemmPoint(m, n, k, _noisy(model(truth, p), rng)))
    fit = fit_gemm(rows, 312.0, 108, 1500.0)
    assert fit.values["eff_max"] == pytest.approx(0.85, rel=0.05)
    assert fit.values["k_half"] == pytest.approx(400.0, rel=0.35)
    assert fit.values["launch_us"] == pytest.approx(6.0, abs=2.0)
    assert fit.heldout_mape_pct is not None and fit.heldout_mape_pct < 8.0
    assert fit.n_heldout > 0
    assert all(fit.stderr[k] > 0 for k in truth)


def test_fit_gemm_one_point_with_fixed_params():
    model = gemm_model(989.5, 132, 3000.0, 128, 128)
    truth = {"eff_max": 0.8, "k_half": 300.0, "launch_us": 3.0}
    p = GemmPoint(2048, 2048, 13312, 1.0)
    row = GemmPoint(2048, 2048, 13312, model(truth, p))
    fit = fit_gemm([row], 989.5, 132, 3000.0, fixed={"k_half": 300.0, "launch_us": 3.0})
    assert fit.values["eff_max"] == pytest.approx(0.8, rel=1e-4)
    assert fit.heldout_mape_pct is None
    c = fit.coefficient("eff_max", "fraction", "x")
    assert c.stderr is None                 # no degrees of freedom left
    assert fit.coefficient("k_half", "elements", "x").stderr is None   # fixed


def test_fit_gemm_needs_enough_points():
    with pytest.raises(InvalidInputError):
        fit_gemm([GemmPoint(1024, 1024, 1024, 1e-4)], 312.0, 108, 1500.0)
    with pytest.raises(InvalidInputError):
        fit_gemm([GemmPoint(1024, 1024, 1024, 1e-4)], 312.0, 108, 1500.0, fixed={"nope": 1.0})


def test_fit_memory_recovers_and_matches_cost_function():
    rng = np.random.default_rng(RNG_SEED)
    truth = {"bw_eff": 0.8, "launch_us": 4.0}
    model = memory_model(2000.0)
    sizes = [2.0 ** e for e in range(12, 32)]
    rows = [MemPoint(b, _noisy(model(truth, MemPoint(b, 1.0)), rng)) for b in sizes]
    fit = fit_memory_checked(rows)
    assert fit.values["bw_eff"] == pytest.approx(0.8, rel=0.04)
    assert fit.values["launch_us"] == pytest.approx(4.0, rel=0.2)
    assert fit.heldout_mape_pct is not None and fit.heldout_mape_pct < 6.0
    # the fit model is the formula of simulator.cost.kernels.memory_time_s
    gpu, prof = _gpu_and_profile(bw_eff=0.8, launch_us=4.0)
    assert model(truth, MemPoint(1e8, 1.0)) == pytest.approx(memory_time_s(1e8, gpu, prof))


def fit_memory_checked(rows):
    from calibrate.fit import fit_memory
    return fit_memory(rows, 2000.0)


def test_fit_link_recovers_alpha_beta():
    rng = np.random.default_rng(RNG_SEED)
    truth = {"alpha_us": 3.0, "small_bw_eff": 0.3, "base_us": 60.0, "bw_eff": 0.78}
    model = link_model(300.0, 0.6, 1.0)
    sizes = [2.0 ** e for e in range(12, 35)]
    rows = [LinkPoint(s, 1.0, Collective.ALL_REDUCE, 8) for s in sizes]
    rows = [LinkPoint(r.size_bytes, _noisy(model(truth, r), rng), r.op, r.n_ranks) for r in rows]
    fit = fit_link(rows, 300.0, hop_latency_us=0.6)
    assert fit.values["bw_eff"] == pytest.approx(0.78, rel=0.05)
    assert fit.values["alpha_us"] == pytest.approx(3.0, rel=0.2)
    assert fit.values["base_us"] == pytest.approx(60.0, rel=0.35)
    assert fit.values["small_bw_eff"] == pytest.approx(0.3, rel=0.35)
    assert fit.heldout_mape_pct is not None and fit.heldout_mape_pct < 8.0


def test_fit_link_from_busbw_and_rejects_single_rank():
    t = busbw_to_time_s(Collective.ALL_REDUCE, 8, 1e9, 200.0)
    assert t == pytest.approx(1e9 * 2 * 7 / 8 / 200e9)
    assert busbw_to_time_s(Collective.ALL_GATHER, 4, 1e9, 100.0) == pytest.approx(0.75e9 / 100e9)
    with pytest.raises(InvalidInputError):
        busbw_to_time_s(Collective.ALL_REDUCE, 8, 1e9, 0.0)
    with pytest.raises(InvalidInputError):
        fit_link([LinkPoint(1e6, 1e-3, Collective.ALL_REDUCE, 1)] * 5, 100.0)


def test_fit_attention_and_interference():
    rng = np.random.default_rng(RNG_SEED)
    gpu, prof = _gpu_and_profile(bw_eff=0.8, launch_us=4.0, attn=0.6)
    flops = [1e9 * 2 ** i for i in range(12)]
    rows = [AttnPoint(f, _noisy(attention_time_s(f, "bf16", False, gpu, prof), rng))
            for f in flops]
    fit = fit_attention(rows, gpu.peak("bf16"), launch_us=4.0)
    assert fit.values["eff"] == pytest.approx(0.6, rel=0.05)
    inter = [InterferencePoint(a, _noisy(1.25 * a, rng)) for a in np.linspace(1e-3, 1e-2, 12)]
    fi = fit_interference(inter)
    assert fi.values["slowdown"] == pytest.approx(1.25, rel=0.04)
    assert fi.heldout_mape_pct is not None


def _gpu_and_profile(bw_eff: float, launch_us: float, attn: float = 0.5):
    gpu = GPUSpec(key="t", name="t", vendor="t", peak_tflops={"bf16": 312.0},
                  mem_bytes=1e10, mem_bw_gbytes_per_s=2000.0, tdp_w=1.0)
    c = lambda v: Coefficient(v, "", "test")
    prof = Profile(name="t", device_key="t",
                   gemm=GemmModel(eff_max={"bf16": c(0.8)}, k_half=c(0.0), launch_us=c(0.0)),
                   memory=MemoryModel(bw_eff=c(bw_eff), launch_us=c(launch_us)),
                   attention=AttentionModel(fwd_eff={"bf16": c(attn)}, bwd_eff={"bf16": c(attn)}),
                   links={}, overlap_slowdown=c(1.0), step_overhead_s=c(0.0))
    return gpu, prof


def test_fit_interference_span_recovers_slowdown():
    """Span design: compute covering the collective; extra = (slowdown - 1) * min(comm, alone)."""
    from calibrate.fit import InterferencePoint
    rng = np.random.default_rng(RNG_SEED)
    pts = []
    for alone, comm in ((0.01, 0.004), (0.02, 0.01), (0.05, 0.02), (0.03, 0.05), (0.08, 0.03)):
        t = alone + 0.7 * min(comm, alone)
        pts.append(InterferencePoint(alone, t * float(np.exp(rng.normal(0.0, 0.01))), comm))
    f = fit_interference(pts)
    assert f.values["slowdown"] == pytest.approx(1.7, rel=0.05)


def test_composite_efficiency_is_bandwidth_of_the_mix():
    from calibrate.fit import composite_eff
    # 8 B at eff 0.5 and 24 B at eff 1.5: time 16 + 16 = 32 units for 32 B -> 1.0
    assert composite_eff([(8.0, 0.5), (24.0, 1.5)]) == pytest.approx(1.0)
    assert composite_eff([(5.0, 0.3)]) == pytest.approx(0.3)


def test_a_memory_group_whose_time_does_not_grow_with_bytes_is_not_used(capsys):
    """On a busy host a group's sizes can all time alike: its fitted rate runs to the fit's
    bound. That rate is not taken (it once gave an optimizer efficiency of 9999, which the
    profile check rejects); the family falls back to the copy bandwidth and a message says
    so."""
    from calibrate.cpu_profile import _memory
    sizes = (1e6, 4e6, 16e6, 64e6)
    rows = [{"kernel": "copy", "family": "copy", "bytes_moved": b, "median_s": 2e-6 + b / 20e9,
             "kernels": 1} for b in sizes]
    rows += [{"kernel": "layernorm", "family": "norm", "pass": "fwd", "bytes_moved": b,
              "median_s": 3e-6 + b / 10e9, "kernels": 1} for b in sizes]
    rows += [{"kernel": "adamw", "family": "optimizer", "pass": "step", "bytes_moved": b,
              "median_s": 5e-3, "kernels": 1} for b in sizes]          # flat: no rate
    _, model, fits = _memory(rows, 1)
    from calibrate.cpu_profile import BIG
    assert fits["memory_adamw_step"].values["bw_eff"] >= 0.99 * BIG     # the runaway fit
    assert "optimizer" not in model.kind_eff
    assert model.eff("optimizer") == model.bw_eff.value == 1.0
    assert model.kind_eff["norm"].value == pytest.approx(0.5, rel=0.05)
    assert "adamw:step" in capsys.readouterr().err
