"""``--dp-overlap`` forces the gradient reduction to overlap the backward where the
framework's default does not (DeepSpeed below ZeRO-3 with ``overlap_comm: true``), and
``--no-dp-overlap`` forces it off; the two are exclusive."""
from __future__ import annotations

import argparse

import pytest

from simulator.cli.commands import _simulate_args, plan_from_args


def _plan(*flags: str):
    p = argparse.ArgumentParser()
    _simulate_args(p)
    a = p.parse_args(["--gpu", "a100-sxm-80gb", "--gpus", "16", "--model", "llama2-7b",
                      "--global-batch", "64", "--precision", "bf16", *flags])
    return plan_from_args(a, 16)


def test_framework_default_then_either_flag_wins():
    assert _plan("--framework", "deepspeed").dp_overlap is False      # overlap_comm off < Z3
    assert _plan("--framework", "deepspeed", "--dp-overlap").dp_overlap is True
    assert _plan("--framework", "megatron-core").dp_overlap is True
    assert _plan("--framework", "megatron-core", "--no-dp-overlap").dp_overlap is False
    assert _plan().dp_overlap is True and _plan("--no-dp-overlap").dp_overlap is False


def test_the_flags_are_exclusive():
    with pytest.raises(SystemExit):
        _plan("--dp-overlap", "--no-dp-overlap")
