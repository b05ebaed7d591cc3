"""Where each parallel group lands on the cluster's fabric.

Rank order follows Megatron's default (tp fastest, then cp, dp, pp):
``rank = tp_r + tp * (cp_r + cp * (dp_r + dp * pp_r))``; EP groups are consecutive
TP blocks of the expert grid, which folds CP into expert data parallelism. A group is ``size`` ranks ``stride`` apart; its ``GroupShape`` (members
per scale-up domain, domains, leaf groups and core blocks spanned) on the cluster's
symbolic ``Fabric`` is what ``simulator.network.price`` routes its collectives over, with
every group of the same kind running at once (they share NICs and leaf uplinks). No graph
is needed, at any cluster size.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware.specs import ClusterSpec
from ..network.collectives import LinkUse
from ..network.fabric import Fabric, GroupShape, fabric_of, group_shape
from .plan import Plan


@dataclass(frozen=True)
class GroupPlacement:
    """A parallel group of ``size`` ranks, ``stride`` apart in rank order, on ``fabric``.

    ``intra`` / ``inter`` describe the links it crosses (the scale-up port; the NIC share of
    one rank) for reports; collectives are priced from ``fabric`` and ``shape``.
    """

    name: str
    size: int
    stride: int
    members_per_domain: int        # members sharing one scale-up domain
    domains: int                   # scale-up domains the group spans
    intra: LinkUse | None          # scale-up port (None if one member per domain)
    inter: LinkUse | None          # one rank's NIC share (None if inside one domain)
    in_switch: bool                # NVLS-capable scale-up fabric
    fabric: Fabric | None = None
    shape: GroupShape | None = None


def group_strides(plan: Plan) -> dict[str, tuple[int, int]]:
    """(size, stride) of each group type; "dp" is the gradient-reduction group (DP x CP)."""
    return {
        "tp": (plan.tp, 1),
        "cp": (plan.cp, plan.tp),
        # gradients are reduced over data- and context-parallel ranks together (contiguous
        # after TP in Megatron's tp-cp-dp order)
        "dp": (plan.dp * plan.cp, plan.tp),
        # Megatron-Core builds the expert grid with cp=1 (RankGenerator(tp=etp, ep, dp=edp,
        # pp, cp=1), megatron/core/parallel_state.py @ d98e8a64 l.887-895): an EP group is ep
        # ranks one expert-TP block apart (expert TP = TP here), CP folded into expert DP
        "ep": (plan.ep, plan.tp),
        # ranks holding the same experts: the DP x CP block thinned by EP
        "edp": (max(1, plan.dp * plan.cp // plan.ep), plan.tp * plan.ep),
        "pp": (plan.pp, plan.tp * plan.cp * plan.dp),
        # HSDP: the shard group (consecutive DP ranks) and the replicas of each shard
        "dp_shard": (plan.shard_ranks, plan.tp),
        "dp_rep": (plan.replicas, plan.tp * plan.shard_ranks),
        "edp_shard": (max(1, plan.shard_ranks // plan.ep), plan.tp * plan.ep),
    }


def place_group(cluster: ClusterSpec, name: str, size: int, stride: int,
                fabric: Fabric | None = None) -> GroupPlacement:
    """Placement of the group containing rank 0 (all groups of a kind are alike)."""
    fab = fabric or fabric_of(cluster)
    shape = group_shape(fab, size, stride)
    intra = inter = None
    if shape.per_domain > 1:
        su = cluster.node.scale_up
        intra = LinkUse(su.kind.value, su.bandwidth_gbytes_per_s, su.latency_us)
    if shape.domains > 1:
        nic = cluster.node.nic
        inter = LinkUse(nic.kind.value, cluster.nic_gbytes_per_s_per_gpu, nic.latency_us)
    return GroupPlacement(name, size, stride, shape.per_domain, shape.domains, intra, inter,
                          cluster.node.in_switch_reduction, fab, shape)


def stage_boundary(cluster: ClusterSpec, plan: Plan, fabric: Fabric | None = None) -> GroupPlacement:
    """The pair of ranks a pipeline send joins: a rank and its peer in the next stage."""
    return place_group(cluster, "pp", min(plan.pp, 2), plan.tp * plan.cp * plan.dp, fabric)
