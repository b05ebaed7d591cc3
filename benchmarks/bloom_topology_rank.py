"""Does the simulator order the BLOOM-176B topology sweep the way the measurements do?

Predicts the five ``bloom_topo_0228_*`` rows and ``bloom176b_final`` of
``published_runs.csv`` (same model, 384 A100-80GB, different tp/pp/dp, head counts and
micro-batch) with ``simulator.validation.predict.predict_row`` and prints each predicted vs measured
step time and Kendall's tau between the two orders (scipy.stats.kendalltau; tau-b, so
tied measurements count as ties).

    python benchmarks/bloom_topology_rank.py [--runs PATH] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_RUNS = ROOT.parent / "shared" / "validation" / "published_runs.csv"
ROW_IDS = ("bloom_topo_0228_01", "bloom_topo_0228_02", "bloom_topo_0228_03",
           "bloom_topo_0228_04", "bloom_topo_0228_05", "bloom176b_final")


def rank_agreement(runs: Path) -> dict:
    from scipy.stats import kendalltau

    import hardware_db
    from simulator.api.catalog import cluster_from_row
    from simulator.validation.predict import predict_row, read_rows

    rows = {r["id"]: r for r in read_rows(runs)}
    missing = [i for i in ROW_IDS if i not in rows]
    if missing:
        raise SystemExit(f"rows not in {runs}: {', '.join(missing)}")
    table = []
    for rid in ROW_IDS:
        o = predict_row(rows[rid], cluster_from_row, hardware_db.load_profile)
        r = rows[rid]
        table.append({"id": rid, "tp": r["tp"], "pp": r["pp"], "dp": r["dp"],
                      "n_heads": r["n_heads"], "micro_batch": r["micro_batch"],
                      "measured_step_time_s": float(r["measured_step_time_s"]),
                      "predicted_step_time_s": o.result.step_time_s if o.result else None,
                      "status": o.status})
    ok = [t for t in table if t["predicted_step_time_s"] is not None]
    tau, p = kendalltau([t["measured_step_time_s"] for t in ok],
                        [t["predicted_step_time_s"] for t in ok])
    return {"rows": table, "kendall_tau": float(tau), "p_value": float(p), "n": len(ok)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = rank_agreement(a.runs)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'row':20s} {'tp':>3} {'pp':>3} {'dp':>3} {'heads':>5} {'mb':>3} "
          f"{'measured s':>11} {'predicted s':>12}")
    for t in res["rows"]:
        pred = f"{t['predicted_step_time_s']:12.2f}" if t["predicted_step_time_s"] else f"{t['status']:>12}"
        print(f"{t['id']:20s} {t['tp']:>3} {t['pp']:>3} {t['dp']:>3} {t['n_heads']:>5} "
              f"{t['micro_batch']:>3} {t['measured_step_time_s']:11.2f} {pred}")
    print(f"Kendall tau (measured vs predicted step time, n={res['n']}): "
          f"{res['kendall_tau']:.3f} (p={res['p_value']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
