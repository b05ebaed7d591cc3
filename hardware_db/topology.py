"""Topology graph of a cluster: scale-up domains, NICs, a (rail-optimized) two-tier fat tree.

Vertices
    ``("gpu", rank)``            one per GPU, rank = node * gpus_per_node + local index
    ``("nvswitch", d)``          one per scale-up domain d = rank // scale_up_domain_gpus
                                 (switch fabrics only: NVSwitch, NVL72, PCIe switch)
    ``("nic", node, j)``         NIC j of node; GPU i of a node uses NIC floor(i * nics / gpus_per_node)
    ``("leaf", pod, rail)``      rail-optimized: NIC j of every node of a pod goes to rail j's
                                 leaf; a pod is up to ``leaf_down_ports`` (32) nodes.
                                 Not rail-optimized: all NICs of floor(32 / nics) nodes share
                                 leaf ``("leaf", group, 0)``.
    ``("spine",)``               the whole spine tier aggregated into one vertex

Edges (every one carries ``kind`` (LinkKind value), ``bandwidth_gbytes_per_s`` (per
direction), ``latency_us`` and ``tier``):
    gpu-nvswitch   tier "scale_up", the per-GPU aggregate scale-up bandwidth
    gpu-gpu        tier "scale_up", mesh fabrics (xGMI, Gaudi RoCE): aggregate / (domain - 1);
                   packaged meshes (MI250X) wire package siblings at pair_gbytes_per_s
    gpu-nic        tier "pcie", the GPU's PCIe x16 link (gpus.json ``pcie_link``)
    nic-leaf       tier "nic", the NIC LinkSpec
    leaf-spine     tier "spine", sum of the leaf's downlinks / oversubscription; latency 0
                   (the NIC's per-hop network latency already stands for the fabric crossing)

Latencies are the LinkSpec's per-hop figures; summing them along a path over-counts the
network hop, so collective models should take alpha from the profile. Graphs are built once
per distinct (node, gpu, n_gpus, rail_optimized, oversubscription) and returned frozen
(read-only) from a small cache; 16,384 GPUs build in about 0.2 s.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from typing import TYPE_CHECKING, Any

from simulator.errors import InvalidInputError
from simulator.hardware.specs import ClusterSpec, LinkSpec, NodeSpec
from simulator.network.topology import SPINE, Layout, path_links, route  # noqa: F401 (re-exported)

from . import loaders

if TYPE_CHECKING:                      # networkx loads only when a graph is built
    import networkx as nx


def _edge_attrs(link: LinkSpec, tier: str, bandwidth: float | None = None,
                latency: float | None = None) -> dict[str, Any]:
    return {"kind": link.kind.value,
            "bandwidth_gbytes_per_s": float(link.bandwidth_gbytes_per_s if bandwidth is None else bandwidth),
            "latency_us": float(link.latency_us if latency is None else latency), "tier": tier}


def _layout(node: NodeSpec, n_gpus: int, rail_optimized: bool) -> Layout:
    ports = int(loaders.topology_params()["leaf_down_ports"])
    nodes_per_leaf = ports if rail_optimized else max(1, ports // node.nics_per_node)
    try:
        mesh = loaders.link_entry(node.scale_up.key).get("fabric") == "mesh"
    except InvalidInputError:  # a user-built LinkSpec not in the catalogue
        mesh = node.scale_up.kind.value == "xgmi"
    domain = max(node.scale_up_domain_gpus, 1)
    return Layout(n_gpus=n_gpus, gpus_per_node=node.gpus_per_node, domain_gpus=domain,
                  nics_per_node=node.nics_per_node, nodes_per_leaf=nodes_per_leaf,
                  rail_optimized=rail_optimized, mesh=mesh)


def _add_scale_up(g: nx.Graph, lay: Layout, link: LinkSpec) -> None:
    if not lay.mesh:
        g.add_edges_from(((("gpu", r), ("nvswitch", lay.domain_of(r))) for r in range(lay.n_gpus)),
                         **_edge_attrs(link, "scale_up"))
        return
    # a mesh: each pair of a domain its own edge, aggregate / (domain - 1); a packaged mesh
    # (LinkSpec.pair_gbytes_per_s) wires the package siblings 2k, 2k + 1 at ``pair`` and every
    # other pair at (aggregate - pair) / (domain - 2)
    pair, d = link.pair_gbytes_per_s, lay.domain_gpus
    per_peer = (link.bandwidth_gbytes_per_s - pair) / max(d - 2 if pair else d - 1, 1)
    g.add_nodes_from(("gpu", r) for r in range(lay.n_gpus))
    for start in range(0, lay.n_gpus, d):
        ranks = range(start, min(start + d, lay.n_gpus))
        for a, b in combinations(ranks, 2):      # package siblings: ranks 2k, 2k + 1
            bw = pair if pair and (a - start) // 2 == (b - start) // 2 else per_peer
            g.add_edge(("gpu", a), ("gpu", b), **_edge_attrs(link, "scale_up", bandwidth=bw))


def _add_nics(g: nx.Graph, lay: Layout, nic: LinkSpec, pcie: LinkSpec,
              on_die: bool = False) -> None:
    """GPU to NIC over PCIe; ports on the chip (``nic_on_die``, Gaudi) have no such hop:
    the edge carries the GPU's share of the node's ports, never the bottleneck."""
    bw = nic.bandwidth_gbytes_per_s * max(1, lay.nics_per_node // max(1, lay.gpus_per_node)) \
        if on_die else None
    g.add_edges_from(((("gpu", r), lay.nic_of(r)) for r in range(lay.n_gpus)),
                     **_edge_attrs(pcie, "pcie", bandwidth=bw, latency=0.0 if on_die else None))
    nics = [(n, j) for n in range(lay.n_nodes) for j in range(lay.nics_per_node)]
    g.add_edges_from(((("nic", n, j), lay.leaf_of_nic(n, j)) for n, j in nics), **_edge_attrs(nic, "nic"))


def _add_spine(g: nx.Graph, lay: Layout, nic: LinkSpec, oversubscription: float) -> None:
    down: dict[tuple, int] = {}
    for n in range(lay.n_nodes):
        for j in range(lay.nics_per_node):
            leaf = lay.leaf_of_nic(n, j)
            down[leaf] = down.get(leaf, 0) + 1
    g.add_node(SPINE)
    for leaf, count in down.items():
        bw = count * nic.bandwidth_gbytes_per_s / oversubscription
        g.add_edge(leaf, SPINE, **_edge_attrs(nic, "spine", bandwidth=bw, latency=0.0))


@lru_cache(maxsize=16)
def _cached(node: NodeSpec, gpu_key: str, n_gpus: int, rail_optimized: bool,
            oversubscription: float) -> nx.Graph:
    import networkx as nx
    lay = _layout(node, n_gpus, rail_optimized)
    g = nx.Graph(layout=lay, oversubscription=oversubscription)
    _add_scale_up(g, lay, node.scale_up)
    _add_nics(g, lay, node.nic, loaders.pcie_link(gpu_key), loaders.nic_on_die(gpu_key))
    _add_spine(g, lay, node.nic, oversubscription)
    return nx.freeze(g)


def build_graph(cluster: ClusterSpec) -> nx.Graph:
    """Frozen networkx graph of ``cluster`` (see the module docstring for vertices and edges)."""
    return _cached(cluster.node, cluster.gpu.key, int(cluster.n_gpus), bool(cluster.rail_optimized),
                   float(cluster.oversubscription))
