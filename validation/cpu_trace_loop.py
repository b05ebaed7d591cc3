"""The trace loop on this CPU (issue 18, "done when"): record the validate-run training step
of three shapes with `--trace-out` (1 process, then 2 gloo processes), fit a profile from
each shape's trace alone, predict the other two shapes, and compare with their measured
(unprofiled) steps; the doctor's explained fraction per trace; and the doctor on a run whose
gradient all-reduce runs after backward (`--bucket-cap-mb 1000`: one bucket).

    python validation/cpu_trace_loop.py --profile CALIB/profile.json --dir /tmp/loop \
        [--reuse] > validation/cpu_trace_loop.json

`--profile` is only what validate-run needs to run (its own prediction is not used here).
`--reuse` keeps traces already in `--dir` whose run had at least 3 clean timed steps and
2 clean traced steps; `--refit-only` keeps every trace there (refit and predict only).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = {"tiny-2l-128": (8, 128), "small-4l-256": (4, 256), "small-6l-512": (2, 512)}
NO_OVERLAP = ("small-4l-256", 2, 4, 1000)   # (model, ranks, micro-batch, bucket_cap_mb)
TRIES = 2


def clean(trace) -> bool:
    """At least 3 clean timed steps and 2 clean traced steps (host CPU pressure)."""
    from calibrate.trace_import import read_json
    from calibrate.trace_stats import CLEAN_PRESSURE
    meta = read_json(trace).get("complexity", {})
    traced = sum(s["pressure"] <= CLEAN_PRESSURE for s in meta.get("traced_steps", []))
    return meta.get("unprofiled_clean_steps", 0) >= 3 and traced >= 2


def record(model, nproc, mb, seq, profile, trace, reuse, bucket=25):
    from calibrate.trace_import import read_json
    from calibrate.validate_run import validate_run
    if not (reuse and trace.is_file() and (reuse == "all" or clean(trace))):
        for _ in range(TRIES):
            validate_run(model, profile, nproc=nproc, micro_batch=mb, seq_len=seq, steps=10,
                         warmup=3, wait_quiet_s=90, trace_out=trace, bucket_cap_mb=bucket)
            if clean(trace):
                break
    meta = read_json(trace)["complexity"]
    return meta["unprofiled_median_step_s"], meta["unprofiled_clean_steps"]


def traced_step_s(trace) -> float:
    """Median over the clean traced steps of (step - the profiler's estimated own cost)."""
    import statistics

    from calibrate.trace_import import load_trace
    from calibrate.trace_stats import clean_steps, event_cost, measure_step
    tr = load_trace(trace)
    steps, _ = clean_steps(tr)
    cost, _ = event_cost(tr, steps)
    return statistics.median(m.wall_s - m.profiler_s for m in
                             (measure_step(tr, s, cost) for s in steps))


def loop(nproc, profile, d, reuse):
    from calibrate.doctor import diagnose
    from calibrate.trace_import import load_trace
    from calibrate.trace_profile import calibrate_from_trace
    from calibrate.validate_run import plan_for, predict, run_spec
    from simulator.hardware.specs import ClusterSpec
    measured, traced = {}, {}
    out = {"nproc": nproc, "measured": {}, "predictions": [], "doctor": {}}
    for name, (mb, seq) in SHAPES.items():
        t, n_clean = record(name, nproc, mb, seq, profile, d / f"{name}-p{nproc}.json", reuse)
        measured[name], traced[name] = t, traced_step_s(d / f"{name}-p{nproc}.json")
        out["measured"][name] = {"median_step_s": t, "clean_steps": n_clean,
                                 "traced_step_less_profiler_s": traced[name]}
    for src, (mb, seq) in SHAPES.items():
        rs = run_spec(src, nproc, mb, seq, 1, 0)
        fit = calibrate_from_trace(d / f"{src}-p{nproc}.json", d / f"fit-{src}-p{nproc}",
                                   rs.model, plan_for(rs))
        for dst, (mb2, seq2) in SHAPES.items():
            rs2 = run_spec(dst, nproc, mb2, seq2, 1, 0)
            p = predict(rs2, fit.profile).step_time_s
            out["predictions"].append({"from": src, "to": dst, "predicted_s": p,
                                       "measured_s": measured[dst],
                                       "error_pct": 100 * (p / measured[dst] - 1),
                                       "traced_s": traced[dst],
                                       "error_vs_traced_pct": 100 * (p / traced[dst] - 1)})
        tr = load_trace(d / f"{src}-p{nproc}.json")
        cl = ClusterSpec(gpu=fit.profile.device, node=fit.profile.node, n_gpus=nproc)
        diag, _, _ = diagnose(tr, rs.model, plan_for(rs), fit.profile, cl)
        out["doctor"][src] = {"explained_fraction": diag.explained_fraction,
                              "priced_fraction": diag.priced_fraction,
                              "host_note": fit.fitted.host_note}
    return out


def no_overlap(profile, d, reuse):
    from calibrate.doctor import diagnose
    from calibrate.trace_import import load_trace
    from calibrate.trace_profile import calibrate_from_trace
    from calibrate.validate_run import plan_for, run_spec
    from simulator.hardware.specs import ClusterSpec
    name, nproc, mb, bucket = NO_OVERLAP
    seq = SHAPES[name][1]
    trace = d / f"{name}-p{nproc}-bucket{bucket}.json"
    t, clean = record(name, nproc, mb, seq, profile, trace, reuse, bucket)
    rs = run_spec(name, nproc, mb, seq, 1, 0, None, bucket)
    fit = calibrate_from_trace(trace, d / "fit-no-overlap", rs.model, plan_for(rs))
    cl = ClusterSpec(gpu=fit.profile.device, node=fit.profile.node, n_gpus=nproc)
    diag, _, _ = diagnose(load_trace(trace), rs.model, plan_for(rs), fit.profile, cl)
    return {"run": f"{name} nproc={nproc} bucket_cap_mb={bucket}", "measured_s": t,
            "clean_steps": clean, "diagnosis": diag.to_dict()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--refit-only", action="store_true", help="use the traces in --dir as "
                    "they are, clean or not (refit and predict only)")
    a = ap.parse_args()
    if a.refit_only:
        a.reuse = "all"
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    res = {"loops": [loop(n, a.profile, d, a.reuse) for n in (1, 2)],
           "no_overlap": no_overlap(a.profile, d, a.reuse)}
    json.dump(res, sys.stdout, indent=1, sort_keys=True)
    for lp in res["loops"]:
        print(f"\nnproc={lp['nproc']}", file=sys.stderr)
        for p in lp["predictions"]:
            print(f"  from {p['from']:13s} -> {p['to']:13s} predicted {p['predicted_s'] * 1e3:9.2f}"
                  f" ms, measured {p['measured_s'] * 1e3:9.2f} ms, {p['error_pct']:+6.1f}%; "
                  f"traced {p['traced_s'] * 1e3:9.2f} ms, {p['error_vs_traced_pct']:+6.1f}%",
                  file=sys.stderr)
        for k, v in lp["doctor"].items():
            print(f"  doctor {k}: explained {100 * v['explained_fraction']:.1f}%, priced "
                  f"{100 * v['priced_fraction']:.1f}%", file=sys.stderr)
    g = res["no_overlap"]["diagnosis"]["gaps"]
    print(f"\nno overlap: top gap {g[0]['what']}: {g[0]['explanation']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
