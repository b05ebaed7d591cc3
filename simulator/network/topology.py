"""Where ranks sit in a cluster's fat tree and the route between two of them.

``Layout`` places GPUs, NICs and leaves (the vertices of the graph ``hardware_db.topology``
builds, stored as ``graph.graph["layout"]``); ``route`` walks GPU -> NIC -> leaf (-> spine
-> leaf) -> NIC -> GPU, or the scale-up fabric inside one domain, without a graph search.
networkx is imported only for graphs without a layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

from ..errors import InvalidInputError

SPINE = ("spine",)


@dataclass(frozen=True)
class Layout:
    """Where each vertex sits; stored as ``graph.graph["layout"]`` for fast routing."""

    n_gpus: int
    gpus_per_node: int          # hardware GPUs per node (NIC accounting)
    domain_gpus: int            # scale-up domain size
    nics_per_node: int
    nodes_per_leaf: int
    rail_optimized: bool
    mesh: bool

    @property
    def n_nodes(self) -> int:
        return -(-self.n_gpus // self.gpus_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def domain_of(self, rank: int) -> int:
        return rank // self.domain_gpus

    def nic_of(self, rank: int) -> tuple:
        local = rank % self.gpus_per_node
        return ("nic", self.node_of(rank), local * self.nics_per_node // self.gpus_per_node)

    def leaf_of_nic(self, node: int, j: int) -> tuple:
        if self.rail_optimized:
            return ("leaf", node // self.nodes_per_leaf, j)
        return ("leaf", node // self.nodes_per_leaf, 0)


def route(graph: Any, rank_a: int, rank_b: int) -> list[Hashable]:
    """Vertices on the path from GPU ``rank_a`` to GPU ``rank_b``.

    Same scale-up domain: over the scale-up fabric. Otherwise: own NIC, leaf, (spine, other
    leaf when the leaves differ), the peer's NIC. Graphs without a ``layout`` fall back to a
    hop-count shortest path.
    """
    lay: Layout | None = graph.graph.get("layout")
    a, b = ("gpu", rank_a), ("gpu", rank_b)
    for v in (a, b):
        if v not in graph:
            raise InvalidInputError("rank", v[1], f"a GPU rank in 0..{sum(1 for n in graph if n[0] == 'gpu') - 1}")
    if lay is None:
        import networkx as nx
        return nx.shortest_path(graph, a, b)
    if rank_a == rank_b:
        return [a]
    if lay.domain_of(rank_a) == lay.domain_of(rank_b):
        return [a, b] if lay.mesh else [a, ("nvswitch", lay.domain_of(rank_a)), b]
    na, nb = lay.nic_of(rank_a), lay.nic_of(rank_b)
    la, lb = lay.leaf_of_nic(*na[1:]), lay.leaf_of_nic(*nb[1:])
    middle = [la] if la == lb else [la, SPINE, lb]
    return [a, na, *middle, nb, b]


def path_links(graph: Any, rank_a: int, rank_b: int) -> list[dict]:
    """Edge attribute dicts (copies) along the route from GPU ``rank_a`` to GPU ``rank_b``."""
    path = route(graph, rank_a, rank_b)
    return [dict(graph.edges[u, v]) for u, v in zip(path, path[1:])]
