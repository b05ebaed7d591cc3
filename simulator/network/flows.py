"""What each collective algorithm sends: classes of identical flows over the fabric's tiers.

A group of ``n`` ranks, ``m`` per scale-up domain over ``k`` domains (``GroupShape``);
``S`` is the buffer as nccl-tests defines it (all-reduce input, all-gather output,
reduce-scatter input, all-to-all send buffer per rank, point-to-point message). Bytes are
per flow and direction; ``per_rank`` counts flows per rank (fractions: a flow split over
the parallel links of several ranks, e.g. a ring's one exit edge per domain spread over
the domain's NICs by NCCL's channels). Every group of the same kind runs at once (all
ranks are in one), so a NIC carries the flows of the ``gpus_per_nic`` GPUs behind it and a
leaf uplink the share of its ports' flows that leave the leaf.

============== ============================ ======================== =====================
algorithm      scale-up port                network (per rank)       leaves the leaf
============== ============================ ======================== =====================
ring           ``2(n-1)/n S`` ((m-1)/m of   ``2(n-1)/n S / m``       one edge per leaf
               ranks when k > 1)            (one exit edge/domain)   group: ``L/k``
tree           ``2S (m-1)/m`` (chain)       ``2S/m`` (DBT; k=2: S/m) DBT edges across
nvls (k = 1)   ``S (1 + 1/m)`` (NVLS eff)   -                        -
nvls_tree      ``S (1 + 1/m)`` (NVLS eff)   ``2S/m`` (k = 2: S/m)    DBT edges across
sharp          ``S (1 + 1/m)`` (NVLS eff)   ``S/m`` (switch reduces) one stream per leaf
hierarchical   RS + AG rings ``(m-1)/m S``  ring over k on ``S/m``   ``L/k``
============== ============================ ======================== =====================

(all-reduce; all-gather / reduce-scatter rings send half. Sources: NCCL's algorithms as
described by its maintainers, nccl-tests #196 and #212, and ``/work/notes`` section 4.2;
NVLS bytes: each GPU's port carries its full buffer to the switch's multimem reduction
and its reduced ``S/m`` slice back, multicast.) All-to-all is priced round by round
(``rounds``), point-to-point as one flow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from .collectives import Collective
from .fabric import NET_TIERS, Fabric, GroupShape, Tier


class Algo(str, Enum):
    AUTO = "auto"
    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"                  # NVLink SHARP in one domain
    NVLS_TREE = "nvls_tree"        # NVLS in each domain + double binary tree across
    SHARP = "sharp"                # NVLS in each domain + in-network (switch) reduction
    HIERARCHICAL = "hierarchical"  # reduce-scatter in domain, ring across, all-gather in domain
    PAIRWISE = "pairwise"          # all-to-all
    P2P = "p2p"                    # send / recv


@dataclass(frozen=True)
class FlowClass:
    """Identical flows: ``per_rank`` of them per rank, ``bytes`` each, over ``tiers``;
    ``leaf_cross`` / ``block_cross`` of them leave their leaf group / core block.
    ``nvls``: the scale-up port runs at NVLS efficiency."""

    name: str
    bytes: float
    per_rank: float
    tiers: tuple[Tier, ...]
    leaf_cross: float = 0.0
    block_cross: float = 0.0
    nvls: bool = False

    def weight(self, tier: Tier, fabric: Fabric) -> float:
        """Flows of this class per link of ``tier`` (all groups of the kind active)."""
        if tier not in self.tiers:
            return 0.0
        if tier in (Tier.SCALE_UP, Tier.PCIE):
            return self.per_rank
        w = self.per_rank * fabric.gpus_per_nic
        return w * {Tier.NIC: 1.0, Tier.LEAF_UP: self.leaf_cross,
                    Tier.SPINE_UP: self.block_cross}[tier]


@dataclass(frozen=True)
class Phase:
    """Flows that run together under one latency term; an algorithm's phases run one
    after the other. ``n``/``m``/``k`` size the latency (see ``price``); ``ar``: the
    all-reduce step count ``2(n-1)`` rather than ``n-1``."""

    algo: Algo
    flows: tuple[FlowClass, ...]
    n: int
    m: int
    k: int
    ar: bool = True


def _bus_factor(op: Collective, n: int) -> float:
    if op == Collective.ALL_REDUCE:
        return 2 * (n - 1) / n
    return (n - 1) / n


def ring_cross(shape: GroupShape) -> tuple[float, float]:
    """Share of a ring's inter-domain edges that leave a leaf group / core block."""
    k = shape.domains
    leaf = shape.leaf_groups / k if shape.leaf_groups > 1 else 0.0
    block = shape.blocks / k if shape.blocks > 1 else 0.0
    return min(1.0, leaf), min(1.0, block)


@lru_cache(maxsize=256)
def tree_cross_fraction(k: int, per_group: int) -> float:
    """Share of the edges of NCCL's binary tree over ``k`` ranks (``ncclGetBtree``:
    rank ``r`` with lowest set bit ``b`` hangs under ``(r ^ b) | 2b``, or ``r ^ b``
    past the end) joining ranks of different groups of ``per_group`` consecutive ranks.
    Counted on up to 8,192 ranks (the share depends on ``per_group``, hardly on ``k``)."""
    if k <= 1 or per_group >= k:
        return 0.0
    kk = min(k, 8192)
    cross = 0
    for r in range(1, kk):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        if up >= kk:
            up = r ^ bit
        cross += (r // per_group) != (up // per_group)
    return cross / (kk - 1)


def _tree_cross(shape: GroupShape) -> tuple[float, float]:
    k = shape.domains
    leaf = tree_cross_fraction(k, max(1, k // shape.leaf_groups)) if shape.leaf_groups > 1 else 0.0
    block = tree_cross_fraction(k, max(1, k // shape.blocks)) if shape.blocks > 1 else 0.0
    return leaf, block


def ring(op: Collective, S: float, shape: GroupShape) -> tuple[Phase, ...]:
    n, m, k = shape.size, shape.per_domain, shape.domains
    d = _bus_factor(op, n) * S
    ar = op == Collective.ALL_REDUCE
    if k == 1:
        return (Phase(Algo.RING, (FlowClass("ring", d, 1.0, (Tier.SCALE_UP,)),), n, m, k, ar),)
    leaf, block = ring_cross(shape)
    flows = [FlowClass("ring-net", d, 1.0 / m, NET_TIERS, leaf, block)]
    if m > 1:
        flows.insert(0, FlowClass("ring-intra", d, (m - 1) / m, (Tier.SCALE_UP,)))
    return (Phase(Algo.RING, tuple(flows), n, m, k, ar),)


def tree(S: float, shape: GroupShape) -> tuple[Phase, ...]:
    """NCCL TREE all-reduce: a chain inside each domain (each GPU sends the buffer up the
    chain and down again), a double binary tree across domains. In one domain it is the
    chain alone: ``2(n-1)`` steps (NCCL's tree latency, tuning.cc l.422-425), so it never
    beats the ring there."""
    n, m, k = shape.size, shape.per_domain, shape.domains
    if k == 1:
        return (Phase(Algo.TREE, (FlowClass("tree-chain", 2.0 * S, (m - 1) / m,
                                            (Tier.SCALE_UP,)),), n, m, k),)
    leaf, block = _tree_cross(shape)
    net = (2.0 if k > 2 else 1.0) * S
    flows = [FlowClass("tree-net", net, 1.0 / m, NET_TIERS, leaf, block)]
    if m > 1:
        flows.insert(0, FlowClass("tree-chain", 2.0 * S, (m - 1) / m, (Tier.SCALE_UP,)))
    return (Phase(Algo.TREE, tuple(flows), n, m, k),)


def nvls(S: float, shape: GroupShape, across: Algo = Algo.NVLS) -> tuple[Phase, ...]:
    """NVLS in each domain; across domains a double binary tree (NVLSTree, each GPU on its
    own rail carries its ``S/m`` slice: ``2 S/m`` per direction, ``S/m`` with two
    domains, sjeaugey in nccl-tests #196) or the switches' reduction (SHARP: ``S/m``)."""
    n, m, k = shape.size, shape.per_domain, shape.domains
    intra = FlowClass("nvls", S * (1 + 1 / m), 1.0, (Tier.SCALE_UP,), nvls=True)
    if k == 1:
        return (Phase(Algo.NVLS, (intra,), n, m, k),)
    if across == Algo.SHARP:
        per_leaf = max(1.0, shape.leaf_ranks / m)
        net = FlowClass("sharp-net", S / m, 1.0, NET_TIERS, 1.0 / per_leaf if shape.leaf_groups > 1
                        else 0.0, 1.0 / per_leaf if shape.blocks > 1 else 0.0)
        return (Phase(Algo.SHARP, (intra, net), n, m, k),)
    leaf, block = _tree_cross(shape)
    net = FlowClass("nvls-tree-net", (2.0 if k > 2 else 1.0) * S / m, 1.0, NET_TIERS, leaf, block)
    return (Phase(Algo.NVLS_TREE, (intra, net), n, m, k),)


def hierarchical(S: float, shape: GroupShape) -> tuple[Phase, ...]:
    """Reduce-scatter inside each domain, all-reduce ring across domains on the ``S/m``
    slice (one rank per domain per slice), all-gather inside: three phases in sequence."""
    m, k = shape.per_domain, shape.domains
    if k == 1 or m == 1:
        return ring(Collective.ALL_REDUCE, S, shape)
    intra = Phase(Algo.RING, (FlowClass("hier-intra", (m - 1) / m * S, 1.0, (Tier.SCALE_UP,)),),
                  m, m, 1, ar=False)
    leaf, block = ring_cross(shape)
    inter = Phase(Algo.RING, (FlowClass("hier-net", 2 * (k - 1) / k * S / m, 1.0, NET_TIERS,
                                        leaf, block),), k, 1, k)
    return (intra, inter, intra)


def p2p(S: float, shape: GroupShape, fabric: Fabric) -> tuple[Phase, ...]:
    """Every rank of a stage sends ``S`` to its peer ``stride`` ranks on; the share of
    pairs whose ends sit in different leaf groups / blocks crosses the spine / core."""
    if shape.domains == 1:
        return (Phase(Algo.P2P, (FlowClass("p2p", S, 1.0, (Tier.SCALE_UP,)),), 2, 2, 1, False),)
    g = fabric.gpus_per_node
    leaf = min(1.0, shape.stride / (fabric.nodes_per_leaf * g)) \
        if fabric.n_nodes > fabric.nodes_per_leaf else 0.0
    block = min(1.0, shape.stride / (fabric.nodes_per_block * g)) \
        if fabric.n_nodes > fabric.nodes_per_block else 0.0
    return (Phase(Algo.P2P, (FlowClass("p2p", S, 1.0, NET_TIERS, leaf, block),), 2, 1, 2, False),)


def all_to_all_flows(S: float, shape: GroupShape) -> tuple[FlowClass, ...]:
    """The aggregate of an all-to-all (what it loads each tier over its whole run): the
    on-domain share over the scale-up port, the off-domain share (PXN: forwarded over
    the port to the GPU on the destination's rail) over the network."""
    n, m, k = shape.size, shape.per_domain, shape.domains
    flows = [FlowClass("a2a-intra", S * max(0, m - 1) / n, 1.0, (Tier.SCALE_UP,))]
    if k > 1:
        off = S * (n - m) / n
        leaf = (n - shape.leaf_ranks) / (n - m) if shape.leaf_groups > 1 else 0.0
        block = (n - shape.block_ranks) / (n - m) if shape.blocks > 1 else 0.0
        flows.append(FlowClass("a2a-net", off, 1.0, NET_TIERS, leaf, block))
    return tuple(flows)


def round_deltas(n: int, samples: int = 4096):
    """``(delta, weight)`` over the rounds ``delta = 1 .. n-1`` of a pairwise all-to-all:
    every round exactly up to ``samples`` rounds, else a midpoint Riemann sum."""
    if n - 1 <= samples:
        return [(float(d), 1.0) for d in range(1, n)]
    step = (n - 1) / samples
    return [(1 + (i + 0.5) * step, step) for i in range(samples)]


def off_block_share(delta: float, n: int, block: float) -> float:
    """Share of ranks whose round-``delta`` peer ``(r + delta) mod n`` lies in another
    block of ``block`` consecutive ranks: ``min(1, delta/block, (n - delta)/block)``."""
    if block >= n:
        return 0.0
    return min(1.0, delta / block, (n - delta) / block)


def algorithms_for(op: Collective, shape: GroupShape, fabric: Fabric) -> tuple[Algo, ...]:
    """What NCCL's tuner would choose among (NCCL_ALGO unset): all-reduce ring and tree,
    NVLS inside one NVSwitch domain, NVLSTree across domains (2+ GPUs per domain), SHARP
    where the switches reduce; ring for all-gather / reduce-scatter; pairwise all-to-all;
    point-to-point. ``hierarchical`` is never chosen by NCCL (ask for it by name)."""
    if op == Collective.ALL_TO_ALL:
        return (Algo.PAIRWISE,)
    if op == Collective.SEND_RECV:
        return (Algo.P2P,)
    if op != Collective.ALL_REDUCE:
        return (Algo.RING,)
    out = [Algo.RING, Algo.TREE]
    if fabric.in_switch and shape.per_domain > 1:
        out.append(Algo.NVLS if shape.domains == 1 else Algo.NVLS_TREE)
        if fabric.sharp and shape.domains > 1:
            out.append(Algo.SHARP)
    return tuple(out)


def phases(op: Collective, algo: Algo, S: float, shape: GroupShape,
           fabric: Fabric) -> tuple[Phase, ...]:
    """The phases of ``algo`` (resolved: not AUTO) for ``op`` on ``shape``."""
    if algo == Algo.RING:
        return ring(op, S, shape)
    if algo == Algo.TREE:
        return tree(S, shape)
    if algo in (Algo.NVLS, Algo.NVLS_TREE, Algo.SHARP):
        return nvls(S, shape, algo)
    if algo == Algo.HIERARCHICAL:
        return hierarchical(S, shape)
    if algo == Algo.P2P:
        return p2p(S, shape, fabric)
    return (Phase(Algo.PAIRWISE, all_to_all_flows(S, shape), shape.size, shape.per_domain,
                  shape.domains, False),)


def log2(k: int) -> float:
    return math.log2(k) if k > 1 else 0.0
