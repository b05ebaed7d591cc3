"""Routing facts for mixture-of-experts layers, loaded from ``moe.json`` (with sources)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).with_name("moe.json")


@dataclass(frozen=True)
class RoutingFacts:
    """``expert_load_cv``: relative spread of one expert's token load beyond independent
    (multinomial) routing, under auxiliary-loss load balancing."""

    expert_load_cv: float
    why: str


def _load() -> RoutingFacts:
    d = json.loads(DATA.read_text())["expert_load_cv"]
    return RoutingFacts(float(d["value"]), d["source"])


ROUTING = _load()
