"""``calibrate.bench_optimizer_host``: the fit of dispatch counts into fixed + per tensor, and
real counts on this CPU: torch's AdamW(foreach=True) issues one dispatch per foreach op
whatever the number of tensors (its only per-tensor calls are the two ``.item()`` of the CPU
step counters), Composer's DecoupledAdamW loop one per op per tensor; and the re-created
DecoupledAdamW updates as its formula says (torch's AdamW with the decay divided by lr)."""
from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from calibrate import bench_optimizer_host as b  # noqa: E402

NS = (8, 32, 128)


def test_fit_line_recovers_fixed_and_per_tensor():
    assert b.fit_line(NS, [12 + 2 * n for n in NS]) == pytest.approx((12, 2))
    assert b.fit_line((2, 4, 16), [2 + 10 * n for n in (2, 4, 16)]) == pytest.approx((2, 10))
    # not through the points: the least-squares line (residuals +1, -2, +1 about 5 + 1 n)
    assert b.fit_line((0, 1, 2), [6, 4, 8]) == pytest.approx((5, 1))


def test_count_fit_splits_ops_and_dtensor_levels():
    by_n = {n: Counter({"_foreach_mul_": 2, "_local_scalar_dense": 2 * n, "lift_fresh": 1,
                        "dtensor:_foreach_mul_": 2}) for n in NS}
    f = b.count_fit(by_n)
    assert f["total"] == pytest.approx((5, 2))
    assert f["dtensor"] == pytest.approx((2, 0))
    assert f["local"] == pytest.approx((3, 2))
    assert f["_local_scalar_dense"] == pytest.approx((0, 2))
    text = b.count_text(f)
    assert text.startswith("5 + 2/tensor (DTensor-level 2 + 0/tensor, local 3 + 2/tensor)")
    assert "foreach/fused calls 2 per step" in text            # the local ones only
    assert text.endswith("per tensor: _local_scalar_dense 2")


def test_foreach_adamw_dispatches_do_not_grow_per_tensor():
    counts = {n: b.count_calls(b.adamw_step(b.plain_params(n), foreach=True)) for n in (4, 16)}
    foreach = {n: Counter({k: v for k, v in c.items() if k.startswith("_foreach_")})
               for n, c in counts.items()}
    assert foreach[4] == foreach[16]                # one dispatch per foreach op at any N
    assert sum(foreach[4].values()) == 9            # incl. the step counters' _foreach_add_
    grown = (counts[16] - foreach[16]) - (counts[4] - foreach[4])
    assert grown == Counter({"_local_scalar_dense": 2 * (16 - 4)})   # .item() x2 per tensor


def test_decoupled_adamw_loop_grows_linearly():
    ns = (2, 4, 16)
    for decay, per_tensor in ((0.0, 10), (1e-5, 11)):      # decay: param.mul_ (L275-277)
        totals = [sum(b.count_calls(b.composer_step(b.plain_params(n), weight_decay=decay))
                      .values()) for n in ns]
        fixed, per = b.fit_line(ns, totals)
        assert per == pytest.approx(per_tensor)
        assert totals == [round(fixed + per * n) for n in ns]   # exactly linear
        assert fixed == pytest.approx(2)            # the step's record_function enter / exit
    c = b.count_calls(b.composer_step(b.plain_params(4)))
    assert c["_local_scalar_dense"] == 4            # state_steps[i].item() per tensor (L272)


def test_decoupled_adamw_updates_as_its_formula():
    """Decay decoupled from lr: with lr == initial_lr, DecoupledAdamW(weight_decay=w) is
    torch's AdamW(weight_decay=w / lr) (both decay, then the same bias-corrected step)."""
    torch.manual_seed(0)
    start = [torch.randn(3, 5) for _ in range(3)]
    grads = [[torch.randn(3, 5) for _ in start] for _ in range(3)]
    lr, w = 1e-2, 1e-3
    mine = [torch.nn.Parameter(t.clone()) for t in start]
    ref = [torch.nn.Parameter(t.clone()) for t in start]
    opt = b.decoupled_adamw_class()(mine, lr=lr, weight_decay=w)
    ref_opt = torch.optim.AdamW(ref, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=w / lr,
                                foreach=True)
    for g in grads:
        for p, q, gi in zip(mine, ref, g):
            p.grad, q.grad = gi.clone(), gi.clone()
        opt.step()
        ref_opt.step()
    for p, q, s in zip(mine, ref, start):
        assert not torch.equal(p.detach(), s)
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


# ---- the warm protocol (calibrate.bench_optimizer_warm) -----------------------------------
@pytest.fixture(scope="module")
def own_pg():
    """The warm cases' fake process group (FSDP2's mesh; ``bench_dp._init_fake_pg``, once
    per process) torn down after this module's tests when they brought it up, so later
    tests that start their own group still can (not between them: the bench keeps the mesh
    it built on it)."""
    import torch.distributed as dist
    before = dist.is_initialized()
    yield
    if not before and dist.is_initialized():
        dist.destroy_process_group()


def _warm_run(ns=(2, 4)) -> tuple[dict, dict]:
    """A one-trial warm timing of every case at ``ns`` (no noise checks), in ``measure``'s
    shape; and the setups."""
    from calibrate import bench_optimizer_warm as w
    from calibrate.bench_mcore_ddp import probe_op, time_phases
    built = w.setups(ns)
    t, pressure = time_phases(built, trials=1, repeats=1, warm=w.WARM)
    m = {"us": {(ph, k[1]): v for k, phases in t.items() if k[0] != "probe"
                for ph, v in phases.items()},
         "ns": ns, "op_fwd_us": probe_op(t)["fwd"], "op": probe_op(t), "pressure": pressure,
         "foreign": 0.0, "attempts": [""], "counts": {}, "trials": 1, "repeats": 1}
    return m, built


def test_warm_rows_have_a_counterpart_of_every_tight_loop_coefficient(own_pg):
    from calibrate import bench_optimizer_warm as w
    m, built = _warm_run()
    for key, phases in built.items():             # fwd and bwd untimed, first; then the pieces
        case = key[0]
        if case != "probe":
            assert [p for p, _ in phases][:2] == ["_fwd", "_bwd"]
            assert [p.split("_", 1)[0] for p, _ in phases][2:] == [case.split("_")[0]] * 3
    c = b.costs(m)
    rows = b.rows(m, w.methods(m), w.LABEL, w.extra_values(c))
    labels = [(r["mechanism"], r["metric"]) for r in rows]
    assert all(metric.startswith("warm: ") for _, metric in labels)
    assert len(set(labels)) == len(labels)
    tight = {(mech, w.LABEL + metric) for mech, metric, _ in b.metric_values(c)}
    assert tight <= set(labels)                   # every existing coefficient, warm
    assert {r["method"].endswith("calibrate.bench_optimizer_warm") for r in rows} == {True}
    for r in rows:
        assert float(r["eager_ops"]) == pytest.approx(float(r["value_us"]) / m["op_fwd_us"],
                                                      abs=2e-3, rel=1e-2)


def test_warm_rounds_leave_gradients_as_a_training_loop_does(own_pg):
    """A round: backward makes the gradients, clip and step see them, zero_grad drops them
    (set_to_none); under the replays it zeroes them in place (the recorded calls hold them)."""
    from calibrate import bench_optimizer_warm as w
    for slow in (False, True):
        fwd, ps = w.plain_model(3)
        assert len(ps) == 3 and tuple(ps[0].shape) == b.LOCAL
        seen = []
        rnd = w._round(fwd, ps, lambda: seen.append("step"),
                       lambda: seen.append(all(p.grad is not None for p in ps)), slow)
        for _ in range(2):
            for _, fn in rnd:
                fn()
        assert seen == [True, "step"] * 2
        assert all((p.grad is not None) == slow for p in ps)
        if slow:
            assert all(not p.grad.any() for p in ps)
    dt = w.case_phases("dtensor", 2)
    assert [p for p, _ in dt] == ["_fwd", "_bwd", "dtensor_clip", "dtensor_step",
                                  "dtensor_zero_grad"]
    slow = [p for p, _ in w.case_phases("fused_slow", 2)]
    assert slow[2:] == ["fused_clip_slow", "fused_step_slow", "fused_zero_grad_slow"]
