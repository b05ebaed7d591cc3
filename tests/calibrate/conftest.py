"""Fixtures of the calibration tests: a synthetic GPU calibration directory (gpu_rows.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from gpu_rows import write_gpu_calibration


@pytest.fixture(scope="module")
def gpu_calibration(tmp_path_factory) -> Path:
    """An 8 x H200 calibration directory (synthetic rows, 2% noise)."""
    return write_gpu_calibration(tmp_path_factory.mktemp("gpu8"))
