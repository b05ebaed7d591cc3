"""HF Trainer's own loop (``hf_trainer_loop``, measured by ``calibrate.bench_hf_trainer``):
the coefficients are the cited rows' medians; the per-micro-batch work the Trainer does before
a forward's first op (``mb_lead_*``) holds the device back, after the loss check's wait, by
that work; the per-step work goes with the optimizer."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

import hardware_db
from simulator.cost.host import loop_lead_host, optimizer_host, pass_first_share
from simulator.engine.simulate import simulate
from simulator.frameworks import HOST
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.spec import TransformerSpec

T = HOST.mechanisms["hf_trainer_loop"]
TOTAL_FIXED, TOTAL_LAYER = (885, 899, 913), (886, 900, 914)
BWD_FIXED, BWD_LAYER = (879, 893, 907), (880, 894, 908)


def _eo(rows, lines):
    for ln in lines:
        assert rows[ln]["mechanism"] == "hf_trainer_loop", ln
    return [float(rows[ln]["eager_ops"]) for ln in lines]


def test_coefficients_are_the_medians_of_the_cited_rows(host_mechanism_rows):
    rows = host_mechanism_rows
    lead = [t - b for t, b in zip(_eo(rows, TOTAL_FIXED), _eo(rows, BWD_FIXED))]
    per_layer = [t - b for t, b in zip(_eo(rows, TOTAL_LAYER), _eo(rows, BWD_LAYER))]
    assert T.mb_lead_fwd_eager_ops == pytest.approx(statistics.median(lead), abs=0.002)
    assert T.mb_lead_layer_fwd_eager_ops == pytest.approx(statistics.median(per_layer),
                                                          abs=0.002)
    assert T.model_bwd_eager_ops == pytest.approx(statistics.median(_eo(rows, BWD_FIXED)))
    assert T.optimizer_fixed_eager_ops == pytest.approx(
        statistics.median(_eo(rows, (887, 901, 915))))
    # the per-layer step row over the bench layer's 9 parameter tensors
    assert T.optimizer_tensor_eager_ops == pytest.approx(
        statistics.median(_eo(rows, (888, 902, 916))) / 9, abs=0.001)
    for ln in TOTAL_FIXED + TOTAL_LAYER:
        assert "total" in rows[ln]["metric"]


def test_first_share_counts_the_lead_before_the_first_op():
    assert pass_first_share(10.0, 5.0) == pytest.approx(0.2)
    assert pass_first_share(10.0, 5.0, 4.0) == pytest.approx((4.0 + 6.0 / 5) / 10.0)
    assert pass_first_share(10.0, 5.0, 20.0) == 1.0
    assert pass_first_share(0.0, 5.0) == pytest.approx(0.2)


def _step(lead: bool, monkeypatch, m: int = 4):
    """A device-bound HF plan (host 0.5 us per op) with the Trainer's loop, its per-micro-batch
    lead on or off."""
    mech = T if lead else dataclasses.replace(T, mb_lead_fwd_eager_ops=0.0,
                                              mb_lead_layer_fwd_eager_ops=0.0)
    monkeypatch.setitem(HOST.mechanisms, "hf_trainer_loop", mech)
    model = TransformerSpec("hf-lead", n_layers=4, hidden=2048, ffn_hidden=8192, n_heads=16,
                            n_kv_heads=16, vocab=32000, seq_len=2048, norm="rmsnorm",
                            position="rope")
    prof = dataclasses.replace(hardware_db.load_profile("h100-sxm"), host=HostModel(
        Coefficient(0.5, "us", "t"), Coefficient(0.5, "us", "t"), False))
    plan = with_framework(Plan(micro_batch=2, global_batch=2 * m, precision="bf16"), "hf")
    return simulate(model, plan, hardware_db.build_cluster("h100-sxm", 1), prof), model, prof


def test_the_device_waits_for_the_loops_work_after_each_loss_check(monkeypatch):
    """Device-bound passes: without the lead the device loses about one op's issue after
    each wait; with it, each micro-batch's forward also waits for the loop's work, so the
    step grows by about the micro-batches times that work (the loop's host time itself
    would hide behind the device without the wait)."""
    m = 4
    off, model, prof = _step(False, monkeypatch, m)
    on, _, _ = _step(True, monkeypatch, m)
    per_mb = loop_lead_host(("hf_trainer_loop",), prof, model.n_layers).seconds
    assert per_mb > 0
    grown = on.step_time_s - off.step_time_s
    assert grown == pytest.approx(m * per_mb, rel=0.1)


def test_per_step_work_goes_with_the_optimizer():
    prof = hardware_db.load_profile("h100-sxm")
    base, _ = optimizer_host(("optimizer_fused",), 100, 0, prof)
    both, _ = optimizer_host(("optimizer_fused", "hf_trainer_loop"), 100, 0, prof)
    us = prof.host.op_fwd_us.value * 1e-6
    assert both.seconds - base.seconds == pytest.approx(
        (T.optimizer_fixed_eager_ops + 100 * T.optimizer_tensor_eager_ops) * us)
