"""The simulated step as a picture, for people who do not open Perfetto
(``simulate --plot step.png``): a Gantt chart with one row per stage and track (the same
tracks as the trace: engine resources, then each parallel group's collectives; link
tracks are left out, they repeat the collectives) and, below it, each stage's memory over
the step. matplotlib is imported lazily.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from ..engine.result import Result
from ..errors import InvalidInputError
from .figure import pyplot as _plt
from .figure import save as _save
from .trace import _track_name, _track_rank

COLORS = {"fwd": "tab:blue", "bwd": "tab:green", "bwd_input": "tab:green",
          "bwd_weight": "tab:brown", "pp_send": "tab:purple", "pp_recv": "tab:purple",
          "dp_comm": "tab:orange", "optimizer": "tab:red", "interference": "tab:gray",
          "collective": "tab:orange"}
GROUP_COLORS = {"tp": "tab:cyan", "cp": "tab:olive", "ep": "tab:pink", "dp": "tab:orange",
                "pp": "tab:purple"}


def _rows(result: Result) -> dict[tuple[int, int, str], list[dict[str, Any]]]:
    rows: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in result.timeline:
        if "resource" not in r or r.get("kind") == "link_use":
            continue
        stage = int(r.get("stage", 0))
        name = _track_name(r["resource"], stage)
        rows[(stage, _track_rank(name), name)].append(r)
    return rows


def _color(r: dict[str, Any]) -> str:
    if r.get("kind") == "collective":
        return GROUP_COLORS.get(r.get("group", ""), "tab:orange")
    return COLORS.get(r.get("kind", ""), "0.6")


def _gantt(ax, rows, scale: float, unit: str) -> None:
    keys = sorted(rows)
    for y, key in enumerate(keys):
        recs = rows[key]
        ax.broken_barh([(r["start_s"] * scale, (r["end_s"] - r["start_s"]) * scale) for r in recs],
                       (y - 0.4, 0.8), facecolors=[_color(r) for r in recs], linewidth=0)
    ax.set_yticks(range(len(keys)), [f"stage {s}: {name}" for s, _, name in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"time in the step ({unit})")
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=k) for k, c in
               (("forward", "tab:blue"), ("backward", "tab:green"), ("pipeline send", "tab:purple"),
                ("optimizer", "tab:red"), ("interference", "tab:gray"))]
    if any(r.get("kind") == "bwd_weight" for recs in rows.values() for r in recs):
        handles.insert(2, Patch(color=COLORS["bwd_weight"], label="weight gradient (W)"))
    handles += [Patch(color=c, label=f"{g} collective")
                for g, c in GROUP_COLORS.items() if any(k[2] == f"comm {g}" for k in keys)]
    ax.legend(handles=handles, fontsize=7, ncol=min(6, len(handles)), loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(keys) < 12 else -0.05))
    ax.grid(True, axis="x", alpha=0.3)


def _memory(ax, result: Result, scale: float, unit: str) -> None:
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in result.timeline:
        if r.get("counter") == "memory_bytes":
            per[int(r["stage"])].append((r["t_s"] * scale, r["value"] / 1e9))
    for s in sorted(per):
        pts = sorted(per[s]) + [(result.step_time_s * scale, sorted(per[s])[-1][1])]
        ax.step([t for t, _ in pts], [v for _, v in pts], where="post", lw=1, label=f"stage {s}")
    ax.axhline(result.memory_capacity_bytes / 1e9, color="red", ls="--", lw=1,
               label="GPU memory")
    ax.set(xlabel=f"time in the step ({unit})", ylabel="GB held (one rank)")
    ax.legend(fontsize=7, ncol=min(8, len(per) + 1))
    ax.grid(True, alpha=0.3)


def plot_timeline(result: Result, path: str | Path, title: str = "simulated step") -> Path:
    """Gantt chart per stage and track, and memory per stage over the step."""
    rows = _rows(result)
    if not rows:
        raise InvalidInputError("engine", result.engine, "the event engine (its timeline is "
                                "what --plot draws)")
    plt = _plt()
    scale, unit = (1.0, "s") if result.step_time_s >= 2 else (1e3, "ms")
    height = 2.5 + 0.22 * len(rows)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, height + 3),
                                  gridspec_kw={"height_ratios": [height, 3]}, sharex=True)
    _gantt(ax, rows, scale, unit)
    ax.set_title(f"{title}: step {result.step_time_s:.4g} s, {result.num_microbatches} "
                 f"micro-batches", fontsize=10)
    _memory(ax2, result, scale, unit)
    return _save(fig, path)
