"""``calibrate.bench_deepspeed``: the arithmetic that turns its timings into the
``deepspeed_zero*_hooks`` rows, its clean skip without DeepSpeed, and (only where DeepSpeed
is installed: ``pytest.importorskip``) one real ZeRO-3 engine on this CPU, whose
process-wide ``F.linear`` replacement must stay inside its own forward."""
from __future__ import annotations

import pytest

from calibrate import bench_deepspeed as ds
from calibrate.bench_host import HOST_LAYERS

EDGE = 3                                  # embedding, final norm, logits


def _timings(per_tensor: float, per_layer: float, const: float, kinds=(1,)) -> dict:
    """Synthetic (fwd, bwd) us: the bare model costs 100 per layer; each kind adds
    ``per_tensor`` per tensor (layers' and the edge's), ``per_layer`` per layer and
    ``const`` per pass."""
    t = {}
    for s in ds.BLOCKS:
        k = ds.tensors_per_layer(s)
        for n in HOST_LAYERS:
            bare = 100.0 * n
            t[("bare", s, n)] = (bare, 2 * bare)
            extra = (n * k + EDGE) * per_tensor + n * per_layer + const
            for kind in kinds:
                t[(kind, s, n)] = (bare + extra, 2 * bare + 2 * extra)
    return t


def test_edge_tensors_are_the_simulators_count():
    assert ds.edge_tensors() == EDGE


def test_per_tensor_costs_and_the_per_micro_batch_rest():
    t = _timings(per_tensor=5.0, per_layer=0.0, const=40.0)
    for pas, f in ((0, 1.0), (1, 2.0)):
        c = ds.split_costs(t, 1, pas)
        assert c["tensor"] == pytest.approx(5.0 * f)
        assert c["slope"] == pytest.approx(5.0 * f)
        assert c["layer"] == pytest.approx(0.0, abs=1e-9)
        assert c["rest"] == pytest.approx(40.0 * f)
        assert c["layer6"] == pytest.approx(30.0 * f) and c["layer9"] == pytest.approx(45.0 * f)
    # a per-layer part shows in the intercept; the pooled rate then carries it
    c = ds.split_costs(_timings(per_tensor=5.0, per_layer=15.0, const=0.0), 1, 0)
    assert c["slope"] == pytest.approx(5.0) and c["layer"] == pytest.approx(15.0)
    assert c["tensor"] == pytest.approx(5.0 + 2 * 15.0 / 15)


def test_zero3_linear_wrapper_per_call_and_rest():
    """ZeRO-3 = its hooks (the plain-linear engine's, per tensor) + the memory-efficient
    linear per Linear call (4 or 7 per layer, and the logits' once) + a constant."""
    hooks, wrap, const = 20.0, 3.0, 50.0
    t = _timings(hooks, 0.0, const, kinds=(ds.STAGE3_PLAIN_LINEAR,))
    for s in ds.BLOCKS:
        for n in HOST_LAYERS:
            f, b = t[(ds.STAGE3_PLAIN_LINEAR, s, n)]
            calls = n * ds.linears_per_layer(s) + 1
            t[(3, s, n)] = (f + calls * wrap, b + calls * wrap)
    t[("linear", "torch")], t[("linear", "zero3")] = (10.0, 30.0), (10.0 + wrap, 30.0 + wrap)
    c = ds.linear_wrapper_costs(t, 0)
    assert c["call"] == pytest.approx(wrap)
    assert c["rest"] == pytest.approx(const + wrap)          # the logits' call is in it
    assert c["layer6"] == pytest.approx(6 * hooks + 4 * wrap)
    rows = ds.metric_rows(t, (3, ds.STAGE3_PLAIN_LINEAR))
    assert {m for m, _, _ in rows} == {"deepspeed_zero3_hooks"}
    assert ("deepspeed_zero3_hooks", "ZeRO-3, memory-efficient linear, per Linear call, fwd",
            pytest.approx(wrap)) in rows


def test_config_per_kind():
    z3 = ds.config(3, 32)["zero_optimization"]
    assert (z3["reduce_bucket_size"], z3["stage3_prefetch_bucket_size"],
            z3["stage3_param_persistence_threshold"]) == (1024, 921, 320)
    assert z3["memory_efficient_linear"] and not z3["overlap_comm"]
    assert not ds.config(ds.STAGE3_PLAIN_LINEAR, 32)["zero_optimization"][
        "memory_efficient_linear"]
    acc = ds.config(ds.STAGE1_ACCUMULATING, 32)
    assert acc["zero_optimization"]["stage"] == 1 and acc["gradient_accumulation_steps"] == 2
    assert ds.config(2, 32)["gradient_accumulation_steps"] == 1


def test_the_bench_says_why_it_skips(without_deepspeed, capsys):
    from calibrate.bench_framework import deepspeed_rows
    assert "deepspeed not importable" in ds.available()
    assert deepspeed_rows({}) == []
    assert "deepspeed_zero*_hooks skipped" in capsys.readouterr().err


@pytest.fixture
def zero3_env(monkeypatch):
    """DeepSpeed on its CPU accelerator over a fake 2-rank process group, torn down after."""
    pytest.importorskip("torch")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    why = ds.available()            # any failure to import (not only a missing package)
    if why:
        pytest.skip(why)
    pytest.importorskip("deepspeed")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_SIZE", "1")):
        monkeypatch.setenv(k, v)
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    if ours:
        from deepspeed.utils import groups
        dist.destroy_process_group()
        release = getattr(groups, "_release_process_group_references", None)
        if release:                     # DeepSpeed's cached clone of the world group
            release()


def test_a_zero3_engine_keeps_its_linear_to_its_own_forward(zero3_env):
    import math

    import torch.nn.functional as F
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    own = F.linear
    fwd, bwd = ds._case(1, False, 3)
    assert F.linear is own                      # put back after deepspeed.initialize
    cells = [c.cell_contents for c in fwd.__closure__]
    assert any(c is zero3_linear_wrap for c in cells)   # swapped in around its forward
    loss = fwd()
    assert F.linear is own and math.isfinite(float(loss.detach()))
    bwd(loss)
    plain_fwd, _ = ds._case(1, False, ds.STAGE3_PLAIN_LINEAR)
    assert not any(c.cell_contents is zero3_linear_wrap for c in plain_fwd.__closure__)
    assert F.linear is own


def _recompute_timings(hooks: float, again: float, const: float) -> dict:
    """Synthetic (fwd, bwd) us: ZeRO-3 costs ``hooks`` per tensor over the bare model in
    both passes; under recompute its backward costs ``again`` more per tensor of a layer,
    over the bare model under recompute (which itself costs 50 per layer more)."""
    t = _timings(hooks, 0.0, const, kinds=(ds.STAGE3_PLAIN_LINEAR,))
    for s in ds.BLOCKS:
        k = ds.tensors_per_layer(s)
        for n in HOST_LAYERS:
            f, b = t[("bare", s, n)]
            t[(ds.BARE_RECOMPUTE, s, n)] = (f + 1.0, b + 50.0 * n)
            pf, pb = t[(ds.STAGE3_PLAIN_LINEAR, s, n)]
            t[(ds.STAGE3_RECOMPUTE, s, n)] = (pf + 1.0, pb + 50.0 * n + again * k * n)
    return t


def test_recompute_costs_over_the_bare_model_under_recompute_and_beyond_zero3():
    hooks, again, const = 20.0, 7.0, 30.0
    t = _recompute_timings(hooks, again, const)
    f, b = ds.recompute_costs(t, 0), ds.recompute_costs(t, 1)
    assert f["tensor"] == pytest.approx(hooks) and f["over_tensor"] == pytest.approx(0.0)
    assert b["tensor"] == pytest.approx(2 * hooks + again)
    assert b["over_tensor"] == pytest.approx(again) and b["over_slope"] == pytest.approx(again)
    assert b["over_layer6"] == pytest.approx(6 * again)
    assert b["over_rest"] == pytest.approx(0.0, abs=1e-9)
    rows = ds.metric_rows(t, (ds.STAGE3_RECOMPUTE,))
    assert {m for m, _, _ in rows} == {ds.RECOMPUTE_MECHANISM}
    tag = ds.TAGS[ds.STAGE3_RECOMPUTE]
    assert (ds.RECOMPUTE_MECHANISM, f"{tag}, per parameter tensor of a recomputed layer, "
            f"{ds.BEYOND}, bwd", pytest.approx(again)) in rows


def test_recompute_kind_times_its_references():
    z = ds.config(ds.STAGE3_RECOMPUTE, 32)["zero_optimization"]
    assert z["stage"] == 3 and not z["memory_efficient_linear"]
    assert set(ds.timed_kinds((ds.STAGE3_RECOMPUTE,))) == {
        ds.STAGE3_RECOMPUTE, ds.STAGE3_PLAIN_LINEAR, ds.BARE_RECOMPUTE}
    assert ds.timed_kinds((1, 2)) == (1, 2)


def test_checkpointed_layers_compute_the_same_gradients():
    torch = pytest.importorskip("torch")
    from calibrate.bench_host import probe_spec
    from calibrate.torch_model import build_model, synthetic_batch
    spec = probe_spec(2)
    plain, rc = build_model(spec, split=True), build_model(spec, split=True)
    ds.checkpoint_layers(rc)
    tokens, targets = synthetic_batch(spec, 1)
    plain(tokens, targets).backward()
    rc(tokens, targets).backward()
    for p, q in zip(plain.parameters(), rc.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_zero3_under_recompute_gathers_again_only_without_prefetch_and_reuse(zero3_env):
    """DeepSpeed 0.19.8: the recomputed layer's submodules fetch (and, but for the one
    whose backward started the recompute, release) their parameters again inside backward.
    At the timed settings the prefetcher has gathered them and the release keeps them, so
    no all-gather is added; with prefetch and reuse off, every partitioned tensor of the
    layer but the last Linear's is gathered again (4 partitioned per 6-tensor layer)."""
    ag = ("bwd", "all_gather_into_tensor")
    for zero, extra in ((None, 0), (ds.NO_PREFETCH_NO_REUSE, 3)):
        plain = ds.collective_counts(1, False, ds.STAGE3_PLAIN_LINEAR, zero).get(ag, (0, 0))
        rc = ds.collective_counts(1, False, ds.STAGE3_RECOMPUTE, zero).get(ag, (0, 0))
        assert rc[0] - plain[0] == extra


def test_regather_kind_is_zero3_plain_with_the_limits_at_zero():
    z = ds.config(ds.STAGE3_REGATHER, 32)["zero_optimization"]
    plain = ds.config(ds.STAGE3_PLAIN_LINEAR, 32)["zero_optimization"]
    assert z == {**plain, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}
    assert set(ds.timed_kinds((ds.STAGE3_REGATHER,))) == {ds.STAGE3_REGATHER,
                                                           ds.STAGE3_PLAIN_LINEAR}


def test_regather_costs_beyond_zero3_keeping_the_parameters():
    """Re-gathering costs ``again`` more per tensor in backward (the edge tensors' too)."""
    hooks, again, const = 20.0, 7.0, 30.0
    t = _timings(hooks, 0.0, const, kinds=(ds.STAGE3_PLAIN_LINEAR,))
    for s in ds.BLOCKS:
        for n in HOST_LAYERS:
            pf, pb = t[(ds.STAGE3_PLAIN_LINEAR, s, n)]
            t[(ds.STAGE3_REGATHER, s, n)] = (pf, pb + again * (n * ds.tensors_per_layer(s) + EDGE))
    f, b = ds.regather_costs(t, 0), ds.regather_costs(t, 1)
    assert f["over_tensor"] == pytest.approx(0.0, abs=1e-9)
    assert b["tensor"] == pytest.approx(2 * hooks + again)
    assert b["over_tensor"] == pytest.approx(again) and b["over_slope"] == pytest.approx(again)
    assert b["over_layer9"] == pytest.approx(9 * again)
    assert b["over_rest"] == pytest.approx(0.0, abs=1e-9)
    rows = ds.metric_rows(t, (ds.STAGE3_REGATHER,))
    assert {m for m, _, _ in rows} == {ds.REGATHER_MECHANISM}
    tag = ds.TAGS[ds.STAGE3_REGATHER]
    assert (ds.REGATHER_MECHANISM, f"{tag}, per parameter tensor, {ds.BEYOND_REGATHER}, bwd",
            pytest.approx(again)) in rows


def test_zero3_regather_all_gathers_every_partitioned_tensor_again_in_backward(zero3_env):
    """DeepSpeed 0.19.8: at the timed 1e9 limits no parameter is gathered in backward (all
    stay gathered from forward); with ``REGATHER``'s 0 limits each partitioned tensor of a
    layer (all but its two norms, persistent) is all-gathered once in backward too, and the
    forward's all-gathers are the same."""
    ag = "all_gather_into_tensor"
    for s in ds.BLOCKS:
        partitioned = ds.tensors_per_layer(s) - 2
        plain = ds.collectives_per_layer(s, ds.STAGE3_PLAIN_LINEAR)
        rg = ds.collectives_per_layer(s, ds.STAGE3_REGATHER)
        assert plain.get(("bwd", ag), (0, 0))[0] == 0
        assert rg[("fwd", ag)] == plain[("fwd", ag)] and rg[("fwd", ag)][0] == partitioned
        assert rg[("bwd", ag)] == rg[("fwd", ag)]
