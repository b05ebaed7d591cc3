"""Cluster size does not cost: build + simulate at 1,024 / 16,384 / 1,048,576 GPUs (not a test:
machines are shared and noisy). Each case runs in its own process so its peak memory is its
own; prints wall time (median of --repeat runs), peak RSS, and the ratio to the 1,024-GPU case.
Targets (issue 12): 1,048,576 GPUs in under 2 s and 300 MB.

    python benchmarks/network_scale.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = {
    "llama3-405b TP8 PP16, dense": ("llama3-405b", dict(tp=8, pp=16, micro_batch=1,
                                                        sequence_parallel=True,
                                                        recompute="full", zero_stage=1), 2),
    "deepseek-v3 TP1 PP16 EP64, MoE": ("deepseek-v3", dict(tp=1, pp=16, ep=64, micro_batch=1,
                                                           recompute="full", zero_stage=1), 1),
}
SIZES = (1024, 16384, 1 << 20)

CHILD = r"""
import json, resource, statistics, sys, time
import hardware_db
from simulator.engine.simulate import simulate
from simulator.parallel.plan import Plan
from simulator.workload import get_preset
model, kw, n, gbs_per_dp, repeat = json.loads(sys.argv[1])
t0 = time.perf_counter()
cluster = hardware_db.build_cluster("h100-sxm", n, oversubscription=2.0)
build = time.perf_counter() - t0
prof = hardware_db.load_profile("h100-sxm")
m = get_preset(model)
dp = n // (kw["tp"] * kw["pp"])
plan = Plan(dp=dp, global_batch=dp * gbs_per_dp * kw["pp"], **kw)
walls = []
for _ in range(repeat):
    t = time.perf_counter()
    r = simulate(m, plan, cluster, prof)
    walls.append(time.perf_counter() - t)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"build_s": build, "simulate_s": statistics.median(walls), "rss_mb": rss,
                  "step_s": r.step_time_s, "busiest": r.busiest_link, "mb": r.num_microbatches}))
"""


def run_case(model: str, kw: dict, n: int, per_dp: int, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([model, kw, n, per_dp, repeat])],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for name, (model, kw, per_dp) in CASES.items():
        print(name)
        base = None
        for n in SIZES:
            r = run_case(model, kw, n, per_dp, args.repeat)
            total = r["build_s"] + r["simulate_s"]
            base = base or total
            print(f"  {n:>9,} GPUs: build {r['build_s']:.3f} s + simulate {r['simulate_s']:.3f} s "
                  f"= {total:.3f} s ({total / base:.2f}x the 1,024-GPU case), peak RSS "
                  f"{r['rss_mb']:.0f} MB; {r['mb']} micro-batches, step {r['step_s']:.2f} s, "
                  f"busiest link {r['busiest']}")


if __name__ == "__main__":
    main()
