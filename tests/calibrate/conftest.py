"""Fixtures of the calibration tests: a synthetic GPU calibration directory (gpu_rows.py)."""
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
