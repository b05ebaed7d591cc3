"""``calibrate.bench_deepspeed_step``: the fits that turn phase timings into the
``deepspeed_zero_optimizer`` rows, the refusal of unfit runs, its clean skip without
DeepSpeed and its registration in ``bench_framework``; and, only where DeepSpeed is installed
(the ``fake_pg`` fixture skips otherwise), real engines on a fake 2-rank group: the optimizer
class each config gets, the step in pieces leaving the model as ``engine.step()`` does, the
host reads of a step, and a short timed run."""
from __future__ import annotations

import pytest

from calibrate import bench_deepspeed_step as st

PIECE_US = {p: (10.0 + i, 0.5 * i if st.UNIT[p] else 0.0, 0.3) for i, p in enumerate(st.PIECES)}


def _timings(kinds=("z1_bf16",)) -> tuple[dict, dict]:
    """Synthetic (timings, counts) over ``st.sizes()``: every piece costs PIECE_US's
    (fixed, per tensor of its unit, per 1000 partition elements); ``step`` their sum plus
    5 us; the bare optimizer 20 + 1 per tensor + 2 per 1000 elements (step), 3 + 0.1 per
    tensor (zero_grad), clip 8 + 0.5 per tensor."""
    t, c = {}, {}
    for n, split, h in st.sizes():
        model = n * (9 if split else 6) + 3
        elements = n * 12 * h * h + 64 * h
        c[("bare", n, split, h)] = {"model": model, "local": model, "elements": 2 * elements,
                                    "model_elements": 2 * elements}
        t[("bare", n, split, h)] = {"clip": 8 + 0.5 * model, "opt_step": 20 + model
                                    + 2 * elements / 500, "opt_zero_grad": 3 + 0.1 * model}
        for kind in kinds:
            k = (kind, n, split, h)
            c[k] = {"model": model, "local": model // 2 + 1, "elements": elements,
                    "model_elements": 2 * elements, "skipped": 0}
            t[k] = {p: a + b * c[k][st.UNIT[p] or "model"] + e * elements / 1e3
                    for p, (a, b, e) in PIECE_US.items()}
            t[k]["step"] = sum(t[k].values()) + 5.0
    return t, c


def test_fit_recovers_a_plane():
    xs = [(1, 2), (3, 1), (5, 7), (2, 2)]
    ys = [4 + 1.5 * a - 0.5 * b for a, b in xs]
    assert st.fit(xs, ys) == pytest.approx((4.0, 1.5, -0.5))


def test_phase_fits_per_unit_and_element():
    t, c = _timings()
    f = st.phase_fits(t, c, "z1_bf16", st.UNIT)
    for p, (a, b, e) in PIECE_US.items():
        assert f[p] == pytest.approx((a, b, e), abs=1e-6)
    assert st.phase_fits(t, c, "bare", st.BARE)["opt_step"] == pytest.approx((20, 1, 2))


def test_step_values_whole_over_bare_and_pieces_summed():
    t, c = _timings()
    v = dict(st.step_values(t, c, "z1_bf16"))
    local = sum(b for p, (_, b, _) in PIECE_US.items() if st.UNIT[p] == "local")
    model = sum(b for p, (_, b, _) in PIECE_US.items() if st.UNIT[p] == "model")
    assert local > 0 and model > 0
    assert v["pieces summed, per local parameter tensor (this rank's partition)"] == \
        pytest.approx(local)
    assert v["pieces summed, per model parameter tensor"] == pytest.approx(model)
    fixed = sum(a for a, _, _ in PIECE_US.values())
    assert v["pieces summed, per step, fixed"] == pytest.approx(fixed)
    assert v["engine.step() at the boundary, per step, fixed"] > fixed     # + 5, + local's
    assert v["engine.step() - bare step() and zero_grad(), per step, fixed"] == pytest.approx(
        v["engine.step() at the boundary, per step, fixed"] - 23.0, abs=1.0)
    size = st._size_text(st.CHECK_SIZE)
    assert v[f"check: engine.step() at {size}"] == pytest.approx(
        v[f"check: pieces summed at {size}"] + 5.0)
    bare = dict(st.bare_values(t, c))
    assert bare["bare fp32 clip_grad_norm_(1.0), per parameter tensor"] == pytest.approx(0.5)
    both = "bare fp32 torch AdamW(fused=True).step() + zero_grad(set_to_none=True)"
    assert bare[f"{both}, per step, fixed"] == pytest.approx(23.0)
    assert bare[f"{both}, per parameter tensor"] == pytest.approx(1.1)


def test_each_piece_is_fitted_per_tensor_of_what_its_loop_walks():
    """stage_1_and_2.py 0.19.8: flatten frees params_not_in_partition's gradients and
    flattens params_in_partition's (the model's on rank 0); free_grads frees
    params_in_partition's; the norm and overflow walk the partition's gradients."""
    assert st.UNIT["flatten"] == "model" and st.UNIT["free_grads"] == "local"
    assert st.UNIT["grad_norm"] == st.UNIT["overflow"] == "local"
    assert st.UNIT["zero_grad"] == st.UNIT["bit16_views"] == "model"


def test_warm_rounds_are_untimed_and_follow_the_same_setup():
    """``time_phases(warm=1)``: per trial each setup runs its untimed round and then its
    timed ones back to back; only the timed rounds' calls are measured."""
    from calibrate.bench_mcore_ddp import time_phases
    log = []
    built = {k: [(f"_{k}", lambda k=k: log.append(k)), ("p", lambda k=k: log.append(k))]
             for k in ("a", "b")}
    t, _ = time_phases(built, trials=2, repeats=2, warm=1)
    assert set(t) == {"a", "b"} and set(t["a"]) == {"p"}
    per_trial = ["a"] * 6 + ["b"] * 6
    assert log == ["a"] * 6 + ["b"] * 6 + per_trial * 2      # 3 warm-ups, then 2 trials


def test_unfit_runs_are_refused():
    t, c = _timings()
    m = {"t": t, "counts": c, "op": {"fwd": 8.0, "bwd": 12.0}, "attempts": [""]}
    assert st.problems(m) == []
    c[("z1_bf16", 1, False, 8)]["skipped"] = 2
    assert st.problems({**m, "attempts": ["foreign load 30%"]}) == [
        "noisy: foreign load 30%", "z1_bf16: 2 steps skipped on overflow"]


def test_the_bench_says_why_it_skips(without_deepspeed, capsys):
    assert st.rows({}) == []
    assert "deepspeed_zero_optimizer skipped: deepspeed not importable" in \
        capsys.readouterr().err


def test_bench_framework_runs_it_by_name(monkeypatch):
    from calibrate import bench_framework as bf
    monkeypatch.setattr(st, "rows", lambda base: [{"mechanism": st.MECHANISM, **base}])
    assert bf._optional_rows({"x": 1}, lambda name: name == st.MECHANISM) == [
        {"mechanism": st.MECHANISM, "x": 1}]
    assert bf._optional_rows({}, lambda name: name == "other") == []


def test_zero_1_and_2_bf16_and_fp16_run_deepspeeds_zero_optimizer(fake_pg):
    """0.19.8's routing: DeepSpeedZeroOptimizer for bf16 and fp16 at stage 1 and 2 with the
    default accumulation dtype; BF16_Optimizer only for bf16 ZeRO-1 accumulating in fp32."""
    import deepspeed

    from calibrate.torch_model import build_model
    for kind in st.KINDS:
        eng = st.engine(kind, 1, False, 8)
        assert type(eng.optimizer).__name__ == "DeepSpeedZeroOptimizer"
        c = st.counts(eng)
        assert c["model"] == 9 and 0 < c["local"] < 9
        assert c["inner"] == ("FusedAdam" if kind.endswith("_ds") else "AdamW")
        assert 2 * c["elements"] >= c["model_elements"]           # rank 0's half, padded
    cfg = {**st.config("z1_bf16", 8), "data_types": {"grad_accum_dtype": "fp32"}}
    model = build_model(st.spec_of(1, 8))
    import torch
    eng, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(
        model.parameters(), fused=True), config=cfg)
    assert type(eng.optimizer).__name__ == "BF16_Optimizer"


def test_the_step_in_pieces_does_what_engine_step_does(fake_pg):
    import torch
    whole, parts = (st.engine_phases("z2_fp16", 2, True, 8) for _ in range(2))
    for phases in (whole[0], parts[0]):
        d = dict(phases)
        d["_fwd"](), d["_bwd"]()
    dict(whole[0])["step"]()
    for name, fn in parts[0][2:2 + len(st.PIECES)]:
        fn()
    engines = [dict(p[0])["step"].__self__ for p in (whole, parts)]
    assert [e.global_steps for e in engines] == [1, 1] and engines[1].skipped_steps == 0
    for a, b in zip(*(e.module.parameters() for e in engines)):
        assert torch.equal(a, b) and a.grad is None and b.grad is None
    assert not all(torch.equal(a, b) for a, b in zip(
        engines[0].module.parameters(), st.engine("z2_fp16", 2, True, 8).module.parameters()))


def test_a_step_reads_the_device_where_the_source_says(fake_pg):
    from calibrate.bench_deepspeed import _launcher_env
    _launcher_env()
    size = (1, False, 8)
    built = {("z1_bf16", *size): st.engine_phases("z1_bf16", *size)[0]}
    phases = dict(built[("z1_bf16", *size)])
    for _ in range(3):                  # the throughput timer syncs from the third step
        phases["_fwd"](), phases["_bwd"](), phases["step"]()
    s = st.host_syncs(built, "z1_bf16", size)
    step = " ".join(s["step"])
    assert "item at deepspeed/runtime/zero/stage_1_and_2.py:" in step
    assert "synchronize at deepspeed/utils/timer.py:" in step
    assert sum(n for k, n in s["step"].items() if k.startswith("__bool__")) == 2
    assert any(k.startswith("synchronize") for k in s["fwd"]) and s["bwd"] == {}


def test_a_short_run_gives_positive_per_tensor_costs(fake_pg, monkeypatch):
    for name, value in (("LAYERS", (1, 4)), ("CHECK_SIZE", (4, True, 32)), ("WAIT_S", 0.0)):
        monkeypatch.setattr(st, name, value)
    m = st.measure(kinds=("z1_bf16",), trials=3, repeats=1)
    v = dict(st.step_values(m["t"], m["counts"], "z1_bf16"))
    assert v["engine.step() at the boundary, per model parameter tensor"] > 0
    assert v["pieces summed, per local parameter tensor (this rank's partition)"] > 0
    rows = st.rows_of(m, {"host": "h", "torch": "t", "date": "d"})
    op = m["op"]["fwd"]
    got = {r["metric"]: r for r in rows}
    assert all(k.startswith(st.LABEL) for k in got) and st.LABEL == "warm: "
    both = "bare fp32 torch AdamW(fused=True).step() + zero_grad(set_to_none=True)"
    assert got[f"{st.LABEL}{both}, per parameter tensor"]["value_us"] > 0
    assert "warm protocol" in got[f"{st.LABEL}{both}, per step, fixed"]["method"]
    key = (f"{st.LABEL}{st.TAGS['z1_bf16']}, engine.step() at the boundary, per model "
           "parameter tensor")
    assert got[key]["value_us"] == pytest.approx(
        v["engine.step() at the boundary, per model parameter tensor"], abs=0.01)
    assert got[key]["eager_ops"] == pytest.approx(got[key]["value_us"] / op, abs=0.01)
    assert "stage_1_and_2.py:" in got[key]["method"] and all(
        r["mechanism"] == st.MECHANISM for r in rows)
