"""``complexity report --html``: the validation report as one self-contained HTML page with
its plots (PNG, embedded): predicted against measured step time per row, the error per
source, and every row's signed error. matplotlib is imported lazily.
"""
from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path

from ..report.figure import pyplot as _plt
from .predict import RowOutcome, outcome_columns, summary_line
from .report import source_family


def _points(outcomes: list[RowOutcome]) -> list[tuple[str, str, float, float, float]]:
    """(id, source, measured s, predicted s, error %) of every modelled row."""
    out = []
    for o in outcomes:
        c = outcome_columns(o)
        try:
            meas, pred = float(o.row.get("measured_step_time_s") or ""), float(c["predicted_step_time_s"])
        except ValueError:
            continue
        if o.error_pct is not None:
            out.append((o.row.get("id", "?"), source_family(o.row), meas, pred, o.error_pct))
    return out


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _scatter(pts) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 6))
    by_src = defaultdict(list)
    for p in pts:
        by_src[p[1]].append(p)
    for src in sorted(by_src):
        ax.scatter([p[2] for p in by_src[src]], [p[3] for p in by_src[src]], s=22, label=src)
    lo = min(min(p[2], p[3]) for p in pts) / 1.3
    hi = max(max(p[2], p[3]) for p in pts) * 1.3
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.85",
                    label="within 10 %")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured step time (s)", ylabel="predicted step time (s)",
           title="predicted vs measured, per published run")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _per_source(pts) -> str:
    plt = _plt()
    groups = defaultdict(list)
    for p in pts:
        groups[p[1]].append(p[4])
    names = sorted(groups)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    mape = [sum(abs(e) for e in groups[n]) / len(groups[n]) for n in names]
    bias = [sum(groups[n]) / len(groups[n]) for n in names]
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], mape, height=0.4, label="MAPE %")
    ax.barh([i - 0.2 for i in y], bias, height=0.4, label="mean signed error %")
    ax.set_yticks(list(y), [f"{n} ({len(groups[n])})" for n in names], fontsize=8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="%", title="error per source (rows)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _per_row(pts) -> str:
    plt = _plt()
    rows = sorted(pts, key=lambda p: p[4])
    fig, ax = plt.subplots(figsize=(8, 0.16 * len(rows) + 1.5))
    ax.barh(range(len(rows)), [p[4] for p in rows],
            color=["tab:red" if p[4] < 0 else "tab:blue" for p in rows])
    ax.set_yticks(range(len(rows)), [p[0] for p in rows], fontsize=6)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="signed error % (predicted - measured) / measured", title="every row")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def write_html(outcomes: list[RowOutcome], markdown_text: str, out_dir: Path) -> Path:
    """``out_dir/report.html``: the plots, then the Markdown report as preformatted text."""
    pts = _points(outcomes)
    imgs = [_scatter(pts), _per_source(pts), _per_row(pts)] if pts else []
    body = "\n".join(f'<p><img alt="validation plot" src="data:image/png;base64,{b}"></p>'
                     for b in imgs)
    page = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Validation report"
            f"</title></head>\n<body style=\"font-family: sans-serif; max-width: 70em\">\n"
            f"<h1>Validation report</h1>\n<p>{html.escape(summary_line(outcomes))}</p>\n{body}\n"
            f"<pre>{html.escape(markdown_text)}</pre>\n</body></html>\n")
    path = out_dir / "report.html"
    path.write_text(page)
    return path
