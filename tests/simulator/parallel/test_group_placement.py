"""Parallel groups' (size, stride) against Megatron-Core's rank grids.

Megatron-Core (megatron/core/parallel_state.py @ d98e8a64, class RankGenerator and
initialize_model_parallel l.859-895) builds two grids over the same ranks: the dense one in
order tp-cp-dp-pp and the expert one in order tp-ep-dp-pp with ``cp=1`` (context
parallelism folded into expert data parallelism). The groups are re-derived here from that
rank arithmetic, independently of ``simulator.parallel.placement``, and compared.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.api.catalog import make_cluster
from simulator.parallel.placement import group_strides, place_group
from simulator.parallel.plan import Plan


def _grid_groups(sizes: dict[str, int], order: list[str], axis: str) -> list[list[int]]:
    """Megatron's RankGenerator.get_ranks(axis): ranks that differ only in ``axis``, the
    first axis of ``order`` varying fastest."""
    strides, s = {}, 1
    for a in order:
        strides[a] = s
        s *= sizes[a]
    others = [a for a in order if a != axis]
    groups = []

    def walk(i: int, base: int) -> None:
        if i == len(others):
            groups.append([base + k * strides[axis] for k in range(sizes[axis])])
            return
        for c in range(sizes[others[i]]):
            walk(i + 1, base + c * strides[others[i]])
    walk(0, 0)
    return sorted(groups)


def _from_stride(size: int, stride: int, world: int) -> list[list[int]]:
    """All groups of ``size`` ranks ``stride`` apart (the placement's description)."""
    seen, groups = set(), []
    for r in range(world):
        if r in seen:
            continue
        base = r
        g = [base + k * stride for k in range(size)]
        seen.update(g)
        groups.append(g)
    return sorted(groups)


@st.composite
def _plans(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([d for d in (1, 2, 4, 8) if (dp * cp) % d == 0]))
    pp = draw(st.sampled_from([1, 2]))
    return tp, cp, dp, ep, pp


@settings(max_examples=60, deadline=None)
@given(_plans())
def test_groups_match_megatron_rank_grids(case):
    tp, cp, dp, ep, pp = case
    plan = Plan(tp=tp, cp=cp, dp=dp, ep=ep, pp=pp)
    world = tp * cp * dp * pp
    dense = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    expert = {"tp": tp, "ep": ep, "dp": dp * cp // ep, "pp": pp}
    want = {
        "tp": _grid_groups(dense, ["tp", "cp", "dp", "pp"], "tp"),
        "cp": _grid_groups(dense, ["tp", "cp", "dp", "pp"], "cp"),
        "pp": _grid_groups(dense, ["tp", "cp", "dp", "pp"], "pp"),
        "ep": _grid_groups(expert, ["tp", "ep", "dp", "pp"], "ep"),
        "edp": _grid_groups(expert, ["tp", "ep", "dp", "pp"], "dp"),
    }
    got = group_strides(plan)
    for name, groups in want.items():
        size, stride = got[name]
        assert _from_stride(size, stride, world) == groups, name
    # gradient reduction of dense weights: data- and context-parallel ranks together
    dpcp = _grid_groups({"tp": tp, "cpdp": cp * dp, "pp": pp}, ["tp", "cpdp", "pp"], "cpdp")
    assert _from_stride(*got["dp"], world) == dpcp


def test_context_parallelism_keeps_an_ep8_group_inside_one_node():
    """CP 2 x DP 32, EP 8, TP 1 on 8-GPU nodes: Megatron's EP group is 8 consecutive ranks,
    one NVLink domain; spacing it by TP x CP would span two nodes and send the all-to-all
    over InfiniBand."""
    cluster = make_cluster("h100-sxm", 64)
    size, stride = group_strides(Plan(tp=1, cp=2, dp=32, ep=8))["ep"]
    assert (size, stride) == (8, 1)
    g = place_group(cluster, "ep", size, stride)
    assert g.domains == 1 and g.members_per_domain == 8
