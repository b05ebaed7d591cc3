"""``calibrate.bench_deepspeed_zero3_step``: the fits that turn phase timings into the
``deepspeed_zero3_optimizer`` rows, the refusal of unfit runs and its clean skip without
DeepSpeed; and, only where DeepSpeed is installed (the ``fake_pg`` fixture skips otherwise),
real ZeRO-3 engines on a fake 2-rank group: the optimizer each config gets, the step in
pieces leaving the model and optimizer as ``engine.step()`` does, the host reads of a step,
the GPU stand-ins, and a short timed run."""
from __future__ import annotations

import pytest

from calibrate import bench_deepspeed_zero3_step as z

PHASES = {**z.UNIT, **z.STANDINS}
PIECE_US = {p: {"fixed": 10.0 + i, **{u: 0.5 * i + (2.0 if u == "persistent" else 0.0)
                                      for u in us}, "kelements": 0.3}
            for i, (p, us) in enumerate(PHASES.items())}


def _timings(kinds=("z3_bf16",)) -> tuple[dict, dict]:
    """Synthetic (timings, counts) over ``z.sizes()``: every phase costs PIECE_US's fixed,
    per tensor of its units and per 1000 partition elements; ``step`` the pieces' sum + 5."""
    t, c = {}, {}
    for n, split, h, persist in z.sizes():
        for kind in kinds:
            k = (kind, n, split, h, persist)
            c[k] = {"model": n * (9 if split else 6) + 3, "persistent": 2 * n + 1 if persist
                    else 0, "elements": n * 6 * h * h + 32 * h, "sub_groups": 1, "skipped": 0}
            t[k] = {p: sum(v * (c[k]["elements"] / 1e3 if u == "kelements" else
                                1.0 if u == "fixed" else c[k][u]) for u, v in cost.items())
                    for p, cost in PIECE_US.items()}
            t[k]["step"] = sum(t[k][p] for p in z.PIECES) + 5.0
    return t, c


def test_phase_fits_per_unit_and_element():
    t, c = _timings()
    f = z.phase_fits(t, c, "z3_bf16", PHASES)
    for p, cost in PIECE_US.items():
        assert f[p] == pytest.approx(cost, abs=1e-6)


def test_step_values_sums_and_the_gpu_path():
    t, c = _timings()
    v = dict(z.step_values(t, c, "z3_bf16"))

    def total(names, unit):
        return sum(PIECE_US[p].get(unit, 0.0) for p in names)
    for unit, what in z.WHAT.items():
        if unit != "kelements":
            assert v[f"pieces summed, {what}"] == pytest.approx(total(z.PIECES, unit))
    gpu = [k for k in v if k.startswith("GPU path summed") and k.endswith("per step, fixed")]
    assert len(gpu) == 1
    assert v[gpu[0]] == pytest.approx(total(z.PIECES, "fixed") - PIECE_US["alloc_check"]["fixed"]
                                      + total(z.STANDINS, "fixed"))
    assert v["engine.step() at the boundary, per step, fixed"] == pytest.approx(
        total(z.PIECES, "fixed") + 5.0)
    size = z._size_text(z.CHECK_SIZE)
    assert v[f"check: engine.step() at {size}"] == pytest.approx(
        v[f"check: pieces summed at {size}"] + 5.0)


def test_each_piece_is_fitted_per_tensor_of_what_its_loops_walk():
    """stage3.py 0.19.8: partition_all_parameters walks every parameter and partitions the
    persistent ones again, _post_step all-gathers them and walks every tensor
    (invalidate_secondary_tensor); the norm, both zero_grads, the flatten and the
    unflatten walk every tensor's partition; the inner step sees one flat tensor."""
    assert z.UNIT["partition_all"] == z.UNIT["post_step"] == ("model", "persistent")
    for p in ("grad_norm", "zero_grad_in_step", "prepare", "copy_back", "zero_grad"):
        assert z.UNIT[p] == ("model",)
    assert z.UNIT["inner_step"] == z.UNIT["unscale_clip"] == z.UNIT["glue"] == ()
    assert z.PIECES[0] == "pre_step" and z.PIECES[-2:] == ("zero_grad", "glue")
    assert z.sizes()[0][3] is True and {s[3] for s in z.sizes()} == {True, False}


def test_unfit_runs_are_refused():
    t, c = _timings()
    m = {"t": t, "counts": c, "op": {"fwd": 8.0, "bwd": 12.0}, "attempts": [""]}
    assert z.problems(m) == []
    c[("z3_bf16", 1, False, 8, True)]["skipped"] = 2
    c[("z3_bf16", 4, False, 8, True)]["sub_groups"] = 2
    assert z.problems({**m, "attempts": ["foreign load 30%"]}) == [
        "noisy: foreign load 30%", "z3_bf16: 2 steps skipped on overflow",
        "z3_bf16: 2 sub-groups"]


def test_the_bench_says_why_it_skips(without_deepspeed, capsys):
    assert z.rows({}) == []
    assert "deepspeed_zero3_optimizer skipped: deepspeed not importable" in \
        capsys.readouterr().err


def test_the_cuda_memory_stats_stand_in_runs_torchs_flattening():
    """torch.cuda.memory_stats' own code over ``CUDA_STATS``: 122 flat, sorted keys."""
    stats = z.cuda_memory_stats()()
    assert len(stats) == 122 and list(stats) == sorted(stats)
    assert "allocated_bytes.large_pool.peak" in stats and stats["num_alloc_retries"] == 0


def test_zero3_kinds_run_stage3_with_one_sub_group(fake_pg):
    for kind in z.KINDS:
        for persist in (True, False):
            eng = z.engine(kind, 2, True, 8, persist)
            c = z.counts(eng)
            assert c["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
            assert c["inner"] == ("FusedAdam" if kind.endswith("_ds") else "AdamW")
            assert c["model"] == 21 and c["sub_groups"] == 1
            assert c["persistent"] == (5 if persist else 0)          # the norms only
            assert 2 * c["elements"] >= c["model_elements"]
            assert eng.zero_overlap_comm() and eng.zero_contiguous_gradients()


@pytest.mark.parametrize("kind", ["z3_fp16", "z3_bf16"])
def test_the_step_in_pieces_does_what_engine_step_does(fake_pg, kind):
    import torch
    whole, parts = (z.engine_phases(kind, 2, True, 8) for _ in range(2))
    names = [n for n, _ in parts[0][2:-3]]
    assert [n for n in names if n in z.PIECES] == list(z.PIECES)
    for _ in range(2):
        for phases in (whole[0], parts[0]):
            d = dict(phases)
            d["_fwd"](), d["_bwd"]()
        dict(whole[0])["step"]()
        for _, fn in parts[0][2:-3]:
            fn()
    engines = [dict(p[0])["step"].__self__ for p in (whole, parts)]
    assert [e.global_steps for e in engines] == [2, 2] and engines[1].skipped_steps == 0
    for a, b in zip(*(e.module.parameters() for e in engines)):
        assert torch.equal(a.ds_tensor, b.ds_tensor) and a.ds_status == b.ds_status
        assert torch.equal(a.data, b.data) and a.grad is None and b.grad is None
    flat = [e.optimizer.fp32_partitioned_groups_flat[0] for e in engines]
    assert torch.equal(*flat)
    states = [e.optimizer.optimizer.state[f] for e, f in zip(engines, flat)]
    assert all(torch.equal(states[0][k], states[1][k]) for k in ("exp_avg", "exp_avg_sq"))
    assert not all(torch.equal(a.ds_tensor, b.ds_tensor) for a, b in zip(
        engines[0].module.parameters(), z.engine(kind, 2, True, 8).module.parameters()))


def test_a_step_reads_the_device_where_the_source_says(fake_pg):
    from calibrate.bench_deepspeed import _launcher_env
    _launcher_env()
    size = (1, False, 8, True)
    built = {(k, *size): z.engine_phases(k, *size)[0] for k in ("z3_bf16", "z3_fp16")}
    for phases in built.values():
        d = dict(phases)
        for _ in range(3):              # the throughput timer syncs from the third step
            d["_fwd"](), d["_bwd"](), d["step"]()
    bf, fp = (" ".join(z.host_syncs(built, k, size)["step"]) for k in ("z3_bf16", "z3_fp16"))
    for step in (bf, fp):
        assert "__bool__ at deepspeed/runtime/utils.py:233" in step
        assert "tensor(device) at deepspeed/runtime/zero/stage3.py:" in step
        assert "synchronize at deepspeed/utils/timer.py:" in step
    assert "item at deepspeed/runtime/zero/stage3.py:" in fp
    assert "item at" not in bf                   # bf16 runs no overflow check at stage 3


def test_a_short_run_gives_rows(fake_pg, monkeypatch):
    from calibrate import bench_deepspeed_step as st
    for name, value in (("LAYERS", (1, 4)), ("CHECK_SIZE", (4, True, 32, True))):
        monkeypatch.setattr(z, name, value)
    monkeypatch.setattr(st, "WAIT_S", 0.0)
    m = z.measure(kinds=("z3_bf16",), trials=3, repeats=1)
    v = dict(z.step_values(m["t"], m["counts"], "z3_bf16"))
    assert v["pieces summed, per model parameter tensor"] > 0
    rows = z.rows_of(m, {"host": "h", "torch": "t", "date": "d"})
    got = {r["metric"]: r for r in rows}
    assert all(k.startswith(z.LABEL) for k in got) and z.LABEL == "warm: "
    key = f"{z.LABEL}{z.TAGS['z3_bf16']}, pieces summed, per model parameter tensor"
    assert got[key]["value_us"] == pytest.approx(v["pieces summed, per model parameter tensor"],
                                                 abs=0.01)
    assert got[key]["eager_ops"] == pytest.approx(got[key]["value_us"] / m["op"]["fwd"],
                                                  abs=0.01)
    assert "stage3.py step 2873-2949" in got[key]["method"] and "warm protocol" in \
        got[key]["method"] and all(r["mechanism"] == z.MECHANISM for r in rows)
