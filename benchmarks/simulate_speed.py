"""Wall time of `simulate` on the two large cases of the core issue (not a test: machines are
shared and noisy). Prints the median of several runs for each case and their ratio to 1 s.

    python benchmarks/simulate_speed.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import hardware_db
from simulator.engine.simulate import simulate
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

CASES = {
    "gpt3-175b on 1,024 a100-sxm-80gb, TP8 PP8 DP16, interleaved vpp=3, gbs 1536": (
        "gpt3-175b", "a100-sxm-80gb", 1024,
        Plan(tp=8, pp=8, dp=16, vpp=3, schedule="interleaved", micro_batch=1, global_batch=1536,
             sequence_parallel=True, recompute="selective", zero_stage=1)),
    "llama3-405b on 16,384 h100-sxm, TP8 PP16 DP128, gbs 2048": (
        "llama3-405b", "h100-sxm", 16384,
        Plan(tp=8, pp=16, dp=128, micro_batch=1, global_batch=2048, sequence_parallel=True,
             recompute="full", zero_stage=1)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for name, (model, gpu, n, plan) in CASES.items():
        m = get_preset(model)
        t0 = time.perf_counter()
        cluster = hardware_db.build_cluster(gpu, n)
        build_s = time.perf_counter() - t0
        prof = hardware_db.load_profile(gpu)
        walls = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            r = simulate(m, plan, cluster, prof)
            walls.append(time.perf_counter() - t)
        med = statistics.median(walls)
        print(f"{name}\n  simulate median {med:.3f} s over {args.repeat} runs "
              f"(min {min(walls):.3f}, max {max(walls):.3f}); cluster build {build_s:.3f} s; "
              f"budget ratio {med / 1.0:.2f} of 1 s; predicted step {r.step_time_s:.2f} s, "
              f"MFU {100 * r.mfu:.1f} %, {r.num_microbatches} micro-batches")


if __name__ == "__main__":
    main()
