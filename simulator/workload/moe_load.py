"""Expected load imbalance of a dropless mixture-of-experts layer across expert-parallel ranks.

Every rank waits for the busiest one at each MoE layer (the combining all-to-all), so a
layer costs what the rank with the most routed tokens costs. A rank holding ``e`` of ``E``
experts receives a share ``q = e/E`` of the ``N`` token-expert assignments of its EP group:
independent routing spreads that count binomially (relative variance ``(1 - q)/(N q)``), and
routers trained with a balancing loss still favour some experts (relative spread
``expert_load_cv`` per expert, ``cv/sqrt(e)`` for a sum of ``e`` experts, assumed
independent). The expected maximum over ``n`` ranks of a normal load is
``mean * (1 + a_n * rel)`` with ``a_n`` the expected maximum of ``n`` standard normals
(Blom's approximation ``Phi^-1((n - 0.375) / (n + 0.25))``).
"""
from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations
from math import comb
from statistics import NormalDist


def expected_max_normal(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal draws (Blom 1958)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def expected_max_load_ratio(n_ranks: int, experts_per_rank: int, experts: int,
                            tokens_per_rank: float, expert_load_cv: float) -> float:
    """E[max rank load] / mean rank load for a dropless layer."""
    if n_ranks <= 1 or tokens_per_rank <= 0:
        return 1.0
    q = experts_per_rank / experts
    rel = math.sqrt((1.0 - q) / tokens_per_rank + expert_load_cv ** 2 / experts_per_rank)
    return 1.0 + expected_max_normal(n_ranks) * rel


# ---- DeepEP-style (flex) dispatch: distinct destinations per token ---------------------------
def expected_distinct(bins: float, draws: int, pool: float) -> float:
    """Expected number of distinct bins hit when ``draws`` items are drawn without
    replacement from ``pool`` items spread evenly over ``bins`` bins (``pool / bins`` each):
    ``bins * (1 - C(pool - pool/bins, draws) / C(pool, draws))``."""
    if bins <= 1:
        return min(1.0, float(bins))
    return bins * (1.0 - _miss(pool, pool / bins, min(draws, int(pool))))


def _miss(pool: float, c: float, draws: int) -> float:
    """P(none of ``c`` marked items among ``draws`` drawn without replacement from ``pool``)."""
    if c <= 0:
        return 1.0
    out = 1.0
    for i in range(draws):
        if pool - c - i <= 0:
            return 0.0
        out *= (pool - c - i) / (pool - i)
    return out


def _bins_hit(top_k: int, experts: int, groups: int, group_topk: int, bins: int) -> float:
    """Expected distinct bins (ranks or nodes, contiguous expert ranges) a token's experts
    fall on: exact, averaging over every choice of ``group_topk`` groups the sum over bins of
    P(bin hit) = 1 - C(pool - c_b, k) / C(pool, k), ``c_b`` the bin's candidate experts."""
    limited = 0 < group_topk < groups
    g_of = (lambda e: e * groups // experts) if limited else (lambda e: 0)
    n_g = groups if limited else 1
    cnt = [[0] * bins for _ in range(n_g)]
    for e in range(experts):
        cnt[g_of(e)][e * bins // experts] += 1
    choices = list(combinations(range(n_g), group_topk if limited else 1))
    total = 0.0
    for chosen in choices:
        per_bin = [sum(cnt[g][b] for g in chosen) for b in range(bins)]
        pool = sum(per_bin)
        total += sum(1.0 - _miss(pool, c, min(top_k, pool)) for c in per_bin)
    return total / len(choices)


@lru_cache(maxsize=4096)
def flex_destinations(top_k: int, experts: int, groups: int, group_topk: int, ranks: int,
                      nodes: int) -> tuple[float, float]:
    """(distinct destination ranks, distinct destination nodes) per token when its ``top_k``
    experts are chosen uniformly from the candidate experts: all ``experts``, or with
    group-limited routing (``group_topk`` of ``groups`` groups, DeepSeek's node-limited
    routing) the chosen groups' experts; groups, ranks and nodes hold contiguous expert
    ranges. A token goes once to each rank (experts of one rank share the copy) and once to
    each node (the sender's own counted, as DeepEP's RDMA channel carries it). Exact
    (``_bins_hit``) up to ``MAX_GROUP_CHOICES`` group choices; beyond, each group choice is
    taken to fill whole bins (``expected_distinct``)."""
    limited = 0 < group_topk < groups
    if not limited or comb(groups, group_topk) <= MAX_GROUP_CHOICES:
        return (_bins_hit(top_k, experts, groups, group_topk, ranks),
                _bins_hit(top_k, experts, groups, group_topk, nodes))
    pool = experts * group_topk / groups
    return (expected_distinct(min(ranks, pool * ranks / experts), top_k, pool),
            expected_distinct(min(nodes, pool * nodes / experts), top_k, pool))


MAX_GROUP_CHOICES = 5000
