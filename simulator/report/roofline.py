"""A roofline picture people can read (``bottleneck --plot``, ``analyze --plot``).

Left: the device roofline (one roof per precision) with every op that does FLOPs at
(FLOP per byte, achieved TFLOP/s), sized by its time; the ``top`` ops by time are labelled
from a column beside the axes, in the order of their heights, with leader lines, so labels
never overlap however the points cluster. Below: ops with no FLOPs (norms, softmax,
copies, optimizer traffic) have no place on a roofline, so they are shown as the memory
bandwidth they achieve against the HBM peak, the ``top`` of them by time.
matplotlib is imported lazily (``figure.pyplot``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .figure import pyplot as _plt
from .figure import save as _save


@dataclass(frozen=True)
class RooflinePoint:
    name: str
    flops: float
    bytes_moved: float
    time_s: float
    memory_bound: bool

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved > 0 else float("inf")

    @property
    def achieved_tflops(self) -> float:
        return self.flops / self.time_s / 1e12

    @property
    def achieved_gbytes_per_s(self) -> float:
        return self.bytes_moved / self.time_s / 1e9


def short(name: str, n: int = 32) -> str:
    """``name`` in at most ``n`` characters, keeping its head and tail (module and op)."""
    if len(name) <= n:
        return name
    head = (n - 1) // 2
    return name[:head] + "\u2026" + name[-(n - 1 - head):]


def label_column(ax, points: Sequence[tuple[float, float, str]], x_text: float = 1.03) -> None:
    """Label data points from a column right of ``ax`` (axes fraction ``x_text``), one
    evenly spaced row per label in the points' height order, each with a leader line."""
    pts = sorted(points, key=lambda p: (p[1], p[0], p[2]))
    for k, (x, y, text) in enumerate(pts):
        ax.annotate(text, xy=(x, y), xycoords="data", xytext=(x_text, (k + 0.5) / len(pts)),
                    textcoords="axes fraction", fontsize=7, va="center", ha="left",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5",
                                "shrinkA": 0, "shrinkB": 2})


def _roofs(ax, roofs: Mapping[str, float], bw_gbytes_per_s: float, xs: list[float]) -> None:
    for label, peak in sorted(roofs.items(), key=lambda kv: -kv[1]):
        ax.plot(xs, [min(peak, x * bw_gbytes_per_s / 1e3) for x in xs], lw=1.2,
                label=f"roof {label} ({peak:g} TFLOP/s)")
        ax.axvline(peak * 1e3 / bw_gbytes_per_s, color="0.7", ls=":", lw=0.8)


def _x_range(pts: list[RooflinePoint], roofs: Mapping[str, float], bw: float) -> list[float]:
    """Log-spaced intensities spanning the points and every ridge, a decade either side."""
    import math
    ridges = [peak * 1e3 / bw for peak in roofs.values()]
    vals = [p.intensity for p in pts if math.isfinite(p.intensity)] + ridges
    lo, hi = math.floor(math.log10(min(vals))) - 1, math.ceil(math.log10(max(vals))) + 1
    return [10 ** (lo + i * (hi - lo) / 100) for i in range(101)]


def _flop_panel(ax, pts: list[RooflinePoint], roofs, bw, top: int, title: str) -> None:
    _roofs(ax, roofs, bw, _x_range(pts, roofs, bw))
    mx = max((p.time_s for p in pts), default=1.0)
    for bound, color in ((False, "tab:blue"), (True, "tab:red")):
        sel = [p for p in pts if p.memory_bound == bound]
        ax.scatter([p.intensity for p in sel], [p.achieved_tflops for p in sel],
                   s=[12 + 220 * p.time_s / mx for p in sel], color=color, alpha=0.6)
        ax.scatter([], [], s=30, color=color, alpha=0.6,
                   label="memory-bound" if bound else "compute-bound")
    best = sorted(pts, key=lambda p: (-p.time_s, p.name))[:top]
    label_column(ax, [(p.intensity, p.achieved_tflops,
                       f"{short(p.name)}  {p.time_s * 1e3:.3g} ms") for p in best])
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)",
           ylabel="achieved TFLOP/s", title=f"{title}: top {len(best)} of {len(pts)} ops by time")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)


def _bandwidth_panel(ax, pts: list[RooflinePoint], bw: float, top: int) -> None:
    best = sorted(pts, key=lambda p: (-p.time_s, p.name))[:top][::-1]
    ax.barh(range(len(best)), [p.achieved_gbytes_per_s for p in best], color="tab:orange")
    ax.set_yticks(range(len(best)), [f"{short(p.name, 28)}  {p.time_s * 1e3:.3g} ms" for p in best],
                  fontsize=7)
    ax.axvline(bw, color="k", lw=1.2, label=f"HBM {bw:g} GB/s")
    ax.set(xlabel="achieved GB/s", title=f"ops without FLOPs: top {len(best)} of {len(pts)} by time")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)


def draw_roofline(points: Sequence[RooflinePoint], roofs: Mapping[str, float],
                  mem_bw_gbytes_per_s: float, path: str | Path, title: str = "roofline",
                  top: int = 10) -> Path:
    plt = _plt()
    timed = [p for p in points if p.time_s > 0 and p.bytes_moved > 0]
    flop = [p for p in timed if p.flops > 0]
    zero = [p for p in timed if p.flops <= 0]
    if zero:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 9.5),
                                      gridspec_kw={"height_ratios": [1.5, 1], "hspace": 0.3})
        _bandwidth_panel(ax2, zero, mem_bw_gbytes_per_s, top)
    else:
        fig, ax = plt.subplots(figsize=(11, 5.5))
    _flop_panel(ax, flop, roofs, mem_bw_gbytes_per_s, top, title)
    fig.subplots_adjust(left=0.3 if zero else 0.08, right=0.68)
    return _save(fig, path, tight=False)
