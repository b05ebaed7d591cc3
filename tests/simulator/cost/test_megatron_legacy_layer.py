"""Megatron-LM's legacy layer Python (frameworks.json "megatron_legacy_layer"): the numbers
are the medians of their own CPU measurement (calibrate.bench_megatron_legacy), each glue
row is the whole layer minus the op graph's ops at the same run's probe cost, the
full-recompute wrapper is the recomputed layer's backward minus the plain one and the
re-run forward's ops and glue, and they are charged per layer forward (again under full
recompute, scaled by the launch mode), per layer backward and per recomputed layer."""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

import pytest

import hardware_db
from calibrate.bench_framework import legacy_graph_ops
from calibrate.bench_megatron_legacy import available
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.frameworks import HOST
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.plan import Plan
from simulator.workload.presets import get_preset

ROOT = Path(__file__).resolve().parents[3]
MODEL = get_preset("tiny-2l-128")
BASE = hardware_db.load_profile("a100-sxm-80gb")
LEGACY = HOST.mechanisms["megatron_legacy_layer"]
CSV = Path(__file__).resolve().parents[3] / "hardware_db" / "data" / "measurements" \
    / "host_mechanisms.csv"


def test_the_bench_layer_in_op_graph_ops():
    """Megatron-LM's GPT layer as the op graph has it: materialized attention (qk, softmax,
    dropout, av) and the two residual dropouts: 13 forward ops, 19 backward; outside the
    layers (embedding, final norm, output layer, Megatron's cross-entropy) 11 / 12."""
    assert legacy_graph_ops(32, 32) == (13, 19)
    assert legacy_graph_ops(32, 32, outside=True) == (11, 12)


def test_glue_rows_are_the_layer_beyond_its_ops_and_the_mechanism_their_median(mechanism_runs):
    runs = mechanism_runs("megatron_legacy_layer")
    assert len(runs) == 3
    for r in runs:
        whole, glue = r["per layer, fwd (whole layer)"], r["per layer, fwd, glue"]
        op = whole[2]
        assert glue[1] == pytest.approx(whole[1] - 13 * op, abs=0.1)   # op is rounded
        assert glue[0] == pytest.approx(glue[1] / op, rel=1e-3)      # op is rounded
        # the backward glue subtracts 19 ops at the probe's backward cost: a bit more
        # than the forward cost, so less than 19 forward ops
        bw, bg = r["per layer, bwd (whole layer)"], r["per layer, bwd, glue"]
        assert bw[1] - bg[1] > 19 * op
        # the wrapper: recomputed backward - plain backward - (13 ops + glue) forward
        rc, wrap = r["per layer, bwd under full recompute (whole layer)"], \
            r["full-recompute wrapper, bwd"]
        assert wrap[1] == pytest.approx(rc[1] - bw[1] - 13 * op - glue[1], abs=0.2)
    med = {k: statistics.median(r[k][0] for r in runs)
           for k in ("per layer, fwd, glue", "per layer, bwd, glue",
                     "full-recompute wrapper, bwd")}
    assert LEGACY.layer_module_fwd_eager_ops == pytest.approx(med["per layer, fwd, glue"],
                                                              abs=0.01)
    assert LEGACY.layer_bwd_eager_ops == pytest.approx(med["per layer, bwd, glue"], abs=0.01)
    assert LEGACY.recompute_layer_bwd_eager_ops == pytest.approx(
        med["full-recompute wrapper, bwd"], abs=0.01)
    # the model's Python: its whole (the 1-layer model minus its layer and outside ops) is
    # split into the batch code (every stage), the embedding's (first) and the rest (last)
    split: dict[str, list[float]] = {}
    with CSV.open() as fh:
        for r in csv.DictReader(fh):
            if r["mechanism"] == "megatron_legacy_model_split":
                split.setdefault(r["metric"], []).append(float(r["eager_ops"]))
    every = statistics.median(split["per micro-batch, batch code (every stage), fwd"])
    first_f = statistics.median(split["per micro-batch, embedding (first stage), fwd, glue"])
    first_b = statistics.median(split["per micro-batch, embedding (first stage), bwd, glue"])
    assert (LEGACY.model_every_fwd_eager_ops, LEGACY.model_first_fwd_eager_ops,
            LEGACY.model_first_bwd_eager_ops) == pytest.approx((every, first_f, first_b), abs=0.01)
    whole_f = statistics.median(r["per model pass, fwd, outside the layers, glue"][0] for r in runs)
    whole_b = statistics.median(r["per model pass, bwd, outside the layers, glue"][0] for r in runs)
    assert LEGACY.model_fwd_eager_ops + every + first_f == pytest.approx(whole_f, abs=0.02)
    assert LEGACY.model_bwd_eager_ops + first_b == pytest.approx(whole_b, abs=0.02)
    # a legacy layer costs several times the op graph's 13 + 19 ops on the host
    assert LEGACY.layer_module_fwd_eager_ops > 13 and LEGACY.layer_bwd_eager_ops > 10


def _chunk(mech, mode="eager", recompute="none"):
    # backward ops cost more than forward ones: mechanisms are priced at the forward cost
    prof = dataclasses.replace(BASE, host=HostModel(Coefficient(10.0, "us", "test"),
                                                    Coefficient(12.0, "us", "test")))
    cl = hardware_db.build_cluster("a100-sxm-80gb", 2)
    plan = Plan(dp=2, micro_batch=1, global_batch=2, host_mechanisms=mech, host_mode=mode,
                recompute=recompute)
    return build_chunks(MODEL, plan, cl, prof, place_groups(cl, plan))[0][0]


@pytest.mark.parametrize("mode", ["eager", "compiled", "cuda_graphs"])
def test_charged_per_layer_forward_and_backward(mode):
    a, b = _chunk((), mode), _chunk(("megatron_legacy_layer",), mode)
    layers = len(b.layers)
    scale = HOST.modes[mode].op_scale
    fwd = LEGACY.layer_module_fwd_eager_ops * 10e-6 * scale
    bwd = LEGACY.layer_bwd_eager_ops * 10e-6
    # the chunk holds the output layer: the model's own Python once per pass (outside the
    # layers: eager also under per-layer CUDA graphs)
    outside = 1.0 if HOST.modes[mode].graph_launch_us > 0 else scale
    model_f = (LEGACY.model_fwd_eager_ops + LEGACY.model_first_fwd_eager_ops
               + LEGACY.model_every_fwd_eager_ops) * 10e-6 * outside
    model_b = (LEGACY.model_bwd_eager_ops + LEGACY.model_first_bwd_eager_ops) * 10e-6 * outside
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(layers * fwd + model_f)
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(layers * bwd + model_b)
    a, b = _chunk((), mode, "full"), _chunk(("megatron_legacy_layer",), mode, "full")
    wrapper = LEGACY.recompute_layer_bwd_eager_ops * 10e-6 * scale
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(layers * (fwd + bwd + wrapper) + model_b)
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(layers * fwd + model_f)


def test_the_bench_says_why_it_skips(monkeypatch, tmp_path):
    monkeypatch.delenv("MEGATRON_LM_PATH", raising=False)
    assert "MEGATRON_LM_PATH is not set" in available()
    monkeypatch.setenv("MEGATRON_LM_PATH", str(tmp_path))
    assert "no megatron/model/transformer.py" in available()


def test_model_python_split_over_pipeline_stages():
    """Under pipeline parallelism the batch code runs on every stage, the embedding's Python
    on the first, the head's and loss's on the last; a middle stage pays the batch code only."""
    c = Coefficient(10.0, "us", "test")
    prof = dataclasses.replace(BASE, host=HostModel(c, c))
    cl = hardware_db.build_cluster("a100-sxm-80gb", 3)
    model = get_preset("small-6l-512")
    got = {}
    for mech in ((), ("megatron_legacy_layer",)):
        plan = Plan(pp=3, micro_batch=1, global_batch=6, host_mechanisms=mech)
        got[mech] = [st[0] for st in build_chunks(model, plan, cl, prof, place_groups(cl, plan))]
    a, b = got[()], got[("megatron_legacy_layer",)]
    glue = [len(ch.layers) * LEGACY.layer_module_fwd_eager_ops for ch in b]
    extra = [(y.fwd.host_s - x.fwd.host_s) / 10e-6 - g for x, y, g in zip(a, b, glue)]
    every = LEGACY.model_every_fwd_eager_ops
    assert extra == pytest.approx([every + LEGACY.model_first_fwd_eager_ops, every,
                                   every + LEGACY.model_fwd_eager_ops])
