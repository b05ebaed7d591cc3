"""Framework defaults and mixed-precision conventions, loaded from ``frameworks.json``.

The JSON holds the facts and their sources; this module only gives them types. Loaded once
at import (a small file; no third-party imports).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

DATA = Path(__file__).with_name("frameworks.json")


@dataclass(frozen=True)
class FrameworkDefaults:
    """What a framework does when the source is silent, with the reason (``why``)."""

    attention: str
    dp_overlap: bool
    tp_overlap: bool
    sp_with_tp: bool | None          # None: not fixed by the framework; choose best feasible
    why: str
    pp_scatter_gather: bool = True
    pp_blocking_p2p: bool = True
    grad_accum_bytes_per_param: float = 0.0
    zero1_allreduce: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FrameworkDefaults":
        return cls(**{k: v for k, v in d.items() if k != "source"}, why=d["source"])


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer state, before sharding."""

    weights: float
    grads: float
    optimizer: float


@dataclass(frozen=True)
class CrossEntropyBytes:
    """Memory traffic and saved bytes of the loss, per logit."""

    fwd_bytes_per_logit: float
    bwd_bytes_per_logit: float
    saved_bytes_per_logit: float
    kernels: int


@dataclass(frozen=True)
class WorkspaceRule:
    """Transient memory: copies of the largest activation tensor and DP buckets."""

    largest_tensor_copies: int
    comm_buckets: int
    bucket_bytes_per_param: int


@dataclass(frozen=True)
class Conventions:
    state_mixed: StateBytes
    state_fp32: StateBytes
    optimizer_traffic_mixed_bytes_per_param: float
    optimizer_traffic_fp32_bytes_per_param: float
    cross_entropy: CrossEntropyBytes
    workspace: WorkspaceRule


def _strip(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "source"}


def _load() -> tuple[dict[str, FrameworkDefaults], FrameworkDefaults, Conventions]:
    data = json.loads(DATA.read_text())
    fws = {k: FrameworkDefaults.from_dict(v) for k, v in data["frameworks"].items()}
    c = data["conventions"]
    sb, traffic = c["state_bytes_per_param"], c["optimizer_step_traffic_bytes_per_param"]
    conv = Conventions(StateBytes(**sb["mixed"]), StateBytes(**sb["fp32"]),
                       float(traffic["mixed"]), float(traffic["fp32"]),
                       CrossEntropyBytes(**_strip(c["cross_entropy"])),
                       WorkspaceRule(**_strip(c["workspace"])))
    return fws, FrameworkDefaults.from_dict(data["default_framework"]), conv


FRAMEWORKS, DEFAULT_FRAMEWORK, CONVENTIONS = _load()
