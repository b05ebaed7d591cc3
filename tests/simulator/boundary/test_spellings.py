"""Other spellings of enumerated values (``simulator.boundary.spellings``) and of hardware
names reach the same thing as the canonical spelling; an ambiguous or unknown spelling is
an ``InvalidInputError`` naming the field, never a silent guess."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

import hardware_db
from simulator.api.catalog import cluster_from_row
from simulator.errors import InvalidInputError
from simulator.hardware.specs import Dtype, LinkKind
from simulator.parallel.plan import Plan, Recompute
from simulator.validation.predict import predict_row
from simulator.workload.spec import MLP, TransformerSpec

RUNS = Path(__file__).resolve().parents[3] / "validation" / "published_runs.csv"


@pytest.mark.parametrize("text, dtype", [
    ("BF16", Dtype.BF16), ("bf16-mixed", Dtype.BF16), ("bfloat16", Dtype.BF16),
    ("32-true", Dtype.FP32),
    ("16-mixed", Dtype.FP16), ("FP16", Dtype.FP16), ("fp8-hybrid", Dtype.FP8),
    ("FP8_E4M3", Dtype.FP8), ("mxfp8", Dtype.FP8), ("float32", Dtype.FP32)])
def test_precision_spellings(text, dtype):
    assert Plan(precision=text).precision is dtype


@pytest.mark.parametrize("text, mode", [
    ("Selective", Recompute.SELECTIVE), ("FULL", Recompute.FULL), ("uniform", Recompute.FULL),
    ("block", Recompute.FULL), ("true", Recompute.FULL), ("no", Recompute.NONE),
    ("off", Recompute.NONE)])
def test_recompute_spellings(text, mode):
    assert Plan(recompute=text).recompute is mode


@pytest.mark.parametrize("field, text", [("precision", "amp"), ("precision", "nvfp4"),
                                         ("precision", "bf16-true"), ("recompute", "partial")])
def test_ambiguous_or_unknown_spellings_name_the_field(field, text):
    with pytest.raises(InvalidInputError) as ei:
        Plan(**{field: text})
    assert ei.value.field == field


def _spec(mlp):
    return TransformerSpec(name="t", n_layers=2, hidden=256, ffn_hidden=512, n_heads=4,
                           n_kv_heads=4, vocab=1000, seq_len=128, mlp=mlp)


@pytest.mark.parametrize("text, mlp", [
    ("SwiGLU", MLP.SWIGLU), ("GeGLU", MLP.SWIGLU), ("gated_gelu", MLP.SWIGLU),
    ("GELU", MLP.GELU), ("squared_relu", MLP.RELU2)])
def test_mlp_spellings(text, mlp):
    assert _spec(text).mlp is mlp


@pytest.mark.parametrize("text", ["bogus", "silu", "gelu_pytorch_tanh", "gelu_new", "relu"])
def test_an_activation_name_is_not_an_mlp_form(text):
    """hidden_act does not say whether the MLP is gated (Gemma gates gelu_pytorch_tanh)."""
    with pytest.raises(InvalidInputError) as ei:
        _spec(text)
    assert ei.value.field == "mlp"


def _row(rid: str) -> dict[str, str]:
    with RUNS.open(newline="") as f:
        return next(r for r in csv.DictReader(f) if r["id"] == rid)


def _step(row: dict[str, str]) -> float:
    o = predict_row(row, cluster_from_row, hardware_db.load_profile)
    assert o.status == "ok", o.status
    return o.result.step_time_s


def test_a_row_in_other_spellings_predicts_the_same_step():
    """nemo2407_h100_05 (Llama-2-7B, fp8) with its cells respelled: same step time."""
    row = _row("nemo2407_h100_05")
    other = dict(row, precision="FP8-hybrid", mlp="SwiGLU", vpp="none", cp="-",
                 sequence_parallel="False", gpu="H100 SXM5", scale_up="NVLink",
                 framework="NeMo_2")
    assert _step(other) == _step(row)
    assert _step(dict(row, vpp="0")) == _step(row)


def test_link_family_names_keep_the_gpus_own_link():
    h100 = hardware_db.build_cluster("h100-sxm", 16, scale_up="nvlink")
    assert h100.node.scale_up.key == "nvlink4"
    assert hardware_db.build_cluster("h100-sxm", 16, scale_up="NVSwitch").node.scale_up.key \
        == "nvlink4"
    assert hardware_db.build_cluster("mi300x", 16, scale_up="xgmi").node.scale_up.kind \
        is LinkKind.XGMI
    assert hardware_db.build_cluster("a100", 8, scale_up="pcie4").node.scale_up.key \
        == "pcie-gen4"
    assert hardware_db.build_cluster("gb200", 72, scale_up="NVL72").node.scale_up.key \
        == "nvlink5-nvl72"
    with pytest.raises(InvalidInputError) as ei:       # an L40S node has no NVLink
        hardware_db.build_cluster("l40s", 8, scale_up="nvlink")
    assert ei.value.field == "scale_up"


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA H200", "h200-sxm")])
def test_gpu_names_as_the_driver_reports_them(name, key):
    assert hardware_db.resolve_gpu_key(name) == key


def test_an_unknown_gpu_behind_a_vendor_prefix_is_still_refused():
    with pytest.raises(InvalidInputError) as ei:
        hardware_db.resolve_gpu_key("NVIDIA RTX 9999")
    assert ei.value.field == "gpu"
