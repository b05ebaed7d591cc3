"""Other spellings of a framework name land on the same framework: the same plan, the same
memory conventions, the same host mechanisms (frameworks.json "aliases")."""
from __future__ import annotations

import pytest

from simulator.frameworks.defaults import canonical_framework, framework_names
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan

PAIRS = [("mcore", "megatron-core"), ("megatron_core", "megatron-core"),
         ("megatron_lm", "megatron-lm"), ("megatron", "megatron-lm"), ("nemo2", "nemo"),
         ("NeMo-2", "nemo"), ("transformers", "hf"), ("huggingface", "hf"),
         ("ddp", "pytorch"), ("torch-ddp", "pytorch"), ("pytorch-ddp", "pytorch")]


@pytest.mark.parametrize("alias, name", PAIRS)
def test_alias_is_the_framework(alias, name):
    assert canonical_framework(alias) == name
    assert alias.lower() in framework_names()
    base = Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16, precision="bf16")
    assert with_framework(base, alias) == with_framework(base, name)


def test_an_unknown_name_is_not_silently_a_framework():
    assert canonical_framework("colossalai") == "colossalai"
    assert "colossalai" not in framework_names()
