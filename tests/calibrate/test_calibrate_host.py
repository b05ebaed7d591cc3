"""The host probe (calibrate.bench_host), its fit into Profile.host, and the reference
profiles' host model (calibrate.reference_host)."""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calibrate.bench_host import HOST_LAYERS, graph_ops, per_op_us
from calibrate.cpu_profile import fit_profiles
from calibrate.csvrows import MEAS_DIR
from calibrate.reference_host import host_for
from test_calibrate_cpu import ENV, FAKE, _synthetic


def _host_rows(fwd_us: float, bwd_us: float, fixed_us: float, threads: int = 2) -> list[dict]:
    rows = []
    for n in HOST_LAYERS:
        gf, gb = graph_ops(n)
        for pas, g, per in (("fwd", gf, fwd_us), ("bwd", gb, bwd_us)):
            t = (fixed_us + g * per) * 1e-6
            rows.append({"point": f"decoder{n}:t{threads}:{pas}", "kind": "decoder",
                         "layers": n, "pass": pas, "threads": threads, "graph_ops": g,
                         "aten_kernel_ops_fwd": 14 * n + 6, "median_s": t, "p10_s": t})
    rows.append({"point": f"linear:t{threads}:fwd", "kind": "linear", "layers": 0,
                 "pass": "fwd", "threads": threads, "graph_ops": 1, "aten_kernel_ops_fwd": 1,
                 "median_s": 7e-6, "p10_s": 7e-6})
    return rows


def _write_host(out: Path, rows: list[dict]) -> None:
    rows = [{**r, **ENV, "p25_s": r["median_s"], "p75_s": r["median_s"], "iqr_s": 0.0,
             "mean_s": r["median_s"], "n_samples": 30, "suspect": False,
             "cpu_pressure": 0.0} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows), out / "measurements" / "host.parquet")


def test_graph_ops_of_the_probe_layers():
    """A dense GELU layer of the op graph: ln1, qkv, attention, out-proj, residual, ln2, fc1,
    GELU, fc2, residual (10) forward; backward: two GEMMs per Linear (8) and one op for
    each other op (6)."""
    f1, b1 = graph_ops(1)
    f5, b5 = graph_ops(5)
    assert (f5 - f1, b5 - b1) == (40, 56)


def test_per_op_cost_is_the_slope_over_layers():
    """Fixed per-call costs (embedding, loss, Python call) cancel in the difference."""
    us = per_op_us(_host_rows(11.0, 9.0, fixed_us=300.0), threads=2)
    assert us["fwd"] == pytest.approx(11.0) and us["bwd"] == pytest.approx(9.0)
    assert us["linear"] == pytest.approx(7.0)


def test_host_model_in_the_cpu_profile(tmp_path: Path):
    _synthetic(tmp_path, np.random.default_rng(7))
    without = fit_profiles(tmp_path, FAKE)["profile.json"]
    assert without.host is None and without.memory.launch_us.value > 0
    _write_host(tmp_path, _host_rows(12.0, 8.0, fixed_us=250.0))
    prof = fit_profiles(tmp_path, FAKE)["profile.json"]
    assert prof.host.synchronous
    assert prof.host.op_fwd_us.value == pytest.approx(12.0)
    assert prof.host.op_bwd_us.value == pytest.approx(8.0)
    # the per-call fixed cost now belongs to the host; the kernels keep their rates
    assert prof.gemm.launch_us.value == 0 and prof.memory.launch_us.value == 0
    assert prof.device.peak("fp32") == pytest.approx(without.device.peak("fp32"))
    assert "host.parquet" in prof.host.op_fwd_us.source


@pytest.mark.torch
def test_host_probe_measures_both_passes(tmp_path: Path):
    pytest.importorskip("torch")
    from dataclasses import replace

    from calibrate.bench import quick_plan
    from calibrate.bench_host import bench_host
    from calibrate.store import read_rows
    path = bench_host(tmp_path, ENV, replace(quick_plan(), busy_retry_s=0.0), quiet=True)
    rows = read_rows(path)
    kinds = {(r["kind"], r["pass"]) for r in rows}
    assert {("decoder", "fwd"), ("decoder", "bwd"), ("linear", "fwd")} <= kinds
    assert all(r["median_s"] > 0 for r in rows if not (r["kind"] == "linear"
                                                      and r["pass"] == "bwd"))
    big = [r for r in rows if r["kind"] == "decoder" and r["layers"] == HOST_LAYERS[1]
           and r["pass"] in ("fwd", "bwd")]
    assert all(r["aten_kernel_ops_fwd"] > r["graph_ops"] / 2 for r in big)
    step = {(r["layers"], r["pass"]): r["min_s"] for r in rows if r["pass"] in ("opt", "zero")}
    assert set(step) == {(n, p) for n in HOST_LAYERS for p in ("opt", "zero")}
    assert all(v > 0 for v in step.values())
    assert step[(HOST_LAYERS[1], "opt")] > step[(HOST_LAYERS[0], "opt")]   # more tensors


def _csv(name: str) -> list[dict]:
    with open(MEAS_DIR / name, newline="") as fh:
        return list(csv.DictReader(fh))


def test_reference_host_transfers_the_published_linear_cost():
    """forward per op = published CPU time per nn.Linear forward on the GPU's host;
    backward = forward x the probe's backward/forward ratio (from the copied rows)."""
    linear = {r["gpu"]: float(r["value"]) for r in _csv("host_overhead.csv")
              if r["kernel"].startswith("torch.nn.Linear forward")}
    probe = [r for r in _csv("host_mechanisms.csv") if r["mechanism"] == "eager_probe"]
    last = max(r["date"] for r in probe)
    med = lambda m: statistics.median(float(r["value_us"]) for r in probe  # noqa: E731
                                      if r["date"] == last and r["metric"] == m)
    ratio = med("per op-graph op, backward") / med("per op-graph op, forward")
    h = host_for("h100-sxm")
    assert linear["H100 SXM (DGX, Xeon 8480C host)"] == 13.48
    assert h.op_fwd_us.value == 13.48
    assert h.op_bwd_us.value == pytest.approx(13.48 * ratio, abs=0.01)
    g = host_for("gb200")
    assert g.op_fwd_us.value == linear["GB200"] == 37.08
    assert host_for("a100-sxm-80gb").op_fwd_us.value == 13.48
    assert not h.synchronous and "host_overhead.csv line 6" in h.op_fwd_us.source


def test_a_memory_kernel_with_few_clean_points_keeps_all_of_them(tmp_path: Path):
    """Each memory-bound kernel is fitted on its own: when other load spoiled most of one
    kernel's points, that kernel keeps all its points (and the thread count is marked)
    instead of leaving one clean point to fit two parameters (a busy-host failure)."""
    from calibrate.hygiene import select_rows
    rows = [{"kernel": k, "pass": "fwd", "threads": 2, "suspect": k == "copy" and i > 0,
             "bytes_moved": 1e6 * (i + 1)} for k in ("copy", "layernorm", "gelu")
            for i in range(5)]
    sel = select_rows("memory", rows, tmp_path / "memory.parquet")
    assert sum(r["kernel"] == "copy" for r in sel.rows) == 5
    assert sum(r["kernel"] == "gelu" for r in sel.rows) == 5
    assert sel.contaminated_threads == frozenset({2})


def test_step_overhead_is_the_probes_unpriced_intercept():
    """Synthetic probe rows with known per-op costs and a known fixed cost per call: the
    fitted step overhead is the sum of the four calls' intercepts less what the host model
    charges for the probe's ops outside its layers; without optimizer rows it is not
    measured (None)."""
    from calibrate.bench_host import probe_spec
    from calibrate.cpu_host import _probe_head_ops, host_model, step_overhead
    fwd_us, bwd_us, fixed_us = 12.0, 15.0, 300.0
    rows = _host_rows(fwd_us, bwd_us, fixed_us)
    host = host_model(rows, 2, False)
    assert step_overhead(rows, 2, host) is None
    for n in HOST_LAYERS:                          # opt: 100 us + 20 us/layer; zero: 10 us
        for pas, t in (("opt", 100.0 + 20.0 * n), ("zero", 10.0)):
            rows.append({"point": f"decoder{n}:t2:{pas}", "kind": "decoder", "layers": n,
                         "pass": pas, "threads": 2, "graph_ops": 0, "aten_kernel_ops_fwd": 0,
                         "median_s": t * 1e-6, "p10_s": t * 1e-6})
    again = host_model(rows, 2, False)             # the new rows leave the per-op fit alone
    assert (again.op_fwd_us.value, again.op_bwd_us.value) == (host.op_fwd_us.value, host.op_bwd_us.value)
    hf, hb = _probe_head_ops(probe_spec(HOST_LAYERS[0]))
    want = (2 * fixed_us + 100.0 + 10.0 - hf * fwd_us - hb * bwd_us) * 1e-6
    got = step_overhead(rows, 2, host)
    assert got.value == pytest.approx(max(0.0, want), abs=1e-9)
    assert want > 0 and got.source.startswith("measured: decoder probe intercepts")
