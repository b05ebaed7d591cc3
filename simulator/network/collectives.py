"""Collective kinds, and the single-link alpha-beta form calibration fits.

``alpha_beta_time_s`` with ``ring_steps_and_traffic`` is what ``calibrate.fit`` fits a link's
``LinkCoefficients`` with (two protocol regimes, small / large messages), and what
``simulator.network.price`` keeps for collectives inside one scale-up domain.
``collective_time_s`` prices a collective on one given bottleneck link (ring, tree, NVLS) -
a quick single-link estimate; the simulator itself routes groups over the whole fabric
(``simulator.network.price``). Sizes in bytes, times in seconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..hardware.profile import LinkCoefficients, Profile


class Collective(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


def ring_steps_and_traffic(op: Collective, n: int, size_bytes: float) -> tuple[int, float]:
    """(sequential steps, bytes each rank sends) for a ring over ``n`` ranks.

    ``size_bytes`` is the full buffer (all-reduce input, all-gather output, reduce-scatter
    input, all-to-all send buffer per rank, send/recv message).
    """
    if op == Collective.SEND_RECV:
        return 1, size_bytes
    if n <= 1:
        return 0, 0.0
    frac = (n - 1) / n
    if op == Collective.ALL_REDUCE:
        return 2 * (n - 1), 2 * frac * size_bytes
    if op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        return n - 1, frac * size_bytes
    return n - 1, frac * size_bytes      # all-to-all: pairwise exchange, (n-1)/n leaves


def alpha_beta_time_s(steps: int, wire_bytes: float, link_bw_bytes_per_s: float,
                      hop_latency_s: float, c: LinkCoefficients, bw_scale: float = 1.0) -> float:
    """Faster of the small-message and large-message protocol regimes."""
    if steps == 0 or wire_bytes <= 0:
        return 0.0
    small = steps * (c.alpha_us.value * 1e-6 + hop_latency_s) \
        + wire_bytes / (link_bw_bytes_per_s * c.small_bw_eff.value * bw_scale)
    large = c.base_us.value * 1e-6 + steps * hop_latency_s \
        + wire_bytes / (link_bw_bytes_per_s * c.bw_eff.value * bw_scale)
    return min(small, large)


@dataclass(frozen=True)
class LinkUse:
    """The bottleneck link class a collective's ring crosses, as the topology reports it."""

    kind: str                         # LinkKind value, keys Profile.links
    bandwidth_gbytes_per_s: float     # per direction, available to one ring flow
    latency_us: float                 # datasheet one-hop latency


class Algorithm(str, Enum):
    AUTO = "auto"        # the fastest of those the fabric offers, as NCCL's tuner picks
    RING = "ring"
    TREE = "tree"        # double binary tree (all-reduce only)
    IN_SWITCH = "nvls"   # reduction inside the switch (NVLink SHARP), all-reduce only


def tree_steps_and_traffic(n: int, size_bytes: float) -> tuple[int, float]:
    """Double-binary-tree all-reduce: reduce up and broadcast down, ``2*ceil(log2 n)``
    sequential steps; each rank sends its buffer once up and once down (2 x size)."""
    if n <= 1:
        return 0, 0.0
    return 2 * math.ceil(math.log2(n)), 2.0 * size_bytes


def collective_time_s(op: Collective, n: int, size_bytes: float, link: LinkUse,
                      prof: Profile, in_switch: bool = False,
                      algorithm: Algorithm = Algorithm.AUTO) -> float:
    """Collective time over ``n`` ranks on the given bottleneck link.

    Ring for every collective; for all-reduce also the double binary tree (fewer steps,
    wins on small messages) and, where the fabric reduces in the switch (``in_switch``),
    NVLS. ``Algorithm.AUTO`` takes the fastest available.
    """
    c = prof.link(link.kind)
    bw, lat = link.bandwidth_gbytes_per_s * 1e9, link.latency_us * 1e-6
    steps, wire = ring_steps_and_traffic(op, n, size_bytes)
    ring = alpha_beta_time_s(steps, wire, bw, lat, c)
    if op != Collective.ALL_REDUCE or algorithm == Algorithm.RING:
        return ring
    options = {Algorithm.RING: ring}
    t_steps, t_wire = tree_steps_and_traffic(n, size_bytes)
    options[Algorithm.TREE] = alpha_beta_time_s(t_steps, t_wire, bw, lat, c)
    if in_switch and c.in_switch_speedup is not None:
        options[Algorithm.IN_SWITCH] = alpha_beta_time_s(steps, wire, bw, lat, c,
                                                         c.in_switch_speedup.value)
    if algorithm != Algorithm.AUTO:
        return options.get(algorithm, ring)
    return min(options.values())
