"""CPU calibration: discovery, profile fitting from stored measurements, resume, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calibrate.cli import run_fit
from calibrate.cpu_profile import fit_profiles
from calibrate.discover import DeviceInfo, describe, discover
from calibrate.fit import GemmPoint, LinkPoint, gemm_model, link_model
from simulator.errors import ComplexityError, InvalidInputError, ProfileError
from simulator.hardware.profile import Profile
from simulator.network.collectives import Collective

ENV = {"device": "cpu-test", "torch_version": "0", "gloo": "yes", "date": "2025-01-01",
       "git_revision": "x", "python": "3", "cpu_pressure_avg60_pct": "0"}
FAKE = DeviceInfo("cpu", "Test CPU", 2, 2, 8e9, message="no NVIDIA GPU found")


def test_discover_never_raises_and_describes():
    info = discover()
    assert info.kind in ("cpu", "cuda")
    assert info.key.startswith(info.kind + "-")
    text = describe(info)
    assert text.strip()
    if info.kind == "cpu":
        assert "no NVIDIA GPU found" in text


def _write(out: Path, bench: str, rows: list[dict]) -> None:
    (out / "measurements").mkdir(parents=True, exist_ok=True)
    rows = [{**r, **ENV, "p25_s": r["median_s"], "p75_s": r["median_s"], "iqr_s": 0.0,
             "mean_s": r["median_s"], "p10_s": r["median_s"], "n_samples": 5,
             "suspect": False} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows), out / "measurements" / f"{bench}.parquet")


def _synthetic(out: Path, rng: np.random.Generator) -> None:
    """Measurements generated from known coefficients with the cost formulas + 3% noise."""
    noise = lambda: float(np.exp(rng.normal(0, 0.03)))
    g = gemm_model(0.2, 0, 50.0, 0, 0)          # 200 GFLOP/s, 50 GB/s
    truth = {"eff_max": 1.0, "k_half": 64.0, "launch_us": 5.0}
    gemm = [{"point": f"{s}:{t}", "m": s, "n": s, "k": s, "dtype": "fp32", "threads": 2,
             "median_s": g(truth, GemmPoint(s, s, s, 1.0, 4)) * noise(), "t": t}
            for s in (32, 64, 128, 192, 256, 384, 512, 768, 1024) for t in range(2)]
    mem = [{"point": f"m{e}", "kernel": "copy", "elems": e, "bytes_moved": 8.0 * e, "threads": 2,
            "median_s": (3e-6 + 8.0 * e / 50e9) * noise()} for e in (2 ** i for i in range(10, 23))]
    attn = []
    for s in (128, 256, 512, 1024):
        fl = 4.0 * 2 * 4 * s * s * 64 * (0.5 + 0.5 / max(1, s // 128))
        fwd = 3e-6 + fl / (0.2e12 * 0.5)
        bwd = 3e-6 + 2.5 * fl / (0.2e12 * 0.4)
        for pas, t in (("fwd", fwd), ("fwd_bwd", fwd + bwd)):
            attn.append({"point": f"a{s}{pas}", "batch": 2, "heads": 4, "seq": s, "head_dim": 64,
                         "pass": pas, "flops_fwd": fl, "threads": 2, "median_s": t * noise()})
    lm = link_model(1.5, 0.0, 1.0)
    lt = {"alpha_us": 100.0, "small_bw_eff": 0.5, "base_us": 400.0, "bw_eff": 1.5}
    coll = [{"point": f"c{b}", "op": "all_reduce", "size_bytes": float(b), "n_ranks": 2,
             "backend": "gloo", "median_s": lm(lt, LinkPoint(b, 1.0, Collective.ALL_REDUCE, 2))
             * noise() / 1.5 * 1.5} for b in (2 ** i for i in range(10, 25))]
    # fit_link is called with B = 1 GB/s, so bw_eff carries GB/s: rescale the truth
    lm1 = link_model(1.0, 0.0, 1.0)
    for r in coll:
        r["median_s"] = lm1(lt, LinkPoint(r["size_bytes"], 1.0, Collective.ALL_REDUCE, 2)) * noise()
    inter = [{"point": f"i{n}", "gemm_n": n, "allreduce_bytes": 1e6, "n_ranks": 2,
              "alone_s": 1e-3 * n, "alone_iqr_s": 0.0, "comm_alone_s": 1e-2,
              "median_s": 1.2e-3 * n * noise()} for n in range(1, 7)]
    for bench, rows in (("gemm", gemm), ("memory", mem), ("attention", attn),
                        ("collectives", coll), ("interference", inter)):
        _write(out, bench, rows)


def test_fit_profiles_recovers_synthetic_coefficients(tmp_path: Path):
    _synthetic(tmp_path, np.random.default_rng(7))
    prof = fit_profiles(tmp_path, FAKE)["profile.json"]
    assert prof.device.peak("fp32") == pytest.approx(0.2, rel=0.05)
    assert prof.device.mem_bw_gbytes_per_s == pytest.approx(50.0, rel=0.05)
    assert prof.memory.launch_us.value == pytest.approx(3.0, rel=0.3)
    assert prof.attention.fwd_eff["fp32"].value == pytest.approx(0.5, rel=0.08)
    assert prof.attention.bwd_eff["fp32"].value == pytest.approx(0.4, rel=0.12)
    assert prof.node.scale_up.bandwidth_gbytes_per_s == pytest.approx(1.5, rel=0.1)
    assert prof.links["host"].alpha_us.value == pytest.approx(100.0, rel=0.3)
    assert prof.overlap_slowdown.value == pytest.approx(1.2, rel=0.04)
    assert prof.gemm.eff_max["fp32"].value == 1.0 and prof.device.sm_count == 0
    for c in (prof.gemm.k_half, prof.memory.launch_us, prof.links["host"].base_us,
              prof.overlap_slowdown):
        assert c.source and c.heldout_error_pct is not None
    res = run_fit(tmp_path, info=FAKE, quiet=True)
    back = Profile.read_json(res.profiles["profile.json"])
    assert back.device.key == prof.device.key and back.node.key == prof.node.key
    assert back.device.peak("fp32") == pytest.approx(prof.device.peak("fp32"), rel=1e-5)
    assert back.node.scale_up.kind == prof.node.scale_up.kind


def test_bad_inputs_give_one_line_errors(tmp_path: Path):
    with pytest.raises(InvalidInputError) as e:
        run_fit(tmp_path / "missing", quiet=True)
    assert "\n" not in str(e.value)
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(InvalidInputError):
        run_fit(tmp_path / "empty", quiet=True)
    bad = tmp_path / "bad" / "measurements"
    bad.mkdir(parents=True)
    for b in ("gemm", "memory", "attention", "collectives", "interference"):
        (bad / f"{b}.parquet").write_text("not parquet")
    with pytest.raises(InvalidInputError) as e:
        run_fit(tmp_path / "bad", quiet=True)
    assert "\n" not in str(e.value)


def test_profile_of_other_schema_version_is_rejected(tmp_path: Path):
    _synthetic(tmp_path, np.random.default_rng(3))
    res = run_fit(tmp_path, info=FAKE, quiet=True)
    path = res.profiles["profile.json"]
    d = json.loads(path.read_text())
    d["schema_version"] = 999
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError) as e:
        Profile.read_json(path)
    assert "schema_version" in str(e.value) and "\n" not in str(e.value)
    path.write_text("{not json")
    with pytest.raises(ComplexityError):
        Profile.read_json(path)


@pytest.mark.torch
def test_quick_calibration_resumes(tmp_path: Path):
    pytest.importorskip("torch")
    from dataclasses import replace

    from calibrate.bench import bench_gemm, quick_plan
    from calibrate.store import read_rows
    plan = replace(quick_plan(), gemm=((64, 64, 64, "fp32"), (128, 128, 128, "fp32")),
                   gemm_1thread=((64, 64, 64, "fp32"),))
    path = bench_gemm(tmp_path, ENV, plan, quiet=True)
    first = read_rows(path)
    # an interrupted run: drop one point, re-run, only that point is measured again
    pq.write_table(pa.Table.from_pylist(first[:-1]), path)
    bench_gemm(tmp_path, ENV, plan, quiet=True)
    again = read_rows(path)
    assert [r["point"] for r in again] == [r["point"] for r in first]
    assert again[0]["median_s"] == first[0]["median_s"]       # kept, not re-measured
    assert all(r["median_s"] > 0 and r["iqr_s"] >= 0 for r in again)


@pytest.mark.torch
def test_quick_calibration_end_to_end(tmp_path: Path):
    """Whatever else runs on this host, the quick calibration writes a profile: clean, or
    with the coefficients the load contaminated marked (no wall-time assertion: shared host)."""
    pytest.importorskip("torch")
    from calibrate.cli import run_calibrate
    res = run_calibrate(tmp_path, quick=True, quiet=True)
    prof = Profile.read_json(res.profiles["profile.json"])
    assert prof.device.peak("fp32") > 0 and prof.device.mem_bw_gbytes_per_s > 0
    assert res.contaminated["profile.json"] == tuple(prof.contaminated_paths())
    names = {p.stem for p in res.measurements}
    if "collectives" in res.failed:                  # gloo failed even after its retries
        assert "host" not in prof.links and "collectives" not in names
    else:
        assert prof.links["host"].bw_eff.value == 1.0
        assert prof.node.scale_up.kind.value == "host"
        assert {"gemm", "memory", "attention", "collectives"} <= names


def _mark_all_suspect(out: Path, bench: str) -> None:
    path = out / "measurements" / f"{bench}.parquet"
    rows = [{**r, "suspect": True} for r in pq.read_table(path).to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_busy_host_gives_a_marked_profile_and_strict_refuses(tmp_path: Path):
    """Every GEMM and collective point taken under load: the fit still runs, the GEMM and
    host-link coefficients (only those) are marked contaminated; --strict refuses."""
    _synthetic(tmp_path, np.random.default_rng(5))
    clean = fit_profiles(tmp_path, FAKE)["profile.json"]
    assert clean.contaminated_paths() == []
    for bench in ("gemm", "collectives"):
        _mark_all_suspect(tmp_path, bench)
    prof = fit_profiles(tmp_path, FAKE)["profile.json"]
    paths = prof.contaminated_paths()
    assert "profile.gemm.k_half" in paths and "profile.gemm.eff_max.fp32" in paths
    assert "profile.links.host.alpha_us" in paths
    assert not any(p.startswith(("profile.memory", "profile.attention")) for p in paths)
    assert prof.gemm.k_half.value == clean.gemm.k_half.value    # same rows, same fit
    res = run_fit(tmp_path, info=FAKE, quiet=True)
    back = Profile.read_json(res.profiles["profile.json"])
    assert back.contaminated_paths() == paths == list(res.contaminated["profile.json"])
    assert '"contaminated": true' in res.profiles["profile.json"].read_text()
    with pytest.raises(InvalidInputError) as e:
        run_fit(tmp_path, info=FAKE, quiet=True, strict=True)
    assert "gemm.parquet" in str(e.value) and "\n" not in str(e.value)


def test_a_few_suspect_points_are_dropped_not_marked(tmp_path: Path):
    _synthetic(tmp_path, np.random.default_rng(6))
    path = tmp_path / "measurements" / "gemm.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[0]["suspect"] = True
    rows[0]["median_s"] = rows[0]["p10_s"] = rows[0]["median_s"] * 50   # a stalled point
    pq.write_table(pa.Table.from_pylist(rows), path)
    prof = fit_profiles(tmp_path, FAKE)["profile.json"]
    assert prof.contaminated_paths() == []
    assert prof.device.peak("fp32") == pytest.approx(0.2, rel=0.05)


def test_failed_comm_benchmarks_leave_a_single_process_profile(tmp_path: Path):
    _synthetic(tmp_path, np.random.default_rng(8))
    for bench in ("collectives", "interference"):
        (tmp_path / "measurements" / f"{bench}.parquet").unlink()
    res = run_fit(tmp_path, info=FAKE, quiet=True)
    prof = Profile.read_json(res.profiles["profile.json"])
    assert res.failed == ("collectives", "interference")
    assert prof.links == {} and prof.node.gpus_per_node == 1
    assert prof.overlap_slowdown.value == 1.0 and prof.overlap_slowdown.contaminated
    assert prof.overlap_slowdown.source.startswith("assumed")
    with pytest.raises(InvalidInputError):
        run_fit(tmp_path, info=FAKE, quiet=True, strict=True)


def test_busy_retry_backs_off_and_keeps_the_quietest_attempt(monkeypatch):
    from calibrate import bench
    from calibrate.store import Stats
    pauses: list[float] = []
    monkeypatch.setattr(bench.time, "sleep", pauses.append)
    seq = iter([0.9, 0.8, 0.5, 0.7, 0.6])
    timer = lambda: Stats(1.0, 1.0, 1.0, 3, pressure=next(seq))
    st, suspect = bench.BusyRetry(budget_s=7.5).measure(timer)
    assert pauses == [1.0, 2.0, 4.0, 0.5]          # doubling, then what is left of the budget
    assert st.pressure == 0.5 and suspect           # quietest kept; still above the limit
    calm = iter([0.9, 0.05])
    st, suspect = bench.BusyRetry(60).measure(lambda: Stats(1, 1, 1, 3, pressure=next(calm)))
    assert st.pressure == 0.05 and not suspect


@pytest.mark.torch
def test_gloo_failures_are_retried_then_reported(tmp_path: Path, monkeypatch):
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    from calibrate import bench_comm
    from calibrate.bench import quick_plan
    monkeypatch.setattr(bench_comm.time, "sleep", lambda s: None)
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) < bench_comm.ATTEMPTS:
            raise RuntimeError("worker 1 died\nConnection reset by peer")
    monkeypatch.setattr(mp, "start_processes", flaky)
    bench_comm.bench_comm(tmp_path, ENV, quick_plan(), quiet=True)
    assert len(calls) == bench_comm.ATTEMPTS
    calls.clear()
    monkeypatch.setattr(mp, "start_processes", lambda *a, **k: calls.append(1) or 1 / 0)
    with pytest.raises(bench_comm.BenchmarkError) as e:
        bench_comm.bench_comm(tmp_path, ENV, quick_plan(), quiet=True)
    assert len(calls) == bench_comm.ATTEMPTS and "division by zero" in str(e.value)


def test_family_efficiencies_and_span_interference_recovered(tmp_path: Path):
    """Memory families (op-graph bytes, per-group launch) and the span interference design:
    synthetic rows made with known coefficients come back out of fit_profiles."""
    rng = np.random.default_rng(11)
    _synthetic(tmp_path, rng)
    noise = lambda: float(np.exp(rng.normal(0, 0.02)))
    bw = 50e9
    groups = {("copy", "fwd"): ("copy", 8.0, 1, 1.0, 3e-6),
              ("layernorm", "fwd"): ("norm", 8.0, 1, 0.4, 6e-6),
              ("layernorm", "bwd"): ("norm", 16.0, 1, 0.8, 15e-6),
              ("adamw", "step"): ("optimizer", 28.0, 4, 0.6, 8e-6)}
    mem = []
    for (k, pas), (fam, per, kern, eff, launch) in groups.items():
        for e in (2 ** i for i in range(12, 23)):
            t = kern * launch + per * e / (bw * eff)
            mem.append({"point": f"{k}:{e}:{pas}", "kernel": k, "elems": e, "pass": pas,
                        "family": fam, "bytes_moved": per * e, "kernels": kern, "threads": 2,
                        "cache": "cold", "median_s": t * noise()})
    inter = [{"point": f"span{i}", "gemm_n": 256, "allreduce_bytes": 1e6, "n_ranks": 2,
              "mode": "span", "alone_s": a, "alone_iqr_s": 0.0, "comm_alone_s": c,
              "median_s": (a + 0.8 * min(a, c)) * noise()}
             for i, (a, c) in enumerate(((0.01, 0.005), (0.02, 0.01), (0.04, 0.02),
                                         (0.06, 0.03), (0.05, 0.08)))]
    _write(tmp_path, "memory", mem)
    _write(tmp_path, "interference", inter)
    prof = fit_profiles(tmp_path, FAKE)["profile.json"]
    assert prof.device.mem_bw_gbytes_per_s == pytest.approx(50.0, rel=0.05)
    assert prof.memory.kind_eff["norm"].value == pytest.approx(24 / (8 / 0.4 + 16 / 0.8), rel=0.05)
    assert prof.memory.kind_eff["optimizer"].value == pytest.approx(0.6, rel=0.05)
    assert prof.memory.kind_eff["copy"].value == 1.0
    assert prof.overlap_slowdown.value == pytest.approx(1.8, rel=0.05)
    assert 3.0 <= prof.memory.launch_us.value <= 15.0      # median of the group launches
