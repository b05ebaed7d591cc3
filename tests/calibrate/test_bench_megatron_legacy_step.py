"""``calibrate.bench_megatron_legacy_step``: the row arithmetic on synthetic timings built from
known coefficients (per hook, per model, per fused weight, per tensor of each optimizer piece),
the distributed optimizer's shard count, the skip without a checkout, and, where
``MEGATRON_LM_PATH`` holds Megatron-LM 23.04, the real wrapper and optimizers in a child
process (their stand-ins patch torch for the whole process): a hook on every parameter tensor,
fusion skipping the linear weights' add, ``step()`` running the pieces the bench times. The
committed CSV rows carry the coefficients the bench reported."""
from __future__ import annotations

import csv
import os
import statistics
import types
from pathlib import Path

import pytest

from calibrate import bench_megatron_legacy_step as b

CSV = Path(__file__).resolve().parents[2] / "hardware_db" / "data" / "measurements" \
    / "host_mechanisms.csv"
K = {"hook": 6.0, "model_b": 20.0, "save": 5.0, "model_save": 9.0, "wrap": 4.0,
     "fixed": 50.0, "per": 2.0}


def _tensors(n: int, bias: bool) -> int:
    return (12 if bias else 8) * n + 4


def _synthetic():
    """Timings and counts of every setup ``values`` reads (with position effects in the bare
    model that the same-step differences must cancel), from ``K``."""
    t, c = {}, {}
    for n in b.LAYERS:
        bare = {f"bare_{p}{i}": 1000.0 * n + 100 * i + (30 if p == "fwd" else 0)
                for p in ("fwd", "bwd") for i in (0, 1)}
        hooks = K["model_b"] + _tensors(n, True) * K["hook"]
        t[("ddp", n, True)] = {**bare, "fwd0": bare["bare_fwd0"] + K["wrap"],
                               "bwd0": bare["bare_bwd0"] + hooks,
                               "bwd1": bare["bare_bwd1"] + hooks - n * 4 * K["save"]
                               - K["model_save"]}
        c[("ddp", n, True)] = {"model_tensors": _tensors(n, True), "layer_tensors": 12,
                               "local_tensors": _tensors(n, True), "fused_linears": 4}
    for kind in ("opt", "dist"):
        for n, bias in b.OPT_SETUPS:
            model = _tensors(n, bias)
            local = model if kind == "opt" else model // 2 + 1
            cnt = c[(kind, n, bias)] = {"model_tensors": model, "local_tensors": local,
                                        "local_per_rank": [local, model - local + 2]}
            names = b.PARTS + b.DDP_STEP[:2] + (("allreduce_gradients",) if kind == "opt"
                                                else ())
            t[(kind, n, bias)] = {ph: K["fixed"] + K["per"] * cnt[
                "model_tensors" if ph in b.MODEL_FIT else "local_tensors"] for ph in names}
    return t, c


def test_hook_values_recover_the_coefficients():
    t, c = _synthetic()
    v = dict(b.hook_values(t, c))
    assert v["per parameter tensor, bwd (hook: main_grad.add_, grad = None)"] == \
        pytest.approx(K["hook"])
    assert v["per layer, bwd (hooks of its tensors)"] == pytest.approx(12 * K["hook"])
    assert v["per model pass, bwd, fixed beyond its tensors' hooks"] == pytest.approx(
        K["model_b"])
    assert v["per model pass, bwd, intercept (incl. the 4 tensors outside the layers)"] == \
        pytest.approx(K["model_b"] + 4 * K["hook"])
    assert v["per fused linear weight, bwd, saved under gradient-accumulation fusion"] == \
        pytest.approx(K["save"])
    assert v["per model pass, bwd, saved under fusion (output layer's word-embedding wgrad)"] \
        == pytest.approx(K["model_save"])
    assert v["per layer, bwd, hooks under gradient-accumulation fusion"] == pytest.approx(
        12 * K["hook"] - 4 * K["save"])
    assert v["per model pass, fwd (LocalDDP.forward wrapper)"] == pytest.approx(K["wrap"])
    assert v["per layer, fwd (none expected)"] == pytest.approx(0)
    for ph in b.DDP_STEP:
        assert v[f"{ph}, per step, fixed"] == pytest.approx(K["fixed"])
        assert v[f"{ph}, per model parameter tensor"] == pytest.approx(K["per"])
    assert v["per step, fixed: zero_grad_buffer + reduce_model_grads"] == pytest.approx(
        2 * K["fixed"])


@pytest.mark.parametrize("kind", ["opt", "dist"])
def test_opt_values_fit_fixed_and_per_tensor(kind):
    t, c = _synthetic()
    v = dict(b.opt_values(t, c, kind))
    per = "local parameter tensor" if kind == "dist" else "parameter tensor"
    assert v["step, per step, fixed"] == pytest.approx(K["fixed"])
    assert v[f"step, per {per}"] == pytest.approx(K["per"])
    assert v["gather_model_params, per model parameter tensor"] == pytest.approx(K["per"])
    # step = 1 x, its four pieces = 4 x: beyond them -3 x
    assert v[f"step() beyond its pieces (timers, checks), per {per}"] == pytest.approx(
        -3 * K["per"])
    assert v[f"clip scaling when the norm exceeds clip_grad, per {per}"] == pytest.approx(0)
    assert v[f"inner_step, CUDA estimate (CPU fused kernel's per-tensor work off), per {per}"] \
        == pytest.approx(0)
    n_total = 5 if kind == "dist" else 4
    total = [k for k in v if k.startswith("per step total (")]
    assert v[total[0]] == pytest.approx(n_total * K["fixed"])
    # per local tensor: zero_grad, step, scheduler_step (and gather: one tensor count)
    assert v[total[1]] == pytest.approx((3 if kind == "dist" else 4) * K["per"])
    model = "per step total (gather_model_params + reduce_model_grads), per model parameter " \
        "tensor (with either total)"
    assert v.get(model) == (pytest.approx(2 * K["per"]) if kind == "dist" else None)
    assert ("reduce_model_grads, per step, fixed" in v) == (kind == "dist")
    assert not any(k.startswith(("zero_grad_buffer", "allreduce_gradients")) for k in v)


def test_local_per_rank_follows_the_shard_formula():
    """One buffer of 10 (padded 12), 2 ranks: shard 0 = [0, 6), shard 1 = [6, 12); a tensor
    counts on every rank whose shard its [start, end) meets."""
    buf = types.SimpleNamespace(numel_padded=12)
    ddp = types.SimpleNamespace(_grad_buffers={"f32": buf}, _grad_buffer_param_index_map={
        "f32": {"a": (0, 4), "b": (4, 8), "c": (8, 10)}})
    assert b.local_per_rank(ddp) == [2, 2]


def test_framework_rows_skip_without_the_checkout(monkeypatch, capsys):
    monkeypatch.delenv("MEGATRON_LM_PATH", raising=False)
    assert b.framework_rows({}, lambda name: name == b.OPT) == []
    assert "MEGATRON_LM_PATH is not set" in capsys.readouterr().err
    assert b.framework_rows({}, lambda name: False) == []


CHILD = r"""
import json, os, warnings
os.environ["MEGATRON_LM_PATH"] = %r
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
from calibrate import bench_megatron_legacy_step as b, bench_mcore_loop
out = {}
ph, cnt = b.hook_phases(1)
d = dict(ph)
ddp = d["_zero_grad_buffer"].__self__
out["counts"], out["hooks"] = cnt, len(ddp.grad_accs)
for name in ("_zero_grad_buffer", "_zero_grad", "fwd0", "bwd0"):
    d[name]()
named = dict(ddp.module.named_parameters())
out["grads_left"] = sum(p.grad is not None for p in named.values())
out["added"] = {n: bool(p.main_grad.abs().sum() > 0) for n, p in named.items()}
for name in ("_zero_grad_buffer", "_fuse", "fwd1", "bwd1", "_unfuse"):
    d[name]()
out["fused_added"] = {n: bool(p.main_grad.abs().sum() > 0) for n, p in named.items()}
from megatron import get_args, get_timers
args, timers = get_args(), get_timers()
opt = d["_zero_grad"].__self__
opt.reduce_model_grads(args, timers)
calls = []
def spy(obj, attr, name):
    own = getattr(obj, attr)
    setattr(obj, attr, lambda *a, **k: (calls.append(name), own(*a, **k))[1])
for attr, name in (("_copy_model_grads_to_main_grads", "copy_grads"),
                   ("clip_grad_norm", "clip_grad_norm"),
                   ("_copy_main_params_to_model_params", "copy_params")):
    spy(opt, attr, name)
spy(opt.optimizer, "step", "inner_step")
ok, norm, _ = opt.step(args, timers)
out["step_calls"], out["norm"], out["ok"] = calls, norm, ok
out["optimizer"] = type(opt.optimizer).__name__, opt.optimizer.defaults.get("fused")
out["no_bias"] = b.step_phases(1, False, False)[1]
dph, out["dist"] = b.step_phases(5, True, True)
out["dist_phases"] = [n for n, _ in dph]
bench_mcore_loop.WAIT_S = 0
m = b.measure(trials=1, repeats=1)
base = {"host": "h", "torch": torch.__version__, "date": "d"}
out["rows"] = [(r["mechanism"], r["metric"], r["value_us"]) for r in b.rows(m, base)]
out["phases_ok"] = all(v >= 0 for ph in m["t"].values() for v in ph.values())
print("JSON" + json.dumps(out))
"""

FUSED = ("query_key_value.weight", "dense.weight", "dense_h_to_4h.weight",
         "dense_4h_to_h.weight")


def test_real_step_runs_what_it_times(megatron_child):
    out = megatron_child(CHILD % os.environ.get("MEGATRON_LM_PATH", ""), b.available())
    c = out["counts"]
    assert (c["layer_tensors"], c["model_tensors"], c["fused_linears"]) == (12, 16, 4)
    assert out["hooks"] == c["model_tensors"]                # a hook on every tensor
    assert out["grads_left"] == 0                            # every hook ran ...
    assert all(out["added"].values())                        # ... and added its gradient
    fused = {n: v for n, v in out["fused_added"].items() if n.endswith(FUSED)}
    assert len(fused) == 4 and not any(fused.values())       # the wgrad GEMM's to add
    assert all(v for n, v in out["fused_added"].items() if n not in fused)
    assert out["step_calls"] == ["copy_grads", "clip_grad_norm", "inner_step", "copy_params"]
    assert out["ok"] and 0 < out["norm"] < b.CLIP            # no clip scaling in a step
    assert out["optimizer"] == ["FusedAdam", True]
    assert (out["no_bias"]["layer_tensors"], out["no_bias"]["model_tensors"]) == (8, 12)
    dist = out["dist"]
    assert dist["local_per_rank"][0] == dist["local_tensors"] < dist["model_tensors"]
    assert sum(dist["local_per_rank"]) >= dist["model_tensors"]
    assert "allreduce_gradients" not in out["dist_phases"]
    assert out["phases_ok"]
    assert {m for m, _, _ in out["rows"]} == set(b.MECHANISMS)
    assert all(isinstance(v, float) for _, _, v in out["rows"])


# the medians (eager ops) of the three committed runs, as the bench's report gave them
PER_T = "per parameter tensor, bwd (hook: main_grad.add_, grad = None)"
REPORTED = {
    (b.HOOKS, PER_T): 1.130,
    (b.HOOKS, "per layer, bwd (hooks of its tensors)"): 13.561,
    (b.HOOKS, "per model pass, bwd, fixed beyond its tensors' hooks"): -5.808,
    (b.HOOKS, "per fused linear weight, bwd, saved under gradient-accumulation fusion"): 1.084,
    (b.HOOKS, "per layer, bwd, hooks under gradient-accumulation fusion"): 9.952,
    (b.HOOKS, "per step, fixed: zero_grad_buffer + reduce_model_grads"): 4.174,
    (b.OPT, "step, per step, fixed"): 11.305,
    (b.OPT, "step, per parameter tensor"): 1.218,
    (b.OPT, "zero_grad, per parameter tensor"): 0.048,
    (b.OPT, "scheduler_step, per step, fixed"): 0.484,
    (b.OPT, "clip_grad_norm, per parameter tensor"): 0.373,
    (b.OPT, "inner_step, CUDA estimate (CPU fused kernel's per-tensor work off), per "
            "parameter tensor"): 0.201,
    (b.OPT, "per step total (zero_grad + step + gather_model_params + scheduler_step), per "
            "step, fixed"): 12.442,
    (b.OPT, "per step total (zero_grad + step + gather_model_params + scheduler_step), per "
            "parameter tensor"): 1.275,
    (b.OPT, "per step total, GPU estimate (one-op norm, inner step's CUDA estimate), per "
            "parameter tensor"): 0.866,
    (b.DIST, "step, per step, fixed"): 14.629,
    (b.DIST, "step, per local parameter tensor"): 1.934,
    (b.DIST, "reduce_model_grads, per step, fixed"): 6.602,
    (b.DIST, "gather_model_params, per step, fixed"): 4.486,
    (b.DIST, "gather_model_params, per model parameter tensor"): 0.550,
    (b.DIST, "zero_grad, per local parameter tensor"): 0.122,
}


def _committed(mechanism: str) -> dict[str, list[tuple[float, float, float]]]:
    """metric -> (eager ops, us, probe us per forward op) of each run in the CSV."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    with CSV.open() as fh:
        for r in csv.DictReader(fh):
            if r["mechanism"] == mechanism:
                out.setdefault(r["metric"], []).append(
                    (float(r["eager_ops"]), float(r["value_us"]), float(r["op_fwd_us_same_run"])))
    return out


def test_committed_rows_carry_the_reported_coefficients():
    rows = {m: _committed(m) for m in b.MECHANISMS}
    for (mech, metric), value in REPORTED.items():
        runs = rows[mech][metric]
        assert len(runs) == 3, metric
        assert statistics.median(eo for eo, _, _ in runs) == pytest.approx(value, abs=1e-3)
        assert all(eo == pytest.approx(us / op, rel=2e-3, abs=2e-3) for eo, us, op in runs)
    hooks = rows[b.HOOKS]
    for tensor, layer in zip(hooks[PER_T], hooks["per layer, bwd (hooks of its tensors)"]):
        assert tensor[0] > 0 and layer[1] == pytest.approx(12 * tensor[1], abs=0.1)
    opt, total = rows[b.OPT], "per step total (zero_grad + step + gather_model_params + " \
        "scheduler_step), per parameter tensor"
    for i, run_total in enumerate(opt[total]):       # the total is its pieces' sum
        pieces = sum(opt[f"{p}, per {'model ' * (p == 'gather_model_params')}parameter "
                         "tensor"][i][1]
                     for p in ("zero_grad", "step", "gather_model_params", "scheduler_step"))
        assert run_total[1] == pytest.approx(pieces, abs=0.05)
    for mech, per in ((b.OPT, "parameter tensor"), (b.DIST, "local parameter tensor")):
        for piece in ("step", "inner_step", "copy_params", "clip_grad_norm"):
            assert all(eo > 0 for eo, _, _ in rows[mech][f"{piece}, per {per}"])
