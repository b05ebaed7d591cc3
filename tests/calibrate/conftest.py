"""Fixtures of the calibration tests: a synthetic GPU calibration directory (gpu_rows.py)."""
from __future__ import annotations

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
