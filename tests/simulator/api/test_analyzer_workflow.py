"""The four-line workflow of the design brief, as written, on a preset and on a
torch.nn.Module; every call's result, the ledger's diffs, and the typed errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.api.catalog import HardwareDbCatalog
from simulator.errors import InvalidInputError
from simulator.search.driver import SearchOptions
from simulator.workload import get_preset

CAT = HardwareDbCatalog()
OPTS = SearchOptions(workers=1, event_top=1, top_k=2)
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def test_import_simulator_stays_light_and_exposes_the_analyzer():
    code = ("import sys, simulator; bad = [m for m in ('torch', 'hardware_db', 'pyarrow') "
            "if m in sys.modules]; from simulator import ComplexityAnalyzer; "
            "bad += [m for m in ('torch',) if m in sys.modules]; print(bad); "
            "sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def _closed_form_flops_per_token(m) -> float:
    """PaLM/Megatron convention: 6 x GEMM weights (input embedding is a lookup, norms are
    not GEMMs) + 12 x layers x seq x attention width (QK^T and AV, non-causal, fwd+bwd)."""
    gemm_weights = m.total_params() - m.vocab * m.hidden - (2 * m.n_layers + 1) * m.hidden
    return 6 * gemm_weights + 12 * m.n_layers * m.seq_len * m.q_dim


def test_four_line_workflow_on_a_preset(tmp_path):
    from simulator import ComplexityAnalyzer
    model = "llama3-8b"
    config = {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "precision": "bf16",
              "n_gpus": 8, "tp": 2}
    hardware_specs = {"gpu": "h100-sxm", "gpus": 32}

    analyzer = ComplexityAnalyzer(ledger=tmp_path / "ledger", catalog=CAT, options=OPTS)
    baseline_metrics = analyzer.analyze_model(model, config)
    optimized_config = analyzer.auto_tune(hardware_specs)
    performance_prediction = analyzer.predict_performance(optimized_config)

    spec = get_preset(model).with_seq_len(4096)
    b = baseline_metrics
    assert b.kind == "transformer" and b.params_total == spec.total_params()
    assert b.flops_per_token == pytest.approx(_closed_form_flops_per_token(spec), rel=1e-12)
    assert b.flops_per_step == b.flops_per_token * 64 * 4096
    assert b.config.dp == 4 and b.config.n_gpus == 8 and b.step_time_s > 0
    assert b.tokens_per_s_per_gpu == pytest.approx(64 * 4096 / b.step_time_s / 8, rel=1e-9)
    assert b.arithmetic_intensity_flop_per_byte > 0 and b.ridge_flop_per_byte > 0
    assert b.roofline_class in ("compute-bound", "memory-bound")
    assert b.peak_memory_bytes_per_gpu > 0 and b.fits_in_memory == (
        b.peak_memory_bytes_per_gpu <= b.memory_capacity_bytes)

    c = optimized_config
    assert c.n_gpus == 32 and c.gpu == "h100-sxm" and c.global_batch == 64
    assert c.tp * c.pp * c.cp * c.dp == 32
    w = analyzer.last_search.winner
    p = performance_prediction
    assert p.step_time_s == pytest.approx(w.step_time_s, rel=1e-9)   # same plan, same engine
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=0.02)
    assert p.fits_in_memory and p.config == c

    rows = analyzer.ledger.read()
    assert [r["method"] for r in rows] == ["analyze_model", "auto_tune", "predict_performance"]
    cmp = analyzer.ledger.compare()
    assert cmp[0].single_change == "hardware"           # analyze on 8 GPUs -> tune on 32
    assert cmp[1].changed["config.n_gpus"] == [8, 32]

    # one knob changed -> the ledger names it and how much the step time moved
    q = analyzer.predict_performance(c.with_(micro_batch=1 if c.micro_batch > 1 else 2))
    last = analyzer.ledger.compare()[-1]
    assert last.single_change == "config.micro_batch"
    before, after, pct = last.moved["step_time_s"]
    assert (before, after) == (p.step_time_s, q.step_time_s)
    assert pct == pytest.approx(100 * (q.step_time_s / p.step_time_s - 1), rel=1e-12)


@pytest.mark.torch
def test_four_line_workflow_on_a_torch_module(tmp_path):
    torch = pytest.importorskip("torch")
    from simulator import ComplexityAnalyzer
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024))
    config = {"input_shape": (64, 1024), "n_gpus": 8}
    hardware_specs = "h100-sxm"

    analyzer = ComplexityAnalyzer(ledger=tmp_path / "ledger", catalog=CAT)
    baseline_metrics = analyzer.analyze_model(model, config)
    optimized_config = analyzer.auto_tune(hardware_specs)
    performance_prediction = analyzer.predict_performance(optimized_config)

    b, B, w = baseline_metrics, 64, 1024 * 4096
    # forward 2BW per linear; backward dgrad + wgrad of the 2nd, wgrad only of the 1st
    # (the input needs no gradient): (2 + 2) + (4 + 2) = 10 B W per rank
    assert b.kind == "module" and b.params_total == 2 * w + 4096 + 1024
    assert b.flops_per_step == 10 * B * w * 8
    assert b.config.strategy == "ddp" and b.config.precision == "fp32"
    assert b.samples_per_s == pytest.approx(B * 8 / b.step_time_s, rel=1e-12)
    assert b.bottleneck and b.arithmetic_intensity_flop_per_byte > 0

    c = optimized_config
    searched = analyzer.last_search
    assert len(searched) == 8                      # 2 precisions x (3 DDP buckets + FSDP)
    assert c.strategy in ("ddp", "fsdp") and c.n_gpus == 8
    best = max((s for s in searched if s.fits_in_memory), key=lambda s: s.samples_per_s)
    assert c == best.config
    p = performance_prediction
    assert p.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)
    assert p.step_time_s <= b.step_time_s           # the baseline (DDP, fp32) was a candidate
    assert analyzer.ledger.compare()[-1].method == "predict_performance"
    assert len(analyzer.ledger.read()) == 3


def test_wrong_argument_types_are_typed_one_line_errors(tmp_path):
    from simulator import ComplexityAnalyzer
    az = ComplexityAnalyzer(ledger=None, catalog=CAT, options=OPTS)
    cases = [
        (lambda: az.analyze_model(42, {}), "model"),
        (lambda: az.analyze_model("llama3-8b", [1, 2]), "config"),
        (lambda: az.analyze_model("llama3-8b", {"batch": 4}), "config.batch"),
        (lambda: az.analyze_model("llama3-8b", {"tp": "2"}), "tp"),
        (lambda: az.auto_tune({"gpu": "h100-sxm"}), "model"),        # nothing analyzed yet
        (lambda: az.predict_performance({"gpu": "h100-sxm"}), "model"),
        (lambda: az.auto_tune(3.5, model="tiny-2l-128"), "hardware_specs"),
        (lambda: az.auto_tune({"gpu_type": "h100"}, model="tiny-2l-128"), "hardware_specs"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidInputError) as ei:
            call()
        assert ei.value.field == field and "\n" not in str(ei.value)


@pytest.mark.torch
def test_module_without_inputs_names_input_shape():
    torch = pytest.importorskip("torch")
    from simulator import ComplexityAnalyzer
    az = ComplexityAnalyzer(ledger=None, catalog=CAT)
    with pytest.raises(InvalidInputError) as ei:
        az.analyze_model(torch.nn.Linear(4, 4), {"n_gpus": 2})
    assert ei.value.field == "config.input_shape"
