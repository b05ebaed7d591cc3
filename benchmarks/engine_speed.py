"""Speed of the event engine against references computed in the same run (not a test:
machines are shared and noisy, so only ratios within one run mean anything).

For each case it times ``simulate`` (median of ``--repeat`` runs) three ways and prints
the ratios:

* ``event``: the event engine as shipped (periodic fast path where the schedule repeats);
* ``reference``: the event engine playing every micro-batch (``periodic=False``);
* ``analytic``: the closed form (``engine="analytic"``).

plus the relative difference of the predicted step time between ``event`` and
``reference``. llm-analysis and Calculon are not dependencies and not installed here: the
script says whether it finds them, and does not drive them. ``--startup`` also times
``complexity list gpus`` and ``complexity --help`` against ``python -c pass`` (process
start) in fresh processes.

    python benchmarks/engine_speed.py [--repeat 3] [--startup]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time

import hardware_db
from simulator.engine.simulate import simulate
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import get_preset

_GPT3 = dict(micro_batch=1, sequence_parallel=True, recompute="selective", zero_stage=1)
_405B = dict(micro_batch=1, sequence_parallel=True, recompute="full", zero_stage=1)
CASES = {
    "GPT-3 175B, 1,024 A100, TP8 PP8 DP16 vpp 3, 96 micro-batches": (
        "gpt3-175b", "a100-sxm-80gb", 1024,
        Plan(tp=8, pp=8, dp=16, vpp=3, schedule="interleaved", global_batch=1536, **_GPT3)),
    "Llama-3 405B, 16,384 H100, TP8 PP16 DP128, 16 micro-batches": (
        "llama3-405b", "h100-sxm", 16384,
        Plan(tp=8, pp=16, dp=128, global_batch=2048, **_405B)),
    "Llama-3 405B, 16,384 H100, TP8 PP16 DP128, 4,096 micro-batches": (
        "llama3-405b", "h100-sxm", 16384,
        Plan(tp=8, pp=16, dp=128, global_batch=4096 * 128, **_405B)),
    "GPT-3 175B, 4,096 A100, TP8 PP64 DP8, 256 micro-batches": (
        "gpt3-175b", "a100-sxm-80gb", 4096,
        Plan(tp=8, pp=64, dp=8, global_batch=8 * 256, **_GPT3)),
    "GPT-3 175B, 1,024 A100, TP8 PP8 DP16 vpp 12, 96 micro-batches": (
        "gpt3-175b", "a100-sxm-80gb", 1024,
        Plan(tp=8, pp=8, dp=16, vpp=12, schedule="interleaved", global_batch=1536, **_GPT3)),
    "Llama-3 405B, 1,048,576 H100, TP8 PP16 DP8192, 16 micro-batches": (
        "llama3-405b", "h100-sxm", 1048576,
        Plan(tp=8, pp=16, dp=8192, global_batch=8192 * 16, **_405B)),
    # framework plans: their hosts wait for the device (get_batch, the loss check, batched
    # hand-offs), which the analytic recursion plays period by period; DeepSpeed's
    # pipeline engine runs on the event engine only (the sweep declines its rendezvous)
    "Llama-3 70B, 64 H100, TP8 PP4 vpp 2, megatron-core, 2,000 micro-batches": (
        "llama3-70b", "h100-sxm", 64,
        with_framework(Plan(tp=8, pp=4, dp=2, vpp=2, schedule="interleaved",
                            global_batch=4000, micro_batch=1), "megatron-core")),
    "Llama-3 405B, 1,024 H100, TP8 PP16 vpp 4, megatron-lm, 1,024 micro-batches": (
        "llama3-405b", "h100-sxm", 1024,
        with_framework(Plan(tp=8, pp=16, dp=8, vpp=4, schedule="interleaved",
                            global_batch=8192, micro_batch=1), "megatron-lm")),
    "BLOOM-176B, 384 A100, TP4 PP12 DP8, megatron-deepspeed, 128 micro-batches": (
        "bloom-176b", "a100-sxm-80gb", 384,
        with_framework(Plan(tp=4, pp=12, dp=8, global_batch=2048, micro_batch=2,
                            recompute="full"), "megatron-deepspeed")),
}
PEERS = ("llm_analysis", "calculon")


def _median(fn, repeat: int) -> tuple[float, object]:
    walls, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), out


def _case(name: str, model: str, gpu: str, n: int, plan: Plan, repeat: int) -> None:
    m = get_preset(model)
    cluster = hardware_db.build_cluster(gpu, n)
    prof = hardware_db.load_profile(gpu)
    simulate(m, plan, cluster, prof, engine="analytic")            # warm the caches
    t_fast, fast = _median(lambda: simulate(m, plan, cluster, prof), repeat)
    t_ref, ref = _median(lambda: simulate(m, plan, cluster, prof, periodic=False), repeat)
    t_an, an = _median(lambda: simulate(m, plan, cluster, prof, engine="analytic"), repeat)
    rel = abs(fast.step_time_s / ref.step_time_s - 1)
    print(f"{name}\n  event {1e3 * t_fast:8.1f} ms   reference {1e3 * t_ref:8.1f} ms   "
          f"analytic {1e3 * t_an:6.1f} ms   | reference/event {t_ref / t_fast:5.1f}x   "
          f"event/analytic {t_fast / t_an:5.1f}x   | step {fast.step_time_s:.3f} s, "
          f"vs reference {rel:.1e}, analytic {an.step_time_s:.3f} s")


def _startup(repeat: int) -> None:
    def wall(argv: list[str]) -> float:
        def once():
            subprocess.run(argv, check=True, capture_output=True)
        return _median(once, repeat)[0]
    base = wall([sys.executable, "-c", "pass"])
    cli = [sys.executable, "-m", "simulator.cli.main"]
    for args in (["--help"], ["list", "gpus"]):
        t = wall(cli + args)
        print(f"complexity {' '.join(args):10s} {t:.3f} s wall  (process start alone "
              f"{base:.3f} s; ratio {t / base:.1f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--startup", action="store_true", help="also time the command's start")
    ap.add_argument("--match", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    peers = [p for p in PEERS if importlib.util.find_spec(p)]
    print(f"peers found: {', '.join(peers) or 'none'} (llm-analysis, Calculon; not driven "
          f"by this script)")
    for name, (model, gpu, n, plan) in CASES.items():
        if args.match in name:
            _case(name, model, gpu, n, plan, args.repeat)
    if args.startup:
        _startup(max(args.repeat, 5))


if __name__ == "__main__":
    main()
