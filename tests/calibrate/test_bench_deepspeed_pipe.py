"""``calibrate.bench_deepspeed_pipe``: the slope / intercept arithmetic that turns whole-step
timings into the ``deepspeed_pipe_engine`` rows, the instructions DeepSpeed's own
``TrainSchedule`` gives each stage, the rotated topology that puts this process at the last
stage, the clean skip without DeepSpeed, and (only where DeepSpeed is installed) a short
real run of both stages' engines on a fake 2-rank group."""
from __future__ import annotations

import math

import pytest

from calibrate import bench_deepspeed_pipe as pp


def _deepspeed():
    """Skip unless DeepSpeed imports on its CPU accelerator."""
    why = pp.available()
    if why:
        pytest.skip(why)


def test_slope_and_intercept_of_synthetic_steps():
    assert pp.slope_intercept(130.0, 530.0, 1, 5) == pytest.approx((100.0, 30.0))
    # engine = bare + 70 per micro-batch + 400 per step; bare = 900 per micro-batch + 50
    t = {}
    for s in (0, 1):
        for m in pp.MICRO_BATCHES:
            t[("bare", s, m)] = (900.0 * m + 50.0, 0.0)
            t[("pipe", s, m)] = (900.0 * m + 50.0 + 70.0 * m + 400.0 + 10 * s, 0.0)
    assert pp.stage_costs(t, "pipe", "bare", 0) == pytest.approx({"per_mb": 70.0,
                                                                  "per_step": 400.0})
    assert pp.stage_costs(t, "pipe", "bare", 1)["per_step"] == pytest.approx(410.0)


def test_per_unit_splits_counts_and_drops_zeros():
    lo, hi = pp.MICRO_BATCHES
    counts = {lo: {"A": lo, "B": 3, "C": 2 * lo + 1}, hi: {"A": hi, "B": 3, "C": 2 * hi + 1}}
    mb, step = pp.per_unit(counts)
    assert mb == {"A": 1, "C": 2} and step == {"B": 3, "C": 1}


def test_minus_takes_the_bare_passes_off_the_passes_only():
    inst = {"ForwardPass": 300.0, "BackwardPass": 500.0, "RecvGrad": 20.0}
    assert pp.minus(inst, {"ForwardPass": 250.0, "BackwardPass": 420.0}) == pytest.approx(
        {"ForwardPass": 50.0, "BackwardPass": 80.0, "RecvGrad": 20.0})


def test_a_slow_or_busy_host_is_tagged(monkeypatch, tmp_path, capsys):
    """Rows measured while the probe ran over ``SLOW`` x this host's recorded median (a
    slowdown PSI does not see), or under CPU pressure, are tagged and reported."""
    csv = tmp_path / "m.csv"
    csv.write_text("mechanism,op_fwd_us_same_run,host\n" + "x,10.0,h\n" * 3 + "x,99.0,other\n")
    monkeypatch.setattr(pp, "CSV", csv)
    assert pp._suspect({"op": 14.0, "pressure": 0.01}, "h", "t") == ""
    assert pp._suspect({"op": 16.0, "pressure": 0.01}, "h", "t").startswith("SUSPECT (host slow")
    assert "busy, 40% CPU pressure" in pp._suspect({"op": 10.0, "pressure": 0.4}, "h", "t")
    assert "rows suspect" in capsys.readouterr().err


def test_instruction_counts_are_deepspeeds_train_schedule():
    """2 stages: 5 instructions per micro-batch on each stage (the last loads its labels),
    the reductions and the step once per step, 2 schedule steps per micro-batch and 2 of
    fill and drain; the simulator's own copy of the order agrees on the exchanges."""
    _deepspeed()
    from simulator.parallel import deepspeed_pipe as sim
    first = {"LoadMicroBatch", "ForwardPass", "SendActivation", "RecvGrad", "BackwardPass"}
    last = {"RecvActivation", "LoadMicroBatch", "ForwardPass", "BackwardPass", "SendGrad"}
    once = {"ReduceTiedGrads": 1, "ReduceGrads": 1, "OptimizerStep": 1, "steps": 2}
    for stage, names in ((0, first), (1, last)):
        mb, step = pp.per_unit({m: pp.instruction_counts(m, stage) for m in pp.MICRO_BATCHES})
        assert mb == {**{n: 1 for n in names}, "steps": 2} and step == once
        c = pp.instruction_counts(4, stage)
        assert c["steps"] == 2 * (4 + pp.STAGES - 1)
        kinds = [cmd.kind for cmd in sim.train_commands(stage, pp.STAGES, 4)]
        for ours, theirs in (("SendActivation", sim.SEND_ACT), ("RecvGrad", sim.RECV_GRAD),
                             ("RecvActivation", sim.RECV_ACT), ("SendGrad", sim.SEND_GRAD)):
            assert c.get(ours, 0) == kinds.count(theirs)


def test_the_rotated_topology_puts_rank_0_at_the_stage():
    _deepspeed()
    for tp in (1, pp.TP):
        for stage in range(pp.STAGES):
            topo = pp.topology(stage, tp)
            me = topo.get_coord(0)
            assert me.pipe == stage and getattr(me, "model", 0) == 0
            assert sorted(topo.mapping.values()) == list(range(pp.STAGES * tp))


def test_rows_per_micro_batch_per_step_and_per_instruction():
    _deepspeed()
    inst = {"LoadMicroBatch": 10.0, "ForwardPass": 40.0, "OptimizerStep": 99.0}
    res = {"stages": {0: {"per_mb": 100.0, "per_step": 300.0, "clip": 120.0, "tensors": 7,
                          "instructions": inst}}}
    vals = dict(pp.values(res))
    first = [m for m in vals if m.startswith("per micro-batch, first stage")]
    assert len(first) == 1 and vals[first[0]] == 100.0
    assert vals["per instruction, first stage, per micro-batch cost / 5 instructions"] == 20.0
    assert vals["instrumented ForwardPass per call, first stage, beyond the bare stage's "
                "pass"] == 40.0
    assert vals["instrumented OptimizerStep per call, first stage, per step, SGD's step "
                "included"] == 99.0
    tp = dict(pp.values({"stages": {"1": {"per_mb": 5.0, "per_step": 1.0, "instructions": {
        "SendGrad": 3.0, "OptimizerStep": 2.0}}}}, tp=True))
    assert tp[f"{pp.TP_TAG}, instrumented SendGrad per call, last stage, beyond "
              "unpartitioned"] == 3.0
    assert len(tp) == 3                         # per step: only its noise, in the intercept


def test_the_bench_says_why_it_skips(without_deepspeed, capsys):
    assert pp.rows({}) == []
    assert "deepspeed_pipe_engine skipped: deepspeed not importable" in capsys.readouterr().err


def test_both_stages_engines_run_primed_and_timed(fake_pg, monkeypatch):
    """A short real run: the last stage received the first's activation metadata in the
    priming step (a fake group alone leaves it uninitialized), every per-micro-batch
    instruction of each stage was timed, and the batch loads are the one device move per
    micro-batch that the source shows (inputs on the first stage, labels on the last)."""
    monkeypatch.setattr(pp, "TRIALS", 2)
    monkeypatch.setattr(pp, "INSTRUMENT_STEPS", 2)
    res = pp.measure_pipe()
    assert res["op"] > 0 and math.isfinite(res["pressure"])
    for s, names in ((0, {"LoadMicroBatch", "ForwardPass", "SendActivation", "RecvGrad",
                          "BackwardPass"}),
                     (1, {"RecvActivation", "LoadMicroBatch", "ForwardPass", "BackwardPass",
                          "SendGrad"})):
        c = res["stages"][s]
        assert names <= set(c["instructions"]) and math.isfinite(c["per_mb"])
        assert c["tensors"] == (7 if s == 0 else 8)
        load = "batch[0].clone().to(self.device)" if s == 0 else "batch[1].to(self.device)"
        loads = [v for k, v in res["reads"][s].items() if k.startswith("to(device)")
                 and "pipe/engine.py" in k and load in k]
        assert loads == [pytest.approx([1.0, 0.0])]
    eng = pp.build_engine(1, 1)
    assert eng.pipe_recv_buf is None
    pp.prime([pp.build_engine(0, 1), eng], pp.batches())
    assert tuple(eng.pipe_recv_buf.shape) == (1, 8, 32)


@pytest.mark.parametrize("fake_pg", [pp.STAGES * pp.TP], indirect=True)
def test_partitioned_hand_offs_get_their_metadata_from_the_priming_step(fake_pg):
    """On a pipe x model grid the engines exchange PartitionedTensors; the metadata each
    receiver caches once (the last stage's activation's, the first stage's gradient's) is
    what the other stage sent in the priming step: [ndims, 1, 8, 32, parts, rank, offsets],
    and the engines then train alone on the fake group."""
    pair = [pp.build_engine(s, 1, pp.TP) for s in range(pp.STAGES)]
    assert all(e.is_pipe_partitioned and e.is_grad_partitioned for e in pair)
    data = pp.batches()
    pp.prime(pair, data)
    meta = [3, 1, 8, 32, pp.TP, 0, 0, 128, 256]
    assert pair[1].pipe_partition_input_meta_cache.tolist() == meta
    assert pair[0].grad_partition_grad_layer_meta_cache.tolist() == meta
    for eng in pair:
        pp.train_step(eng, data)()
    assert math.isfinite(float(pair[1].agg_train_loss))


def test_per_step_cost_is_fitted_per_parameter_tensor():
    """``bench_deepspeed_pipe_step``: per step = fixed + per_tensor x the stage's tensors,
    through the intercepts at the two ``BLOCKS`` sizes; its rows name both stages."""
    from calibrate import bench_deepspeed_pipe_step as ps
    lo, hi = ps.BLOCKS
    # 7 tensors at 1 block, 6 more per block: 400 us fixed + 20 us per tensor
    points = {b: (7 + 6 * (b - 1), 400.0 + 20.0 * (7 + 6 * (b - 1))) for b in ps.BLOCKS}
    assert ps.tensor_fit(points) == pytest.approx((400.0, 20.0))
    assert ps.tensor_fit({lo: (8, 700.0), hi: (26, 1060.0)}) == pytest.approx((540.0, 20.0))
    res = {"stages": {0: {"fixed": 400.0, "per_tensor": 20.0},
                      1: {"fixed": 500.0, "per_tensor": 25.0}}}
    vals = dict(ps.values(res, pp))
    assert vals[f"per step, rest, per parameter tensor, first stage ({lo} vs {hi} blocks)"] == 20.0
    assert vals[f"per step, rest, fixed, last stage ({lo} vs {hi} blocks)"] == 500.0
    assert len(vals) == 4
