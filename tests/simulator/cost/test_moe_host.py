"""Megatron-Core's MoE-layer host work (frameworks.json "mcore_moe_layer"): its numbers are
the medians of its own CPU measurement, the op graph's MoE-block ops are not charged twice,
and the token dispatcher's sync makes the device wait for the host inside every MoE
layer's forward (closed form), which never makes a step faster."""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db
from simulator.cost.host import MOE_BLOCK_OPS, MoEHost, layer_host, moe_layer_host
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, moe_sync_wait_s, place_groups
from simulator.frameworks import HOST
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.plan import Plan
from simulator.workload.ops import LayerShape, Op, OpKind, backward_ops, layer_ops
from simulator.workload.presets import get_preset

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "hardware_db" / "data" / "measurements" / "host_mechanisms.csv"
MOE = get_preset("tiny-moe-2l-128")
DENSE = get_preset("tiny-2l-128")
BASE = hardware_db.load_profile("h100-sxm")
MECH = ("mcore_moe_layer",)


def prof(us: float):
    c = Coefficient(us, "us", "test")
    return dataclasses.replace(BASE, host=HostModel(c, c))


def _rows(metric_prefix: str) -> list[float]:
    with CSV.open() as fh:
        return [float(r["eager_ops"]) for r in csv.DictReader(fh)
                if r["mechanism"] == "mcore_moe_layer" and r["metric"].startswith(metric_prefix)]


def test_numbers_are_the_medians_of_the_measured_rows():
    m = HOST.mechanisms["mcore_moe_layer"]
    fwd, bwd = _rows("per MoE layer, fwd"), _rows("per MoE layer, bwd")
    router = _rows("router forward")
    assert len(fwd) == len(bwd) == len(router) == 3
    assert m.moe_layer_fwd_eager_ops == pytest.approx(statistics.median(fwd), abs=0.01)
    assert m.moe_layer_bwd_eager_ops == pytest.approx(statistics.median(bwd), abs=0.01)
    assert m.moe_pre_sync_fwd_eager_ops == pytest.approx(statistics.median(router), abs=0.01)
    assert m.moe_sync_fwd and 0 < m.moe_pre_sync_fwd_eager_ops < m.moe_layer_fwd_eager_ops


def test_op_graph_block_ops_are_subtracted():
    """The measured MoE block includes the router GEMM, the softmax/top-k, the permutation
    and the combine, which the per-op host cost already charges: one op each forward; in
    backward the router's two GEMMs and one op for each of the other three."""
    sh = LayerShape(micro_batch=1, seq_len=128)
    fwd = layer_ops(MOE, sh, layer=MOE.first_layer(True))
    bwd = backward_ops(fwd)
    # the all-to-all path has every block op but the flex path's unpermute
    assert {o.name for o in fwd} >= set(MOE_BLOCK_OPS) - {"moe_unpermute"}
    m = HOST.mechanisms["mcore_moe_layer"]
    mh = moe_layer_host(MECH, fwd, bwd)
    assert mh.fwd == pytest.approx(m.moe_layer_fwd_eager_ops - 4)
    assert mh.pre_sync_fwd == pytest.approx(m.moe_pre_sync_fwd_eager_ops - 2)
    assert mh.bwd == pytest.approx(m.moe_layer_bwd_eager_ops - 5)
    assert moe_layer_host(("te_modules",), fwd, bwd) == MoEHost()


def test_flex_block_ops_are_subtracted_once():
    """The flex path (no probability all-to-all, no chunk sort) puts its unpermute where the
    all-to-all path's combine is: the same four forward ops are subtracted (review of
    58a4019: the unpermute was charged twice)."""
    sh = LayerShape(micro_batch=1, seq_len=128, ep=2, moe_dispatcher="flex")
    fwd = layer_ops(MOE, sh, layer=MOE.first_layer(True))
    bwd = backward_ops(fwd)
    names = {o.name for o in fwd}
    assert "moe_unpermute" in names and "moe_combine" not in names
    m = HOST.mechanisms["mcore_moe_layer"]
    mh = moe_layer_host(MECH, fwd, bwd)
    assert mh.fwd == pytest.approx(m.moe_layer_fwd_eager_ops - 4)
    assert mh.bwd == pytest.approx(m.moe_layer_bwd_eager_ops - 5)


def _post(n: int) -> list[Op]:
    return [Op(f"p{i}", OpKind.MEMORY, bytes_moved=1e3) for i in range(n)]


def test_sync_wait_closed_form():
    """After the sync the device waits max(one op's issue, H_post - G_post)."""
    fwd = [Op("router", OpKind.GEMM, m=8, n=8, k=8), Op("moe_router_topk", OpKind.MEMORY)]
    fwd += _post(5)
    mh = MoEHost(fwd=30.0, pre_sync_fwd=10.0, bwd=0.0, sync=True)
    p = prof(10.0)
    h_post = layer_host(fwd[2:], p, False, "eager").seconds + 20 * 10e-6
    assert h_post == pytest.approx(25 * 10e-6)
    assert moe_sync_wait_s(fwd, mh, p, "eager", lambda ops: 0.0) == pytest.approx(h_post)
    assert moe_sync_wait_s(fwd, mh, p, "eager", lambda ops: 1e-4) == pytest.approx(h_post - 1e-4)
    assert moe_sync_wait_s(fwd, mh, p, "eager", lambda ops: 1.0) == pytest.approx(10e-6)
    assert moe_sync_wait_s(fwd, dataclasses.replace(mh, sync=False), p, "eager",
                           lambda ops: 0.0) == 0.0


def _chunks(model, mech, us: float = 10.0, mode: str = "eager", recompute: str = "none"):
    cl = hardware_db.build_cluster("h100-sxm", 2)
    plan = Plan(dp=2, micro_batch=1, global_batch=2, host_mechanisms=mech, host_mode=mode,
                recompute=recompute)
    return build_chunks(model, plan, cl, prof(us), place_groups(cl, plan))[0][0]


M = HOST.mechanisms["mcore_moe_layer"]
N_MOE = sum(MOE.is_moe_layer(i) for i in range(MOE.n_layers))


def test_dense_models_are_unchanged():
    a, b = _chunks(DENSE, ()), _chunks(DENSE, MECH)
    assert (a.fwd.total_s, a.fwd.host_s, a.bwd.host_s) == (b.fwd.total_s, b.fwd.host_s,
                                                           b.bwd.host_s)


def test_moe_layers_pay_it_in_forward_and_in_the_input_gradient_pass():
    """Eager: the measured block minus the op graph's 4 forward / 5 backward block ops, per
    MoE layer; the backward's share lands in B (router, permute and combine gradients are
    on the input-gradient path), not in W; the forward's device time gains the sync's wait."""
    a, b = _chunks(MOE, ()), _chunks(MOE, MECH)
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(
        N_MOE * (M.moe_layer_fwd_eager_ops - 4) * 10e-6)
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(
        N_MOE * (M.moe_layer_bwd_eager_ops - 5) * 10e-6)
    assert b.wgrad.host_s == pytest.approx(a.wgrad.host_s)          # W unchanged
    assert b.fwd.comm_s.get("host", 0.0) > 0 and "host" not in b.bwd.comm_s
    assert b.fwd.total_s == pytest.approx(a.fwd.total_s + b.fwd.comm_s["host"])


def test_drop_and_pad_never_syncs():
    """With a capacity factor every expert gets capacity rows: Megatron's dispatcher moves no
    token counts to the host (_maybe_dtoh_and_synchronize does nothing when drop_and_pad,
    token_dispatcher.py @ d98e8a64 l.927), so the forward has no sync wait; the host work
    of the block stays."""
    padded = dataclasses.replace(MOE, moe=dataclasses.replace(MOE.moe, capacity_factor=1.25))
    a, b = _chunks(padded, ()), _chunks(padded, MECH)
    assert "host" not in b.fwd.comm_s
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(
        N_MOE * (M.moe_layer_fwd_eager_ops - 4) * 10e-6)
    assert "host" in _chunks(MOE, MECH).fwd.comm_s                  # dropless syncs


def test_recompute_runs_the_block_and_its_sync_again():
    a, b = _chunks(MOE, (), recompute="full"), _chunks(MOE, MECH, recompute="full")
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(
        N_MOE * (M.moe_layer_bwd_eager_ops - 5 + M.moe_layer_fwd_eager_ops - 4) * 10e-6)
    assert b.bwd.comm_s["host"] == pytest.approx(b.fwd.comm_s["host"])
    assert b.bwd.total_s == pytest.approx(a.bwd.total_s + b.bwd.comm_s["host"])


def test_a_layer_cuda_graph_replays_only_the_router_share():
    """--host-mode cuda_graphs: the layer's ops are graph nodes (charged nothing eager), so
    nothing is subtracted; the router's share replays with the graph; the rest of the MoE
    block (and the backward) is issued eagerly, and the sync's wait prices the post-sync
    ops at their eager cost."""
    a, b = _chunks(MOE, (), mode="cuda_graphs"), _chunks(MOE, MECH, mode="cuda_graphs")
    post = M.moe_layer_fwd_eager_ops - M.moe_pre_sync_fwd_eager_ops
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(N_MOE * post * 10e-6)
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(N_MOE * M.moe_layer_bwd_eager_ops * 10e-6)
    eager = _chunks(MOE, MECH)
    assert b.fwd.comm_s["host"] >= eager.fwd.comm_s["host"] * (1 - 1e-12)


@settings(max_examples=12, deadline=None)
@given(us=st.floats(0.5, 60.0), factor=st.floats(1.0, 4.0))
def test_a_slower_host_is_never_faster(us: float, factor: float):
    cl = hardware_db.build_cluster("h100-sxm", 8)
    plan = Plan(dp=8, micro_batch=1, global_batch=16, host_mechanisms=MECH)
    t1 = simulate(MOE, plan, cl, prof(us)).step_time_s
    t2 = simulate(MOE, plan, cl, prof(us * factor)).step_time_s
    assert t2 >= t1 * (1 - 1e-12)
    free = simulate(MOE, dataclasses.replace(plan, host_mechanisms=()), cl, prof(us))
    assert t1 >= free.step_time_s * (1 - 1e-12)


def test_engines_add_the_same_mechanism_time():
    """The event engine and the closed form charge the mechanism (host work and the sync's
    wait) alike: the step grows by the same seconds in both. (On host-bound steps like this
    one the two engines differ by a fixed ~10-20 us with or without it.)"""
    cl = hardware_db.build_cluster("h100-sxm", 8)
    plan = Plan(dp=8, micro_batch=1, global_batch=32, host_mechanisms=MECH)
    plain = dataclasses.replace(plan, host_mechanisms=())
    ev, ev0 = (simulate(MOE, p, cl, prof(20.0)).step_time_s for p in (plan, plain))
    an, an0 = (simulate(MOE, p, cl, prof(20.0), engine="analytic").step_time_s
               for p in (plan, plain))
    assert ev - ev0 > 0
    assert an - an0 == pytest.approx(ev - ev0, rel=1e-9)


def test_bench_skips_cleanly_without_megatron(monkeypatch):
    """Megatron-Core is not a dependency: without it the bench says why and adds no row."""
    import builtins

    from calibrate import bench_framework, bench_mcore_host
    real = builtins.__import__

    def no_megatron(name, *a, **k):
        if name.startswith("megatron"):
            raise ImportError("No module named 'megatron'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_megatron)
    assert "megatron-core not importable" in bench_mcore_host.available()
    assert bench_framework.moe_rows({}, 10.0) == []
    assert bench_framework.dense_rows({}, 10.0) == []
