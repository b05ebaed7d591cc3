"""Fabric alternatives for ``compare`` and ``search``: lists of oversubscription, rails, NIC
count and speed, node type, expanded into one ``HardwareChoice`` each, so a buyer sees what
every option costs in step time and dollars."""
from __future__ import annotations

import argparse
import itertools
from typing import Any, Sequence

from ..errors import InvalidInputError
from ..planning.capacity import HardwareChoice
from ..search.driver import SearchReport


def add_fabric_alternatives(p: argparse.ArgumentParser, nic_gbps: bool = False) -> None:
    g = p.add_argument_group("fabric alternatives (comma lists; every combination is tried)")
    if nic_gbps:
        g.add_argument("--nic-gbps", default=None, help="NIC rates in Gb/s, e.g. 400,800")
    g.add_argument("--nics-per-node", default=None, help="NICs per node, e.g. 4,8")
    g.add_argument("--oversubscription", default="1",
                   help="leaf-to-spine oversubscription, e.g. 1,2,4 (1 = full bisection)")
    g.add_argument("--rail-optimized", default="yes", help="yes, no or yes,no")
    g.add_argument("--node", default=None, help="node presets, e.g. dgx-b200,gb200-nvl72")


def _floats(text: str | None, field: str) -> list[float | None]:
    if text in (None, ""):
        return [None]
    out = []
    for part in str(text).split(","):
        try:
            v = float(part)
        except ValueError:
            raise InvalidInputError(field, text, "a comma list of positive numbers") from None
        if not v > 0:
            raise InvalidInputError(field, text, "a comma list of positive numbers")
        out.append(v)
    return out


def _rails(text: str) -> list[bool]:
    table = {"yes": True, "true": True, "rail": True, "no": False, "false": False}
    vals = [s.strip().lower() for s in str(text).split(",") if s.strip()]
    if not vals or any(v not in table for v in vals):
        raise InvalidInputError("rail_optimized", text, "yes, no or yes,no")
    return [table[v] for v in vals]


def fabric_choices(a: argparse.Namespace, gpu: str, n_gpus: int,
                   nic_gbps: Sequence[float | None] | None = None) -> list[HardwareChoice]:
    """One choice per combination of the fabric lists on ``a``."""
    gbps = list(nic_gbps) if nic_gbps is not None else _floats(getattr(a, "nic_gbps", None), "nic_gbps")
    nics = [None if v is None else int(v) for v in _floats(a.nics_per_node, "nics_per_node")]
    overs = [v or 1.0 for v in _floats(a.oversubscription, "oversubscription")]
    if any(o < 1.0 for o in overs):
        raise InvalidInputError("oversubscription", a.oversubscription, "numbers >= 1")
    nodes = [s.strip() for s in a.node.split(",")] if a.node else [None]
    combos = itertools.product(gbps, nics, overs, _rails(a.rail_optimized), nodes)
    return [HardwareChoice(gpu, n_gpus, nic_gbps=g, nics_per_node=k, oversubscription=o,
                           rail_optimized=r, node=nd) for g, k, o, r, nd in combos]


def fabric_label(ch: HardwareChoice) -> str:
    parts = [f"{ch.nic_gbps:g}G" if ch.nic_gbps else "default NIC",
             f"{ch.nics_per_node} NICs" if ch.nics_per_node else "",
             f"{ch.oversubscription:g}:1", "rail" if ch.rail_optimized else "no-rail",
             ch.node or ""]
    return " ".join(p for p in parts if p)


def fabric_rows(results: Sequence[tuple[HardwareChoice, SearchReport]]) -> list[dict[str, Any]]:
    rows = []
    for ch, rep in results:
        w = rep.winner
        row: dict[str, Any] = {"fabric": fabric_label(ch), "hardware": ch.label}
        if w is None:
            row["note"] = "no feasible plan: " + rep.rejection_summary()
        else:
            d = w.to_dict()
            row.update(step_time_s=w.step_time_s, tokens_per_s=w.tokens_per_s, mfu=w.mfu,
                       usd_per_million_tokens=d.get("usd_per_million_tokens"),
                       bottleneck=w.main_bottleneck.value, plan=d.get("plan"))
        rows.append(row)
    return rows


def format_fabric_rows(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["", "fabric alternatives (best plan on each):",
             f"{'fabric':36s} {'step s':>9} {'tokens/s':>12} {'MFU%':>5} {'$/1M tok':>9}  bottleneck"]
    for r in rows:
        if "step_time_s" not in r:
            lines.append(f"{r['fabric']:36s} {r['note']}")
            continue
        usd = r.get("usd_per_million_tokens")
        lines.append(f"{r['fabric']:36s} {r['step_time_s']:9.4g} {r['tokens_per_s']:12,.0f} "
                     f"{100 * r['mfu']:5.1f} {'n/a' if usd is None else format(usd, '9.3f'):>9}  "
                     f"{r['bottleneck']}")
    return "\n".join(lines)
