"""Coefficient uncertainty: the central-difference sensitivity against an independent
re-implementation, its bounds, and which coefficients it may touch."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.engine.simulate import simulate
from simulator.hardware.profile import Coefficient, Profile
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec
from simulator.uncertainty.coefficients import (
    KNOBS,
    active_knobs,
    coefficient_spread,
    relative_uncertainty,
)

CLUSTER = hardware_db.build_cluster("h100-sxm", 16)
SMALL = TransformerSpec("gpt-small", n_layers=12, hidden=2048, ffn_hidden=8192, n_heads=16,
                        n_kv_heads=16, vocab=51200, seq_len=2048)
PLAN = Plan(tp=2, pp=2, dp=4, micro_batch=1, global_batch=32, sequence_parallel=True)


def _clean(c: Coefficient) -> Coefficient:
    return replace(c, stderr=None, heldout_error_pct=None)


def _strip(prof: Profile) -> Profile:
    """The profile with no coefficient uncertainty at all."""
    d = prof.to_dict()

    def walk(o):
        if isinstance(o, dict):
            if "value" in o and "unit" in o:
                o["stderr"] = None
                o["heldout_error_pct"] = None
            for v in o.values():
                walk(v)
    walk(d)
    return Profile.from_dict(d)


@pytest.mark.parametrize("coef, expected", [
    ({"value": 200.0, "stderr": 50.0}, 0.25),
    ({"value": 200.0, "stderr": 2.0, "heldout_error_pct": 4.0}, 0.04),    # held-out larger
    ({"value": 0.5, "stderr": 0.1, "heldout_error_pct": 1.0}, 0.2),       # stderr larger
    ({"value": 3.0}, 0.0),
    ({"value": 0.0, "stderr": 1.0}, 0.0),
])
def test_relative_uncertainty_is_the_larger_of_stderr_and_heldout(coef, expected):
    assert relative_uncertainty(coef) == pytest.approx(expected)


def test_no_uncertain_coefficient_means_no_spread_and_no_simulation(gpt_small, h100_profile):
    s = coefficient_spread(gpt_small, PLAN, CLUSTER, _strip(h100_profile))
    assert s.sigma_log == 0.0 and s.n_simulations == 0 and s.effects == ()


def test_one_knob_matches_an_independent_central_difference(gpt_small, h100_profile):
    """Only k_half uncertain: two analytic simulations at k_half*(1+s) and k_half/(1+s),
    built here with dataclasses.replace instead of the module's dict perturbation."""
    base = _strip(h100_profile)
    k = base.gemm.k_half
    s_rel = 0.3
    prof = replace(base, gemm=replace(base.gemm, k_half=replace(k, stderr=s_rel * k.value)))
    got = coefficient_spread(gpt_small, PLAN, CLUSTER, prof)
    assert got.n_simulations == 2 and [e.knob for e in got.effects] == ["gemm.k_half"]

    def t(kh):
        p = replace(base, gemm=replace(base.gemm, k_half=replace(k, value=kh)))
        return simulate(gpt_small, PLAN, CLUSTER, p, engine="analytic").step_time_s
    expected = abs(math.log(t(k.value * (1 + s_rel)) / t(k.value / (1 + s_rel)))) / 2
    assert got.sigma_log == pytest.approx(expected, rel=1e-12)
    assert got.sigma_log > 0


def test_efficiencies_are_capped_at_one(gpt_small, h100_profile):
    """A fraction scaled up past 1 is capped: an efficiency above peak is not physical."""
    base = _strip(h100_profile)
    eff = {k: replace(v, stderr=v.value) for k, v in base.gemm.eff_max.items()}   # s = 100 %
    prof = replace(base, gemm=replace(base.gemm, eff_max=eff))
    got = coefficient_spread(gpt_small, PLAN, CLUSTER, prof)
    capped = replace(base, gemm=replace(base.gemm, eff_max={k: replace(v, value=1.0)
                                                             for k, v in eff.items()}))
    halved = replace(base, gemm=replace(base.gemm, eff_max={k: replace(v, value=v.value / 2)
                                                             for k, v in eff.items()}))
    hi = simulate(gpt_small, PLAN, CLUSTER, capped, engine="analytic").step_time_s
    lo = simulate(gpt_small, PLAN, CLUSTER, halved, engine="analytic").step_time_s
    assert got.sigma_log == pytest.approx(abs(math.log(hi / lo)) / 2, rel=1e-12)


def test_links_the_cluster_does_not_use_are_not_simulated(gpt_small, h100_profile):
    """Uncertainty on PCIe/host coefficients costs nothing on an NVLink + InfiniBand cluster."""
    base = _strip(h100_profile)
    links = dict(base.links)
    for kind in ("pcie", "host"):
        if kind in links:
            lc = links[kind]
            links[kind] = replace(lc, bw_eff=replace(lc.bw_eff, stderr=0.2))
    prof = replace(base, links=links)
    assert active_knobs(prof, PLAN, CLUSTER) == []


def test_extra_simulations_are_bounded(gpt_small, h100_profile):
    """Every coefficient uncertain: at most two analytic simulations per knob."""
    d = h100_profile.to_dict()

    def walk(o):
        if isinstance(o, dict):
            if "value" in o and "unit" in o:
                o["stderr"] = 0.1 * abs(o["value"]) if o["value"] else 0.1
            for v in o.values():
                walk(v)
    walk(d)
    s = coefficient_spread(gpt_small, PLAN, CLUSTER, Profile.from_dict(d))
    assert 0 < s.n_simulations <= 2 * len(KNOBS) == 26
    assert s.n_simulations == 2 * len(s.effects)


@settings(max_examples=8, deadline=None)
@given(small=st.floats(0.01, 0.5), extra=st.floats(0.01, 1.0))
def test_larger_coefficient_uncertainty_never_narrows_the_spread(small, extra):
    gpt_small = SMALL
    base = _strip(hardware_db.load_profile("h100-sxm"))
    k = base.gemm.k_half

    def spread(s):
        p = replace(base, gemm=replace(base.gemm, k_half=replace(k, stderr=s * k.value)))
        return coefficient_spread(gpt_small, PLAN, CLUSTER, p).sigma_log
    assert spread(small + extra) >= spread(small)


def test_spread_leaves_the_point_prediction_alone(gpt_small, h100_profile):
    before = simulate(gpt_small, PLAN, CLUSTER, h100_profile)
    coefficient_spread(gpt_small, PLAN, CLUSTER, h100_profile)
    after = simulate(gpt_small, PLAN, CLUSTER, h100_profile)
    assert before.step_time_s == after.step_time_s
    assert h100_profile.to_dict() == hardware_db.load_profile("h100-sxm").to_dict()
