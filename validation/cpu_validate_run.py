"""Issues 3 and 11 "done when" on this CPU: calibrate, then `complexity validate-run` on the
small-kernel regime (tiny models, micro-batch <= 4, seq <= 256) and three small models, single
process and `--nproc 2`; writes validation/cpu_validate_run.json and prints the table.

    python validation/cpu_validate_run.py [--calibration DIR] [--skip-calibrate] [--rounds N]

Every run goes through the CLI exactly as printed in the report. The host is shared: each
run waits for other load to stop (``--wait-quiet``) and its median is over the steps that ran
with low CPU pressure (see calibrate/validate_run.py); ``--rounds`` repeats the whole set
so run-to-run drift shows.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = [  # model, micro-batch, seq, steps, warmup
    # the small-kernel regime (issue 11): 2-4 layers, width <= 256, micro-batch <= 4, seq <= 256
    ("tiny-2l-128", 1, 64, 40, 5),
    ("tiny-2l-128", 1, 256, 30, 5),
    ("tiny-2l-128", 4, 64, 30, 5),
    ("tiny-2l-128", 4, 256, 30, 5),
    ("small-4l-256", 1, 128, 30, 5),
    # the shapes of issue 3
    ("tiny-2l-128", 8, 128, 30, 5),
    ("small-4l-256", 4, 256, 15, 3),
    ("small-6l-512", 2, 512, 8, 2),
]
TARGET = {1: 15.0, 2: 20.0}


def commands(cal: Path) -> list[list[str]]:
    out = []
    for nproc in (1, 2):
        for model, b, s, steps, warm in CONFIGS:
            out.append(["complexity", "validate-run", "--model", model, "--profile",
                        str(cal / "profile.json"), "--nproc", str(nproc), "--micro-batch",
                        str(b), "--seq-len", str(s), "--steps", str(steps), "--warmup",
                        str(warm), "--wait-quiet", "300", "--json"])
    return out


def run(cmd: list[str]) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(cmd)}: {p.stderr.strip()}")
    print(p.stderr.strip().splitlines()[-1], file=sys.stderr, flush=True)
    return json.loads(p.stdout)


def table(results: list[dict]) -> list[str]:
    lines = ["| round | model | nproc | micro-batch | seq | measured s (median) | IQR % | "
             "clean steps | predicted s | error % | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ok = abs(r["error_pct"]) <= TARGET[min(2, r["nproc"])]
        lines.append(
            f"| {r['round']} | {r['model']} | {r['nproc']} | {r['micro_batch']} | "
            f"{r['seq_len']} | {r['measured_step_time_s']:.4f} | {r['measured_iqr_pct']:.1f} | "
            f"{r['measured_clean_steps']}/{len(r['measured_step_times_s'])} | "
            f"{r['predicted_step_time_s']:.4f} | {r['error_pct']:+.1f} | "
            f"{'ok' if ok else 'MISS'} (±{TARGET[min(2, r['nproc'])]:.0f}%) |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibration", default="/tmp/complexity-cpu-calibration")
    ap.add_argument("--skip-calibrate", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="calibrate --quick")
    args = ap.parse_args()
    cal = Path(args.calibration)
    cal_cmd = ["complexity", "calibrate", "--out", str(cal)] + (["--quick"] if args.quick else [])
    cal_s = None
    if not args.skip_calibrate:
        t0 = time.perf_counter()
        subprocess.run(cal_cmd, check=True)
        cal_s = time.perf_counter() - t0
    profiles = {p.name: json.loads(p.read_text()) for p in sorted(cal.glob("profile*.json"))}
    results = []
    for rnd in range(1, args.rounds + 1):
        for cmd in commands(cal):
            res = run(cmd)
            res["round"], res["command"] = rnd, shlex.join(cmd)
            results.append(res)
    out = {"calibrate_command": shlex.join(cal_cmd), "calibrate_wall_s": cal_s,
           "profiles": profiles,
           "results": results}
    (HERE / "cpu_validate_run.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
