"""Expert-load spread beyond independent routing, from measured per-layer expert loads.

``python -m calibrate.moe_load`` fits ``expert_load_cv`` (``simulator/frameworks/moe.json``)
to ``hardware_db/data/measurements/moe_expert_load.csv`` and scores the load-imbalance model
(``simulator.workload.moe_load.expected_max_load_ratio``) on held-out layers.
"""
from __future__ import annotations

import statistics as st
import sys
from typing import Sequence

from simulator.workload.moe_load import expected_max_load_ratio

from .csvrows import Row, load_rows

FILE = "moe_expert_load.csv"


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


def heldout(rows: Sequence[Row]) -> tuple[float, float, float]:
    """Fit on even layers, predict the mean max/mean load ratio of odd layers: (cv, predicted,
    measured). Each layer's experts are the 'ranks' (one expert each)."""
    train, test = rows[0::2], rows[1::2]
    cv = fit_expert_load_cv(train)
    meas = st.mean(max(loads(r)) / st.mean(loads(r)) for r in test)
    x = loads(test[0])
    pred = expected_max_load_ratio(len(x), 1, len(x), st.mean(x), cv)
    return cv, pred, meas


def main(argv: Sequence[str] | None = None) -> int:
    rows = load_rows(FILE)
    cv = fit_expert_load_cv(rows)
    h = heldout(rows)
    print(f"expert_load_cv = {cv:.4f} ({FILE} lines {rows[0].line}-{rows[-1].line}); held-out "
          f"(fit even layers, predict odd): cv {h[0]:.4f}, predicted max/mean {h[1]:.3f}, "
          f"measured {h[2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
