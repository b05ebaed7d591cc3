"""Shared fixtures for the framework-mechanism tests that run a framework on this CPU."""
from __future__ import annotations

import pytest

WORLD = 4


@pytest.fixture
def fake_world():
    """A fake process group of ``WORLD`` ranks (no communication), torn down afterwards
    unless another test had one up already; yields its size."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    yield dist.get_world_size()
    if ours:
        dist.destroy_process_group()
