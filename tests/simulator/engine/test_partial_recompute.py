"""Full recompute of only the first N layers of each model chunk (``Plan.recompute_layers``:
Megatron's --recompute-method block --recompute-num-layers N; torchtitan's every-k-th layer
and fms-fsdp's share of layers are the same count): each recomputed layer keeps only its
input and re-runs its forward, the others keep everything and re-run nothing."""
from __future__ import annotations

import dataclasses

import pytest

import hardware_db
from simulator.cli.main import main as cli_main
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import layer_shape
from simulator.errors import InvalidInputError
from simulator.memory.chunk import chunk_memory, layer_memory
from simulator.parallel.plan import Plan, Recompute
from simulator.planning.launch_args import megatron_args
from simulator.planning.launch_frameworks import torchtitan_toml
from simulator.workload.presets import get_preset

MODEL = get_preset("llama2-7b")                  # 32 layers
CLUSTER = hardware_db.build_cluster("a100-sxm-80gb", 8)
PROF = hardware_db.load_profile("a100-sxm-80gb")


def _plan(recompute: str = "full", n: int = 0, **kw) -> Plan:
    return Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16", recompute=recompute,
                recompute_layers=n, **kw)


def test_the_count_is_checked_and_names_its_field():
    for bad, rc in ((-1, "full"), (4, "selective"), (4, "none")):
        with pytest.raises(InvalidInputError, match="recompute_layers"):
            _plan(rc, bad)
    p = _plan("full", 4)
    assert [p.recompute_of(i) for i in (0, 3, 4, 31)] == [Recompute.FULL] * 2 + [Recompute.NONE] * 2
    assert _plan("full").recompute_of(31) == Recompute.FULL


def test_activations_are_the_two_kinds_of_layer_summed():
    """A chunk of 32 layers with 12 recomputed keeps 12 layers' inputs and 20 layers' full
    activations (a dense model: one layer kind)."""
    plan = _plan("full", 12)
    sh = layer_shape(MODEL, plan)
    layers = list(range(MODEL.n_layers))
    kind = MODEL.layer_kind(0)
    full = layer_memory(MODEL, sh, Recompute.FULL, kind)[0]
    none = layer_memory(MODEL, sh, Recompute.NONE, kind)[0]
    edge = chunk_memory(MODEL, _plan("none"), sh, layers, True, True).act_bytes - 32 * none
    got = chunk_memory(MODEL, plan, sh, layers, True, True).act_bytes
    assert got == pytest.approx(12 * full + 20 * none + edge)
    assert full < none


def test_each_recomputed_layer_runs_its_forward_again():
    """Hardware FLOPs grow by one layer forward per recomputed layer (no framework: the
    whole forward re-runs); N = all layers is full recompute; memory falls and time grows
    with N."""
    def run(p):
        r = simulate(MODEL, p, CLUSTER, PROF)
        return r, r.hardware_tflops_per_gpu * 1e12 * r.step_time_s

    base, f0 = run(_plan("none"))
    all_, f32 = run(_plan("full"))
    per_layer = (f32 - f0) / MODEL.n_layers
    last_t, last_mem = base.step_time_s, max(base.peak_memory_bytes)
    for n in (4, 16, 31):
        r, f = run(_plan("full", n))
        assert f - f0 == pytest.approx(n * per_layer, rel=1e-9)
        assert r.step_time_s >= last_t and max(r.peak_memory_bytes) <= last_mem
        last_t, last_mem = r.step_time_s, max(r.peak_memory_bytes)
    r32, _ = run(_plan("full", 32))
    assert r32.step_time_s == pytest.approx(all_.step_time_s)
    assert max(r32.peak_memory_bytes) == pytest.approx(max(all_.peak_memory_bytes))


def test_pipeline_chunks_each_recompute_their_first_layers():
    """With 4 pipeline stages of 8 layers, 2 recomputed layers per chunk: 8 in all."""
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    flops = {}
    for n in (0, 2):
        p = dataclasses.replace(_plan("full" if n else "none", n), pp=4, dp=2, global_batch=8)
        r = simulate(MODEL, p, cl, PROF)
        flops[n] = r.hardware_tflops_per_gpu * 1e12 * r.step_time_s * 8
    full = simulate(MODEL, dataclasses.replace(_plan("full"), pp=4, dp=2, global_batch=8), cl,
                    PROF)
    per_layer = (full.hardware_tflops_per_gpu * 1e12 * full.step_time_s * 8 - flops[0]) / 32
    assert flops[2] - flops[0] == pytest.approx(8 * per_layer, rel=1e-9)


def test_cli_and_launch_arguments(capsys):
    rc = cli_main(["simulate", "--model", "llama2-7b", "--gpu", "a100-sxm-80gb", "--gpus", "8",
                   "--global-batch", "8", "--recompute", "full", "--recompute-layers", "8",
                   "--no-interval"])
    assert rc == 0 and "recompute=full:8" in capsys.readouterr().out
    assert cli_main(["simulate", "--model", "llama2-7b", "--gpu", "a100-sxm-80gb", "--gpus",
                     "8", "--global-batch", "8", "--recompute-layers", "8", "--no-interval"]) != 0
    assert "recompute_layers" in capsys.readouterr().err
    args = " ".join(megatron_args(MODEL, _plan("full", 8)))
    assert "--recompute-method block --recompute-num-layers 8" in args
    toml = torchtitan_toml(MODEL, _plan("full", 8))
    assert 'mode = "selective"' in toml and 'selective_ac_option = "4"' in toml
    assert 'mode = "full"' in torchtitan_toml(MODEL, _plan("full", 12))


def test_remedies_and_variants_of_a_partial_plan():
    """Memory remedies offer every layer recomputed; what-if variants that change the
    recompute mode drop the layer count instead of failing on it."""
    from simulator.engine.memory_fit import _candidates
    from simulator.planning.whatif import _plan_variants
    p = _plan("full", 8)
    remedies = dict(_candidates(p))
    assert remedies["recompute=full (every layer)"].recompute_layers == 0
    variants = {how: v for what, how, v in _plan_variants(p, CLUSTER) if what == "recompute"}
    assert set(variants) == {"full:8 -> none", "full:8 -> selective", "full:8 -> full"}
    assert all(v.recompute_layers == 0 for v in variants.values())


def test_search_finds_the_fewest_recomputed_layers_that_fit():
    """``fewest_recomputed``: the smallest count that fits, one fewer does not; the search
    with ``partial_recompute`` ranks it where full recompute was the cheapest fit."""
    from simulator.search.space import fewest_recomputed, peak_memory_bytes
    m = get_preset("llama2-13b")
    p = dataclasses.replace(_plan("full"), micro_batch=2, global_batch=16, zero_stage=3)
    full_peak = peak_memory_bytes(m, p)
    none_peak = peak_memory_bytes(m, dataclasses.replace(p, recompute="none"))
    cap = (full_peak + none_peak) / 2
    got = fewest_recomputed(m, p, cap)
    assert got is not None and 1 < got.recompute_layers < m.n_layers
    assert peak_memory_bytes(m, got) <= cap
    assert peak_memory_bytes(m, dataclasses.replace(got, recompute_layers=got.recompute_layers
                                                    - 1)) > cap
    assert fewest_recomputed(m, p, full_peak) is None       # only every layer fits


def test_the_python_api_and_the_fsdp_sketch_keep_the_count():
    from simulator.api.config import TrainingConfig
    from simulator.api.transformer_flow import config_of, plan_of
    from simulator.planning.whatif import recomputed_share
    from simulator.planning.launch_frameworks import fsdp_sketch
    p = _plan("full", 8)
    cfg = config_of(p, TrainingConfig(gpu="a100-sxm-80gb", n_gpus=8),
                    "a100-sxm-80gb", 8)
    assert cfg.recompute_layers == 8 and plan_of(cfg).recompute_layers == 8
    assert recomputed_share(MODEL, p) == pytest.approx(8 / 32)
    assert recomputed_share(MODEL, dataclasses.replace(p, pp=4, dp=2)) == 1.0   # 8 per chunk
    sketch = fsdp_sketch(MODEL, dataclasses.replace(p, zero_stage=3))
    assert "if i < 8:" in sketch


def test_the_trace_comparison_ops_follow_each_layers_recompute():
    """``calibrate.sim_ops.step_ops`` (what a profiler trace is compared with): backward
    GEMM FLOPs grow by N layers' forward GEMMs, not by all of them."""
    from calibrate.sim_ops import step_ops

    def bwd_gemm(p):
        return sum(s.op.flops * s.count for s in step_ops(MODEL, p)
                   if s.phase == "bwd" and s.family == "gemm")
    none, full, part = bwd_gemm(_plan("none")), bwd_gemm(_plan("full")), bwd_gemm(_plan("full", 4))
    assert full > none > 0
    assert part - none == pytest.approx((full - none) * 4 / 32)


def test_the_bottleneck_report_weighs_recompute_rows_by_the_recomputed_share():
    from simulator.planning.whatif import bottleneck_report
    t = {}
    for name, p in (("none", _plan("none")), ("part", _plan("full", 8)), ("full", _plan("full"))):
        r = bottleneck_report(MODEL, p, CLUSTER, PROF)
        t[name] = r.compute_bound_s + r.memory_bound_s
    assert t["part"] - t["none"] == pytest.approx((t["full"] - t["none"]) * 8 / 32)
    assert t["full"] > t["none"]
