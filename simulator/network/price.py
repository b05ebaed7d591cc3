"""Time of a collective on a fabric: its flows share the tiers max-min fairly, plus the
latency of its algorithm and protocol.

``time = latency(algorithm, protocol, n, m, k) + max over flow classes (bytes / rate)``
with rates from ``maxmin.fair_rates`` over every tier's links at ``capacity x
efficiency`` (``Profile``: the scale-up kind's ``LinkCoefficients`` for the scale-up port;
the NIC kind's for NIC, leaf and spine links alike - the same network efficiency on every
network tier; ``NetworkModel.pcie_eff`` for the GPU-to-NIC hop and ``nvls_eff`` for NVLS
traffic). Two protocols as NCCL has them: LL (small messages: low latency, the links'
``small_bw_eff``) and Simple (large); the faster wins, and with ``Algo.AUTO`` the fastest
algorithm, as NCCL's tuner picks. A collective inside one scale-up domain keeps the
single-link alpha-beta form the scale-up coefficients were fitted with. A pairwise
all-to-all across domains runs in ``n - 1`` rounds, each as slow as its busiest tier
(``_a2a_rounds_s``); the GTC 2025 all-to-all bars (e x NIC bandwidth per GPU at 32 GPUs)
need this - the aggregate load alone over-predicts them by ~29%.

``background``: flows of other collectives running at the same time; they take their
max-min share of the links. Results are cached per (op, size, group shape, fabric,
coefficients, algorithm, background).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..errors import CalibrationMissingError, InvalidInputError
from ..hardware.profile import LinkCoefficients, NetworkModel, Profile
from ..hardware.specs import ClusterSpec
from .collectives import Collective
from .fabric import Fabric, GroupShape, Tier, fabric_of, group_shape
from .flows import (
    Algo,
    FlowClass,
    Phase,
    algorithms_for,
    log2,
    off_block_share,
    phases,
    round_deltas,
)
from .maxmin import fair_rates

LL, LL128, SIMPLE = "LL", "LL128", "Simple"
NVLS_REF_GPUS = 8   # fallback only: in_switch_speedup was measured on 8-GPU nodes


@dataclass(frozen=True)
class Coefs:
    """The profile's coefficients a fabric needs (hashable, for the cache)."""

    scale_up: LinkCoefficients
    net: LinkCoefficients | None
    model: NetworkModel | None

    def nvls_eff(self) -> float:
        if self.model is not None and self.model.nvls_eff is not None:
            return self.model.nvls_eff.value
        su = self.scale_up
        if su.in_switch_speedup is None:
            return su.bw_eff.value
        g = NVLS_REF_GPUS
        return su.bw_eff.value * su.in_switch_speedup.value * (g + 1) / (2 * (g - 1))


def coefs_of(prof: Profile, fabric: Fabric) -> Coefs:
    su = prof.link(fabric.scale_up_kind)
    net = prof.links.get(fabric.nic_kind)
    return Coefs(su, net, prof.network)


@dataclass(frozen=True)
class CollectiveCost:
    """One priced collective; ``tier_busy_s``: seconds each tier's links are busy."""

    op: Collective
    size_bytes: float
    n: int
    time_s: float
    algorithm: str
    protocol: str
    bottleneck: str
    tier_busy_s: tuple[tuple[str, float], ...] = ()
    latency_s: float = 0.0

    @property
    def latency_bound(self) -> bool:
        """More of the time is latency than data on the bottleneck link."""
        return self.latency_s > self.time_s - self.latency_s

    @property
    def algbw_gbytes_per_s(self) -> float:
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else math.inf

    @property
    def busbw_gbytes_per_s(self) -> float:
        """nccl-tests' bus bandwidth: algbw x 2(n-1)/n (all-reduce), x (n-1)/n
        (all-gather, reduce-scatter, all-to-all), x 1 (send/recv)."""
        n = self.n
        f = {Collective.ALL_REDUCE: 2 * (n - 1) / n, Collective.SEND_RECV: 1.0}.get(
            self.op, (n - 1) / n)
        return self.algbw_gbytes_per_s * f


ZERO_COST = CollectiveCost(Collective.SEND_RECV, 0.0, 1, 0.0, "none", "-", "-")


def collective_cost(op: Collective, size_bytes: float, shape: GroupShape, fabric: Fabric,
                    prof: Profile, algorithm: Algo | str = Algo.AUTO,
                    background: tuple[FlowClass, ...] = ()) -> CollectiveCost:
    """Price ``op`` over the group ``shape`` on ``fabric`` (see the module docstring).
    Raises ``InvalidInputError`` for an algorithm the op or fabric does not offer."""
    op = Collective(op)
    n = 2 if op == Collective.SEND_RECV else shape.size
    if n <= 1 or size_bytes <= 0:
        return CollectiveCost(op, float(size_bytes), max(1, n), 0.0, "none", "-", "-")
    algo = resolve_algorithm(op, algorithm, shape, fabric)
    return _cost(op, float(size_bytes), shape, fabric, coefs_of(prof, fabric), algo,
                 tuple(background))


def resolve_algorithm(op: Collective, algorithm: Algo | str, shape: GroupShape,
                      fabric: Fabric) -> Algo:
    """``Algo.AUTO`` stays; ``nvls`` means NVLSTree across domains; anything the op or the
    fabric does not offer is an ``InvalidInputError``."""
    try:
        algo = Algo(str(getattr(algorithm, "value", algorithm)).lower())
    except ValueError:
        raise InvalidInputError("algorithm", str(getattr(algorithm, "value", algorithm)),
                                ", ".join(a.value for a in Algo)) from None
    if algo in (Algo.AUTO, Algo.PAIRWISE, Algo.P2P):
        return Algo.AUTO
    if algo == Algo.NVLS and shape.domains > 1:
        algo = Algo.NVLS_TREE
    offered = set(algorithms_for(op, shape, fabric))
    if op == Collective.ALL_REDUCE:
        offered.add(Algo.HIERARCHICAL)
        if fabric.in_switch and shape.per_domain > 1 and shape.domains > 1:
            offered.add(Algo.SHARP)
    if algo not in offered:
        raise InvalidInputError("algorithm", str(getattr(algorithm, "value", algorithm)),
                                f"for {op.value} on this group/fabric: auto, "
                                + ", ".join(sorted(a.value for a in offered)))
    return algo


def price_with(op: Collective, size_bytes: float, shape: GroupShape, fabric: Fabric,
               coefs: Coefs, algorithm: Algo | str = Algo.AUTO) -> CollectiveCost:
    """``collective_cost`` with the coefficients given directly (calibration fits)."""
    algo = resolve_algorithm(Collective(op), algorithm, shape, fabric)
    return _cost(Collective(op), float(size_bytes), shape, fabric, coefs, algo, ())


@lru_cache(maxsize=65536)
def _cost(op: Collective, size: float, shape: GroupShape, fabric: Fabric, c: Coefs,
          algo: Algo, background: tuple[FlowClass, ...]) -> CollectiveCost:
    candidates = algorithms_for(op, shape, fabric) if algo == Algo.AUTO else (algo,)
    best = None
    for a in candidates:
        cost = _algorithm_cost(op, size, shape, fabric, c, a, background)
        if best is None or cost.time_s < best.time_s:
            best = cost
    return best


def _algorithm_cost(op, size, shape, fabric, c, algo, background) -> CollectiveCost:
    total, lat, busy, worst = 0.0, 0.0, {}, (-1.0, "-")
    protos = []
    for ph in phases(op, algo, size, shape, fabric):
        t, proto, bw_s, bneck, tier_busy = _phase(ph, shape, fabric, c, background)
        total += t
        lat += t - bw_s
        protos.append(proto)
        for tier, s in tier_busy.items():
            busy[tier] = busy.get(tier, 0.0) + s
        if bw_s > worst[0]:
            worst = (bw_s, bneck)
    proto = protos[0] if len(set(protos)) == 1 else "/".join(protos)
    return CollectiveCost(op, size, 2 if op == Collective.SEND_RECV else shape.size, total,
                          algo.value, proto, worst[1], tuple(sorted(busy.items())), lat)


# ---- one phase -----------------------------------------------------------------------------
def _protocols(ph: Phase, fabric: Fabric, c: Coefs) -> tuple[str, ...]:
    """NCCL runs NVLSTree, CollNet (SHARP) and network all-to-all on Simple only, and
    nothing but Simple over a transport without LL / LL128 (``Fabric.net_ll``: EFA); LL128
    (on by default for NVLink nodes with GPU and NIC under one PCIe switch, tuning.cc
    l.518-531) for rings and trees across domains. Inside one domain the scale-up link's
    two fitted regimes stand for whatever NCCL chose there."""
    if ph.k == 1:
        return (LL, SIMPLE)
    if ph.algo in (Algo.NVLS_TREE, Algo.SHARP, Algo.PAIRWISE) or not fabric.net_ll:
        return (SIMPLE,)
    if ph.algo in (Algo.RING, Algo.TREE) and c.model is not None:
        return (LL, LL128, SIMPLE)
    return (LL, SIMPLE)


def _phase(ph: Phase, shape: GroupShape, fabric: Fabric, c: Coefs, background):
    """(time, protocol, bandwidth time, bottleneck, busy seconds per tier) of the faster
    protocol."""
    best = None
    for proto in _protocols(ph, fabric, c):
        caps = _capacities(fabric, c, proto)
        if Tier.SCALE_UP in caps:                   # a mesh: only the links to the peers
            pattern = {Algo.PAIRWISE: "a2a", Algo.P2P: "p2p"}.get(ph.algo, "ring")
            caps[Tier.SCALE_UP] *= fabric.scale_up_share(ph.m, shape.stride, pattern,
                                                         shape.size)
        if ph.algo == Algo.PAIRWISE and ph.k > 1:
            bw_s, busy = _a2a_rounds_s(ph, shape, fabric, caps, background)
        else:
            bw_s, busy = _flows_s(ph.flows, fabric, c, caps, background, _algo_scale(ph, c))
        t = _latency_s(ph, proto, c, fabric) + bw_s
        if best is None or t < best[0]:
            bneck = max(busy, key=lambda k: (busy[k], k)) if busy else "-"
            best = (t, proto, bw_s, bneck, busy)
    return best


def _algo_scale(ph: Phase, c: Coefs) -> float:
    """1 / the algorithm's own efficiency (SHARP, NCCL's tree across domains)."""
    m = c.model
    if m is None:
        return 1.0
    if ph.algo == Algo.SHARP:
        return 1.0 / m.sharp_eff.value
    if ph.algo == Algo.TREE and ph.k > 1:
        return 1.0 / m.tree_eff.value
    return 1.0


def _capacities(fabric: Fabric, c: Coefs, proto: str) -> dict[Tier, float]:
    """Bytes/s each tier's link carries under ``proto`` (capacity x efficiency)."""
    ll128 = c.model.ll128_eff.value if proto == LL128 and c.model is not None else 1.0

    def eff(lc: LinkCoefficients | None) -> float:
        if lc is None:
            raise CalibrationMissingError(
                f"profile has no collective coefficients for {fabric.nic_kind!r} links")
        return (lc.small_bw_eff if proto == LL else lc.bw_eff).value * ll128
    out = {}
    for tier in fabric.tiers:
        if tier == Tier.SCALE_UP:
            e = eff(c.scale_up)
        elif tier == Tier.PCIE:
            e = c.model.pcie_eff.value if c.model is not None else 1.0
        else:
            e = eff(c.net)
        out[tier] = fabric.capacity_gbytes_per_s(tier) * 1e9 * e
    return out


def _weights(f: FlowClass, fabric: Fabric, c: Coefs, scale: float = 1.0) -> dict[Tier, float]:
    """Links of each tier ``f`` loads, per unit of its rate (times ``scale``: an
    algorithm's own efficiency); NVLS bytes cost the port ``port efficiency / NVLS
    efficiency`` each."""
    w = {t: f.weight(t, fabric) * scale for t in fabric.tiers if f.weight(t, fabric) > 0}
    if f.nvls and Tier.SCALE_UP in w:
        w[Tier.SCALE_UP] *= c.scale_up.bw_eff.value / c.nvls_eff()
    return w


def _flows_s(flows, fabric, c, caps, background, scale=1.0):
    """Bandwidth time (slowest flow class at its max-min rate) and busy time per tier."""
    weights = {("fg", i): _weights(f, fabric, c, scale) for i, f in enumerate(flows)}
    weights.update({("bg", i): _weights(f, fabric, c) for i, f in enumerate(background)})
    rates = fair_rates(weights, caps)
    slowest = max(f.bytes / rates[("fg", i)] for i, f in enumerate(flows))
    busy: dict[str, float] = {}
    for i, f in enumerate(flows):
        for tier, w in weights[("fg", i)].items():
            busy[tier.value] = busy.get(tier.value, 0.0) + w * f.bytes / caps[tier]
    return slowest, busy


def _a2a_rounds_s(ph: Phase, shape: GroupShape, fabric: Fabric, caps, background):
    """Pairwise all-to-all across domains: round ``delta`` sends ``S/n`` from every rank
    to rank ``+delta`` (PXN: through the NIC on the destination's rail) and lasts as
    long as its busiest tier; ``background`` stretches it as it does the aggregate."""
    n, m = ph.n, ph.m
    S = sum(f.bytes for f in ph.flows) * n / max(1, n - 1)
    c, gpn = S / n, fabric.gpus_per_nic
    leaf_ranks = shape.leaf_ranks if shape.leaf_groups > 1 else n
    block_ranks = shape.block_ranks if shape.blocks > 1 else n
    total, busy = 0.0, {}
    for d, w in round_deltas(n):
        off = off_block_share(d, n, m)
        loads = {Tier.SCALE_UP: c if m > 1 else 0.0}
        if off > 0:
            loads[Tier.PCIE] = c
            loads[Tier.NIC] = c * (max(1.0, off * gpn) if gpn >= 1 else gpn)
            loads[Tier.LEAF_UP] = c * gpn * off_block_share(d, n, leaf_ranks)
            loads[Tier.SPINE_UP] = c * gpn * off_block_share(d, n, block_ranks)
        times = {t: v / caps[t] for t, v in loads.items() if t in caps and v > 0}
        total += w * max(times.values(), default=0.0)
        for t, s in times.items():
            busy[t.value] = busy.get(t.value, 0.0) + w * s
    if background:
        total *= _stretch(ph.flows, fabric, caps, background)
    return total, busy


def _stretch(flows, fabric, caps, background) -> float:
    """How much ``background`` slows ``flows`` under max-min sharing (>= 1)."""
    alone = _plain_s(flows, fabric, caps, ())
    shared = _plain_s(flows, fabric, caps, background)
    return shared / alone if alone > 0 else 1.0


def _plain_s(flows, fabric, caps, background) -> float:
    weights = {("fg", i): {t: f.weight(t, fabric) for t in caps if f.weight(t, fabric) > 0}
               for i, f in enumerate(flows)}
    weights.update({("bg", i): {t: f.weight(t, fabric) for t in caps if f.weight(t, fabric) > 0}
                    for i, f in enumerate(background)})
    rates = fair_rates(weights, caps)
    return max(f.bytes / rates[("fg", i)] for i, f in enumerate(flows))


# ---- latency -------------------------------------------------------------------------------
def _steps(ph: Phase) -> tuple[int, int]:
    """(pipeline steps, of which across the network) of a phase."""
    n, k = ph.n, ph.k
    if ph.algo in (Algo.RING, Algo.NVLS):
        return (2 * (n - 1), 2 * (k - 1)) if ph.ar else (n - 1, k - 1)
    if ph.algo == Algo.TREE:      # chain in the domain, binary tree across domains
        return 2 * (ph.m - 1) + 2 * math.ceil(log2(k)), 2 * math.ceil(log2(k))
    if ph.algo in (Algo.NVLS_TREE, Algo.SHARP):
        return 2 * math.ceil(log2(k)) + 2, 2 * math.ceil(log2(k))
    if ph.algo == Algo.PAIRWISE:
        return n - 1, n - 1 if k > 1 else 0
    return 1, 1 if k > 1 else 0


def _latency_s(ph: Phase, proto: str, c: Coefs, fabric: Fabric) -> float:
    steps, net_steps = _steps(ph)
    if ph.k == 1:
        return _alpha_beta_latency_s(c.scale_up, steps, fabric.scale_up_latency_us, proto)
    if c.model is None:
        if c.net is None:
            raise CalibrationMissingError(
                f"profile has no collective coefficients for {fabric.nic_kind!r} links")
        return _alpha_beta_latency_s(c.net, steps, fabric.nic_latency_us, proto)
    return _nccl_latency_us(ph, proto, c.model, steps, net_steps) * 1e-6


def _alpha_beta_latency_s(lc: LinkCoefficients, steps: int, hop_us: float, proto: str) -> float:
    """The latency terms of ``collectives.alpha_beta_time_s``: ``steps * (alpha + hop)``
    (LL) or ``base + steps * hop`` (Simple)."""
    if proto == LL:
        return steps * (lc.alpha_us.value + hop_us) * 1e-6
    return (lc.base_us.value + steps * hop_us) * 1e-6


def _nccl_latency_us(ph: Phase, proto: str, M: NetworkModel, steps: int, net_steps: int) -> float:
    """NCCL's tuner latencies (``NetworkModel`` docstring) for a phase across domains."""
    if ph.algo in (Algo.RING, Algo.TREE):
        lat = M.latency(ph.algo.value, proto)
        base, intra, net = lat.base_us.value, lat.intra_step_us.value, lat.net_step_us.value
        if ph.algo == Algo.TREE:
            return base + 2 * ((ph.m - 1) * intra + log2(ph.k) * net)
        if ph.m == 1:                       # one rank per node: the tree's network latency
            net = M.latency("tree", proto).net_step_us.value
        floor = M.net_overhead_us.value * (3 if proto == SIMPLE else 1)
        total = base + (steps - net_steps) * max(intra, floor) + net_steps * net
        return total * (M.ring_simple_factor.value if ph.ar and proto == SIMPLE else 1.0)
    simple = M.latency("ring", SIMPLE)
    if ph.algo == Algo.NVLS_TREE:
        return M.nvls_tree_base_us.value + M.nvls_tree_level_us.value * log2(ph.k)
    if ph.algo == Algo.SHARP:
        return M.nvls_tree_base_us.value + 2 * simple.net_step_us.value
    if ph.algo == Algo.PAIRWISE:
        return simple.base_us.value + (ph.n - 1) * M.a2a_peer_us.value
    lat = M.latency("ring", proto)
    return lat.base_us.value + lat.net_step_us.value


def cluster_collective(cluster: ClusterSpec, op: Collective | str, size_bytes: float,
                       prof: Profile, algorithm: Algo | str = Algo.AUTO,
                       group: int | None = None, stride: int = 1) -> CollectiveCost:
    """``op`` over ``group`` ranks (default: every GPU of ``cluster``) ``stride`` apart,
    every such group of the cluster running at once (nccl-tests with one communicator per
    group)."""
    fab = fabric_of(cluster)
    n = group or cluster.n_gpus
    if not 1 <= n * stride <= cluster.n_gpus or n < 1:
        raise InvalidInputError("group", n, f"a group of 1..{cluster.n_gpus // max(1, stride)} "
                                f"ranks with stride {stride} on {cluster.n_gpus} GPUs")
    return collective_cost(op, size_bytes, group_shape(fab, n, stride), fab, prof, algorithm)
