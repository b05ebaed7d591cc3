"""torchtitan, plain FSDP2 and plain DDP have behaviour defaults of their own
(frameworks.json "frameworks"), not the unknown-framework fallback: torchtitan's TP plan
shards its norms along the sequence, DDP reduces in 25 MiB buckets."""
from __future__ import annotations

import pytest

from simulator.frameworks.defaults import DEFAULT_FRAMEWORK, framework_defaults
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan


@pytest.mark.parametrize("name", ["torchtitan", "fsdp2", "pytorch", "ddp"])
def test_known_and_sourced(name):
    fw = framework_defaults(name)
    assert fw is not DEFAULT_FRAMEWORK and "unknown framework" not in fw.why


def test_torchtitan_tp_comes_with_sequence_parallelism():
    p = with_framework(Plan(tp=2, dp=4, micro_batch=1, global_batch=16), "torchtitan")
    assert p.sequence_parallel and p.dp_overlap and not p.tp_overlap


def test_ddp_buckets_are_25_mib():
    p = with_framework(Plan(dp=8, micro_batch=1, global_batch=16, precision="bf16"), "ddp")
    assert p.dp_bucket_bytes == 25 * 1024 * 1024
    assert p.bucket_params() == 25 * 1024 * 1024 // p.grad_bytes
