"""Megatron-Core's dense-layer Python glue (frameworks.json "mcore_layer_glue"): the number
is the median of its own CPU measurement, each measured glue row is the stated difference of
the rows measured with it, and it is charged per layer forward (again under full
recompute), scaled by the launch mode."""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

import pytest

import hardware_db
from calibrate.bench_framework import _graph_ops
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.frameworks import HOST
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "hardware_db" / "data" / "measurements" / "host_mechanisms.csv"
MODEL = get_preset("tiny-2l-128")
BASE = hardware_db.load_profile("h100-sxm")
GLUE = HOST.mechanisms["mcore_layer_glue"]


def _runs() -> list[dict[str, float]]:
    """The measured rows, one dict (metric -> eager ops) per bench run, in CSV order."""
    runs: list[dict[str, float]] = []
    with CSV.open() as fh:
        for r in csv.DictReader(fh):
            if r["mechanism"] != "mcore_layer_glue":
                continue
            if r["metric"].startswith("per layer, fwd (local"):
                runs.append({})
            runs[-1][r["metric"]] = float(r["eager_ops"])
    return runs


def test_the_bench_layer_in_op_graph_ops():
    """Megatron's local-spec layer at the bench shapes, as the op graph has it: 12 forward
    ops (unfused attention: qk, softmax, av), 18 backward, 4 Linear calls."""
    assert _graph_ops(32, 16) == (12, 18, 4, 3, 5)


def test_glue_is_the_stated_difference_and_the_median():
    runs = _runs()
    assert len(runs) == 3
    for r in runs:
        glue = (r["per layer, fwd (local spec, whole layer)"] - 12
                - 4 * r["parallel linear extra over nn.Linear, fwd"]
                - r["unfused core attention extra over the op graph, fwd"])
        assert r["per layer, fwd, glue"] == pytest.approx(glue, abs=0.01)
    assert GLUE.layer_module_fwd_eager_ops == pytest.approx(
        statistics.median(r["per layer, fwd, glue"] for r in runs), abs=0.01)
    # the same decomposition of the backward is negative in every run: none is charged
    assert all(r["per layer, bwd, glue"] < 0 for r in runs)
    assert GLUE.layer_bwd_eager_ops == 0.0


def _chunk(mech, mode="eager", recompute="none"):
    c = Coefficient(10.0, "us", "test")
    prof = dataclasses.replace(BASE, host=HostModel(c, c))
    cl = hardware_db.build_cluster("h100-sxm", 2)
    plan = Plan(dp=2, micro_batch=1, global_batch=2, host_mechanisms=mech, host_mode=mode,
                recompute=recompute)
    return build_chunks(MODEL, plan, cl, prof, place_groups(cl, plan))[0][0]


@pytest.mark.parametrize("mode, scale", [("eager", 1.0), ("compiled", None),
                                         ("cuda_graphs", 0.0)])
def test_charged_per_layer_forward_scaled_by_the_mode(mode, scale):
    a, b = _chunk((), mode), _chunk(("mcore_layer_glue",), mode)
    scale = HOST.modes[mode].op_scale if scale is None else scale
    per_layer = GLUE.layer_module_fwd_eager_ops * 10e-6 * scale
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(len(b.layers) * per_layer)
    assert b.bwd.host_s == pytest.approx(a.bwd.host_s)
    a, b = _chunk((), mode, "full"), _chunk(("mcore_layer_glue",), mode, "full")
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(len(b.layers) * per_layer)
    # the re-run forward precedes the input-gradient pass: B of a split backward has it,
    # the weight-gradient half (W) does not
    assert b.wgrad.host_s == pytest.approx(a.wgrad.host_s)


def test_model_python_is_the_median_of_its_runs_and_megatron_core_carries_it():
    """Megatron-Core's GPTModel Python outside its layers (frameworks.json "mcore_model"):
    the medians of its three bench runs, charged by the frameworks built on Megatron-Core."""
    import csv as _csv
    rows: dict[str, list[float]] = {}
    with CSV.open() as fh:
        for r in _csv.DictReader(fh):
            if r["mechanism"] == "mcore_model":
                rows.setdefault(r["metric"], []).append(float(r["eager_ops"]))
    m = HOST.mechanisms["mcore_model"]
    fwd = rows["per model pass, fwd, outside the layers, glue"]
    bwd = rows["per model pass, bwd, outside the layers, glue"]
    assert len(fwd) == len(bwd) == 3
    assert m.model_fwd_eager_ops == pytest.approx(statistics.median(fwd), abs=0.01)
    assert m.model_bwd_eager_ops == pytest.approx(statistics.median(bwd), abs=0.01)
    for fw in ("megatron-core", "nemo"):
        assert "mcore_model" in HOST.framework(fw).mechanisms
