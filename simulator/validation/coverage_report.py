"""The intervals as a product: coverage of the held-out 80 % intervals per source and per
regime feature, a reliability table (nominal vs observed coverage) and its plot."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from ..uncertainty.calibration import Coverage, coverage, coverage_by, reliability
from ..uncertainty.learn import HeldOut
from ..uncertainty.regime import FEATURES
from ..uncertainty.table import ModelFormTable
from .intervals import Learned


def _cov_row(c: Coverage) -> str:
    return (f"| {c.group} | {c.rows} | {c.covered} | {100 * c.fraction:.0f} | "
            f"{100 * c.median_width_frac:.0f} |")


def _cov_table(title: str, rows: Sequence[Coverage]) -> list[str]:
    return [f"| {title} | rows | inside 80 % | coverage % | median width % |",
            "|---|---:|---:|---:|---:|"] + [_cov_row(c) for c in rows] + [""]


def coverage_markdown(learned: Learned, plot_name: str | None) -> list[str]:
    h = learned.heldout
    total = coverage(h)
    hy = learned.table.hyper
    sims = ", ".join(f"{f} {hy.similarity[f]:g}" for f in FEATURES)
    lines = [
        "## 80 % intervals: do they hold?", "",
        "Each row's interval is predicted with its whole source (publication) left out of "
        "the model-form learning, hyperparameters included (nested leave-one-source-out); "
        "the coefficient part comes from the shipped profile. Width = (P90 - P10) / "
        "prediction. A calibrated interval covers about 80 % of the measured step times.", "",
        f"**All rows:** {total.covered} of {total.rows} measured step times inside the 80 % "
        f"interval ({100 * total.fraction:.1f} %), median width {100 * total.median_width_frac:.1f} "
        "% of the prediction.", ""]
    lines += _cov_table("source", coverage_by(h, lambda x: x.record.source))
    for f in FEATURES:
        groups = coverage_by(h, lambda x, f=f: getattr(x.record.regime, f))
        if len(groups) > 1:
            lines += _cov_table(f, groups)
    lines += ["Reliability (nominal vs observed coverage, same held-out intervals):", "",
              "| nominal % | " + " | ".join(f"{100 * q:.0f}" for q, _ in reliability(h)) + " |",
              "|---|" + "---:|" * len(reliability(h)),
              "| observed % | " + " | ".join(f"{100 * o:.0f}" for _, o in reliability(h)) + " |", ""]
    if plot_name:
        lines += [f"![reliability]({plot_name})", ""]
    lines += [f"Learned from all {len(learned.table.records)} rows (what ships in "
              "`simulator/uncertainty/data/model_form.json`): similarity per differing feature "
              f"{sims}; prior {hy.prior_rows:g} pseudo-rows at {hy.prior_scale:g} x the pooled "
              f"spread. The variance is averaged over {len(learned.table.hypers)} such sets "
              "(this fit and one with each source left out: bagging, so a grid choice that "
              "flips on a small residual change moves the interval by a fraction of the "
              "flip; `benchmarks/interval_stability.py` measures it).", ""]
    lines += _novelty_lines(learned.table)
    return lines


def _novelty_lines(table: ModelFormTable) -> list[str]:
    """What a value no validation row has adds (learned by leaving each value out)."""
    cells = []
    for f in FEATURES:
        v, learned = table.novelty_var(f)
        values = {getattr(r.regime, f) for r in table.records}
        why = ("one value in the rows" if len(values) <= 1
               else "no value leaves two sources to learn from")
        how = ("learned" if learned else
               f"assumed: the largest learned ({why})" if v > 0 else f"nothing learned ({why})")
        cells.append(f"| {f} | {v:.4f} | {100 * math.sqrt(v):.1f} | {how} |")
    return ["A value no row has (a GPU family, framework or MoE never validated, a context "
            "bucket no row reaches) widens the model-form part by its novelty variance, "
            "learned by leaving each value of the feature out (gaps clipped at zero, averaged "
            "over the values):", "",
            "| feature | novelty variance (ln time)^2 | as 1 sd % | how |",
            "|---|---:|---:|---|"] + cells + [""]


def plot_reliability(heldout: Sequence[HeldOut], path: str | Path) -> Path | None:
    """Nominal vs observed coverage; None when matplotlib is not installed."""
    try:
        from ..report.plots import _plt, _save
        plt = _plt()
    except Exception:                        # UnsupportedError: the plot extra is missing
        return None
    pts = reliability(heldout)
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    ax.plot([0, 1], [0, 1], ":", color="gray", label="calibrated")
    ax.plot([q for q, _ in pts], [o for _, o in pts], "o-", label=f"held out ({len(heldout)} rows)")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="nominal coverage", ylabel="observed coverage",
           title="interval reliability (leave one source out)")
    ax.legend(fontsize=8)
    return _save(fig, path)
