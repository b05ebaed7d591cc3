"""``calibrate.bench_mcore_loop``: the row arithmetic on synthetic timings built from known
per-micro-batch and per-step costs, the re-expressed sampler, and, where megatron-core is
installed, the real schedule with the re-expressed pretrain_gpt step at tiny size in a child
process (its parallel state and CPU stand-ins stay out of this one)."""
from __future__ import annotations

import pytest

from calibrate import bench_mcore_loop as b

K = {"model": 900.0, "sched_mb": 40.0, "sched_step": 25.0, "script_mb": 120.0,
     "workers_mb": 300.0, "avg_mb": 2.0, "avg_step": 5.0, "layer": 0.5, "next": 30.0,
     "copies": 10.0, "bcast": 20.0, "rest": 3.0, "next_w2": 200.0, "gb_w2": 190.0,
     "other": 35.0, "loss": 45.0}


def _synthetic() -> dict:
    """``per_call``'s input: {setup: {phase: us}} from ``K`` (pieces: ``CALLS`` calls)."""
    k, hi = K, b.MICRO[-1]
    loop = {}
    for n in b.MICRO:
        loop[f"direct{n}"] = 7.0 * n
        loop[f"triv{n}"] = loop[f"direct{n}"] + k["sched_step"] + n * k["sched_mb"]
        loop[f"full{n}"] = loop[f"triv{n}"] + n * k["script_mb"]
    model = {f"direct{hi}_m": hi * k["model"],
             f"triv{hi}_m": hi * (k["model"] + k["sched_mb"]) + k["sched_step"],
             f"full{hi}_w2": loop[f"full{hi}"] + hi * k["workers_mb"],
             "next_w2": k["next_w2"], "get_batch_w2": k["gb_w2"]}
    model[f"full{hi}_m"] = model[f"triv{hi}_m"] + hi * k["script_mb"]
    gb = k["next"] + k["copies"] + k["bcast"] + k["rest"]
    pieces = {"next_w0": k["next"], "copies": k["copies"], "broadcasts": k["bcast"],
              "get_batch_w0": gb, "get_batch_tp_other": k["other"], "loss_func": k["loss"],
              "set_mb1": 10.0 + k["layer"], "set_mb5": 10.0 + 5 * k["layer"],
              **{f"avg{n}": k["avg_step"] + n * k["avg_mb"] for n in b.MICRO}}
    return {b.LOOP: loop, b.MODEL: model,
            b.PIECES: {n: v * b.CALLS for n, v in pieces.items()}}


def test_values_recover_the_costs():
    v = dict(b.values(b.per_call(_synthetic())))
    k, hi = K, b.MICRO[-1]
    assert v[next(m for m in v if m.startswith("schedule (") and m.endswith("micro-batch"))] \
        == pytest.approx(k["sched_mb"])
    assert v["schedule, per step (finalize_model_grads and no_sync excluded)"] == \
        pytest.approx(k["sched_step"])
    script = [x for m, x in v.items() if m.startswith("forward_step +")]
    assert script == [pytest.approx(k["script_mb"])]
    assert v["same, per step (check: about 0)"] == pytest.approx(0.0, abs=1e-9)
    workers = [x for m, x in v.items() if m.startswith("DataLoader num_workers")]
    assert workers == [pytest.approx(k["workers_mb"])]
    rest = [x for m, x in v.items() if m.startswith("get_batch alone, rest")]
    assert rest == [pytest.approx(k["rest"])]
    over = [x for m, x in v.items() if "over 0, main thread" in m and m.startswith("get_")]
    assert over == [pytest.approx(k["gb_w2"] - (k["next"] + k["copies"] + k["bcast"]
                                                + k["rest"]))]
    assert [x for m, x in v.items() if m.startswith("loss_func")] == [pytest.approx(k["loss"])]
    avg = [x for m, x in v.items() if m.startswith("train_step loss averaging")]
    assert avg == [pytest.approx(k["avg_mb"]), pytest.approx(k["avg_step"])]
    assert [x for m, x in v.items() if m.startswith("set_current")] == [
        pytest.approx(k["layer"])]
    checks = [x for m, x in v.items() if m.startswith("check:")]
    assert checks == [pytest.approx(k["sched_mb"]), pytest.approx(k["script_mb"])]
    total = [x for m, x in v.items() if m.startswith("total")]
    assert total == [pytest.approx(k["sched_mb"] + k["script_mb"] + k["workers_mb"]
                                   + k["avg_mb"])]
    assert len(v) == 20 and hi == 4


def test_problems_flag_noise_and_nonpositive_pieces():
    t = _synthetic()
    m = {"u": b.per_call(t), "op": {"fwd": 10.0}, "attempts": [""]}
    assert b.problems(m) == []
    assert b.problems({**m, "attempts": ["CPU pressure 40%"]}) == ["noisy: CPU pressure 40%"]
    t[b.LOOP]["triv4"] = t[b.LOOP]["direct4"]           # no schedule cost per micro-batch
    bad = b.problems({**m, "u": b.per_call(t)})
    assert any(p.startswith("schedule (") for p in bad)


def test_sampler_takes_this_ranks_slice_of_each_global_batch():
    s = b.PretrainingSampler(total=11, consumed=1, micro_batch=2, dp_rank=1, dp_size=2)
    # global batches of 4 from index 1: [1..4], [5..8]; rank 1 takes the 2nd pair; 9, 10 drop
    assert list(s) == [[3, 4], [7, 8]]


def test_average_losses_sums_then_divides():
    store = [{"lm loss": (2.0, 4)}, {"lm loss": (6.0, 4)}]
    assert b.average_losses(store) == {"lm loss": 1.0}
    assert b.average_losses([{"x": 3.0}, {"x": 5.0}]) == {"x": 4.0}    # legacy: per batch


CHILD = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
from calibrate import bench_mcore_loop as b
torch.set_num_threads(1)
calls = {"broadcast": 0, "all_reduce": 0}     # all_reduce: on the data-parallel group only
model = b.train_model(1)
from megatron.core import parallel_state as mpu
for name in calls:
    own = getattr(dist, name)
    def counted(*a, _own=own, _name=name, **k):
        calls[_name] += _name == "broadcast" or k.get("group") is mpu.get_data_parallel_group()
        return _own(*a, **k)
    setattr(dist, name, counted)
null, real, batch, leaf = b.model_calls()
it = b.data_iterator(0)
tokens, labels, loss_mask, mask, pos = b.get_batch(it)
out = {"shapes": [list(x.shape) for x in (tokens, labels, loss_mask, mask, pos)],
       "mask_dtype": str(mask.dtype), "get_batch_calls": dict(calls)}
store = b.scheduled(b.pretrain_step(real), model, it, 3)()
out["store"] = len(store)
out["store_keys"] = sorted(store[0])
out["tokens"] = [float(store[0]["lm loss"][1])]
out["calls"] = dict(calls)
out["grads"] = sum(p.grad is not None for p in model.parameters())
out["params"] = sum(1 for _ in model.parameters())
loss, ntok, rep = b.loss_func(loss_mask, real(model, *batch))
out["loss"] = [list(loss.shape), int(ntok)]
m = b.measure(trials=1, repeats=1)
out["rows"] = len(b.values(m["u"]))
out["phases_ok"] = all(v > 0 for k, v in m["u"].items())
out["counts"] = m["counts"]
print("JSON" + json.dumps(out))
"""


def test_real_schedule_runs_the_reexpressed_step(megatron_child):
    out = megatron_child(CHILD, b.available())
    t = b.TOKENS
    assert out["shapes"] == [[1, t], [1, t], [1, t], [1, 1, t, t], [1, t]]
    assert out["mask_dtype"] == "torch.bool"
    assert out["get_batch_calls"] == {"broadcast": 5, "all_reduce": 0}   # pp 1: all five
    # 3 micro-batches: 5 broadcasts and one DP all-reduce of the reporting loss each
    assert out["calls"] == {"broadcast": 20, "all_reduce": 3}
    assert out["store"] == 3 and out["store_keys"] == ["lm loss"]
    assert out["tokens"] == [float(t)]
    assert out["grads"] == out["params"]                 # the schedule ran the backward
    assert out["loss"] == [[], t]
    assert out["rows"] == 20 and out["phases_ok"]
    c = out["counts"]
    assert c["copies"] == 5 and c["loss_func"] > 5
    assert c["triv4"] > c["direct4"]                     # the schedule's own ops
