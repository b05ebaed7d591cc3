"""Shipped reference profiles load, cite a source for every coefficient, rebuild
byte-for-byte on one machine, and within each coefficient's standard error on any machine."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from calibrate.profile_io import profile_differences, round_value, sig
from calibrate.reference import GPU_KEYS, PROFILE_DIR, build_all
from simulator.hardware.profile import Coefficient, Profile

PROFILES = sorted(PROFILE_DIR.glob("*.json"))


def _coefficients(obj, path="profile"):
    """Yield (path, Coefficient) for every Coefficient nested in a profile."""
    if isinstance(obj, Coefficient):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _coefficients(v, f"{path}.{k}")
    elif hasattr(obj, "__dataclass_fields__"):
        for f in fields(obj):
            yield from _coefficients(getattr(obj, f.name), f"{path}.{f.name}")


def test_every_reference_gpu_has_a_profile():
    assert {p.stem for p in PROFILES} >= set(GPU_KEYS)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_loads_and_every_coefficient_has_a_source(path: Path):
    prof = Profile.read_json(path)
    assert prof.device_key == path.stem
    coefs = list(_coefficients(prof))
    assert len(coefs) > 20
    for where, c in coefs:
        assert c.source.strip(), f"{where} has no source"
        assert c.value == c.value, f"{where} is NaN"
        if c.heldout_error_pct is not None:
            assert c.heldout_error_pct >= 0
    assert prof.fingerprint["builder"] == "calibrate.reference"
    assert "infiniband" in prof.links
    assert prof.gemm_eff("bf16") > 0.3 and prof.gemm_eff("bf16") <= 1.0


def test_fitted_coefficients_report_heldout_error():
    """A fitted coefficient reports its held-out error and a standard error, except one the
    fit left on a bound (A100's GEMM k_half at its floor), which has no linearised error."""
    prof = Profile.read_json(PROFILE_DIR / "a100-sxm-80gb.json")
    assert prof.gemm.k_half.heldout_error_pct is not None
    assert prof.gemm.k_half.value <= 1e-6 and prof.gemm.k_half.stderr is None
    assert prof.gemm.eff_max["bf16"].stderr is not None
    nv = prof.links["nvlink"]
    assert nv.alpha_us.heldout_error_pct is not None and nv.alpha_us.stderr is not None


def test_rebuild_matches_shipped_within_each_coefficients_stderr(tmp_path: Path):
    """Least-squares digits depend on the BLAS build: the shipped profiles must agree with a
    rebuild here within a fraction of each coefficient's standard error, not byte for byte."""
    build_all(tmp_path)
    for key in GPU_KEYS:
        rebuilt = json.loads((tmp_path / f"{key}.json").read_text())
        shipped = json.loads((PROFILE_DIR / f"{key}.json").read_text())
        diffs = list(profile_differences(rebuilt, shipped))
        assert not diffs, f"{key} profile is stale (python -m calibrate.reference): {diffs[:5]}"


def test_rebuild_is_byte_identical_on_one_machine(tmp_path: Path):
    build_all(tmp_path / "a")
    build_all(tmp_path / "b")
    for key in GPU_KEYS:
        assert (tmp_path / "a" / f"{key}.json").read_bytes() == \
            (tmp_path / "b" / f"{key}.json").read_bytes(), key


def test_rounding_keeps_the_digits_the_error_justifies():
    assert round_value(838.4123, 276.8) == 838.0          # 2 places below stderr's 100s
    assert round_value(0.870365, 0.149697) == 0.87
    assert round_value(0.0938687, 0.0127606) == 0.0939
    assert round_value(1234.56789, None) == 1234.57       # no error: 6 significant digits
    assert sig(0.00296982, 2) == 0.003 and sig(1.29661, 2) == 1.3


def test_differences_catch_a_real_change_and_pass_machine_noise():
    c = {"value": 838.0, "unit": "elements", "source": "fit (k_half 838 +/- 280)",
         "stderr": 280.0, "heldout_error_pct": 6.1}
    assert not list(profile_differences({"k": c}, {"k": c}))
    noise = {**c, "value": 839.0, "stderr": 270.0, "source": "fit (k_half 839 +/- 281)"}
    assert not list(profile_differences({"k": noise}, {"k": c}))
    moved = {**c, "value": 900.0}                          # > 0.05 x 280 away
    assert any("k.value" in d for d in profile_differences({"k": moved}, {"k": c}))
    reworded = {**c, "source": "assumed"}
    assert any("text differs" in d for d in profile_differences({"k": reworded}, {"k": c}))
    assert list(profile_differences({"a": 1.0}, {"a": 1.001}))
    assert list(profile_differences({"a": 1}, {"b": 1}))


def test_sustained_clock_is_a_ceiling_measured_where_a_row_exists():
    """GPUs with a published sustained (MSMF) row carry it as a ceiling (a fraction of the
    peak, not a factor on the level); elsewhere the ceiling says it is transferred."""
    for key in ("h100-sxm", "h200-sxm", "b200"):
        prof = Profile.read_json(PROFILE_DIR / f"{key}.json")
        src = prof.gemm.sustained_eff["bf16"].source
        assert "MSMF" in src and "kernels_extra.csv line" in src and "ceiling" in src, key
        assert "realistic" not in prof.gemm.eff_max["bf16"].source, key
    for key in ("a100-sxm-80gb", "gb200", "mi300x"):
        prof = Profile.read_json(PROFILE_DIR / f"{key}.json")
        assert "assumed" in prof.gemm.sustained_eff["bf16"].source, key
    h100 = Profile.read_json(PROFILE_DIR / "h100-sxm.json")
    # the ceiling is the H200 MSMF row (744.5 TF of 989.5), below the MAMF burst (794.5)
    assert h100.gemm.sustained_eff["bf16"].value * 989.5 == pytest.approx(744.5, rel=1e-3)
    assert h100.gemm.eff_max["bf16"].value * 989.5 > 744.5


def test_an_efficiency_is_never_rounded_to_zero_by_its_error_bar():
    """A noisy fit (busy host) can give an efficiency with a larger standard error than
    itself; rounding to the error's digit would write 0, which no profile reader accepts."""
    from calibrate.profile_io import round_numbers
    from simulator.hardware.profile_schema import check_numbers
    c = {"value": 1.3e-5, "unit": "fraction", "source": "fit", "stderr": 0.2}
    out = round_numbers({"eff": c})
    assert out["eff"]["value"] == 1e-5
    check_numbers({"gemm": out})
    # other units keep the rounding to their error (k_half 0 is a meaningful value)
    assert round_numbers({"value": 3.0, "unit": "elements", "source": "fit",
                          "stderr": 90000.0})["value"] == 0.0


def test_sibling_gpus_carry_their_own_mamf_rows():
    """A100 PCIe (300 W) and B300 have no shape sweep of their own: they take their
    family's shape terms, and their own best-shape (MAMF) rows set what differs -- the A100
    PCIe ceiling sits below the SXM card's by the ratio of the two MAMF rows (252.9 / 271.2
    TF, kernels.csv lines 2-3), the B300 level above B200's by 1769 / 1745 TF (lines 6-7)."""
    load = lambda k: Profile.read_json(PROFILE_DIR / f"{k}.json")
    sxm, pcie = load("a100-sxm-80gb"), load("a100-pcie-80gb")
    assert pcie.gemm.k_half.value == sxm.gemm.k_half.value
    assert pcie.gemm.sustained_eff["bf16"].value / sxm.gemm.sustained_eff["bf16"].value == \
        pytest.approx(252.9 / 271.2, rel=1e-4)
    assert "A100 PCIe" in pcie.gemm.eff_max["fp32"].source
    b200, b300 = load("b200"), load("b300")
    assert b300.gemm.eff_max["bf16"].value / b200.gemm.eff_max["bf16"].value == \
        pytest.approx(1769.0 / 1745.0, rel=1e-3)
    assert b300.gemm.eff_max["fp8"].value / b200.gemm.eff_max["fp8"].value == \
        pytest.approx(3353.3 / 3432.5, rel=1e-3)
    for c in (b300.gemm.k_half, b300.links["nvlink"].alpha_us, b300.gemm.sustained_eff["bf16"]):
        assert "transferred" in c.source or "assumed" in c.source
    # H100 PCIe, built as A100 PCIe is: the SXM card's shape terms and burst level as
    # fractions of its own peak, which at its own best shape (6912x16384x2048) reproduce its
    # MAMF row (499.5 TF, kernels_extra.csv line 11) within 3 %; the power limit in the
    # ceiling, the SXM ceiling x one tool's PCIe/SXM MAMF ratio (499.5 / 821.2, lines 11-12)
    from dataclasses import replace
    import hardware_db as hdb
    from simulator.cost.kernels import gemm_time_s
    h100, hp = load("h100-sxm"), load("h100-pcie")
    assert hp.gemm.k_half.value == h100.gemm.k_half.value
    burst = replace(hp, gemm=replace(hp.gemm, sustained_eff={}))
    m, n, k = 6912, 16384, 2048
    tf = 2 * m * n * k / gemm_time_s(m, n, k, "bf16", hdb.load_gpu("h100-pcie"), burst) / 1e12
    assert tf == pytest.approx(499.5, rel=0.03)
    for d, peak_sxm, peak_pcie in (("bf16", 989.5, 756.5), ("fp8", 1979.0, 1513.0)):
        sxm_tf = h100.gemm.sustained_eff[d].value * peak_sxm
        pcie_tf = hp.gemm.sustained_eff[d].value * peak_pcie
        assert pcie_tf / sxm_tf == pytest.approx(499.5 / 821.2, rel=1e-3), d
        assert pcie_tf < 499.5 * (2 if d == "fp8" else 1)      # sustained below its burst
    # same-die siblings without rows of their own: the sibling's rates in TF/s, said so
    # GB300 (no row): the larger of its B300 die's and GB200's rows, in TF/s, per dtype
    gb300, gb200 = load("gb300"), load("gb200")
    for d, peak_b300, peak_gb in (("bf16", 2250.0, 2500.0), ("fp8", 4500.0, 5000.0)):
        want = max(b300.gemm.eff_max[d].value * peak_b300, gb200.gemm.eff_max[d].value * peak_gb)
        assert gb300.gemm.eff_max[d].value * peak_gb == pytest.approx(want, rel=1e-3), d
        assert gb300.gemm.sustained_eff[d].value >= gb200.gemm.sustained_eff[d].value
    assert "pessimistic" in gb300.gemm.eff_max["bf16"].source


@pytest.mark.parametrize("gpu", ["a100-pcie-80gb", "h100-pcie", "h800", "b300", "gb300", "mi325x",
                                 "l40s", "gh200", "a800-sxm-80gb", "mi250x", "mi355x",
                                 "gaudi2", "gaudi3"])
def test_a_shipped_sibling_profile_simulates_on_its_own_node(gpu, capsys):
    from simulator.cli.main import main
    args = ["simulate", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--dp", "8",
            "--micro-batch", "1", "--global-batch", "64", "--seq-len", "4096", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step_time_s"] > 0 and d["profile"].startswith(gpu)


def test_h800_is_h100_compute_on_its_own_nvlink():
    """H800 = H100 SXM compute (same GH100 die); only its NVLink is cut, to 200 GB/s per
    direction (links.json 'nvlink4-h800'). The NVLink efficiency carried from the H200 sweep
    on that bandwidth gives what DeepSeek-V3 measured usable on H800 (160 GB/s, links.csv
    line 72) within 2 %: an independent check of the transfer."""
    import hardware_db as hdb
    h100, h800 = (Profile.read_json(PROFILE_DIR / f"{k}.json") for k in ("h100-sxm", "h800"))
    for d in ("bf16", "fp8"):
        assert h800.gemm.eff_max[d].value == h100.gemm.eff_max[d].value
        assert h800.gemm.sustained_eff[d].value == h100.gemm.sustained_eff[d].value
    link = hdb.load_link("nvlink4-h800")
    usable = h800.links["nvlink"].bw_eff.value * link.bandwidth_gbytes_per_s
    assert usable == pytest.approx(160.0, rel=0.02)
    assert "transferred" in h800.links["nvlink"].bw_eff.source
    cl = hdb.build_cluster("h800", 16)
    assert cl.node.gpus_per_node == 8 and cl.gpu.key == "h800"


def test_gh200_is_h100_compute_on_a_four_gpu_mesh_with_a_grace_host():
    """GH200 (JUPITER's configuration): H100 compute (same GH100 die, 132 SMs), the Grace
    host's own measured Linear call (33.17 us, host_overhead.csv line 4, against 13.48 us
    on a DGX H100's Xeon), four GPUs per node in an NVLink mesh (150 GB/s per direction per
    pair, no NVLS) and four 200 Gb/s NICs. A large 4-GPU all-reduce on the mesh runs at
    what the carried NVLink efficiency gives at the per-GPU bandwidth, and a layer's host
    time is the Grace/x86 ratio of the H100's."""
    import hardware_db as hdb
    from simulator.cost.host import eager_host_us
    from simulator.cost.layer import group_collective_s
    from simulator.network.collectives import Collective
    from simulator.parallel.placement import place_group
    from simulator.workload.ops import layer_ops
    from simulator.workload.presets import get_preset
    h100, gh = (Profile.read_json(PROFILE_DIR / f"{k}.json") for k in ("h100-sxm", "gh200"))
    for d in ("bf16", "fp8"):
        assert gh.gemm.eff_max[d].value == h100.gemm.eff_max[d].value
        assert gh.gemm.sustained_eff[d].value == h100.gemm.sustained_eff[d].value
    assert gh.host.op_fwd_us.value == 33.17 and h100.host.op_fwd_us.value == 13.48
    cl = hdb.build_cluster("gh200", 16)
    assert (cl.node.gpus_per_node, cl.node.scale_up_domain_gpus, cl.node.nics_per_node) == \
        (4, 4, 4)
    assert cl.node.scale_up.key == "nvlink4-gh200-quad" and not cl.node.in_switch_reduction
    assert cl.node.nic.bandwidth_gbytes_per_s == 25.0 and cl.gpu.mem_bytes == 96e9
    size = 1 << 30
    t = group_collective_s(Collective.ALL_REDUCE, size, place_group(cl, "tp", 4, 1), gh)
    busbw = 2 * 3 / 4 * size / t / 1e9
    assert busbw == pytest.approx(gh.links["nvlink"].bw_eff.value * 450.0, rel=0.05)
    from simulator.engine.stage_work import layer_shape
    from simulator.parallel.plan import Plan
    model = get_preset("llama3-8b")
    ops = layer_ops(model, layer_shape(model, Plan(global_batch=1)))
    assert eager_host_us(ops, gh, False) / eager_host_us(ops, h100, False) == \
        pytest.approx(33.17 / 13.48, rel=1e-6)


def test_l40s_level_is_solved_from_its_own_mamf_row():
    """L40S (Ada) has one measurement, its best-shape rate (252.0 TF bf16 at 4416x3776x3072,
    kernels_extra.csv line 13): the model reproduces it at that shape; everything else says
    it is assumed."""
    from simulator.cost.kernels import gemm_time_s
    import hardware_db as hdb
    prof, gpu = Profile.read_json(PROFILE_DIR / "l40s.json"), hdb.load_gpu("l40s")
    assert "kernels_extra.csv line 13" in prof.gemm.eff_max["bf16"].source
    for c in (prof.gemm.k_half, prof.memory.bw_eff, prof.attention.fwd_eff["bf16"]):
        assert "assumed" in c.source or "transferred" in c.source
    m, n, k = 4416, 3776, 3072
    burst = dataclasses_replace_cap(prof)
    tf = 2 * m * n * k / gemm_time_s(m, n, k, "bf16", gpu, burst) / 1e12
    assert tf == pytest.approx(252.0, rel=0.02)


def dataclasses_replace_cap(prof):
    """The profile without its power-limit ceiling: MAMF rows are short bursts."""
    from dataclasses import replace
    return replace(prof, gemm=replace(prof.gemm, sustained_eff={}))


@pytest.mark.parametrize("key", GPU_KEYS)
def test_builder_datasheets_match_the_hardware_database(key):
    """The reference builder's datasheet table (calibrate/reference_data.py, which carries the
    CSV line each coefficient cites) holds the same numbers as hardware_db's gpus.json and
    links.json, so a profile is never fitted against one peak and run against another."""
    import hardware_db as hdb
    from calibrate.reference_data import DATASHEET
    ds, gpu = DATASHEET[key], hdb.load_gpu(key)
    for dtype, tf in ds.peak.items():
        assert gpu.peak_tflops[dtype] == pytest.approx(tf), dtype
    assert gpu.mem_bw_gbytes_per_s == pytest.approx(ds.mem_bw_gbytes_per_s)
    if gpu.sm_count:                       # gpus.csv leaves some SM counts empty
        assert gpu.sm_count == ds.sm_count
    node = hdb.build_cluster(key, hdb.default_node_for_gpu(key).gpus_per_node).node
    if ds.nvlink_gbytes_per_s:             # 0: no NVLink domain in the node (PCIe cards)
        assert node.scale_up.bandwidth_gbytes_per_s == pytest.approx(ds.nvlink_gbytes_per_s)
    else:
        assert node.scale_up.kind.value == "pcie"


def test_a800_is_a100_compute_on_its_own_nvlink():
    """A800 = A100 SXM 80GB compute (same GA100 die); only its NVLink is cut, to 200 GB/s per
    direction (links.json 'nvlink3-a800'). Every GEMM, attention and memory coefficient is the
    A100's; the NVLink efficiencies are the A100 sweep's, said to be carried."""
    a100, a800 = (Profile.read_json(PROFILE_DIR / f"{k}.json")
                  for k in ("a100-sxm-80gb", "a800-sxm-80gb"))
    for d in ("bf16", "fp16", "fp32"):
        assert a800.gemm.eff_max[d].value == a100.gemm.eff_max[d].value
    assert a800.gemm.sustained_eff["bf16"].value == a100.gemm.sustained_eff["bf16"].value
    assert a800.memory.bw_eff.value == a100.memory.bw_eff.value
    nv8, nv1 = a800.links["nvlink"], a100.links["nvlink"]
    assert nv8.bw_eff.value == nv1.bw_eff.value and "transferred" in nv8.bw_eff.source
    assert "A800" in a800.gemm.eff_max["bf16"].source


@pytest.mark.parametrize("gpu, line, shape, tf_row", [
    ("mi300x", 2, (10240, 15360, 8192), 668.4),
    ("mi250x", 14, (1024, 14080, 19968), 147.0),      # one GCD
    ("mi325x", 15, (13312, 10240, 8192), 784.9),
    ("mi355x", 16, (12288, 8192, 8192), 1565.0),
])
def test_each_amd_gemm_level_comes_from_its_own_mamf_row(gpu, line, shape, tf_row):
    """Each AMD Instinct card's level is solved from its own MAMF row (kernels_extra.csv)
    with the carried shape terms, so the model gives that row back at its shape; below it,
    a sustained ceiling that says where it came from."""
    from dataclasses import replace
    import hardware_db as hdb
    from simulator.cost.kernels import gemm_time_s
    prof = Profile.read_json(PROFILE_DIR / f"{gpu}.json")
    assert f"kernels_extra.csv line {line}" in prof.gemm.eff_max["bf16"].source
    burst = replace(prof, gemm=replace(prof.gemm, sustained_eff={}))
    m, n, k = shape
    tf = 2 * m * n * k / gemm_time_s(m, n, k, "bf16", hdb.load_gpu(gpu), burst) / 1e12
    assert tf == pytest.approx(tf_row, rel=0.03)
    sustained = 2 * m * n * k / gemm_time_s(m, n, k, "bf16", hdb.load_gpu(gpu), prof) / 1e12
    assert sustained < tf and "MSMF" in prof.gemm.sustained_eff["bf16"].source
    assert "xgmi" in prof.links and "nvlink" not in prof.links


def test_mi250x_has_no_fp8_and_says_its_row_is_optimistic():
    prof = Profile.read_json(PROFILE_DIR / "mi250x.json")
    assert "optimistic" in prof.gemm.eff_max["bf16"].source
    assert "fp8" not in prof.gemm.eff_max
    assert "MI250X xGMI" in prof.links["xgmi"].bw_eff.source
