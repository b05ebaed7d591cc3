"""Expert-load spread beyond independent routing, from measured expert loads.

``python -m calibrate.moe_load`` fits the routing spread ``expert_load_cv``
(``simulator/frameworks/moe.json``) and scores the load-imbalance model
(``simulator.workload.moe_load.expected_max_load_ratio``) on held-out data:

* ``moe_expert_load.csv``: per-layer token counts of an 8-expert model trained with an
  auxiliary balancing loss (excess variance over the multinomial, pooled over layers);
* ``moe_load_summary.csv``: MaxVio_global (max over experts of load/mean - 1, over a whole
  validation set, averaged over layers) of 64-expert models, with an auxiliary loss and with
  auxiliary-loss-free bias balancing. The expected maximum of ``E`` experts' loads is
  ``mean * (1 + a_E * rel)`` (``a_E``: expected maximum of ``E`` standard normals), so
  ``rel = MaxVio / a_E``; the multinomial part of ``rel`` is below 1e-3 for any set of a
  million tokens or more and is neglected, leaving ``cv = MaxVio / a_E``.
"""
from __future__ import annotations

import statistics as st
import sys
from typing import Sequence

from simulator.workload.moe_load import expected_max_load_ratio, expected_max_normal

from .csvrows import Row, load_rows, select

FILE = "moe_expert_load.csv"
SUMMARY = "moe_load_summary.csv"


def loads(r: Row) -> list[int]:
    return [int(x) for x in r.data["tokens_per_expert"].split(";")]


def fit_expert_load_cv(rows: Sequence[Row]) -> float:
    """Pooled excess relative variance: per layer, the unbiased variance of the expert loads
    minus the multinomial variance ``N p (1 - p)`` (``p = 1/E``), over the squared mean."""
    excess = []
    for r in rows:
        x = loads(r)
        n, e = sum(x), len(x)
        excess.append((st.variance(x) - n * (1 / e) * (1 - 1 / e)) / st.mean(x) ** 2)
    return max(0.0, st.mean(excess)) ** 0.5


def maxvio_cv(r: Row) -> float:
    """The per-expert spread one MaxVio_global row implies (module docstring)."""
    if r.data["statistic"] != "MaxVio_global":
        raise ValueError(f"{r.file} line {r.line}: statistic {r.data['statistic']!r}, "
                         "expected MaxVio_global")
    return float(r.data["value"]) / expected_max_normal(int(r.data["experts"]))


def fit_maxvio_cv(rows: Sequence[Row]) -> float:
    """Root mean square of the rows' spreads (pooled variance)."""
    return st.mean(maxvio_cv(r) ** 2 for r in rows) ** 0.5


def summary_rows(balancing: str) -> list[Row]:
    return select(load_rows(SUMMARY), lambda d: d["balancing"] == balancing)


def heldout(rows: Sequence[Row]) -> tuple[float, float, float]:
    """Fit on even layers, predict the mean max/mean load ratio of odd layers: (cv, predicted,
    measured). Each layer's experts are the 'ranks' (one expert each)."""
    train, test = rows[0::2], rows[1::2]
    cv = fit_expert_load_cv(train)
    meas = st.mean(max(loads(r)) / st.mean(loads(r)) for r in test)
    x = loads(test[0])
    pred = expected_max_load_ratio(len(x), 1, len(x), st.mean(x), cv)
    return cv, pred, meas


def heldout_maxvio(rows: Sequence[Row]) -> list[tuple[int, float, float]]:
    """Leave one row out: (line, predicted MaxVio from the others' cv, measured)."""
    out = []
    for i, r in enumerate(rows):
        cv = fit_maxvio_cv([x for j, x in enumerate(rows) if j != i])
        out.append((r.line, cv * expected_max_normal(int(r.data["experts"])),
                    float(r.data["value"])))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    rows = load_rows(FILE)
    cv = fit_expert_load_cv(rows)
    h = heldout(rows)
    print(f"aux loss, 8 experts: expert_load_cv = {cv:.4f} ({FILE} lines {rows[0].line}-"
          f"{rows[-1].line}); held-out (fit even layers, predict odd): cv {h[0]:.4f}, "
          f"predicted max/mean {h[1]:.3f}, measured {h[2]:.3f}")
    for bal in ("aux_loss", "loss_free"):
        s = summary_rows(bal)
        held = ", ".join(f"line {ln}: {p:.3f} vs {m:.3f}" for ln, p, m in heldout_maxvio(s))
        print(f"{bal}, {s[0].data['experts']} experts: expert_load_cv = {fit_maxvio_cv(s):.4f} "
              f"({SUMMARY} lines {', '.join(str(r.line) for r in s)}); leave-one-out "
              f"MaxVio predicted vs measured: {held}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
