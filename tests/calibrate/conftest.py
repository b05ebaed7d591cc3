"""Fixtures of the calibration tests: a synthetic GPU calibration directory (gpu_rows.py),
DeepSpeed absent or on a fake process group, a child interpreter for Megatron-Core."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_rows import write_gpu_calibration


@pytest.fixture(scope="module")
def gpu_calibration(tmp_path_factory) -> Path:
    """An 8 x H200 calibration directory (synthetic rows, 2% noise)."""
    return write_gpu_calibration(tmp_path_factory.mktemp("gpu8"))


@pytest.fixture
def without_deepspeed(monkeypatch):
    """Imports of deepspeed fail (as where it is not installed), on its CPU accelerator's
    setting; both restored afterwards."""
    import builtins
    real = builtins.__import__

    def no_deepspeed(name, *a, **k):
        if name == "deepspeed" or name.startswith("deepspeed."):
            raise ImportError("not here")
        return real(name, *a, **k)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(builtins, "__import__", no_deepspeed)


@pytest.fixture
def fake_pg(monkeypatch, request):
    """DeepSpeed on its CPU accelerator over a fake process group of 2 ranks (or
    ``request.param``), torn down after, with torch's thread count put back (the benches
    run on one thread process-wide); skipped where DeepSpeed does not import."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from calibrate.bench_deepspeed import available
    why = available()
    if why:
        pytest.skip(why)
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    world = getattr(request, "param", 2)
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", str(world)),
                 ("LOCAL_SIZE", "1")):
        monkeypatch.setenv(k, v)                # restored afterwards, as the bench sets them
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    elif dist.get_world_size() != world:
        pytest.skip(f"a process group of {dist.get_world_size()} ranks is up already")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    if ours:
        from deepspeed.utils import groups
        dist.destroy_process_group()
        release = getattr(groups, "_release_process_group_references", None)
        if release:
            release()


@pytest.fixture
def megatron_child():
    """``run(code, why)``: ``code`` run by a fresh interpreter at the repository root (the
    Megatron-Core benches' CPU stand-ins patch torch for the whole process), whose stdout
    ends in 'JSON' and an object, returned; skipped with ``why`` when that is not empty
    (Megatron-Core not importable)."""
    root = Path(__file__).resolve().parents[2]

    def run(code: str, why: str) -> dict:
        if why:
            pytest.skip(why)
        r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                           text=True, timeout=600, check=False,
                           env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.split("JSON", 1)[1])
    return run
