"""Profiles built in memory get the range checks of a profile read from JSON: a fitted
coefficient out of range is replaced by the base profile's value (and says so), and one
that reaches ``validate`` / a writer / the API is refused naming its path."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from kineto_synth import Trace

import hardware_db
from calibrate.profile_io import write_profile
from calibrate.profile_range import keep_in_range
from calibrate.trace_fit import shape_bytes
from calibrate.trace_import import OpRecord
from calibrate.trace_profile import calibrate_from_trace
from simulator.api.catalog import resolve_device
from simulator.api.modules import resolve
from simulator.errors import InvalidInputError, ProfileError
from simulator.hardware.profile import Coefficient, Profile

H100_MEM_BW_GBYTES_PER_S = 3350.0


def _ref() -> Profile:
    return hardware_db.load_profile("h100-sxm")


def _with_kind_eff(prof: Profile, value: float) -> Profile:
    c = Coefficient(value, "fraction", "a fit that went wrong")
    return replace(prof, memory=replace(prof.memory, kind_eff={"norm": c}))


def _with_alpha(prof: Profile, value: float) -> Profile:
    nv = prof.links["nvlink"]
    return replace(prof, links={**prof.links, "nvlink": replace(
        nv, alpha_us=replace(nv.alpha_us, value=value))})


# ---- the trace fit -----------------------------------------------------------------------------
def norm_trace(path: Path, eff: float, launch_us: float = 3.0) -> Path:
    """H100 layer-norm kernels timed at ``eff`` x the HBM datasheet bandwidth."""
    tr = Trace(gpu_name="NVIDIA H100 80GB HBM3")
    for i in range(1, 4):
        start = tr.t
        for rows in (256, 1024, 4096, 16384):
            dims = [(rows, 4096), (), (4096,)]
            op = OpRecord("aten::native_layer_norm", "norm", "", "fwd", 0, 0, 0, 0,
                          tuple(dims), "c10::BFloat16")
            us = launch_us + shape_bytes(op) / (H100_MEM_BW_GBYTES_PER_S * 1e9 * eff) * 1e6
            tr.leaf("aten::native_layer_norm", 5.0, dims, kernel_us=us, gap=2.0,
                    dtype="c10::BFloat16")
            tr.t = max(tr.t, tr.gpu_t)
        tr.step(i, start, tr.t + 5.0)
    return tr.write(path)


def test_trace_fit_keeps_the_base_value_for_an_efficiency_above_one(tmp_path: Path):
    """Kernels 5x faster than the HBM datasheet allows: the family fit comes out > 1, the
    profile keeps the base's value, says so, and reads back."""
    res = calibrate_from_trace(norm_trace(tmp_path / "n.json", eff=5.0), tmp_path / "out")
    assert res.fitted.kind_eff["norm"].value > 1.0               # what the fit produced
    ref = _ref()
    c = res.profile.memory.kind_eff["norm"]
    assert c.value == ref.memory.bw_eff.value                    # the base's (no norm entry)
    assert c.source.startswith("not informed by trace n.json: the fitted value ")
    assert "out of range" in c.source and "not used" in c.source
    assert f"{res.fitted.kind_eff['norm'].value:.4g}" in c.source
    assert "memory.kind_eff.norm" in res.kept
    back = Profile.read_json(res.path)                            # the file is readable
    assert back.memory.kind_eff["norm"].value == ref.memory.bw_eff.value
    report = json.loads((tmp_path / "out" / "trace_fit.json").read_text())
    assert any("memory.kind_eff.norm" in n and "not used" in n for n in report["notes"])


def test_trace_fit_ships_an_efficiency_in_range(tmp_path: Path):
    res = calibrate_from_trace(norm_trace(tmp_path / "n.json", eff=0.6), tmp_path / "out")
    c = res.profile.memory.kind_eff["norm"]
    assert 0.4 < c.value < 0.8 and c.source.startswith("fitted from trace n.json")
    assert "memory.kind_eff.norm" not in res.kept


# ---- keep_in_range -----------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_bad_latency_is_replaced_by_the_base_value(bad):
    ref = _ref()
    prof, rejected = keep_in_range(_with_alpha(ref, bad), ref, "not informed by the fit",
                                   "the reference")
    assert prof.links["nvlink"].alpha_us.value == ref.links["nvlink"].alpha_us.value
    assert prof.links["nvlink"].alpha_us.source.startswith(
        f"not informed by the fit: the fitted value {bad:.4g}" if math.isfinite(bad)
        else f"not informed by the fit: the fitted value {bad!r}")
    assert list(rejected) == ["links.nvlink.alpha_us"]


def test_coefficients_in_range_are_left_alone():
    ref = _ref()
    prof = _with_kind_eff(ref, 0.7)
    assert keep_in_range(prof, ref, "x", "y") == (prof, {})


def test_a_profile_with_its_own_device_keeps_a_measured_fraction_above_one():
    """The JSON reader's rule: with its own device, fractions up to MAX_MEASURED_FRACTION."""
    ref = _ref()
    own = replace(_with_kind_eff(ref, 1.7), device=hardware_db.load_gpu("h100-sxm"))
    assert keep_in_range(own, ref, "x", "y")[1] == {}
    prof, rejected = keep_in_range(_with_kind_eff(own, 1e4), ref, "x", "y")
    assert list(rejected) == ["memory.kind_eff.norm"]
    assert prof.memory.kind_eff["norm"].value == ref.memory.bw_eff.value


def test_without_a_base_the_range_error_is_raised():
    with pytest.raises(ProfileError) as ei:
        keep_in_range(_with_kind_eff(_ref(), 1e4), None, "x", "")
    assert ei.value.field == "profile.memory.kind_eff.norm" and ei.value.value == 1e4


# ---- validate, writers, the API ----------------------------------------------------------------
BAD = [(lambda p: _with_kind_eff(p, 1e4), "profile.memory.kind_eff.norm"),
       (lambda p: _with_kind_eff(p, 0.0), "profile.memory.kind_eff.norm"),
       (lambda p: _with_alpha(p, -0.5), "profile.links.nvlink.alpha_us"),
       (lambda p: replace(p, gemm=replace(p.gemm, eff_max={"bf16": Coefficient(
           math.nan, "fraction", "nan")})), "profile.gemm.eff_max.bf16")]


@pytest.mark.parametrize("make,path", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_an_out_of_range_profile_built_in_memory_is_refused(make, path, tmp_path: Path):
    prof = make(_ref())
    calls = [prof.validate, lambda: prof.write_json(tmp_path / "a.json"),
             lambda: write_profile(prof, tmp_path / "b.json"),
             lambda: resolve_device("h100-sxm", prof), lambda: resolve(None, prof),
             lambda: resolve(hardware_db.load_gpu("h100-sxm"), prof)]
    for call in calls:
        with pytest.raises(InvalidInputError) as ei:
            call()
        assert ei.value.field == path and path in str(ei.value)
    assert not list(tmp_path.iterdir())                  # nothing written


def test_the_shipped_profiles_validate():
    for key in hardware_db.list_profiles():
        assert hardware_db.load_profile(key).validate().device_key == key


# ---- the GPU calibration fitter ------------------------------------------------------------------
def test_gpu_fit_keeps_the_reference_value_for_a_negative_launch(gpu_calibration, monkeypatch):
    import calibrate.gpu_profile as gp
    fit = gp.fit_memory_gpu

    def broken(rows, gpu, prov):
        mem, fits = fit(rows, gpu, prov)
        return replace(mem, launch_us=replace(mem.launch_us, value=-4.0)), fits
    monkeypatch.setattr(gp, "fit_memory_gpu", broken)
    prof = gp.fit_gpu_profiles(gpu_calibration)["profile.json"]
    ref = hardware_db.load_profile("h200-sxm")
    assert prof.memory.launch_us.value == ref.memory.launch_us.value
    assert prof.memory.launch_us.source.startswith(
        "not informed by this calibration: the fitted value -4 was out of range")
    assert "memory.launch_us" in prof.notes
