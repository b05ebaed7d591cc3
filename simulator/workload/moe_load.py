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
