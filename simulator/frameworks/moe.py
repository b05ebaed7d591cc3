"""Routing facts for mixture-of-experts layers, loaded from ``moe.json`` (with sources)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).with_name("moe.json")


@dataclass(frozen=True)
class RoutingFacts:
    """Relative spread of one expert's token load beyond independent (multinomial) routing
    (``expert_load_cv``): measured ``(experts, cv)`` points under an auxiliary balancing loss
    (``aux_points``, ascending in experts) and one value under auxiliary-loss-free bias
    balancing (``loss_free_cv``)."""

    aux_points: tuple[tuple[int, float], ...]
    loss_free_cv: float
    why: str

    def expert_load_cv(self, experts: int, loss_free: bool = False) -> float:
        """The spread for a layer of ``experts`` routed experts: log-linear in the expert
        count between the measured aux-loss points, flat outside them (assumed,
        ``moe.json`` ``aux_loss_between``); ``loss_free``: the bias-balanced value."""
        if loss_free:
            return self.loss_free_cv
        pts = self.aux_points
        if experts <= pts[0][0]:
            return pts[0][1]
        for (e0, c0), (e1, c1) in zip(pts, pts[1:]):
            if experts <= e1:
                f = math.log(experts / e0) / math.log(e1 / e0)
                return c0 * (c1 / c0) ** f
        return pts[-1][1]


def _load() -> RoutingFacts:
    d = json.loads(DATA.read_text())["expert_load_cv"]
    pts = tuple(sorted((int(p["experts"]), float(p["value"])) for p in d["aux_loss"]))
    why = " | ".join([p["source"] for p in d["aux_loss"]] + [d["aux_loss_between"],
                                                              d["loss_free"]["source"]])
    return RoutingFacts(pts, float(d["loss_free"]["value"]), why)


ROUTING = _load()
