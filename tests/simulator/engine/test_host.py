"""Host time as a simulated resource: the host issues every pass before the device runs it.

Expected values come from the two-machine flow shop written out here (host issues passes
back to back; the device starts a pass once its first op is issued and ends it no earlier
than the host's last issue), not from the engine's code.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.errors import InvalidInputError
from simulator.hardware.profile import Coefficient, HostModel, Profile
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec
from simulator.workload.ops import LayerShape, backward_ops, embedding_ops, head_ops, layer_ops

MODEL = TransformerSpec("host-gpt", n_layers=4, hidden=512, ffn_hidden=2048, n_heads=8,
                        n_kv_heads=8, vocab=8000, seq_len=512)
BASE = hardware_db.load_profile("h100-sxm")


def with_host(fwd_us: float, bwd_us: float | None = None, sync: bool = False) -> Profile:
    c = lambda v: Coefficient(v, "us", "test")  # noqa: E731
    return dataclasses.replace(BASE, host=HostModel(c(fwd_us), c(fwd_us if bwd_us is None
                                                                  else bwd_us), sync))


def no_host() -> Profile:
    return dataclasses.replace(BASE, host=None)


def one_gpu():
    return hardware_db.build_cluster("h100-sxm", 1)


def pass_op_counts(model: TransformerSpec, mb: int) -> tuple[int, int]:
    """Ops the host issues per forward and backward pass of the whole model (one stage),
    counted from the op graph: one per GEMM / attention, ``kernels`` per memory op."""
    sh = LayerShape(micro_batch=mb, seq_len=model.seq_len)
    fwd = embedding_ops(model, sh) + [o for i in range(model.n_layers)
                                     for o in layer_ops(model, sh, i)] + head_ops(model, sh)
    count = lambda ops: sum(o.kernels if o.kind.value == "memory" else 1 for o in ops)  # noqa: E731
    return count(fwd), count(backward_ops(fwd))


def device_passes(plan: Plan, prof: Profile) -> tuple[float, float, float, float]:
    """(forward device s, backward device s, forward host s, backward host s) of the one
    chunk of a single-stage plan."""
    cl = one_gpu()
    ch = build_chunks(MODEL, plan, cl, prof, place_groups(cl, plan))[0][0]
    return ch.fwd.total_s, ch.bwd.total_s, ch.fwd.host_s, ch.bwd.host_s


def test_host_ops_counted_from_the_op_graph():
    plan = Plan(micro_batch=1, global_batch=1)
    nf, nb = pass_op_counts(MODEL, 1)
    _, _, hf, hb = device_passes(plan, with_host(10.0, 7.0))
    assert hf == pytest.approx(nf * 10e-6)
    assert hb == pytest.approx(nb * 7e-6)


def test_host_bound_step_is_the_host_time():
    """Host far slower than the device: the step is the host's issue time of every pass
    plus the optimizer, which runs after the last issue."""
    prof = with_host(2000.0)
    plan = Plan(micro_batch=1, global_batch=3)
    g_f, g_b, h_f, h_b = device_passes(plan, prof)
    assert h_f > g_f and h_b > g_b
    r = simulate(MODEL, plan, one_gpu(), prof)
    assert r.step_time_s == pytest.approx(3 * (h_f + h_b) + r.breakdown.optimizer_s, rel=1e-9)
    assert r.breakdown.host_s > 0.5 * r.step_time_s


def test_device_bound_step_pays_only_the_first_issue():
    """Host much faster than the device: the device never waits after the first op is
    issued, so the step is the host-free step plus the first op's host time."""
    h = 0.01
    plan = Plan(micro_batch=1, global_batch=3)
    base = simulate(MODEL, plan, one_gpu(), no_host()).step_time_s
    nf, _ = pass_op_counts(MODEL, 1)
    _, _, h_f, _ = device_passes(plan, with_host(h))
    r = simulate(MODEL, plan, one_gpu(), with_host(h)).step_time_s
    assert r == pytest.approx(base + h_f / nf, rel=1e-9)


def test_flow_shop_recursion_mixed_regime():
    """Forward host-bound, backward device-bound: the host runs ahead during backward, so
    the step is shorter than the sum of per-pass maxima; expected from the recursion."""
    prof = with_host(60.0, 0.5)
    plan = Plan(micro_batch=1, global_batch=4)
    g_f, g_b, h_f, h_b = device_passes(plan, prof)
    nf, nb = pass_op_counts(MODEL, 1)
    assert h_f > g_f and h_b < g_b
    h = d = 0.0
    for g, hh, n in [(g_f, h_f, nf), (g_b, h_b, nb)] * 4:
        hs, he = h, h + hh
        ds = max(d, hs + hh / n)
        d, h = max(ds + g, he), he
    r = simulate(MODEL, plan, one_gpu(), prof)
    assert r.step_time_s == pytest.approx(d + r.breakdown.optimizer_s, rel=1e-9)
    assert r.step_time_s < 4 * (max(g_f, h_f) + max(g_b, h_b)) + r.breakdown.optimizer_s


def test_synchronous_host_adds_its_time():
    """A CPU device: the host thread runs the kernels, host and device times add."""
    plan = Plan(micro_batch=1, global_batch=2)
    base = simulate(MODEL, plan, one_gpu(), no_host()).step_time_s
    prof = with_host(5.0, 4.0, sync=True)
    _, _, h_f, h_b = device_passes(plan, prof)
    r = simulate(MODEL, plan, one_gpu(), prof)
    assert r.step_time_s == pytest.approx(base + 2 * (h_f + h_b), rel=1e-9)
    assert r.breakdown.host_s == pytest.approx(2 * (h_f + h_b), rel=1e-9)


@pytest.mark.parametrize("h", [0.5, 30.0, 400.0])
@pytest.mark.parametrize("sync", [False, True])
def test_event_and_analytic_agree_with_a_host(h, sync):
    plan = Plan(micro_batch=2, global_batch=6)
    prof = with_host(h, h / 2, sync)
    ev = simulate(MODEL, plan, one_gpu(), prof).step_time_s
    an = simulate(MODEL, plan, one_gpu(), prof, engine="analytic").step_time_s
    assert ev == pytest.approx(an, rel=1e-9)


def test_breakdown_still_sums_to_the_step():
    cl = hardware_db.build_cluster("h100-sxm", 8)
    plan = Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8)
    r = simulate(MODEL, plan, cl, with_host(200.0))
    assert sum(r.breakdown.as_dict().values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.breakdown.host_s > 0


def test_launch_modes_order_host_bound_steps():
    """Per-layer CUDA graphs and compiled blocks issue a layer with less host work than
    eager: on a host-bound plan eager > compiled > cuda_graphs (mode costs from
    frameworks.json)."""
    prof = with_host(100.0)
    t = {m: simulate(MODEL, Plan(micro_batch=1, global_batch=2, host_mode=m), one_gpu(),
                     prof).step_time_s for m in ("eager", "compiled", "cuda_graphs")}
    assert t["eager"] > t["compiled"] > t["cuda_graphs"]
    floor = simulate(MODEL, Plan(micro_batch=1, global_batch=2), one_gpu(), no_host())
    assert t["cuda_graphs"] >= floor.step_time_s


def test_pipeline_host_sync_waits_for_the_device():
    """Megatron's batch_p2p_sync: the host waits for the device after each hand-off, so it
    cannot overlap its issue time with the device's work across passes."""
    cl = hardware_db.build_cluster("h100-sxm", 2)
    prof = with_host(13.5)
    free = Plan(pp=2, micro_batch=1, global_batch=8)
    synced = dataclasses.replace(free, host_mechanisms=("megatron_p2p_sync",))
    t_free = simulate(MODEL, free, cl, prof).step_time_s
    t_sync = simulate(MODEL, synced, cl, prof).step_time_s
    assert t_sync > t_free
    t0 = simulate(MODEL, synced, cl, no_host()).step_time_s
    assert t0 == pytest.approx(simulate(MODEL, free, cl, no_host()).step_time_s, rel=1e-12)


def test_unknown_host_mode_or_mechanism_is_a_field_error():
    with pytest.raises(InvalidInputError, match="host_mode"):
        Plan(host_mode="turbo")
    with pytest.raises(InvalidInputError, match="host_mechanisms"):
        Plan(host_mechanisms=("magic",))


@settings(max_examples=20, deadline=None)
@given(st.floats(0.1, 500.0), st.floats(1.0, 3.0), st.sampled_from([1, 2, 4]),
       st.booleans())
def test_more_host_time_is_never_faster(h, factor, m, sync):
    plan = Plan(micro_batch=1, global_batch=m)
    a = simulate(MODEL, plan, one_gpu(), with_host(h, h, sync)).step_time_s
    b = simulate(MODEL, plan, one_gpu(), with_host(h * factor, h * factor, sync)).step_time_s
    floor = simulate(MODEL, plan, one_gpu(), no_host()).step_time_s
    assert floor <= a * (1 + 1e-12) and a <= b * (1 + 1e-12)
