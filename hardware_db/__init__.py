"""Hardware facts as data (``data/*.json``, a source for every number) and the loaders and
topology builders that turn them into ``simulator.hardware.specs`` specs.

Imports only the standard library, ``simulator.hardware.specs`` / ``simulator.errors`` and
``simulator.boundary`` (the checks of ``schema``, the data files' load-time schema)
(networkx only when a topology graph is built, ``simulator.hardware.profile`` lazily, for
``load_profile``).
"""
from .cluster import build_cluster
from .loaders import (
    default_node_for_gpu,
    default_node_key,
    gpu_entry,
    link_entry,
    list_gpus,
    list_links,
    list_nic_links,
    list_nodes,
    list_profiles,
    list_scale_up_links,
    load_gpu,
    load_link,
    load_node,
    load_profile,
    node_entry,
    resolve_gpu_key,
)
from .topology import build_graph, path_links, route

__all__ = [
    "build_cluster", "build_graph", "default_node_for_gpu", "default_node_key", "gpu_entry",
    "link_entry", "list_gpus", "list_links", "list_nic_links", "list_nodes", "list_profiles",
    "list_scale_up_links", "load_gpu", "load_link", "load_node", "load_profile", "node_entry",
    "path_links", "resolve_gpu_key", "route",
]
