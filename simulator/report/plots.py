"""Pictures (optional extra ``plot``: ``pip install 'complexity-framework[plot]'``).

matplotlib is imported inside each function (Agg backend), so the rest of the package
works without it. The file type follows the extension (``.png``, ``.svg``, ``.pdf``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from .figure import pyplot as _plt
from .figure import save as _save


def plot_scaling(curves: Sequence[Any], path: str | Path) -> Path:
    """Throughput and scaling efficiency vs GPU count, one line per curve."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in curves:
        pts = [p for p in c.points if p.tokens_per_s]
        xs = [p.n_gpus for p in pts]
        label = f"{c.kind.value} ({c.gpu})"
        ax1.plot(xs, [p.tokens_per_s for p in pts], "o-", label=label)
        if pts:
            x0, y0 = pts[0].n_gpus, pts[0].tokens_per_s
            ax1.plot(xs, [y0 * x / x0 for x in xs], ":", color="gray")
        ax2.plot(xs, [100 * p.efficiency for p in pts], "o-", label=label)
    ax1.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="tokens/s",
            title="throughput (dotted: ideal)")
    ax2.axhspan(85, 105, color="#d8f0d8")
    ax2.axhspan(70, 85, color="#f7efcf")
    ax2.axhspan(0, 70, color="#f6d6d6")
    ax2.set(xscale="log", ylim=(0, 105), xlabel="GPUs", ylabel="efficiency %",
            title="scaling efficiency (good / acceptable / poor)")
    from matplotlib.ticker import NullFormatter
    ticks = sorted({p.n_gpus for c in curves for p in c.points})
    for ax in (ax1, ax2):
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_roofline(ops: Sequence[Any], peak_tflops: float, mem_bw_gbytes_per_s: float,
                  path: str | Path, title: str = "roofline", top: int = 10) -> Path:
    """The device roofline with each op of the plan's layer (``whatif.OpRoofline``):
    see ``report.roofline.draw_roofline``."""
    from .roofline import RooflinePoint, draw_roofline
    short = {"forward": "fwd", "backward": "bwd", "recompute": "recompute"}
    pts = [RooflinePoint(f"{o.name} ({short.get(o.phase, o.phase)})", o.flops, o.bytes_moved, o.time_s,
                         o.roofline.value == "memory-bound")
           for o in ops if o.roofline.value in ("compute-bound", "memory-bound")]
    return draw_roofline(pts, {"peak": peak_tflops}, mem_bw_gbytes_per_s, path, title, top)


def plot_search(records: Sequence[Mapping[str, Any]], path: str | Path,
                winner: Mapping[str, Any] | None = None) -> Path:
    """Search space: tokens/s/GPU vs peak memory of every simulated candidate."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ok = [r for r in records if r.get("status") == "ok"]
    pp = sorted({r["pp"] for r in ok})
    sc = ax.scatter([r["peak_memory_bytes"] / 1e9 for r in ok],
                    [r["tokens_per_s_per_gpu"] for r in ok],
                    c=[pp.index(r["pp"]) for r in ok], cmap="viridis", s=10, alpha=0.7)
    if ok:
        ax.axvline(ok[0]["memory_capacity_bytes"] / 1e9, color="red", ls="--", label="GPU memory")
        cb = fig.colorbar(sc, ax=ax, ticks=range(len(pp)))
        cb.ax.set_yticklabels([str(p) for p in pp])
        cb.set_label("pipeline stages (pp)")
    if winner:
        ax.scatter([winner["peak_memory_gb"]], [winner["tokens_per_s_per_gpu"]], marker="*",
                   s=250, color="red", label="winner")
    ax.title.set_fontsize(10)
    ax.set(xlabel="peak memory per GPU (GB)", ylabel="tokens/s per GPU",
           title=f"search space: {len(ok)} feasible plans (analytic); star: event-confirmed winner")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_comparison(rows: Sequence[Any], path: str | Path) -> Path:
    """Bars per hardware choice: throughput, days, cost, energy."""
    plt = _plt()
    ok = [r for r in rows if r.estimate is not None]
    labels = [r.choice.label for r in ok]
    panels = [("tokens/s", [r.estimate.tokens_per_s for r in ok]),
              ("days", [r.estimate.days for r in ok]),
              ("cost (M USD)", [(r.estimate.cost_usd or 0) / 1e6 for r in ok]),
              ("energy (MWh)", [r.estimate.energy_mwh for r in ok])]
    fig, axes = plt.subplots(1, 4, figsize=(14, 4))
    for ax, (name, vals) in zip(axes, panels):
        ax.bar(range(len(vals)), vals, color="tab:blue")
        ax.set_xticks(range(len(vals)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_title(name)
        ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def plot_plan(breakdown: Mapping[str, float], title: str,
              curve: Sequence[tuple[float, float]] = (), curve_labels: tuple[str, str, str] = ("", "", ""),
              hline: float | None = None, log: bool = False, path: str | Path = "plan.png") -> Path:
    """Step-time breakdown of a plan, and optionally one curve (e.g. days vs GPUs)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2 if curve else 1, figsize=(11 if curve else 6, 4))
    ax = axes[0] if curve else axes
    items = [(k.replace("_s", ""), v) for k, v in breakdown.items() if v > 1e-9]
    ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    ax.set(xlabel="seconds per step", title=title)
    ax.invert_yaxis()
    if curve:
        ax2 = axes[1]
        ax2.plot([x for x, _ in curve], [y for _, y in curve], "o-")
        if hline is not None:
            ax2.axhline(hline, color="red", ls="--")
        ax2.set(xlabel=curve_labels[0], ylabel=curve_labels[1], title=curve_labels[2])
        if log:
            ax2.set(xscale="log", yscale="log")
        ax2.grid(True, which="both", alpha=0.3)
    return _save(fig, path)
