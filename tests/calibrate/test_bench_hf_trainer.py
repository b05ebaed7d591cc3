"""``calibrate.bench_hf_trainer``: the marks-to-quantities arithmetic on synthetic timelines
whose Trainer work is known (it must come back exactly, whatever the model's own forward and
backward cost), the placing of host reads, and on the real Trainer (where transformers is
installed): the reads it makes are the loss check's two per micro-batch (trainer.py's
``torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)``) plus the model's mask check, a
logging step adds the loss's and the gradient norm's, and the paused Trainers step their
optimizer every step though they share accelerate's GradientState."""
from __future__ import annotations

import builtins
import linecache

import pytest

from calibrate import bench_hf_trainer as b

# the synthetic Trainer's work (seconds): fixed + per layer
PRE, PRE_L = 100e-6, 60e-6          # training_step prologue (model.train walks the modules)
MID, POST = 30e-6, 10e-6
LOOP, LOOP_L = 130e-6, 80e-6        # floating_point_ops walks them too
COUNT, FETCH, GBS = 15e-6, 70e-6, 200e-6
STEP, STEP_L = 600e-6, 90e-6        # the step's own work beyond clip, step and zero_grad
FWD_X, BWD_X = 20e-6, 40e-6         # the loss-scaling ops inside the model's windows
ZERO_L = 40e-6                      # zero_grad per layer
OWN, GAP = 20e-6, 3e-6              # the bare loop's own Python per step, per micro-batch


def _model(layers: int) -> tuple[float, float, float, float]:
    """(forward, backward, graph drop, clip + step) of the model itself."""
    return 1e-3 + 6e-4 * layers, 8e-4 + 7e-4 * layers, 2e-5 * layers, 4e-4 + 5e-5 * layers


class Clock:
    """Marks at a synthetic time: ``c(name, dt)`` advances by ``dt``, then marks ``name``."""

    def __init__(self) -> None:
        self.t, self.marks = 0.0, []

    def __call__(self, name: str = "", dt: float = 0.0) -> None:
        self.t += dt
        if name:
            self.marks.append((name, self.t))


def trainer_marks(layers: int, k: int, steps: int = 3) -> list:
    fwd, bwd, free, opt = _model(layers)
    c, spread = Clock(), (STEP + STEP_L * layers) / 5
    for _ in range(steps):
        c("s")
        for _ in range(k):
            c("t0")
            c("f0", PRE + PRE_L * layers)
            c("f1", fwd + FWD_X)
            c("b0", MID)
            c("b1", bwd + BWD_X)
            c("t1", POST + free)
            c("", LOOP + LOOP_L * layers)       # the last one's too, before the clip
        c("c0", spread)
        c("c1", opt / 2)
        c("p0", spread)
        c("p1", opt / 2)
        c("z0", spread)
        c("z1", ZERO_L * layers)
        c("g0", spread)
        c("n0", FETCH * k)
        c("n1", COUNT * k)
        c("g1", GBS)
        c("s_end", spread)
    return c.marks


def bare_marks(layers: int, k: int, steps: int = 3) -> list:
    fwd, bwd, free, opt = _model(layers)
    c = Clock()
    for _ in range(steps):
        c("s")
        for _ in range(k):
            c("f0", GAP)
            c("f1", fwd)
            c("b0")
            c("b1", bwd)
            c("x1", free)
        c("c0", OWN - GAP)
        c("c1", opt / 2)
        c("p0")
        c("p1", opt / 2)
        c("z0")
        c("z1", ZERO_L * layers)
        c("s_end")
    return c.marks


def synthetic_run() -> dict:
    """A run's segments (here in seconds: the arithmetic is unit-free)."""
    us = {("trainer", n, k): b._step_means(trainer_marks(n, k)) for n in b.LAYERS
          for k in b.ACCUM}
    us.update({("bare", n, k): b._step_means(bare_marks(n, k)) for n in b.LAYERS
               for k in b.ACCUM})
    return {"us": us}


def test_segments_of_a_trainer_step():
    m = b.split_steps(trainer_marks(5, 4, steps=1))[0]
    s = b.segments(m)
    fwd, bwd, free, opt = _model(5)
    assert s["pre"] == pytest.approx(PRE + 5 * PRE_L)
    assert s["fwd"] == pytest.approx(fwd + FWD_X)
    assert s["post"] == pytest.approx(POST + free)
    assert s["between"] == pytest.approx(LOOP + 5 * LOOP_L)
    assert s["nib"] == pytest.approx(4 * COUNT)
    assert s["gbs"] == pytest.approx(GBS + 4 * (COUNT + FETCH))
    mb = PRE + 5 * PRE_L + MID + POST + FWD_X + BWD_X + fwd + bwd + free
    assert s["inner"] == pytest.approx(4 * mb + 3 * (LOOP + 5 * LOOP_L))
    assert s["clip"] + s["opt"] == pytest.approx(opt)
    assert s["period"] == pytest.approx(m["s_end"][0] - m["s"][0])


def test_the_trainer_work_comes_back():
    """Per micro-batch and per step, fixed and per layer, as the synthetic Trainer spends
    them (the bare loop's own Python taken off), whatever the model's own cost."""
    c = b.coefficients(synthetic_run())
    assert c["fwd"] == pytest.approx((PRE + MID + FWD_X - GAP, PRE_L), abs=1e-9)
    assert c["bwd"] == pytest.approx((POST + BWD_X, 0.0), abs=1e-9)
    assert c["loop"] == pytest.approx((LOOP, LOOP_L), abs=1e-9)
    assert c["count"] == pytest.approx((COUNT, 0.0), abs=1e-9)
    assert c["fetch"] == pytest.approx((FETCH, 0.0), abs=1e-9)
    total = (PRE + MID + FWD_X - GAP + POST + BWD_X + LOOP + COUNT + FETCH, PRE_L + LOOP_L)
    assert c["total"] == pytest.approx(total, abs=1e-9)
    # per step: what is left besides micro-batches, clip, optimizer step, the bare loop's own
    assert c["step"] == pytest.approx((STEP + GBS - OWN, STEP_L + ZERO_L), abs=1e-9)
    assert c["step_k1"] == pytest.approx(c["step"], abs=1e-9)
    assert c["zero"] == pytest.approx((0.0, ZERO_L), abs=1e-9)
    # no cache interaction here: the slope over accumulation steps says the same
    assert c["slope"] == pytest.approx(c["total"], abs=1e-9)


def test_rows_and_their_metrics():
    m = {**synthetic_run(), "op_fwd_us": 25.0, "pressure": 0.0, "foreign": 0.0,
         "attempts": [""], "trials": 3, "reads": {(1, 0): ([], 2), (1, 1): ([], 2)}}
    values = dict(b.metric_values(m))
    assert values["per micro-batch, get_batch_samples' num_items_in_batch count"] == \
        pytest.approx(COUNT)
    assert len(values) == 14           # 6 with a layer term, count and fetch without
    assert not b.problems(m)
    assert b.problems({**m, "attempts": ["CPU pressure 40%"]}) == ["noisy: CPU pressure 40%"]


def test_reads_placed_in_complete_steps_after_the_first():
    marks = [(n, 0.0) for n in ("s", "t0", "f0", "f1", "t1", "s", "t0", "f0", "f1", "t1",
                                 "t0", "t1", "s", "t0", "s", "t0")]
    reads = [(3, "a"), (8, "in fwd"), (10, "after 1st"), (12, "after 2nd"), (14, "c"),
             (16, "d")]
    assert b.place_reads(marks, reads) == [(1, 0, "f0", "in fwd"), (1, 0, "t1", "after 1st"),
                                           (1, 1, "t1", "after 2nd"), (2, 0, "t0", "c")]
    text = b.reads_text({(1, 0): ([(1, 0, "t1", "x.py:1 f")] * 4, 2)})
    assert text.startswith("per step at accumulation 1: 2")
    assert "x.py:1 f after training_step" in text


def test_skipped_without_transformers(monkeypatch, capsys):
    real = builtins.__import__

    def no_transformers(name, *a, **k):
        if name.split(".")[0] == "transformers":
            raise ImportError("not here")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_transformers)
    assert "not importable" in b.available()
    assert b.rows({}) == []
    assert "hf_trainer_loop skipped" in capsys.readouterr().err


def _source(where: str, lines: int = 1) -> str:
    """The source from a ``package/file.py:line function`` location on (Python places a
    multi-line condition's reads at its ``if``)."""
    import transformers
    path, line = where.split()[0].rsplit(":", 1)
    root = transformers.__file__.rsplit("transformers/", 1)[0]
    return "".join(linecache.getline(root + path, int(line) + i) for i in range(lines))


def test_the_trainer_reads_what_its_source_says():
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    for log in (False, True):
        reads, steps = b.trainer_reads(1, 2, 1 if log else b.NEVER, steps=4)
        assert steps == 3                  # of 5 begun: not the first, nor the one stopped
        at = {(m, w) for _, _, m, w in reads}
        loss = [r for r in reads if r[2] == "t1" and "_run_epoch" in r[3]]
        assert len(loss) == 2 * 2 * steps                 # 2 per micro-batch
        assert {mb for _, mb, _, _ in loss} == {0, 1}      # after each micro-batch
        assert all("(torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step))" in _source(w, 4)
                   for _, _, _, w in loss)
        mask = [r for r in reads if r[2] == "f0"]           # the model's, before its layers
        assert len(mask) == 2 * steps
        logged = [r for r in reads if "_maybe_log_save_evaluate" in r[3]]
        assert len(logged) == (2 * steps if log else 0)
        assert all(".item()" in _source(w) for _, _, _, w in logged)
        assert len(reads) == len(loss) + len(mask) + len(logged), at


def test_paused_trainers_step_their_optimizer_every_step():
    """Two Trainers paused in turn (accumulation 1 and 2): each released step runs its
    micro-batches and one optimizer step, though the other left the shared GradientState's
    sync flag off; the bare loop on the same model marks its parts too."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    paused = [b.PausedTrainer(1, k) for k in (2, 1)]
    try:
        for _ in range(2):
            for p, k in zip(paused, (2, 1)):
                steps = b.split_steps(p.steps(2))
                assert len(steps) == 2
                assert all(len(s["f0"]) == k and len(s["p0"]) == 1 for s in steps)
        step = b.bare_step(paused[0], 2)
        with b.marking([]) as marks:
            step()
        assert {"f0", "b1", "x1", "p0", "z1"} <= {n for n, _ in marks}
    finally:
        for p in paused:
            p.close()
    assert not any(p._thread.is_alive() for p in paused)
