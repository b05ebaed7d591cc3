"""The output-panel term of the GEMM model (``GemmModel.mn_half``, CPU profiles).

Mechanism: a blocked CPU GEMM packs each operand panel once per pass over the other output
dimension, so a narrow output (small ``min(m, n)``) amortises that work over fewer FLOPs:
the rate is multiplied by ``s / (s + mn_half)``, ``s = min(m, n)``. Checked here against
its closed form, as properties, and by recovering a known ``mn_half`` from a synthetic cold
sweep with the calibration's own fitter; the measurement on this CPU is in
``validation/cpu_validate_run.md``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from calibrate.cpu_profile import separates_mn_half
from calibrate.fit import MN_HALF, GemmPoint, fit_gemm, gemm_model
from simulator.cost.kernels import gemm_time_core_s, gemm_time_s
from simulator.hardware.profile import Coefficient, Profile

dims = st.integers(min_value=1, max_value=8192)


def _t(m, n, k, mn_half=0.0):
    return gemm_time_core_s(m, n, k, 4.0 * (m * k + k * n + m * n), 300e9, 1.0, 16.0, 0.0,
                            1.0, 1e15, math.inf, mn_half, min(m, n))


def test_factor_is_the_closed_form():
    """Compute-bound, no launch: time grows by exactly (s + mn_half) / s."""
    for m, n, k in ((512, 128, 512), (128, 2048, 256), (4096, 4096, 64)):
        s = min(m, n)
        assert _t(m, n, k, 32.0) / _t(m, n, k) == pytest.approx((s + 32.0) / s, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(dims, dims, dims)
def test_zero_mn_half_is_the_earlier_formula(m, n, k):
    flops = 2.0 * m * n * k
    assert _t(m, n, k, 0.0) == pytest.approx(flops / (300e9 * k / (k + 16.0)), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(dims, dims, dims, st.floats(min_value=0.5, max_value=2048.0))
def test_wider_output_never_lowers_the_rate(m, n, k, mn_half):
    """Doubling the narrow output dimension at most doubles the time (rate never drops)."""
    if m <= n:
        assert _t(2 * m, n, k, mn_half) <= 2.0 * _t(m, n, k, mn_half) * (1 + 1e-12)
    else:
        assert _t(m, 2 * n, k, mn_half) <= 2.0 * _t(m, n, k, mn_half) * (1 + 1e-12)


def _sweep(truth, rng, shapes):
    g = gemm_model(1.0, 0, 50.0, 0, 0)
    return [GemmPoint(m, n, k, g(truth, GemmPoint(m, n, k, 1.0, 4))
                      * float(np.exp(rng.normal(0, 0.02))), 4) for m, n, k in shapes]


SHAPES = ([(s, s, s) for s in (64, 128, 256, 512, 768)]
          + [(512, n, k) for n in (128, 256, 768) for k in (128, 256, 768)]
          + [(128, 1024, 512), (1024, 128, 256), (256, 512, 1024)])


def test_fit_recovers_a_known_output_panel_term():
    """A cold sweep (fixed per-call refill cost in the intercept) generated with mn_half 40:
    the fitter separates the intercept, k_half and mn_half."""
    truth = {"eff_max": 0.35, "k_half": 16.0, "launch_us": 70.0, MN_HALF: 40.0}
    f = fit_gemm(_sweep(truth, np.random.default_rng(3), SHAPES), 1.0, 0, 50.0, 0, 0,
                 eff_max_upper=1e3, fit_mn_half=True)
    assert f.values[MN_HALF] == pytest.approx(40.0, rel=0.35)
    assert f.values["eff_max"] == pytest.approx(0.35, rel=0.05)
    assert f.values["launch_us"] == pytest.approx(70.0, rel=0.1)


def test_without_the_term_narrow_gemms_come_out_fast():
    """The defect the term removes: fitted without it, the narrow shapes' loss lands in the
    intercept, which the simulator does not charge in a step on a CPU, so a 512x128x512
    GEMM is predicted faster than its truth; with the term it is within 5 %."""
    truth = {"eff_max": 0.35, "k_half": 16.0, "launch_us": 70.0, MN_HALF: 40.0}
    pts = _sweep(truth, np.random.default_rng(5), SHAPES)
    g = gemm_model(1.0, 0, 50.0, 0, 0)
    narrow = GemmPoint(512, 128, 512, 1.0, 4)
    true_t = g({**truth, "launch_us": 0.0}, narrow)
    for fit_term, lo, hi in ((False, 0.0, 0.92), (True, 0.95, 1.05)):
        f = fit_gemm(pts, 1.0, 0, 50.0, 0, 0, eff_max_upper=1e3, fit_mn_half=fit_term)
        pred = g({**f.values, "launch_us": 0.0}, narrow)
        assert lo <= pred / true_t <= hi


def test_cubes_alone_do_not_fit_the_term():
    """On cubes min(m, n) == k: the two saturations are one factor; the calibration then
    fits k_half only."""
    assert not separates_mn_half([GemmPoint(s, s, s, 1e-3, 4) for s in (64, 128, 256, 512)])
    assert separates_mn_half([GemmPoint(m, n, k, 1e-3, 4) for m, n, k in SHAPES])


def test_profile_round_trip_and_gpu_profiles_unchanged(tmp_path):
    h100 = hardware_db.load_profile("h100-sxm")
    assert h100.gemm.mn_half is None and "mn_half" not in h100.to_dict()["gemm"]
    d = h100.to_dict()
    d["gemm"]["mn_half"] = Coefficient(1000.0, "elements", "test").__dict__
    p = Profile.from_dict(d)
    assert p.gemm.mn_half.value == 1000.0
    gpu = hardware_db.load_gpu("h100-sxm")
    with_term = gemm_time_s(8192, 1024, 8192, "bf16", gpu, p)      # compute-bound shape
    without = gemm_time_s(8192, 1024, 8192, "bf16", gpu, h100)
    assert with_term > without
    path = tmp_path / "p.json"
    p.write_json(path)
    assert Profile.read_json(path).gemm.mn_half.value == 1000.0
