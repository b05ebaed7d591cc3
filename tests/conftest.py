"""Shared fixtures: small models, clusters and profiles built from the shipped data."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

import hardware_db
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec, get_preset


@pytest.fixture(scope="session")
def a100_profile():
    return hardware_db.load_profile("a100-sxm-80gb")


@pytest.fixture(scope="session")
def h100_profile():
    return hardware_db.load_profile("h100-sxm")


@pytest.fixture
def gpt_small() -> TransformerSpec:
    """A 12-layer GPT-style model small enough to simulate in milliseconds."""
    return TransformerSpec("gpt-small", n_layers=12, hidden=2048, ffn_hidden=8192, n_heads=16,
                           n_kv_heads=16, vocab=51200, seq_len=2048)


@pytest.fixture
def llama_small() -> TransformerSpec:
    return get_preset("llama2-7b")


def plan(**kw) -> Plan:
    """A Plan with test defaults (bf16, 1F1B)."""
    return Plan(**kw)


@pytest.fixture(scope="session")
def host_mechanism_rows() -> dict[int, dict[str, str]]:
    """hardware_db/data/measurements/host_mechanisms.csv by line (the header is line 1), as
    the frameworks.json sources cite them."""
    path = Path(__file__).resolve().parents[1] / "hardware_db" / "data" / "measurements" / \
        "host_mechanisms.csv"
    with path.open(newline="") as fh:
        return dict(enumerate(csv.DictReader(fh), start=2))
