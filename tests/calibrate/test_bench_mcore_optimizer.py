"""``calibrate.bench_mcore_optimizer`` (Megatron-Core's optimizer step without the distributed
optimizer): the row arithmetic on synthetic timings built from known coefficients, and, where
megatron-core is installed, the real wrapper at tiny size in a child process (its parallel
state and CPU stand-ins stay out of this one): the optimizer is a ``ChainedOptimizer`` of one
``Float16OptimizerWithFloat16Params`` that steps every tensor of the model, its gradient
"copy" hands the fp32 ``main_grad`` over without copying, and the bench's pieces are the
calls ``optimizer.step()`` makes."""
from __future__ import annotations

import pytest

from calibrate import bench_mcore_optimizer as b

TENSORS, BIAS_TENSORS, MODULES = 8, 12, 17


def _synthetic():
    """Timings and counts of every setup ``values`` reads, linear in the model's tensors
    (``finalize``: its modules) with known coefficients."""
    k = {"fixed": 50.0, "per_tensor": 3.0, "per_module": 1.5}
    t, c = {}, {}
    for n, bias in b.SIZES:
        cnt = c[("step", n, bias)] = {
            "model_tensors": n * (BIAS_TENSORS if bias else TENSORS) + 4,
            "model_modules": n * MODULES + 10, "stepped_tensors": 0}
        cnt["stepped_tensors"] = cnt["model_tensors"]
        t[("step", n, bias)] = {
            ph: k["fixed"] + (k["per_module"] * cnt["model_modules"] if ph == "finalize"
                              else k["per_tensor"] * cnt["model_tensors"]) for ph in b.PARTS}
    t[("whole", *b.WHOLE)] = {"step": 999.0}
    c[("whole", *b.WHOLE)] = c[("step", *b.WHOLE)]
    return t, c, k


def test_values_fit_fixed_and_per_model_tensor():
    t, c, k = _synthetic()
    v = dict(b.values(t, c))
    assert v["prepare_grads, per step, fixed"] == pytest.approx(k["fixed"])
    assert v["prepare_grads, per model parameter tensor"] == pytest.approx(k["per_tensor"])
    assert v["finalize, per model module"] == pytest.approx(k["per_module"])
    assert v["zero_grad_buffer, per model parameter tensor"] == pytest.approx(k["per_tensor"])
    gpu = "GPU-path sum (no inner step, one-call norm)"
    assert v[f"{gpu}, per step, fixed"] == pytest.approx(len(b.GPU) * k["fixed"])
    assert v[f"{gpu}, per model parameter tensor"] == pytest.approx(len(b.GPU) * k["per_tensor"])
    n = b.WHOLE[0]
    assert v[f"optimizer.step() whole at {n} layers (check)"] == 999.0
    parts = [p for p in b.d.OPT_PARTS if p != "grad_norm_onecall"]
    assert v[f"sum of its pieces at {n} layers (CPU norm; check)"] == pytest.approx(
        sum(t[("step", *b.WHOLE)][p] for p in parts))
    assert "inner_step" not in b.GPU and "grad_norm_cpu" not in b.GPU


def test_a_run_that_steps_fewer_tensors_than_the_model_is_unfit():
    t, c, _ = _synthetic()
    m = {"t": t, "counts": c, "op": {"fwd": 10.0}, "attempts": [""]}
    assert b.problems(m) == []
    c[("step", 1, False)] = {**c[("step", 1, False)], "stepped_tensors": 3}
    assert any("optimizer steps 3" in p for p in b.problems(m))
    assert b.problems({**m, "attempts": ["CPU pressure 40%"]})[0].startswith("noisy")


CHILD = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch
from calibrate import bench_mcore_optimizer as b
from calibrate import bench_mcore_ddp as d
torch.set_num_threads(1)
out = {}
ph, cnt = b.step_phases(1, False)
out["counts"] = cnt
ph = dict(ph)
opt = ph["zero_grad"].__self__
inner = opt.chained_optimizers[0]
for name in ("zero_grad_buffer", "zero_grad", "no_sync_enter", "_fwd0", "_bwd0", "_fwd1",
             "_bwd1", "no_sync_exit", "_fwd_last", "_bwd_last", "finalize", "prepare_grads"):
    ph[name]()
pairs = [(mp, p) for g16, g32 in zip(inner.float16_groups, inner.fp32_from_float16_groups)
         for p, mp in zip(g16, g32)]
out["main_grad_shared"] = all(mp.grad.data_ptr() == p.main_grad.data_ptr() for mp, p in pairs)
out["model_grad_none"] = all(p.grad is None for _, p in pairs)
for name in ("grads_for_norm", "grad_norm_onecall", "grad_norm_cpu", "clip", "inner_step",
             "copy_params"):
    ph[name]()
out["params_follow_main"] = all(torch.equal(p.data, mp.data.to(p.dtype)) for mp, p in pairs)
built, cnt = b.setups(sizes=((1, False), (2, False), (1, True)), whole=(1, False))
t, pressure = d.time_phases(built, 1, 1, warm=1)
m = {"t": t, "op": d.probe_op(t), "pressure": pressure, "foreign": 0.0, "counts": cnt,
     "attempts": [""], "trials": 1, "repeats": 1, "whole": (1, False)}
rows = b.rows_of(m, {"host": "h", "torch": torch.__version__, "date": "d"})
out["rows"] = [(r["mechanism"], r["metric"], r["value_us"]) for r in rows]
out["phases_ok"] = all(v > 0 for ph in t.values() for v in ph.values())
print("JSON" + json.dumps(out))
"""


def test_real_optimizer_runs_the_pieces_it_times(megatron_child):
    out = megatron_child(CHILD, b.available())
    c = out["counts"]
    assert c["inner"] == "Float16OptimizerWithFloat16Params" and c["optimizers"] == 1
    assert c["stepped_tensors"] == c["model_tensors"] == TENSORS + 4    # embedding, head, final LN
    assert c["layer_tensors"] == TENSORS
    assert out["main_grad_shared"] and out["model_grad_none"]
    assert out["params_follow_main"]
    assert out["phases_ok"]
    assert {m for m, _, _ in out["rows"]} == {b.MECHANISM}
    assert all(isinstance(v, float) for _, _, v in out["rows"])
    assert len(out["rows"]) == 2 * len(b.PARTS) + 4
