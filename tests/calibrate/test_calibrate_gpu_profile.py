"""GPU profile from GPU-format rows (the synthetic calibration of ``conftest.py``): fitted
against the datasheet, it recovers the coefficients the rows were made from, carries
provenance and transfers what one node cannot measure, and drops in for the reference
profile (an 8-GPU NVLink node and a multi-node cluster simulate without error)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_rows import TRUTH, write_gpu_calibration

import hardware_db
from calibrate.cli import run_fit
from calibrate.cpu_profile import fit_profiles
from calibrate.gpu_profile import fit_gpu_profiles, is_gpu_calibration
from simulator.cli.main import main as cli_main
from simulator.engine.simulate import simulate
from simulator.hardware.profile import Profile
from simulator.parallel.plan import Plan
from simulator.workload import get_preset


@pytest.fixture(scope="module")
def gpu_prof(gpu_calibration) -> Profile:
    return fit_gpu_profiles(gpu_calibration)["profile.json"]


def test_rows_are_recognised_as_a_gpu_calibration(gpu_calibration, tmp_path: Path):
    assert is_gpu_calibration(gpu_calibration)
    assert not is_gpu_calibration(tmp_path)


def test_gemm_levels_recovered_against_the_datasheet(gpu_prof):
    for dt, want in TRUTH["eff"].items():
        assert gpu_prof.gemm.eff_max[dt].value == pytest.approx(want, rel=0.03), dt
    assert gpu_prof.gemm.k_half.value == pytest.approx(TRUTH["k_half"], rel=0.25)
    assert gpu_prof.gemm.tile_m == 0                          # Hopper: as the reference
    assert "fp32" in gpu_prof.gemm.eff_max                   # not measured: transferred
    assert gpu_prof.gemm.eff_max["fp32"].source.startswith("transferred from the reference")


def test_memory_and_attention_recovered(gpu_prof):
    assert gpu_prof.memory.bw_eff.value == pytest.approx(TRUTH["bw_eff"], rel=0.03)
    assert gpu_prof.memory.launch_us.value == pytest.approx(TRUTH["mem_launch_us"], rel=0.2)
    assert gpu_prof.memory.kind_eff["norm"].value == pytest.approx(
        TRUTH["kernel_eff"]["layernorm"], rel=0.05)
    for (dt, backend), (f, b) in TRUTH["attn"].items():
        key = dt if backend == "flash" else f"flash3:{dt}"
        assert gpu_prof.attention.fwd_eff[key].value == pytest.approx(f, rel=0.05), key
        assert gpu_prof.attention.bwd_eff[key].value == pytest.approx(b, rel=0.06), key
    # the attention efficiency is per dtype: bf16 applies to the bf16 peak (not an fp32 fit)
    assert gpu_prof.attn_eff("bf16", False) == gpu_prof.attention.fwd_eff["bf16"].value


def test_nvlink_measured_and_nics_transferred(gpu_prof):
    nv = gpu_prof.links["nvlink"]
    for name in ("alpha_us", "small_bw_eff", "base_us", "bw_eff"):
        assert getattr(nv, name).value == pytest.approx(TRUTH["link"][name], rel=0.12), name
        assert getattr(nv, name).source.startswith("latency regime" if name in
                                                    ("alpha_us", "small_bw_eff") else "bandwidth")
    assert nv.in_switch_speedup.value == pytest.approx(TRUTH["speedup"], rel=0.06)
    ref = hardware_db.load_profile("h200-sxm")
    assert set(gpu_prof.links) == set(ref.links)             # every kind the reference has
    for kind in ("infiniband", "roce", "pcie", "host"):
        src = gpu_prof.links[kind].bw_eff.source
        assert src.startswith("transferred from the reference profile 'h200-sxm-reference'")
        assert gpu_prof.links[kind].bw_eff.value == ref.links[kind].bw_eff.value
    assert gpu_prof.overlap_slowdown.value == pytest.approx(TRUTH["overlap"], abs=0.08)


def test_host_model_transferred_not_measured(gpu_prof):
    """The GPU benchmarks time kernels on the device; the host's per-op issue cost comes from
    the reference profile, same values, and its source says so."""
    ref = hardware_db.load_profile("h200-sxm")
    assert gpu_prof.host is not None and ref.host is not None
    for name in ("op_fwd_us", "op_bwd_us"):
        c = getattr(gpu_prof.host, name)
        assert c.value == getattr(ref.host, name).value
        assert c.source.startswith("transferred from the reference profile 'h200-sxm-reference'")
    assert gpu_prof.host.synchronous is False


def test_provenance_names_host_date_driver_clock(gpu_prof):
    prov = "measured on synthetic-node, 2025-01-01, driver 000.00, SM clock median 1755 MHz"
    assert gpu_prof.fingerprint["provenance"].startswith(prov)
    assert gpu_prof.gemm.eff_max["bf16"].source.startswith(prov)
    assert gpu_prof.memory.bw_eff.source.startswith(prov)
    assert gpu_prof.device.key == "h200-sxm" and gpu_prof.device.sm_count == 132
    assert gpu_prof.device_key == "h200-sxm" and gpu_prof.node is None
    assert gpu_prof.fingerprint["builder"] == "calibrate.gpu_profile"


def test_profile_json_round_trips_and_is_deterministic(gpu_calibration, tmp_path: Path):
    a = run_fit(gpu_calibration, quiet=True).profiles["profile.json"].read_text()
    b = run_fit(gpu_calibration, quiet=True).profiles["profile.json"].read_text()
    assert a == b
    prof = Profile.from_dict(json.loads(a))
    assert prof.links["nvlink"].bw_eff.value > 0


def test_drops_in_for_the_reference_on_an_8_gpu_nvlink_node(gpu_prof):
    cluster = hardware_db.build_cluster("h200-sxm", 8)
    assert cluster.node.scale_up.kind.value == "nvlink"
    model = get_preset("llama3-8b")
    ref = hardware_db.load_profile("h200-sxm")
    for plan in (Plan(tp=8, micro_batch=1, global_batch=8),
                 Plan(dp=8, micro_batch=1, global_batch=8, zero_stage=3),
                 Plan(tp=2, dp=4, micro_batch=1, global_batch=8, precision="fp8",
                      attention="flash3")):
        got = simulate(model, plan, cluster, gpu_prof)
        base = simulate(model, plan, cluster, ref)
        # same formulas, coefficients of the same order: within a factor 2 of the reference
        assert 0.5 < got.step_time_s / base.step_time_s < 2.0


def test_drops_in_on_a_multi_node_cluster(gpu_prof):
    cluster = hardware_db.build_cluster("h200-sxm", 32)
    res = simulate(get_preset("llama3-8b"), Plan(tp=8, dp=4, micro_batch=1, global_batch=32),
                   cluster, gpu_prof)
    assert res.step_time_s > 0


def test_cli_simulate_with_a_gpu_calibrated_profile(gpu_calibration, capsys):
    path = run_fit(gpu_calibration, quiet=True).profiles["profile.json"]
    rc = cli_main(["simulate", "--model", "llama3-8b", "--gpu", "h200-sxm", "--gpus", "8",
                   "--tp", "8", "--global-batch", "8", "--profile", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["profile"] == "h200-sxm-measured" and out["step_time_s"] > 0


def test_single_gpu_calibration_transfers_links_and_overlap(tmp_path: Path):
    out = write_gpu_calibration(tmp_path, gpus=1)
    prof = fit_gpu_profiles(out)["profile.json"]
    assert prof.links["nvlink"].bw_eff.source.startswith("transferred from the reference")
    assert "1 GPU" in prof.links["nvlink"].bw_eff.source
    assert prof.overlap_slowdown.source.startswith("transferred from the reference")
    assert "failed_benchmarks" not in prof.fingerprint          # skipped, not failed
    assert "Single GPU" in prof.notes
    res = simulate(get_preset("llama3-8b"), Plan(tp=8, micro_batch=1, global_batch=8),
                   hardware_db.build_cluster("h200-sxm", 8), prof)
    assert res.step_time_s > 0


def test_budget_limited_calibration_still_fits(tmp_path: Path):
    out = write_gpu_calibration(tmp_path, gpus=8, budget_s=75)
    prof = fit_gpu_profiles(out)["profile.json"]
    assert prof.gemm.eff_max["bf16"].value == pytest.approx(TRUTH["eff"]["bf16"], rel=0.05)
    assert not prof.links["nvlink"].bw_eff.source.startswith("transferred")


def test_slowed_points_mark_coefficients_contaminated(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    out = write_gpu_calibration(tmp_path, gpus=1)
    path = out / "measurements" / "gemm.parquet"
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        r["suspect"], r["clock_reasons"] = True, "hw_thermal"
    pq.write_table(pa.Table.from_pylist(rows), path)
    prof = fit_gpu_profiles(out)["profile.json"]
    assert prof.gemm.eff_max["bf16"].contaminated
    assert not prof.memory.bw_eff.contaminated
    with pytest.raises(Exception, match="quiet host"):
        fit_gpu_profiles(out, strict=True)


def test_cpu_profile_never_named_after_a_gpu(tmp_path: Path, monkeypatch):
    """On a GPU host the CPU path still describes (and names) the CPU it measured."""
    import numpy as np
    from test_calibrate_cpu import _synthetic

    import calibrate.discover as disc
    h200 = disc.GpuInfo(0, "NVIDIA H200", 143e9, 1980, 3201, 700.0, 5, 16, 18, 132)
    monkeypatch.setattr(disc, "_nvml_gpus", lambda: ([h200], [("X",)], "580.1"))
    assert disc.discover().kind == "cuda"
    _synthetic(tmp_path, np.random.default_rng(3))
    for prof in fit_profiles(tmp_path).values():
        assert prof.device_key.startswith("cpu-") and "H200" not in prof.device.name
