"""DeepSpeed's ZeRO engine hooks (frameworks.json "host" mechanisms
``deepspeed_zero1_grad_hooks``, ``deepspeed_zero2_grad_hooks``, ``deepspeed_zero3_hooks``):
the coefficients are the medians of their own CPU measurement (``calibrate.bench_deepspeed``,
hardware_db/data/measurements/host_mechanisms.csv) and their sources cite those rows; the
rows are their stated differences; each mechanism exists only at its ZeRO stage of the
``deepspeed`` framework (never under ``megatron-deepspeed``, whose BF16_Optimizer is its own
ZeRO-1); and a host-bound step grows by what they charge. Needs neither DeepSpeed nor torch.
"""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

import pytest

import hardware_db
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.frameworks import HOST
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.framework_plan import _applicable, with_framework
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "hardware_db" / "data" / "measurements" / "host_mechanisms.csv"
Z1, Z2, Z3 = "deepspeed_zero1_grad_hooks", "deepspeed_zero2_grad_hooks", "deepspeed_zero3_hooks"
PLAIN = "ZeRO-3 without memory_efficient_linear"
MODEL = TransformerSpec("ds-gpt", n_layers=4, hidden=256, ffn_hidden=1024, n_heads=4,
                        n_kv_heads=4, vocab=4000, seq_len=128)


def _rows(mechanism: str) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(CSV line, eager ops)] of ``mechanism``, in file order (the header is
    line 1)."""
    out: dict[str, list[tuple[int, float]]] = {}
    with CSV.open(newline="") as fh:
        for line, r in enumerate(csv.DictReader(fh), start=2):
            if r["mechanism"] == mechanism:
                out.setdefault(r["metric"], []).append((line, float(r["eager_ops"])))
    return out


# (mechanism, field, metric whose median it is)
CHARGED = [
    (Z1, "param_tensor_bwd_eager_ops", "ZeRO-1, per parameter tensor, bwd"),
    (Z1, "model_fwd_eager_ops", "ZeRO-1, per micro-batch, rest, fwd"),
    (Z1, "model_bwd_eager_ops", "ZeRO-1, per micro-batch, rest, bwd"),
    (Z1, "param_tensor_bwd_eager_ops_accumulating",
     "ZeRO-1 off the accumulation boundary, per parameter tensor, bwd"),
    (Z1, "model_bwd_eager_ops_accumulating",
     "ZeRO-1 off the accumulation boundary, per micro-batch, rest, bwd"),
    (Z2, "param_tensor_bwd_eager_ops", "ZeRO-2, per parameter tensor, bwd"),
    (Z2, "model_fwd_eager_ops", "ZeRO-2, per micro-batch, rest, fwd"),
    (Z2, "model_bwd_eager_ops", "ZeRO-2, per micro-batch, rest, bwd"),
    (Z3, "param_tensor_fwd_eager_ops", f"{PLAIN}, per parameter tensor, fwd"),
    (Z3, "param_tensor_bwd_eager_ops", f"{PLAIN}, per parameter tensor, bwd"),
    (Z3, "linear_call_fwd_eager_ops", "ZeRO-3, memory-efficient linear, per Linear call, fwd"),
    (Z3, "linear_call_bwd_eager_ops", "ZeRO-3, memory-efficient linear, per Linear call, bwd"),
    (Z3, "model_fwd_eager_ops", "ZeRO-3, per micro-batch, rest, fwd"),
    (Z3, "model_bwd_eager_ops", "ZeRO-3, per micro-batch, rest, bwd"),
    (Z3, "recompute_param_tensor_bwd_eager_ops", "deepspeed_zero3_recompute:ZeRO-3 under "
     "full recompute without memory_efficient_linear, per parameter tensor of a recomputed "
     "layer, beyond ZeRO-3 without recompute, bwd"),
    *((Z3, f"regather_param_tensor_{pas}_eager_ops", "deepspeed_zero3_regather:ZeRO-3 "
       "re-gathering in backward (max live parameters and reuse distance 0) without "
       "memory_efficient_linear, per parameter tensor, beyond ZeRO-3 keeping parameters "
       f"gathered to backward, {pas}") for pas in ("fwd", "bwd")),
]


@pytest.mark.parametrize("mechanism, field, metric", CHARGED)
def test_coefficients_are_the_medians_of_the_rows_their_source_cites(mechanism, field, metric):
    """Each coefficient is the median of its three runs' rows (rows measured under another
    mechanism name are given as ``<name>:<metric>``)."""
    rows_of, _, metric = metric.rpartition(":") if metric.startswith("deepspeed_") \
        else ("", "", metric)
    runs = _rows(rows_of or mechanism)[metric]
    assert len(runs) == 3, metric
    m = HOST.mechanisms[mechanism]
    assert getattr(m, field) == pytest.approx(statistics.median(v for _, v in runs), abs=0.01)
    lines = ", ".join(str(ln) for ln, _ in runs)
    assert f"lines {lines}" in m.why, (field, lines)
    assert "0.19.8" in m.why


def test_zero12_charge_nothing_per_tensor_forward():
    """ZeRO-1/2 hook gradients only: their forward per tensor is measured at ~0."""
    for mech, tag in ((Z1, "ZeRO-1"), (Z2, "ZeRO-2")):
        fwd = [v for _, v in _rows(mech)[f"{tag}, per parameter tensor, fwd"]]
        assert abs(statistics.median(fwd)) < 0.2
        m = HOST.mechanisms[mech]
        assert m.param_tensor_fwd_eager_ops == 0 and m.layer_fwd_eager_ops == 0


def test_rows_are_their_stated_differences():
    """Per run: the pooled per-tensor cost is the two block shapes' per-layer costs over
    their 6 + 9 tensors, the slope their difference over 3 tensors, the intercept what the
    6-tensor layer has beyond 6 slopes (rows rounded to 3 decimals)."""
    for mech, tags in ((Z1, ("ZeRO-1", "ZeRO-1 off the accumulation boundary")),
                       (Z2, ("ZeRO-2",)), (Z3, (PLAIN,))):
        rows = _rows(mech)
        for tag in tags:
            for pas in ("fwd", "bwd"):
                def col(name, t=tag, p=pas):
                    return [v for _, v in rows[f"{t}, {name}, {p}"]]
                for l6, l9, per, slope, icpt in zip(
                        col("per layer of 6 tensors"), col("per layer of 9 tensors"),
                        col("per parameter tensor"), col("per parameter tensor, 6 vs 9 slope"),
                        col("per layer beside its tensors")):
                    assert per == pytest.approx((l6 + l9) / 15, abs=0.01)
                    assert slope == pytest.approx((l9 - l6) / 3, abs=0.01)
                    assert icpt == pytest.approx(l6 - 6 * slope, abs=0.05)


def test_the_default_engines_layer_is_what_zero3_charges_it():
    """Check against the default ZeRO-3 engine's whole layer of 6 tensors and 4 Linear
    calls (memory-efficient linear on): the charge per tensor and per call adds up to it
    within the runs' spread (~15 %)."""
    m = HOST.mechanisms[Z3]
    rows = _rows(Z3)
    for pas, per, call in (("fwd", m.param_tensor_fwd_eager_ops, m.linear_call_fwd_eager_ops),
                           ("bwd", m.param_tensor_bwd_eager_ops, m.linear_call_bwd_eager_ops)):
        whole = statistics.median(v for _, v in rows[f"ZeRO-3, per layer of 6 tensors, {pas}"])
        assert 6 * per + 4 * call == pytest.approx(whole, rel=0.15)


def _plan(zero: int, **kw) -> Plan:
    return Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16", zero_stage=zero, **kw)


def test_each_mechanism_exists_only_at_its_zero_stage():
    assert HOST.mechanisms[Z1].zero_stages == (1,)
    assert HOST.mechanisms[Z2].zero_stages == (2,)
    assert HOST.mechanisms[Z3].zero_stages == (3,)
    opt, timer = "deepspeed_zero_optimizer", "deepspeed_throughput_timer"   # stop 39
    want = {0: (), 1: (Z1, opt), 2: (Z2, opt), 3: (Z3,)}
    for zero, mech in want.items():
        got = with_framework(_plan(zero), "deepspeed", {"zero_stage"}).host_mechanisms
        assert got == ("hf_decoder_layer",) + mech + (timer,), zero
    # DeepSpeed's default stage is 0: no ZeRO hooks unless the run states a stage
    assert with_framework(_plan(3), "deepspeed").host_mechanisms == ("hf_decoder_layer", timer)
    # BLOOM's Megatron-DeepSpeed: BF16_Optimizer (its own ZeRO-1), never the engine's hooks
    for zero in (0, 1, 2, 3):
        got = with_framework(_plan(zero), "megatron-deepspeed", {"zero_stage"}).host_mechanisms
        assert not {Z1, Z2, Z3} & set(got), zero
    # mechanisms without zero_stages are untouched by the filter
    assert _applicable(("hf_decoder_layer", Z1, Z3), 1, 8) == ("hf_decoder_layer", Z1)


def _chunk_pair(mech: str, zero: int, op_us: float = 10.0, **kw):
    """The only chunk of MODEL on 2 H100 at ZeRO ``zero``, without and with ``mech``, with
    DeepSpeed's reuse window (MODEL fits it: every layer stays gathered into backward)."""
    c = Coefficient(op_us, "us", "test")
    prof = dataclasses.replace(hardware_db.load_profile("h100-sxm"), host=HostModel(c, c))
    cl = hardware_db.build_cluster("h100-sxm", 2)
    plain = Plan(dp=2, micro_batch=1, global_batch=2, zero_stage=zero, **kw)
    plain = dataclasses.replace(plain, memory=dataclasses.replace(
        plain.memory, zero3_reuse_window_params=1e9))
    return tuple(build_chunks(MODEL, p, cl, prof, place_groups(cl, p))[0][0]
                 for p in (plain, dataclasses.replace(plain, host_mechanisms=(mech,))))


@pytest.mark.parametrize("mech, zero", [(Z1, 1), (Z2, 2), (Z3, 3)])
def test_charged_per_tensor_per_linear_call_and_per_micro_batch(mech, zero):
    """Per chunk pass: every parameter tensor (4 layers x (4 Linear weights and biases + 2
    LayerNorm weights and biases) + embedding, final norm's weight and bias, output = 52;
    ZeRO-3's hooks are per module, its weights: 4 x 6 + 3 = 27), every layer-module Linear
    call (4 x 4 = 16; the output layer's is in the per-micro-batch constant), and the
    constant once, at 10 us per eager op."""
    m = HOST.mechanisms[mech]
    a, b = _chunk_pair(mech, zero)
    tensors, calls = (4 * 6 + 3 if m.hooks_per_module else 4 * 12 + 4), 4 * 4
    assert m.hooks_per_module == (mech == Z3)
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(
        (tensors * m.param_tensor_fwd_eager_ops + calls * m.linear_call_fwd_eager_ops
         + m.model_fwd_eager_ops) * 10e-6)
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(
        (tensors * m.param_tensor_bwd_eager_ops + calls * m.linear_call_bwd_eager_ops
         + m.model_bwd_eager_ops) * 10e-6)


def test_zero3_linear_calls_and_module_hooks_again_under_full_recompute():
    """Full recompute re-runs each layer's forward in backward: its Linear calls go through
    the memory-efficient linear again and its submodules' hooks fire again, per parameter
    tensor of the recomputed layers (not the embedding's or the head's), measured as
    deepspeed_zero3_recompute's rows; the forward pays nothing more."""
    m = HOST.mechanisms[Z3]
    assert m.recompute_param_tensor_bwd_eager_ops > 0
    a, b = _chunk_pair(Z3, 3, recompute="full")
    layer_tensors, tensors, calls = 4 * 6, 4 * 6 + 3, 4 * 4        # modules: weights
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(
        (tensors * m.param_tensor_bwd_eager_ops
         + layer_tensors * m.recompute_param_tensor_bwd_eager_ops
         + calls * (m.linear_call_bwd_eager_ops + m.linear_call_fwd_eager_ops)
         + m.model_bwd_eager_ops) * 10e-6)
    c, d = _chunk_pair(Z3, 3)
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(d.fwd.host_s - c.fwd.host_s)


def test_a_host_bound_zero3_step_grows_by_the_measured_host_work():
    """``--framework deepspeed --zero-stage 3`` on a small model with a slow host (host
    bound: the device waits for every op): the step grows by what the ZeRO-3 hooks charge
    per micro-batch, forward and backward, times the micro-batches (within 5 %)."""
    cl = hardware_db.build_cluster("h100-sxm", 2)
    c = Coefficient(200.0, "us", "test")
    prof = dataclasses.replace(hardware_db.load_profile("h100-sxm"), host=HostModel(c, c))
    plan = with_framework(Plan(dp=2, micro_batch=1, global_batch=8, precision="bf16",
                               zero_stage=3), "deepspeed", {"zero_stage"})
    assert plan.host_mechanisms == ("hf_decoder_layer", Z3, "deepspeed_throughput_timer")
    without = dataclasses.replace(plan, host_mechanisms=("hf_decoder_layer",
                                                         "deepspeed_throughput_timer"))
    r_with, r_without = simulate(MODEL, plan, cl, prof), simulate(MODEL, without, cl, prof)
    assert r_with.breakdown.host_s > 0
    m = HOST.mechanisms[Z3]
    # the deepspeed framework runs the model's transformers code, here not known: assumed
    # Llama's layout, one Linear each for q, k and v, the output projection, fc1, fc2 and two
    # LayerNorms: 8 modules, whose weights ZeRO-3's hooks count; embedding, final norm, output
    tensors, calls = 4 * 8 + 3, 4 * 6
    per_mb = (tensors * (m.param_tensor_fwd_eager_ops + m.param_tensor_bwd_eager_ops)
              + calls * (m.linear_call_fwd_eager_ops + m.linear_call_bwd_eager_ops)
              + m.model_fwd_eager_ops + m.model_bwd_eager_ops) * 200e-6
    passes = plan.global_batch // (plan.dp * plan.micro_batch)
    grown = r_with.step_time_s - r_without.step_time_s
    assert grown == pytest.approx(passes * per_mb, rel=0.05)


def test_zero1_pays_the_boundary_once_per_step():
    """ZeRO-1 reduces only at the accumulation boundary: over n micro-batches a backward
    pays the off-boundary hooks plus 1/n of the boundary's excess, per tensor and per
    micro-batch; a single micro-batch pays the boundary's."""
    from simulator.cost.host import mechanisms_host, model_host
    prof = hardware_db.load_profile("h100-sxm")
    m, us = HOST.mechanisms[Z1], prof.host.op_fwd_us.value * 1e-6
    for n in (1, 4):
        _, b = mechanisms_host((Z1,), 0, 100, prof, boundary_share=1 / n)
        _, mb = model_host((Z1,), prof, "eager", True, True, boundary_share=1 / n)
        per = m.param_tensor_bwd_eager_ops_accumulating + (
            m.param_tensor_bwd_eager_ops - m.param_tensor_bwd_eager_ops_accumulating) / n
        const = m.model_bwd_eager_ops_accumulating + (
            m.model_bwd_eager_ops - m.model_bwd_eager_ops_accumulating) / n
        assert b.seconds == pytest.approx(100 * per * us, rel=1e-6)
        assert mb.seconds == pytest.approx(const * us, rel=1e-6)


def test_zero3_layers_outside_the_reuse_window_pay_the_release_and_second_fetch():
    """Llama-2 7B keeps only its last 2 of 32 layers gathered into backward: the other 30
    layers' modules pay the measured release (forward) and second fetch (backward)."""
    from simulator.cost.host import ParamLayout, param_tensors
    from simulator.workload.ops import layer_ops
    from simulator.engine.stage_work import layer_shape
    from simulator.workload.presets import get_preset
    m = get_preset("llama2-7b")
    cl = hardware_db.build_cluster("h100-sxm", 8)
    c = Coefficient(10.0, "us", "test")
    prof = dataclasses.replace(hardware_db.load_profile("h100-sxm"), host=HostModel(c, c))
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16",
                               zero_stage=3), "deepspeed", {"zero_stage"})
    far = dataclasses.replace(plan, memory=dataclasses.replace(
        plan.memory, zero3_reuse_window_params=0.0))
    a, b = (build_chunks(m, p, cl, prof, place_groups(cl, p))[0][0] for p in (plan, far))
    mech = HOST.mechanisms[Z3]
    lay = ParamLayout.of(m, plan.memory.param_layout).weights_only()
    modules = param_tensors(layer_ops(m, layer_shape(m, plan)), lay)     # 9 per layer
    assert modules == 9
    # the window keeps 2 layers: b re-gathers 2 layers' modules more than a
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(
        2 * modules * mech.regather_param_tensor_fwd_eager_ops * 10e-6)
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(
        2 * modules * mech.regather_param_tensor_bwd_eager_ops * 10e-6)

