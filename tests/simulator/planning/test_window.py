"""The short-window question (complexity plan --window-min): scaling laws, overheads,
model-size sweep."""
from __future__ import annotations

import json
import math

import pytest

from simulator.api.catalog import HardwareDbCatalog
from simulator.cli.main import main
from simulator.planning.capacity import HardwareChoice
from simulator.planning.window import (
    SCALING_LAWS,
    WindowOverheads,
    size_ladder,
    sweep_sizes,
)
from simulator.search.driver import SearchOptions
from simulator.workload import get_preset

CAT = HardwareDbCatalog()
OPTS = SearchOptions(workers=1, event_top=1, top_k=1)


def test_chinchilla_law_reproduces_the_papers_allocation_exponents():
    # Hoffmann et al. 2022 Table 2, Approach 3: N_opt ~ C^0.46, D_opt ~ C^0.54, where
    # the parametric fit gives a = beta / (alpha + beta), b = alpha / (alpha + beta).
    law = SCALING_LAWS["chinchilla"]
    assert law.beta / (law.alpha + law.beta) == pytest.approx(0.46, abs=0.01)
    assert law.alpha / (law.alpha + law.beta) == pytest.approx(0.54, abs=0.01)
    # numeric argmin over N at fixed C = 6 N D lands on the closed form
    # N_opt = G (C/6)^a, G = (alpha A / (beta B))^(1 / (alpha + beta))
    C = 5.76e23                                     # Chinchilla's compute budget
    a = law.beta / (law.alpha + law.beta)
    G = (law.alpha * law.A / (law.beta * law.B)) ** (1 / (law.alpha + law.beta))
    grid = [10 ** (9 + i / 200) for i in range(800)]
    best = min(grid, key=lambda n: law.loss(n, C / (6 * n)))
    assert best == pytest.approx(G * (C / 6) ** a, rel=0.02)
    assert law.loss(70e9, 1.4e12) == pytest.approx(1.69 + 406.4 / 70e9 ** 0.34
                                                   + 410.7 / 1.4e12 ** 0.28, rel=1e-15)


def test_checkpoint_overhead_arithmetic():
    o = WindowOverheads(startup_s=60, checkpoints=2, checkpoint_bytes_per_param=14,
                        checkpoint_write_gbytes_per_s=5)
    assert o.checkpoint_s(1e9) == 2 * 1e9 * 14 / 5e9


def test_size_ladder_is_monotone_and_llama_style():
    sizes = [m.total_params() for m in size_ladder()]
    assert sizes == sorted(sizes) and 0.1e9 < sizes[0] < 0.2e9 and 12e9 < sizes[-1] < 14e9
    assert all(m.seq_len == 2048 and m.position.value == "rope" for m in size_ladder())


def test_sweep_arithmetic_and_choice():
    models = [get_preset("small-4l-256"), get_preset("small-6l-512")]
    over = WindowOverheads(startup_s=100)
    sw = sweep_sizes(models, 600.0, HardwareChoice("h100-sxm", 16), [32, 64], CAT, OPTS,
                     overheads=over)
    law = SCALING_LAWS["chinchilla"]
    for r in sw.rows:
        n = r.model.total_params()
        assert r.train_s == 600.0 - 100 - over.checkpoint_s(n)
        a = r.answer
        assert a.tokens == a.steps * a.best.plan.global_batch * r.model.seq_len
        assert a.steps == int(r.train_s // a.best.step_time_s)
        assert r.loss == law.loss(n, a.tokens)
    assert sw.best is min(sw.rows, key=lambda r: r.loss)
    most = sweep_sizes(models, 600.0, HardwareChoice("h100-sxm", 16), [32, 64], CAT, OPTS,
                       overheads=over, objective="tokens").best
    assert most.answer.tokens == max(r.answer.tokens for r in sw.rows)


def test_no_time_left_after_overheads_is_reported_not_chosen():
    sw = sweep_sizes([get_preset("small-4l-256")], 60.0, HardwareChoice("h100-sxm", 8), [32],
                     CAT, OPTS, overheads=WindowOverheads(startup_s=120))
    assert sw.best is None and sw.rows[0].note == "no time left after overheads"


def test_cli_plan_window_without_model_prints_answer_and_assumptions(capsys):
    rc = main(["plan", "--window-min", "10", "--gpus", "16", "--gpu", "h100-sxm",
               "--models", "small-4l-256,small-6l-512", "--global-batch", "64", "--workers", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "answer: small-" in out
    assert "assumed overheads: startup 120 s" in out and "Hoffmann et al. 2022" in out
    rc = main(["plan", "--window-min", "10", "--gpus", "16", "--gpu", "h100-sxm",
               "--models", "small-4l-256", "--global-batch", "64", "--workers", "1", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["overheads"]["assumed"] and d["best"]["model"] == "small-4l-256"
    assert math.isclose(d["best"]["train_s"], 600 - 120 - d["best"]["checkpoint_s"])


def test_cli_plan_needs_model_without_window(capsys):
    rc = main(["plan", "--gpu", "h100-sxm", "--gpus", "8", "--tokens", "1B"])
    err = capsys.readouterr().err
    assert rc == 2 and "model" in err and len(err.strip().splitlines()) == 1
