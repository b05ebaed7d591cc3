"""Model names as runs and users write them reach the built-in preset (``find_preset``);
a name that is no preset is still modelled when the row gives the dimensions."""
from __future__ import annotations

import csv
from pathlib import Path

import hardware_db
import pytest

from simulator.api.catalog import cluster_from_row
from simulator.validation.predict import predict_row
from simulator.workload.presets import _ALIASES, PRESETS, find_preset, preset_key

RUNS = Path(__file__).resolve().parents[3] / "validation" / "published_runs.csv"


@pytest.mark.parametrize("name, key", [
    ("Llama3-8B", "llama3-8b"), ("meta-llama/Meta-Llama-3-8B", "llama3-8b"),
    ("Llama 3 8B", "llama3-8b"), ("llama3.1-8b", "llama3-8b"),
    ("meta-llama/Llama-3.1-70B-Instruct", "llama3-70b"), ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("deepseek-ai/DeepSeek-V3-Base", "deepseek-v3"), ("bigscience/bloom", "bloom-176b"),
    ("MT-NLG 530B", "mt-nlg-530b")])
def test_spellings_reach_the_preset(name, key):
    assert find_preset(name) is PRESETS[key]


@pytest.mark.parametrize("name", ["qwen2.5-7b", "mistral-7b", "gpt3-5b", "llama4", ""])
def test_other_models_are_not_presets(name):
    assert find_preset(name) is None


def test_keys_and_aliases_are_unambiguous():
    keys = [preset_key(k) for k in PRESETS]
    assert len(set(keys)) == len(keys)
    assert all(a not in keys and v in PRESETS for a, v in _ALIASES.items())


def _row(rid: str) -> dict[str, str]:
    with RUNS.open(newline="") as f:
        return next(r for r in csv.DictReader(f) if r["id"] == rid)


def test_a_row_naming_an_unknown_model_is_built_from_its_dimensions():
    row = _row("nemo2407_h100_11")                  # llama3-8b, dimensions given too
    named = predict_row(row, cluster_from_row, hardware_db.load_profile)
    other = predict_row(dict(row, model="qwen2.5-7b"), cluster_from_row,
                        hardware_db.load_profile)
    assert other.status == "ok" and "is not a preset" in other.chosen
    assert other.inputs.model.n_layers == named.inputs.model.n_layers
    bare = predict_row(dict(row, model="qwen2.5-7b", hidden=""), cluster_from_row,
                       hardware_db.load_profile)
    assert bare.status.startswith("invalid: model") and "missing: hidden" in bare.status


def test_the_command_line_reads_the_same_spellings():
    from simulator.workload import resolve_model
    assert resolve_model("meta-llama/Meta-Llama-3-8B") is PRESETS["llama3-8b"]
    assert resolve_model("Llama-2-7b-hf", seq_len=2048).seq_len == 2048
