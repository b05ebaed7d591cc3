"""A scale-up fabric wired GPU to GPU without a switch (MI300X's xGMI, a 4-GPU GH200 NVLink
mesh): each pair has its own link of aggregate / (domain - 1), so a group of m members of
a domain reaches (m - 1) / (domain - 1) of a GPU's scale-up bandwidth
(``Fabric.scale_up_share``); through a switch any group gets all of it. The graph model
(``hardware_db.topology``) wires the same per-peer edges."""
from __future__ import annotations

import hardware_db
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.layer import group_collective_s
from simulator.network.collectives import Collective
from simulator.parallel.placement import place_group

SIZE = 1 << 30


def _busbw(gpu: str, members: int, n_gpus: int = 8) -> float:
    prof, cl = hardware_db.load_profile(gpu), hardware_db.build_cluster(gpu, n_gpus)
    t = group_collective_s(Collective.ALL_REDUCE, SIZE, place_group(cl, "tp", members, 1), prof)
    return 2 * (members - 1) / members * SIZE / t / 1e9


@pytest.mark.parametrize("gpu, link, domain", [("mi300x", "xgmi-mi300x", 8),
                                               ("gh200", "nvlink4-gh200-quad", 4),
                                               ("gaudi2", "gaudi2-roce-scaleup", 8),
                                               ("gaudi3", "gaudi3-roce-scaleup", 8)])
def test_a_pair_on_a_mesh_gets_one_link(gpu, link, domain):
    prof, cl = hardware_db.load_profile(gpu), hardware_db.build_cluster(gpu, 8)
    kind = cl.node.scale_up.kind.value
    per_peer = hardware_db.load_link(link).bandwidth_gbytes_per_s / (domain - 1)
    t = group_collective_s(Collective.SEND_RECV, SIZE, place_group(cl, "pp", 2, 1), prof)
    assert SIZE / t / 1e9 == pytest.approx(prof.links[kind].bw_eff.value * per_peer, rel=0.02)
    # the whole domain uses every link: the aggregate at the same efficiency
    assert _busbw(gpu, domain) > (domain - 1) * 0.9 * _busbw(gpu, 2)


@settings(max_examples=10, deadline=None)
@given(a=st.sampled_from([2, 4, 8]), b=st.sampled_from([2, 4, 8]))
def test_more_members_never_less_bandwidth_per_gpu(a, b):
    lo, hi = sorted((a, b))
    assert _busbw("mi300x", hi) >= _busbw("mi300x", lo) * (1 - 1e-9)


def test_a_switch_gives_a_pair_the_whole_port():
    prof = hardware_db.load_profile("h100-sxm")
    assert _busbw("h100-sxm", 2) == pytest.approx(prof.links["nvlink"].bw_eff.value * 450.0,
                                                  rel=0.05)


def test_the_graph_model_wires_the_same_per_peer_links():
    g = hardware_db.build_cluster("gh200", 4, build_graph=True).graph
    edges = [d["bandwidth_gbytes_per_s"] for a, b, d in g.edges(data=True)
             if d["tier"] == "scale_up"]
    assert edges and all(e == pytest.approx(150.0) for e in edges)


def test_a_mesh_share_counts_the_nodes_wiring_not_the_jobs_size():
    """A 4-GPU job on an 8-GPU MI300X mesh: each GPU reaches its 3 peers over 3 of its 7
    links (3 x 64 = 192 GB/s), not the whole 448 (the share used to divide by the job's
    GPUs instead of the node's)."""
    prof = hardware_db.load_profile("mi300x")
    eff = prof.links["xgmi"].bw_eff.value
    assert _busbw("mi300x", 4, n_gpus=4) == pytest.approx(eff * 3 * 64.0, rel=0.05)
    assert _busbw("mi300x", 4, n_gpus=4) == pytest.approx(_busbw("mi300x", 4, n_gpus=8),
                                                          rel=1e-6)


def _graph_gbytes(ranks: list[int], pattern: str) -> float:
    """What the graph's MI250X links allow a group, per device: a ring is capped by every
    device's own links into the group and by every package's links to the rest of it; an
    all-to-all by a device's slowest peer times the peers it talks to; a send by its link."""
    g = hardware_db.build_cluster("mi250x", 8, build_graph=True).graph

    def bw(a: int, b: int) -> float:
        return g.edges[("gpu", a), ("gpu", b)]["bandwidth_gbytes_per_s"]
    if pattern == "p2p":
        return bw(ranks[0], ranks[1])
    if pattern == "a2a":
        return min(min(bw(a, b) for b in ranks if b != a) * (len(ranks) - 1) for a in ranks)
    links = min(sum(bw(a, b) for b in ranks if b != a) for a in ranks)
    packages = [[a, a ^ 1] for a in ranks if a % 2 == 0 and a ^ 1 in ranks]
    if len(packages) > 1:
        links = min(links, *(sum(bw(a, b) for a in p for b in ranks if b not in p)
                              for p in packages))
    return links


@pytest.mark.parametrize("size, stride, pattern", [
    (2, 1, "ring"), (4, 1, "ring"), (8, 1, "ring"),          # TP groups: whole packages
    (2, 2, "ring"), (4, 2, "ring"), (2, 4, "ring"),          # DP/CP beside TP: no siblings
    (8, 1, "a2a"), (4, 2, "a2a"), (2, 1, "a2a"),
    (2, 1, "p2p"), (2, 2, "p2p"), (2, 4, "p2p"),
])
def test_mi250x_share_matches_what_the_graph_wires(size, stride, pattern):
    """MI250X: the two GCDs of a card share 4 Infinity Fabric links (200 GB/s per direction,
    links.json 'xgmi-mi250x' pair_gbytes_per_s); the other 150 GB/s of a GCD's 350 spread over
    the 6 GCDs of the other cards (25 each). The symbolic share of a group (size, stride,
    pattern) gives what the graph's links allow it (``_graph_gbytes``): TP-2 200, TP-4 100
    (the package-to-package cut), TP-8 300, a stride-2 pair 25, an all-to-all of 8 175."""
    from simulator.network.fabric import fabric_of
    fab = fabric_of(hardware_db.build_cluster("mi250x", 8))
    ranks = [i * stride for i in range(size)]
    got = fab.scale_up_share(size, stride, pattern, size) * fab.scale_up_gbytes_per_s
    assert got == pytest.approx(_graph_gbytes(ranks, pattern))


def test_a_strided_pipeline_send_on_mi250x_crosses_packages():
    """A send between stage ranks 4 apart (TP 4) uses one cross-card peer link (25 GB/s),
    not the sibling's 200 (``complexity collective --op send_recv --stride 4``)."""
    prof, cl = hardware_db.load_profile("mi250x"), hardware_db.build_cluster("mi250x", 8)
    eff = prof.links["xgmi"].bw_eff.value
    near = group_collective_s(Collective.SEND_RECV, SIZE, place_group(cl, "pp", 2, 1), prof)
    far = group_collective_s(Collective.SEND_RECV, SIZE, place_group(cl, "pp", 2, 4), prof)
    assert SIZE / near / 1e9 == pytest.approx(eff * 200.0, rel=0.02)
    assert SIZE / far / 1e9 == pytest.approx(eff * 25.0, rel=0.02)


def test_mi250x_collective_bandwidth_follows_the_share():
    prof = hardware_db.load_profile("mi250x")
    eff = prof.links["xgmi"].bw_eff.value
    for members, gbytes in ((2, 200.0), (4, 100.0), (8, 300.0)):
        assert _busbw("mi250x", members) == pytest.approx(eff * gbytes, rel=0.05)


def test_the_graph_wires_mi250x_siblings_wider_and_conserves_each_gcds_links():
    """Each GCD's scale-up edges add up to its 350 GB/s: 200 to its sibling, 25 to each of
    the 6 others; a 2-GCD node wires the sibling link alone, as the symbolic share prices."""
    from simulator.network.fabric import fabric_of
    g = hardware_db.build_cluster("mi250x", 8, build_graph=True).graph
    for r in range(8):
        bws = {b[1]: d["bandwidth_gbytes_per_s"] for a, b, d in g.edges(("gpu", r), data=True)
               if d["tier"] == "scale_up"}
        assert sum(bws.values()) == pytest.approx(350.0)
        assert bws[r ^ 1] == pytest.approx(200.0)
        assert all(v == pytest.approx(25.0) for k, v in bws.items() if k != r ^ 1)
    two = hardware_db.build_cluster("mi250x", 2, gpus_per_node=2, build_graph=True)
    edge = [d["bandwidth_gbytes_per_s"] for a, b, d in two.graph.edges(data=True)
            if d["tier"] == "scale_up"]
    fab = fabric_of(two)
    assert edge == [200.0] and fab.scale_up_share(2) * fab.scale_up_gbytes_per_s == 200.0
