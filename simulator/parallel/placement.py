"""Where each parallel group lands on the cluster, and which links its collectives cross.

Rank order follows Megatron's default (tp fastest, then cp, dp, pp):
``rank = tp_r + tp * (cp_r + cp * (dp_r + dp * pp_r))``; EP groups are consecutive
data-parallel ranks. A group that fits in one scale-up domain runs over the scale-up
fabric; one that spans nodes is bounded by whichever is slower: its scale-up hops, or the
node's NICs shared by the ``gpus_per_node / k`` concurrent groups that have ``k`` members
per node (each group gets ``k`` GPUs' worth of NIC bandwidth, as NCCL runs one ring
channel per NIC). Where the cluster carries a networkx graph (``hardware_db.topology``),
the links of a representative cross-node hop are read off the routed path.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..hardware.specs import ClusterSpec
from ..network.collectives import LinkUse
from ..network.topology import path_links
from .plan import Plan


@dataclass(frozen=True)
class GroupPlacement:
    """A parallel group of ``size`` ranks, ``stride`` apart in rank order."""

    name: str
    size: int
    stride: int
    members_per_domain: int        # members sharing one scale-up domain
    domains: int                   # scale-up domains the group spans
    intra: LinkUse | None          # scale-up bottleneck (None if one member per domain)
    inter: LinkUse | None          # scale-out bottleneck (None if inside one domain)
    in_switch: bool                # NVLS-capable fabric for the intra part


def group_strides(plan: Plan) -> dict[str, tuple[int, int]]:
    """(size, stride) of each group type; "dp" is the gradient-reduction group (DP x CP)."""
    return {
        "tp": (plan.tp, 1),
        "cp": (plan.cp, plan.tp),
        # gradients are reduced over data- and context-parallel ranks together (contiguous
        # after TP in Megatron's tp-cp-dp order)
        "dp": (plan.dp * plan.cp, plan.tp),
        "ep": (plan.ep, plan.tp * plan.cp),
        # ranks holding the same experts: the DP x CP block thinned by EP
        "edp": (max(1, plan.dp * plan.cp // plan.ep), plan.tp * plan.ep),
        "pp": (plan.pp, plan.tp * plan.cp * plan.dp),
    }


def place_group(cluster: ClusterSpec, name: str, size: int, stride: int) -> GroupPlacement:
    """Placement of the group containing rank 0 (all groups of a type are alike)."""
    domain = min(cluster.node.scale_up_domain_gpus, cluster.n_gpus)
    members = [i * stride for i in range(size)]
    domains = len({r // domain for r in members})
    per_domain = size // domains if domains else size
    intra = inter = None
    if per_domain > 1:
        su = cluster.node.scale_up
        intra = LinkUse(su.kind.value, su.bandwidth_gbytes_per_s, su.latency_us)
    if domains > 1:
        inter = _inter_link(cluster, per_domain, members[0], members[1] if per_domain == 1
                            else members[per_domain])
    return GroupPlacement(name, size, stride, per_domain, domains, intra, inter,
                          cluster.node.in_switch_reduction)


def _inter_link(cluster: ClusterSpec, per_domain: int, a: int, b: int) -> LinkUse:
    """Scale-out bottleneck for a group with ``per_domain`` members in each domain."""
    nic = cluster.node.nic
    gpn = cluster.node.gpus_per_node
    bw = per_domain * cluster.nic_gbytes_per_s_per_gpu
    # a group cannot use more NICs than its node has
    bw = min(bw, cluster.node.nics_per_node * nic.bandwidth_gbytes_per_s * max(1, per_domain // gpn))
    latency = nic.latency_us
    if cluster.graph is not None:
        bw, latency = _routed_bottleneck(cluster, a, b, bw, latency)
    if cluster.oversubscription > 1 and _crosses_spine(cluster, a, b):
        bw /= cluster.oversubscription
    return LinkUse(nic.kind.value, bw, latency)


def _routed_bottleneck(cluster: ClusterSpec, a: int, b: int, bw: float,
                       latency: float) -> tuple[float, float]:
    """Cap ``bw`` by the slowest non-scale-up edge on the routed a->b path; sum latencies."""
    edges = path_links(cluster.graph, a, b)
    scale_out = [e for e in edges if e.get("tier") != "scale_up"]
    if not scale_out:
        return bw, latency
    lat = sum(float(e.get("latency_us", 0.0)) for e in scale_out)
    return bw, max(latency, lat)


@lru_cache(maxsize=4096)
def _pod_of(node: int, pod_nodes: int) -> int:
    return node // pod_nodes


def _crosses_spine(cluster: ClusterSpec, a: int, b: int) -> bool:
    gpn, pod = cluster.node.gpus_per_node, cluster.pod_nodes
    return pod > 0 and _pod_of(a // gpn, pod) != _pod_of(b // gpn, pod)


def stage_boundary_link(cluster: ClusterSpec, plan: Plan) -> LinkUse:
    """Link a pipeline send between adjacent stages crosses (per rank)."""
    g = place_group(cluster, "pp", min(plan.pp, 2), plan.tp * plan.cp * plan.dp)
    if g.inter is not None:
        nic = cluster.node.nic
        return LinkUse(nic.kind.value, cluster.nic_gbytes_per_s_per_gpu, nic.latency_us)
    su = cluster.node.scale_up
    return LinkUse(su.kind.value, su.bandwidth_gbytes_per_s, su.latency_us)
