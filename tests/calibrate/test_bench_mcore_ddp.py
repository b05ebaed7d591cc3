"""``calibrate.bench_mcore_ddp``: the row arithmetic on synthetic timings built from known
coefficients (per module, per parameter tensor, per layer, per bucket, per local tensor),
the local-tensor count of the distributed optimizer's shard formula, and, where megatron-core
is installed, the real wrapper at tiny size in a child process (its parallel state and CPU
stand-ins stay out of this one): the hooks the bench times are the ones that ran."""
from __future__ import annotations

import types

import pytest

from calibrate import bench_mcore_ddp as b

LO, HI = b.LAYERS
MODULES, TENSORS, BIAS_TENSORS = 17, 8, 12


def _synthetic():
    """Timings and counts of every setup ``hook_values`` / ``opt_values`` read, built from
    known coefficients (with position effects in the bare model that the same-position
    differences must cancel); returns (t, c, coefficients)."""
    k = {"module": 3.0, "tensor_f": 1.5, "tensor_b": 2.5, "add": 7.0, "model_f": 40.0,
         "model_b": 30.0, "wrap": 11.0, "gather": 50.0, "gather_bucket": 20.0, "ready": 0.8,
         "reduce": 60.0, "reduce_bucket": 25.0, "fixed": 100.0, "per_local": 4.0,
         "step_bucket": 9.0, "body": 1.2}
    t, c = {}, {}

    def bare(n, bias):
        return {f"{p}{i}": 1000.0 * n + (300 if p == "fwd" else 200) + 17 * i * i
                for i in range(3) for p in ("fwd", "bwd")}

    def ddp(n, bias, kind, buckets=1):
        nt = BIAS_TENSORS if bias else TENSORS
        hooks_f = k["model_f"] + n * (MODULES * k["module"] + nt * k["tensor_f"])
        hooks_b = k["model_b"] + n * nt * (k["tensor_b"] + k["add"])
        r = bare(n, bias)
        ph = {"fwd1": r["fwd1"] + k["wrap"], "fwd2": r["fwd2"] + k["wrap"] + hooks_f,
              "fwd0_gathered": r["fwd0"] + k["wrap"] + hooks_f,
              "bwd0": r["bwd0"] + hooks_b, "bwd1": r["bwd1"] + hooks_b - n * 4 * k["add"],
              "bwd2": r["bwd2"] + hooks_b + n * nt * k["ready"] + k["reduce"]
              + (buckets - 1) * k["reduce_bucket"]}
        ph["fwd0"] = ph["fwd0_gathered"] + k["gather"] + (buckets - 1) * k["gather_bucket"]
        local = n * nt // 2 + 2
        cnt = c[(kind, n, bias)] = {
            "model_tensors": n * nt + 4, "local_tensors": local, "layer_tensors": nt,
            "layer_modules": MODULES, "model_modules": n * MODULES + 10, "buckets": buckets,
            "local_per_rank": [local, local], "fused_linear_weights": 4 * n + 1}
        for name in b.OPT_PARTS + b.STEP_PARTS:     # linear in what each is fitted by
            ph[name] = (k["fixed"] + k["per_local"] * cnt[b.FIT_BY.get(name, "local_tensors")]
                        + (buckets - 1) * k["step_bucket"] * (name in b.STEP_PARTS))
        return ph
    for n in (LO, HI):
        for bias in (False, True):
            t[("bare", n, bias)] = bare(n, bias)
            t[("ddp", n, bias)] = ddp(n, bias, "ddp")
    t[("ddp", b.BIG, False)] = ddp(b.BIG, False, "ddp")
    t[("buckets", HI, False)] = ddp(HI, False, "buckets", buckets=6)
    t[("hook_body", b.HOOK_CALLS, False)] = {
        "pre_hook_0": k["body"] * b.HOOK_CALLS,
        "pre_hook_2": (k["body"] + 2 * k["tensor_f"]) * b.HOOK_CALLS}
    t[("whole", HI, False)] = {"step": 999.0}
    c[("whole", HI, False)] = c[("ddp", HI, False)]
    return t, c, k


def test_fit_line_recovers_intercept_and_slope():
    assert b.fit_line((1, 5, 17), [3 + 2 * n for n in (1, 5, 17)]) == pytest.approx((3, 2))
    assert b.fit_line((0, 1, 2), [6, 4, 8]) == pytest.approx((5, 1))    # least squares


def test_hook_values_recover_the_coefficients():
    t, c, k = _synthetic()
    v = dict(b.hook_values(t, c))
    per_layer_f = MODULES * k["module"] + TENSORS * k["tensor_f"]
    assert v["per layer, fwd, steady micro-batch (forward pre-hooks)"] == pytest.approx(
        per_layer_f)
    assert v["per layer, bwd, steady micro-batch (param hooks, main_grad.add_ on every "
             "tensor)"] == pytest.approx(TENSORS * (k["tensor_b"] + k["add"]))
    assert v["per layer, bwd, steady micro-batch, TE grad-accumulation fusion emulated"] == \
        pytest.approx(TENSORS * k["tensor_b"] + (TENSORS - 4) * k["add"])
    assert v["per model pass, fwd, steady micro-batch, fixed"] == pytest.approx(k["model_f"])
    assert v["per model pass, bwd, steady micro-batch, fixed"] == pytest.approx(k["model_b"])
    assert v["fwd pre-hook body called alone (warm), per parameter tensor"] == pytest.approx(
        k["tensor_f"])
    assert v["fwd pre-hook body called alone (warm), per module without parameters"] == \
        pytest.approx(k["body"])
    assert v["per hooked module, fwd pre-hook in a forward (per layer / its modules)"] == \
        pytest.approx(per_layer_f / MODULES)
    assert v["main_grad.add_ in the bwd hook, per tensor"] == pytest.approx(k["add"])
    assert v["per parameter tensor, bwd hook beyond main_grad.add_"] == pytest.approx(
        k["tensor_b"])
    assert v["first micro-batch, fwd, extra over steady, fixed"] == pytest.approx(k["gather"])
    assert v["first micro-batch, fwd, extra over steady, per layer"] == pytest.approx(0)
    assert v["first micro-batch, fwd, extra over steady, per extra bucket"] == pytest.approx(
        k["gather_bucket"])
    assert v["last micro-batch, bwd, extra over steady, per layer"] == pytest.approx(
        TENSORS * k["ready"])
    assert v["last micro-batch, bwd, extra over steady, fixed"] == pytest.approx(k["reduce"])
    assert v["last micro-batch, bwd, extra over steady, per extra bucket"] == pytest.approx(
        k["reduce_bucket"])


def test_opt_values_fit_fixed_and_per_tensor():
    t, c, k = _synthetic()
    v = dict(b.opt_values(t, c))
    assert v["prepare_grads, per step, fixed"] == pytest.approx(k["fixed"])
    assert v["prepare_grads, per local parameter tensor"] == pytest.approx(k["per_local"])
    gpu = "GPU-path sum (no inner step, one-call norm)"
    assert v[f"{gpu}, per local parameter tensor"] == pytest.approx(6 * k["per_local"])
    assert v[f"{gpu}, per step, fixed"] == pytest.approx(6 * k["fixed"])
    assert v["zero_grad_buffer, per model parameter tensor"] == pytest.approx(k["per_local"])
    assert v["finalize, per model module"] == pytest.approx(k["per_local"])
    for ph in ("finalize", "zero_grad_buffer", "no_sync_enter", "no_sync_exit"):
        assert v[f"{ph}, per extra bucket"] == pytest.approx(k["step_bucket"])
    assert v[f"optimizer.step() whole at {HI} layers (check)"] == 999.0


def test_local_counts_follow_the_shard_formula():
    """Two buckets of a buffer, 2 ranks: rank r's shard of bucket k is [offset + r S,
    offset + (r + 1) S); a tensor counts on every rank whose shard it overlaps."""
    torch = pytest.importorskip("torch")
    pim = {"a": (0, 6, 0), "b": (6, 10, 0), "c": (10, 12, 0),       # bucket 0: 12 elements
           "d": (12, 20, 1)}                                        # bucket 1: 8 elements
    buf = types.SimpleNamespace(
        data_parallel_world_size=2, param_index_map=pim,
        buckets=[types.SimpleNamespace(grad_data=torch.zeros(12), offset=0),
                 types.SimpleNamespace(grad_data=torch.zeros(8), offset=12)])
    # bucket 0: S = 6: rank 0 [0, 6) holds a; rank 1 [6, 12) holds b, c
    # bucket 1: S = 4: rank 0 [12, 16) and rank 1 [16, 20) both hold a piece of d
    assert b.local_counts(types.SimpleNamespace(buffers=[buf])) == [2, 3]


CHILD = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch
from calibrate import bench_mcore_ddp as b
torch.set_num_threads(1)
out = {}
ph, cnt = b.ddp_phases(1, False)
d = dict(ph)                        # the second step's phases (names of the first differ)
ddp = d["zero_grad_buffer"].__self__
out["hooked_modules"] = len(ddp.remove_forward_pre_hook_handles)
out["counts"] = cnt
for name in ("zero_grad_buffer", "zero_grad", "no_sync_enter", "fwd0", "bwd0"):
    d[name]()
out["gathered"] = [g.param_gather_dispatched for g in ddp.bucket_groups]
out["add_all"] = {n: bool(p.main_grad.abs().sum() > 0)
                  for n, p in ddp.module.named_parameters()}
for p in ddp.module.parameters():
    p.main_grad.zero_()
d["_hooks_off"]()
out["hooks_off"] = len(ddp.remove_forward_pre_hook_handles)
for name in ("fwd1", "_fuse", "bwd1", "_hooks_on", "_unfuse"):
    d[name]()
named = dict(ddp.module.named_parameters())
out["grads_left"] = sum(p.grad is not None for p in named.values())
out["main_grad_nonzero"] = {n: bool(p.main_grad.abs().sum() > 0) for n, p in named.items()}
out["hooks_on"] = len(ddp.remove_forward_pre_hook_handles)
out["flags_reset"] = not any(p.grad_added_to_main_grad for p in named.values())
m = b.measure(trials=1, repeats=1, layers=(1, 2), big=3)
base = {"host": "h", "torch": torch.__version__, "date": "d"}
rows = b.rows(m, base)
out["rows"] = [(r["mechanism"], r["metric"], r["value_us"]) for r in rows]
out["phases_ok"] = all(v > 0 for ph in m["t"].values() for v in ph.values())
out["rank0"] = all(c["local_per_rank"][0] == c["local_tensors"] for c in m["counts"].values())
print("JSON" + json.dumps(out))
"""


def test_real_wrapper_runs_the_hooks_it_times(megatron_child):
    out = megatron_child(CHILD, b.available())
    c = out["counts"]
    assert (c["layer_modules"], c["layer_tensors"]) == (MODULES, TENSORS)
    assert out["hooked_modules"] == c["model_modules"]      # a forward pre-hook each
    assert (out["hooks_off"], out["hooks_on"]) == (0, c["model_modules"])
    assert out["gathered"] == [True] * c["buckets"]          # the first forward dispatched
    assert out["grads_left"] == 0                            # every param hook ran
    assert all(out["add_all"].values())                      # unfused: add_ on every tensor
    assert out["flags_reset"]
    nz = out["main_grad_nonzero"]
    # the emulated TE fusion skipped main_grad.add_ for the linear weights only
    assert not any(v for n, v in nz.items() if "linear_" in n and n.endswith("weight"))
    assert all(v for n, v in nz.items() if "layernorm" in n)
    assert c["local_per_rank"][0] == c["local_tensors"] < c["model_tensors"]
    assert sum(c["local_per_rank"]) >= c["model_tensors"]   # every tensor on some rank
    assert out["phases_ok"] and out["rank0"]
    mechs = {m for m, _, _ in out["rows"]}
    assert mechs == {b.HOOKS, b.OPT}
    assert all(isinstance(v, float) for _, _, v in out["rows"])
