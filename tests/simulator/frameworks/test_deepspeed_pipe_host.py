"""DeepSpeed's pipeline engine's host work (frameworks.json "host" mechanism
``deepspeed_pipe_engine``, measured by ``calibrate.bench_deepspeed_pipe``): each coefficient
is the median of the clean runs' CSV rows its source cites, the mechanism exists only under
pipeline parallelism in the frameworks that run DeepSpeed's engine, and a chunk pays the
first or the last stage's instructions per micro-batch (more with partitioned TP hand-offs),
half in each pass, and the per-step instructions with its optimizer step."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

import hardware_db
from simulator.cost.host import model_host, optimizer_host
from simulator.frameworks import HOST
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan

M = HOST.mechanisms["deepspeed_pipe_engine"]
FIELDS = {"pipe_first_mb_eager_ops": [551, 589, 665, 703, 779],
          "pipe_last_mb_eager_ops": [563, 601, 677, 715, 791],
          "pipe_tp_first_mb_eager_ops": [575, 613, 689, 727, 803],
          "pipe_tp_last_mb_eager_ops": [582, 620, 696, 734, 810],
          "optimizer_fixed_eager_ops": [818, 820, 822, 824, 826, 828],
          "optimizer_tensor_eager_ops": [817, 819, 821, 823, 825, 827]}
METRIC = {"pipe_first_mb_eager_ops": "per micro-batch, first stage",
          "pipe_last_mb_eager_ops": "per micro-batch, last stage",
          "pipe_tp_first_mb_eager_ops": "per micro-batch, first stage, beyond unpartitioned",
          "pipe_tp_last_mb_eager_ops": "per micro-batch, last stage, beyond unpartitioned",
          "optimizer_fixed_eager_ops": "per step, rest, fixed",
          "optimizer_tensor_eager_ops": "per step, rest, per parameter tensor"}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_coefficients_are_the_medians_of_the_cited_rows(field, host_mechanism_rows):
    rows, lines = host_mechanism_rows, FIELDS[field]
    for ln in lines:
        r = rows[ln]
        assert r["mechanism"] == "deepspeed_pipe_engine" and METRIC[field] in r["metric"], ln
        assert "SUSPECT" not in r["metric"] + r["method"], ln
    med = statistics.median(float(rows[ln]["eager_ops"]) for ln in lines)
    assert getattr(M, field) == pytest.approx(med, abs=0.001)
    cited = ", ".join(map(str, lines))
    assert cited in M.why


def test_only_under_pipeline_parallelism_in_deepspeeds_frameworks():
    for fw in ("deepspeed", "megatron-deepspeed"):
        one = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"), fw)
        two = with_framework(Plan(pp=2, dp=4, micro_batch=1, global_batch=8,
                                  precision="bf16"), fw)
        assert "deepspeed_pipe_engine" not in one.host_mechanisms, fw
        assert "deepspeed_pipe_engine" in two.host_mechanisms, fw
    mc = with_framework(Plan(pp=2, dp=4, micro_batch=1, global_batch=8, precision="bf16"),
                        "megatron-core")
    assert "deepspeed_pipe_engine" not in mc.host_mechanisms
    # DeepSpeed's engine runs only plain 1F1B: other schedules are priced as Megatron's
    for kw in ({"vpp": 2, "schedule": "interleaved"}, {"schedule": "zb-v"}):
        other = with_framework(Plan(pp=2, dp=4, micro_batch=1, global_batch=8,
                                    precision="bf16", **kw), "deepspeed")
        assert "deepspeed_pipe_engine" not in other.host_mechanisms, kw


def test_a_stage_pays_its_instructions_half_in_each_pass():
    """First, middle and last stages pay their own instructions, half in each pass; with TP
    the partitioned hand-offs' extra by its measured forward share; per step, the rest."""
    prof = hardware_db.load_profile("a100-sxm-80gb")
    us = prof.host.op_fwd_us.value * 1e-6
    names = ("deepspeed_pipe_engine",)
    stages = ((True, False, M.pipe_first_mb_eager_ops, M.pipe_tp_first_mb_eager_ops, 0),
              (False, False, M.pipe_middle_mb_eager_ops, M.pipe_tp_middle_mb_eager_ops, 1),
              (False, True, M.pipe_last_mb_eager_ops, M.pipe_tp_last_mb_eager_ops, 2))
    for first, last, ops, extra, k in stages:
        f, b = model_host(names, prof, "eager", first, last, 1.0, 1)
        assert f.seconds == pytest.approx(ops / 2 * us) == b.seconds
        f2, b2 = model_host(names, prof, "eager", first, last, 1.0, 4)
        share = M.pipe_tp_fwd_share[k]
        assert f2.seconds == pytest.approx((ops / 2 + extra * share) * us)
        assert b2.seconds == pytest.approx((ops / 2 + extra * (1 - share)) * us)
    # the middle stage: the first's instructions, its batch load traded for the last
    # stage's receive and gradient send; with TP both partitionings
    assert M.pipe_first_mb_eager_ops < M.pipe_middle_mb_eager_ops
    assert M.pipe_tp_middle_mb_eager_ops == pytest.approx(M.pipe_tp_first_mb_eager_ops
                                                          + M.pipe_tp_last_mb_eager_ops)
    assert M.pipe_tp_fwd_share[0] < 0.5 < M.pipe_tp_fwd_share[2]   # rebuilds in B / F
    h, sync = optimizer_host(names, 100, 10, prof)
    assert h.seconds == pytest.approx((M.optimizer_fixed_eager_ops
                                       + 100 * M.optimizer_tensor_eager_ops) * us)
    assert not sync


def test_a_small_pipelined_step_grows_by_it():
    from simulator.engine.simulate import simulate
    from simulator.workload import get_preset
    m = get_preset("gpt2-124m")
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    plan = with_framework(Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16,
                               precision="bf16"), "deepspeed")
    bare = dataclasses.replace(plan, host_mechanisms=tuple(
        n for n in plan.host_mechanisms if n != "deepspeed_pipe_engine"))
    assert simulate(m, plan, cl, prof).step_time_s > simulate(m, bare, cl, prof).step_time_s


def _ds_step(load_sync: bool, monkeypatch, fwd_us: float, bwd_us: float, pp: int = 3):
    """A DeepSpeed pipeline step (event engine: the instruction stream) with the load wait on
    or off (``sync_load_edge_stages``), on a host costing ``fwd_us`` / ``bwd_us`` per op."""
    from simulator.engine.simulate import simulate
    from simulator.hardware.profile import Coefficient, HostModel
    from simulator.workload.spec import TransformerSpec
    model = TransformerSpec("ds-host", n_layers=6, hidden=512, ffn_hidden=2048, n_heads=8,
                            n_kv_heads=8, vocab=8192, seq_len=512)
    prof = dataclasses.replace(hardware_db.load_profile("h100-sxm"), host=HostModel(
        Coefficient(fwd_us, "us", "test"), Coefficient(bwd_us, "us", "test"), False))
    monkeypatch.setitem(HOST.mechanisms, "deepspeed_pipe_engine",
                        dataclasses.replace(M, sync_load_edge_stages=load_sync))
    plan = with_framework(Plan(pp=pp, micro_batch=1, global_batch=8, precision="bf16"),
                          "deepspeed")
    assert "deepspeed_pipe_engine" in plan.host_mechanisms
    cl = hardware_db.build_cluster("h100-sxm", pp)
    return simulate(model, plan, cl, prof)


def test_load_micro_batch_waits_for_the_device_on_the_edge_stages(monkeypatch):
    """LoadMicroBatch's blocking copy (first stage: inputs, last: labels) makes the host wait
    for the device before each forward there: never faster, and slower where the host banks
    lead in a device-heavy backward and spends it in a host-heavy forward."""
    assert M.sync_load_edge_stages
    assert "blocking .to(self.device)" in M.why
    for f_us, b_us in ((1.0, 1.0), (60.0, 0.5), (400.0, 400.0)):
        free = _ds_step(False, monkeypatch, f_us, b_us).step_time_s
        waits = _ds_step(True, monkeypatch, f_us, b_us).step_time_s
        assert waits >= free * (1 - 1e-12), (f_us, b_us)
    assert _ds_step(True, monkeypatch, 60.0, 0.5).step_time_s > \
        _ds_step(False, monkeypatch, 60.0, 0.5).step_time_s
