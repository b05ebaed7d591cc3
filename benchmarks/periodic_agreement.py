"""Fast path vs reference path of the event engine on the published runs, through the
predict path (``complexity predict``): every row predicted twice in one process, once with
the fast path (the sweep, ``engine.sweep``, and for long plans the periodic plays of
``engine.periodic``) and once playing every task on the event engine; prints the
relative difference of the predicted step time per row, the largest one, how many
simulations the fast path served, and the wall time of both. ``--force`` lowers the fast
path's thresholds (``MIN_ROUNDS``, ``MIN_PASSES``) to zero, so every simulation long enough
for three plays takes it: a stronger check than the shipped thresholds allow.

    python benchmarks/periodic_agreement.py [--runs validation/published_runs.csv]
"""
from __future__ import annotations

import argparse
import importlib
import time

from simulator.api.catalog import cluster_from_row, load_profile_for
from simulator.engine import periodic
from simulator.validation.predict import predict_row, read_rows

SIM = importlib.import_module("simulator.engine.simulate")


def _predict_all(rows, fast: bool) -> tuple[list, float, int]:
    served = []
    real = SIM._periodic_step

    def counted(*a, **k):
        out = real(*a, **k) if fast else None
        served.append(out is not None)
        return out

    SIM._periodic_step = counted
    try:
        t0 = time.perf_counter()
        outs = [predict_row(r, cluster_from_row, lambda key: load_profile_for(key, None))
                for r in rows]
        return outs, time.perf_counter() - t0, sum(served)
    finally:
        SIM._periodic_step = real


TOLERANCE = 1e-9     # fast and reference paths play the same recursion: float rounding only


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="validation/published_runs.csv")
    ap.add_argument("--force", action="store_true", help="fast path wherever it can run")
    args = ap.parse_args()
    if args.force:
        periodic.MIN_ROUNDS = periodic.MIN_PASSES = SIM.SWEEP_ROUNDS = 0
    rows = read_rows(args.runs)
    fast, t_fast, served = _predict_all(rows, True)
    ref, t_ref, _ = _predict_all(rows, False)
    worst, bad = 0.0, []
    for a, b in zip(fast, ref):
        if b.result is None or a.result is None or "internal" in f"{a.status} {b.status}":
            print(f"{b.row.get('id', '?'):40s} fast: {a.status}; reference: {b.status}")
            if "internal" in f"{a.status} {b.status}" or (a.result is None) != (b.result is None):
                bad.append(b.row.get("id", "?"))
            continue
        rel = abs(a.result.step_time_s / b.result.step_time_s - 1)
        worst = max(worst, rel)
        same = "" if a.chosen == b.chosen else "  (different plan chosen!)"
        print(f"{b.row.get('id', '?'):40s} ref {b.result.step_time_s:10.4f} s  "
              f"fast {a.result.step_time_s:10.4f} s  rel {rel:.2e}{same}")
    print(f"rows {len(rows)}; simulations served by the fast path {served}"
          f"{' (thresholds forced to 0)' if args.force else ''}; "
          f"max relative difference {worst:.2e}; predict wall fast {t_fast:.1f} s, "
          f"reference {t_ref:.1f} s (ratio {t_ref / t_fast:.2f})")
    if bad or worst > TOLERANCE:
        print(f"FAILED: {len(bad)} row(s) with an internal error or only one path modelled "
              f"({', '.join(bad[:5])}); max relative difference {worst:.2e} "
              f"(tolerance {TOLERANCE:g})")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
