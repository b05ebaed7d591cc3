"""A flex (DeepEP-style) MoE dispatch or combine on a placed expert-parallel group.

DeepEP's normal kernels (deepseek-ai/DeepEP, "Normal kernels with NVLink and RDMA
forwarding") send each token once to every node holding one of its experts, over RDMA to the
GPU of the same local index (the rail), which forwards it over NVLink to the destination
GPUs; the combine runs the reverse, reducing inside the node before RDMA. Both legs run at
once, so the operation takes as long as the slower one:

* RDMA: an all-to-all among the group's ``domains`` rail peers, ``tokens x nodes hit x
  token_bytes`` through each rank's RDMA channel at the NIC's rate, the sender's own node
  included (DeepEP's kernel pushes those through the same channel, and its benchmark counts
  them so: ``tests/legacy/test_internode.py`` l.60-63, 224; ``workload.moe_load.
  flex_destinations``);
* NVLink: an all-to-all among the group's members in one node, ``tokens x ranks hit x
  token_bytes`` arriving at each rank.

Each leg is priced by ``network.price.collective_cost`` on its own sub-group (every rank
sends at once, as in the kernel). Checked against DeepEP's published bottleneck bandwidths
(tests/simulator/cost/test_flex_dispatch.py).
"""
from __future__ import annotations

from dataclasses import replace

from ..hardware.profile import Profile
from ..network.collectives import Collective
from ..network.price import CollectiveCost, collective_cost
from ..parallel.placement import GroupPlacement
from ..workload.moe_load import flex_destinations
from ..workload.op_types import FlexRouting


def flex_legs(r: FlexRouting, g: GroupPlacement) -> tuple[float, float]:
    """(NVLink bytes arriving at a rank, bytes through its RDMA channel) for one dispatch or
    combine."""
    nodes = max(1, g.domains)
    ranks_hit, nodes_hit = flex_destinations(r.top_k, r.experts, r.groups, r.group_topk,
                                             g.size, nodes)
    return r.tokens * ranks_hit * r.token_bytes, r.tokens * nodes_hit * r.token_bytes


def flex_leg_costs(r: FlexRouting, g: GroupPlacement, prof: Profile
                   ) -> tuple[CollectiveCost | None, CollectiveCost | None]:
    """(NVLink leg, RDMA leg) priced on their sub-groups; None where the group has none."""
    return _leg_costs(*flex_legs(r, g), g, prof)


def _leg_costs(nvl_bytes: float, rdma_bytes: float, g: GroupPlacement, prof: Profile
               ) -> tuple[CollectiveCost | None, CollectiveCost | None]:
    per, d = g.members_per_domain, g.domains
    intra = rail = None
    if per > 1:                                   # all-to-all inside one node
        shape = replace(g.shape, size=per, per_domain=per, domains=1, leaf_groups=1, blocks=1)
        intra = collective_cost(Collective.ALL_TO_ALL, nvl_bytes, shape, g.fabric, prof)
    if d > 1:                                     # one rank per node, the rail peers; an
        shape = replace(g.shape, size=d, stride=g.stride * per, per_domain=1, domains=d,
                        leaf_groups=min(g.shape.leaf_groups, d),
                        blocks=min(g.shape.blocks, d))
        # an all-to-all sends (d-1)/d of its buffer out: size it so the NIC carries all the
        # channel's bytes, the own node's share included
        rail = collective_cost(Collective.ALL_TO_ALL, rdma_bytes * d / (d - 1), shape,
                               g.fabric, prof)
    return intra, rail


def flex_cost(r: FlexRouting, g: GroupPlacement, prof: Profile) -> CollectiveCost:
    """The slower of the two legs, with both legs' link time counted."""
    if g.size <= 1 or g.shape is None or g.fabric is None:
        return CollectiveCost(Collective.ALL_TO_ALL, 0.0, max(1, g.size), 0.0, "none", "-", "-")
    nvl_bytes, rdma_bytes = flex_legs(r, g)
    legs = [c for c in _leg_costs(nvl_bytes, rdma_bytes, g, prof) if c is not None]
    slow = max(legs, key=lambda c: c.time_s)
    busy: dict[str, float] = {}
    for c in legs:
        for tier, sec in c.tier_busy_s:
            busy[tier] = busy.get(tier, 0.0) + sec
    return replace(slow, size_bytes=nvl_bytes, n=g.size,
                   algorithm=f"flex ({slow.algorithm})", tier_busy_s=tuple(sorted(busy.items())))
