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
         ("ddp", "pytorch"), ("torch-ddp", "pytorch"), ("pytorch-ddp", "pytorch"),
         ("FSDP", "fsdp"), ("pytorch_fsdp", "fsdp"), ("torch fsdp2", "fsdp2"),
         ("Megatron-Bridge", "nemo"), ("nemo_1", "nemo"), ("composer", "llm-foundry"),
         ("DS", "deepspeed"), ("accelerate", "hf"), ("FSDP_1", "fsdp"),
         ("GPT-NeoX", "megatron-deepspeed"), ("neox", "megatron-deepspeed")]


@pytest.mark.parametrize("alias, name", PAIRS)
def test_alias_is_the_framework(alias, name):
    assert canonical_framework(alias) == name
    base = Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16, precision="bf16")
    assert with_framework(base, alias) == with_framework(base, name)


def test_an_unknown_name_is_not_silently_a_framework():
    assert canonical_framework("colossalai") == "colossalai"
    assert "colossalai" not in framework_names()


def test_megatron_lm_on_fp8_hardware_is_megatron_core():
    """frameworks.json "eras": Megatron-LM gained FlashAttention and Transformer Engine in
    December 2022, before any FP8-capable GPU shipped, so a Megatron-LM run on such a GPU
    or in FP8 gets Megatron-Core's defaults; on an A100 in bf16 it stays Megatron-LM
    2021-22 (fused-softmax attention, the SC21 and Korthikanti rows)."""
    from simulator.frameworks.defaults import framework_for_hardware
    for name in ("megatron", "Megatron-LM", "megatron_lm"):
        assert framework_for_hardware(name, True, "bf16") == "megatron-core"
        assert framework_for_hardware(name, False, "fp8") == "megatron-core"
        assert framework_for_hardware(name, False, "bf16") == name
    for name in ("nemo", "deepspeed", "megatron-deepspeed", "fsdp2", ""):
        assert framework_for_hardware(name, True, "fp8") == name
    base = Plan(tp=2, dp=4, micro_batch=1, global_batch=16, precision="bf16")
    assert with_framework(base, "megatron-lm").attention.value == "materialized"
    assert with_framework(base, framework_for_hardware("megatron-lm", True, "bf16")) == \
        with_framework(base, "megatron-core")
