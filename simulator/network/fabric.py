"""A cluster's fabric as tiers of identical links, built from counts and capacities.

No graph per GPU: a ``Fabric`` holds the handful of numbers that fix every tier, so a
cluster of 1,048,576 GPUs costs what one of 1,000 does. Tiers, per direction:

``scale-up``   each GPU's port into its scale-up domain (NVLink / NVSwitch, xGMI, ...);
``pcie``       each GPU's PCIe link to its NIC (the hop a NIC's traffic crosses first);
``nic``        each NIC port;
``leaf-spine`` a leaf's uplinks, counted per NIC port under the leaf: the leaf's
               ``leaf_down_ports`` ports over ``oversubscription``;
``spine-core`` a block's uplinks into the core tier (only past ``switch_radix *
               leaf_down_ports`` NIC ports), per NIC port, thinned once more by
               ``core_oversubscription``.

Leaf groups: rail-optimized (and with PXN, NCCL's default) a flow stays on the rail of its
destination, so what leaves a leaf is what leaves the group of ``leaf_down_ports`` nodes
(one port each per rail leaf, the "scalable unit"); not rail-optimized, a leaf holds all
the ports of ``leaf_down_ports / ports-per-node`` nodes. Multi-plane fabrics repeat the
leaf/spine tiers once per plane; a node's ports on one plane count as its rails.

``GroupShape`` is where a strided parallel group lands: members per scale-up domain,
domains, leaf groups and core blocks it spans - counted arithmetically, never by
enumerating the cluster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from ..hardware.specs import ClusterSpec


class Tier(str, Enum):
    SCALE_UP = "scale-up"
    PCIE = "pcie"
    NIC = "nic"
    LEAF_UP = "leaf-spine"
    SPINE_UP = "spine-core"


NET_TIERS = (Tier.PCIE, Tier.NIC, Tier.LEAF_UP, Tier.SPINE_UP)


@dataclass(frozen=True)
class Fabric:
    """Every tier of a cluster's fabric as (link count rule, capacity). Capacities are
    datasheet GB/s per direction; ``bw_scale`` multiplies all of them (what-ifs)."""

    n_gpus: int
    gpus_per_node: int
    domain_gpus: int
    scale_up_kind: str
    scale_up_gbytes_per_s: float
    in_switch: bool
    nics_per_node: int
    nic_kind: str
    nic_gbytes_per_s: float
    pcie_gbytes_per_s: float = 0.0
    rail_optimized: bool = True
    leaf_down_ports: int = 0
    switch_radix: int = 0
    oversubscription: float = 1.0
    core_oversubscription: float = 1.0
    planes: int = 1
    sharp: bool = False
    net_ll: bool = True
    scale_up_latency_us: float = 0.0
    nic_latency_us: float = 0.0
    bw_scale: float = 1.0
    scale_up_mesh: bool = False        # GPU-to-GPU links, no switch (``LinkSpec.mesh``)
    mesh_gpus: int = 0                 # GPUs the mesh wires together (the node's domain)
    scale_up_pair_gbytes_per_s: float = 0.0   # ``LinkSpec.pair_gbytes_per_s``

    def scale_up_share(self, members: int, stride: int = 1, pattern: str = "ring",
                       size: int = 0) -> float:
        """Share of a GPU's scale-up bandwidth a group of ``members`` in one domain can
        use: all of it through a switch; on a mesh the links to its ``members - 1`` peers
        of the ``mesh_gpus - 1`` the node wires (RCCL / NCCL run rings over every such link
        at once), however few GPUs the job uses. A packaged mesh:
        ``packaged_gbytes_per_s``."""
        wired = self.wired_gpus
        if not self.scale_up_mesh or wired <= 1:
            return 1.0
        if self.scale_up_pair_gbytes_per_s > 0:
            gbytes = self.packaged_gbytes_per_s(members, stride, pattern, size)
            return min(1.0, gbytes / self.scale_up_gbytes_per_s)
        return min(1.0, (max(2, members) - 1) / (wired - 1))

    def packaged_gbytes_per_s(self, members: int, stride: int, pattern: str, size: int) -> float:
        """GB/s per device of a group on a mesh of two-device packages (MI250X: ranks 2k,
        2k + 1 share ``pair``, every other peer gets ``rest`` = (bandwidth - pair) /
        (mesh - 2)). Only a stride-1 group holds whole packages. A ring collective is capped
        by the links a package has to the rest of the group (each ring enters and leaves a
        package once per channel); an all-to-all spreads over every peer, so its slowest
        peers bind; a send between two devices is the sibling link only for a 2-member
        stride-1 group (a pipeline of more stages also crosses packages)."""
        wired = self.wired_gpus
        pair = self.scale_up_pair_gbytes_per_s
        if wired <= 2:
            return pair
        rest = (self.scale_up_gbytes_per_s - pair) / (wired - 2)
        m, packaged = max(2, members), stride == 1
        if pattern == "p2p":
            return pair if packaged and size == 2 else rest
        if not packaged:
            return (m - 1) * rest
        if m == 2:
            return pair
        if pattern == "a2a":
            return (m - 1) * rest
        return min(pair + (m - 2) * rest, 2 * (m - 2) * rest)

    @property
    def wired_gpus(self) -> int:
        """GPUs one scale-up mesh wires together (the node's domain, not the job's)."""
        return self.mesh_gpus or self.domain_gpus

    # ---- counts ------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return max(1, -(-self.n_gpus // self.gpus_per_node))

    @property
    def gpus_per_nic(self) -> float:
        """GPUs sharing one NIC port (below 1 when a GPU has several ports)."""
        return self.gpus_per_node / max(1, self.nics_per_node)

    @property
    def nodes_per_leaf(self) -> int:
        """Nodes in one leaf group (see the module docstring); all nodes when no spine."""
        if self.leaf_down_ports <= 0:
            return self.n_nodes
        per_plane = max(1, self.nics_per_node // max(1, self.planes))
        ports_per_node = 1 if self.rail_optimized else per_plane
        return max(1, self.leaf_down_ports // ports_per_node)

    @property
    def three_tier(self) -> bool:
        ports = self.n_nodes * self.nics_per_node
        return self.switch_radix > 0 and self.leaf_down_ports > 0 and \
            ports > self.switch_radix * self.leaf_down_ports

    @property
    def nodes_per_block(self) -> int:
        """Nodes under one spine block (a third tier joins the blocks)."""
        if not self.three_tier:
            return self.n_nodes
        block_ports = (self.switch_radix // 2) * self.leaf_down_ports
        return max(self.nodes_per_leaf, block_ports // max(1, self.nics_per_node))

    @property
    def tiers(self) -> tuple[Tier, ...]:
        out = [Tier.SCALE_UP]
        if self.n_gpus > self.domain_gpus:
            out += [Tier.PCIE, Tier.NIC]
            if self.n_nodes > self.nodes_per_leaf:
                out.append(Tier.LEAF_UP)
            if self.three_tier and self.n_nodes > self.nodes_per_block:
                out.append(Tier.SPINE_UP)
        return tuple(out)

    # ---- capacities --------------------------------------------------------------------
    def capacity_gbytes_per_s(self, tier: Tier) -> float:
        """Datasheet capacity of one link of ``tier`` (leaf/spine tiers: per NIC port
        below them), per direction, times ``bw_scale``. ``inf`` where not limiting."""
        nic = self.nic_gbytes_per_s
        cap = {Tier.SCALE_UP: self.scale_up_gbytes_per_s,
               Tier.PCIE: self.pcie_gbytes_per_s or math.inf,
               Tier.NIC: nic,
               Tier.LEAF_UP: nic / self.oversubscription,
               Tier.SPINE_UP: nic / (self.oversubscription * self.core_oversubscription)}[tier]
        return cap * self.bw_scale

    def kind_of(self, tier: Tier) -> str:
        """Link kind (``Profile.links`` key) whose coefficients price ``tier``."""
        return self.scale_up_kind if tier == Tier.SCALE_UP else self.nic_kind

    def scaled(self, factor: float) -> "Fabric":
        return replace(self, bw_scale=self.bw_scale * factor)

    def describe(self) -> str:
        """One line: node, NICs, leaf/spine shape."""
        rail = "rail-optimized" if self.rail_optimized else "not rail-optimized"
        spine = f"{self.oversubscription:g}:1 spine" if self.n_nodes > self.nodes_per_leaf \
            else "one leaf"
        core = ", core tier" if Tier.SPINE_UP in self.tiers else ""
        return (f"{self.n_nodes} nodes x {self.gpus_per_node} GPUs, {self.nics_per_node} x "
                f"{self.nic_gbytes_per_s * 8:g} Gb/s {self.nic_kind} per node, {rail}, "
                f"{spine}{core}")


def fabric_of(cluster: ClusterSpec) -> Fabric:
    """The symbolic fabric of ``cluster`` (no graph)."""
    node = cluster.node
    return Fabric(
        n_gpus=cluster.n_gpus, gpus_per_node=node.gpus_per_node,
        domain_gpus=max(1, min(node.scale_up_domain_gpus, cluster.n_gpus)),
        scale_up_kind=node.scale_up.kind.value,
        scale_up_gbytes_per_s=node.scale_up.bandwidth_gbytes_per_s,
        in_switch=node.in_switch_reduction, nics_per_node=max(1, node.nics_per_node),
        nic_kind=node.nic.kind.value, nic_gbytes_per_s=node.nic.bandwidth_gbytes_per_s,
        pcie_gbytes_per_s=cluster.pcie_gbytes_per_s, rail_optimized=cluster.rail_optimized,
        leaf_down_ports=cluster.leaf_down_ports, switch_radix=cluster.switch_radix,
        oversubscription=cluster.oversubscription,
        core_oversubscription=cluster.core_oversubscription, planes=cluster.planes,
        sharp=cluster.in_network_reduction, net_ll=cluster.net_ll_protocol,
        scale_up_latency_us=node.scale_up.latency_us, nic_latency_us=node.nic.latency_us,
        scale_up_mesh=node.scale_up.mesh, mesh_gpus=max(1, node.scale_up_domain_gpus),
        scale_up_pair_gbytes_per_s=node.scale_up.pair_gbytes_per_s)


# ---- where a group lands ---------------------------------------------------------------------
@dataclass(frozen=True)
class GroupShape:
    """A group of ``size`` ranks ``stride`` apart in rank order, on a fabric.

    ``per_domain`` members share a scale-up domain and the group spans ``domains`` of
    them; ``leaf_groups`` / ``blocks``: distinct leaf groups and core blocks its members'
    nodes fall in. ``stride`` is kept for point-to-point pairs.
    """

    size: int
    stride: int
    per_domain: int
    domains: int
    leaf_groups: int
    blocks: int

    @property
    def leaf_ranks(self) -> float:
        """Members per leaf group (consecutive in group order)."""
        return self.size / self.leaf_groups

    @property
    def block_ranks(self) -> float:
        return self.size / self.blocks


def distinct_blocks(size: int, stride: int, unit: int) -> int:
    """How many distinct ``floor(i * stride / unit)`` for ``i < size``: the blocks of
    ``unit`` consecutive ranks that a strided group touches (closed form where the
    stride tiles the block, else counted up to 65,536 members, else estimated)."""
    if size <= 1 or unit <= 1:
        return max(1, size if unit <= 1 else 1)
    if stride >= unit:
        return size
    if unit % stride == 0:
        return -(-size // (unit // stride))
    if size <= 1 << 16:
        return len({i * stride // unit for i in range(size)})
    return max(1, min(size, math.ceil(size * stride / unit)))


def group_shape(fabric: Fabric, size: int, stride: int) -> GroupShape:
    """Shape of the group ``{0, stride, ..., (size - 1) * stride}`` (every group of a
    kind is alike under Megatron's rank order)."""
    size, stride = max(1, int(size)), max(1, int(stride))
    domains = distinct_blocks(size, stride, fabric.domain_gpus)
    g = fabric.gpus_per_node
    leaf = distinct_blocks(size, stride, fabric.nodes_per_leaf * g)
    block = distinct_blocks(size, stride, fabric.nodes_per_block * g)
    return GroupShape(size, stride, max(1, size // domains), domains,
                      max(1, min(leaf, domains)), max(1, min(block, leaf)))
