"""How much the model-form interval moves when the validation residuals move a little:
the shipped table's records, each log residual perturbed by N(0, noise) (default 0.01, a
1 % change of a prediction), the table relearned, and the model-form sigma of a few
query regimes compared with the unperturbed one; once with the single hyperparameter set
of the full fit and once with the bagged ensemble the table uses (``simulator.uncertainty.
learn``). Prints, per query, the mean and largest relative change over the trials and the
ratio single / bagged, measured in one run.

    python benchmarks/interval_stability.py [--trials 8] [--noise 0.01] [--seed 1]
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

from simulator.uncertainty.learn import learn_table
from simulator.uncertainty.regime import Regime
from simulator.uncertainty.table import ModelFormTable, load_table

QUERIES = (
    ("H100 Megatron-Core 4k <10B", Regime("h100", "megatron-core", "dense", "4k", "<10B",
                                          "<=2k", "<=64")),
    ("A100 Megatron >100B >512", Regime("a100", "megatron", "dense", "<=2k", ">100B", ">2k",
                                        ">512")),
    ("B200 Megatron-Core 8k", Regime("b200", "megatron-core", "dense", "8k", "<10B", ">2k",
                                     "<=64")),
    ("H100 MoE, framework unknown", Regime("h100", "?", "moe", "4k", "10-100B", "<=2k",
                                           "<=64")),
    ("A100 Megatron-DeepSpeed", Regime("a100", "megatron-deepspeed", "dense", "<=2k",
                                       ">100B", ">2k", "<=512")),
)


def _sigmas(records, bagged: bool) -> list[float]:
    t = learn_table(records)
    if not bagged:
        t = ModelFormTable(t.records, t.hyper, {}, t.novelty, ())
    return [t.sigma_log(q) for _, q in QUERIES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--noise", type=float, default=0.01, help="sd of the perturbation (ln)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    recs = list(load_table().records)
    rng = random.Random(a.seed)
    perturbed = [[dataclasses.replace(r, log_residual=r.log_residual + rng.gauss(0, a.noise))
                  for r in recs] for _ in range(a.trials)]
    print(f"{len(recs)} records, {a.trials} trials, residual noise {a.noise} (ln)")
    print(f"{'query':32s} {'mode':7s} {'sigma':>7s} {'mean |d|/s':>11s} {'max':>7s}")
    means = {}
    for bagged in (False, True):
        base = _sigmas(recs, bagged)
        rel = [[abs(s / b - 1) for s, b in zip(_sigmas(p, bagged), base)] for p in perturbed]
        for n, (name, _) in enumerate(QUERIES):
            col = [r[n] for r in rel]
            means[(name, bagged)] = statistics.mean(col)
            print(f"{name:32s} {'bagged' if bagged else 'single':7s} {base[n]:7.3f} "
                  f"{100 * statistics.mean(col):10.1f}% {100 * max(col):6.1f}%")
    for name, _ in QUERIES:
        b = means[(name, True)]
        ratio = means[(name, False)] / b if b else float("inf")
        print(f"{name:32s} single / bagged mean change: {ratio:.1f}x")


if __name__ == "__main__":
    main()
