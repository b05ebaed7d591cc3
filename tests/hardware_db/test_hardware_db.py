"""hardware_db: data files with sources, loaders, build_cluster, topology graph."""
from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_db as hdb
from hardware_db import loaders, topology
from simulator.errors import CalibrationMissingError, InvalidInputError, ProfileError
from simulator.hardware.specs import SCALE_OUT_KINDS, ClusterSpec, GPUSpec, LinkKind, LinkSpec, NodeSpec

DATA = Path(hdb.__file__).resolve().parent / "data"
REQUIRED_GPUS = ["v100-sxm-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h200-sxm",
                 "b200", "gb200", "mi300x"]
REQUIRED_NODES = ["dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8", "dgx-2"]
# ../shared beside the checkout (present in CI, absent on a bare clone: the test skips)
PUBLISHED = next(p for p in Path(__file__).resolve().parents
                 if (p / "pyproject.toml").is_file()).parent / "shared" / "validation" / "published_runs.csv"


def _numeric_fields(entry: dict) -> list[str]:
    return [k for k, v in entry.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) or k == "peak_tflops"]


# ---- data files: every number has a source ------------------------------------------
@pytest.mark.parametrize("name,table", [("gpus", "gpus"), ("links", "links"), ("nodes", "nodes")])
def test_every_number_has_a_source(name, table):
    entries = json.loads((DATA / f"{name}.json").read_text())[table]
    assert entries
    for key, e in entries.items():
        for f in _numeric_fields(e):
            assert e["sources"].get(f, "").strip(), f"{name}:{key}.{f} has no source"


def test_node_counts_have_sources_and_links_exist():
    for key in hdb.list_nodes():
        e = hdb.node_entry(key)
        for f in ("gpus_per_node", "scale_up_domain_gpus", "nics_per_node", "in_switch_reduction"):
            assert e["sources"][f].strip()
        assert e["scale_up"] in hdb.list_scale_up_links()
        assert e["nic"] in hdb.list_nic_links()
        assert e["gpu_key"] in hdb.list_gpus()


def test_topology_params_have_sources():
    p = loaders.topology_params()
    assert p["leaf_down_ports"] > 0 and p["sources"]["leaf_down_ports"]


def test_required_gpus_and_nodes_present():
    assert set(REQUIRED_GPUS) <= set(hdb.list_gpus())
    assert set(REQUIRED_NODES) <= set(hdb.list_nodes())


@pytest.mark.parametrize("key", loaders.list_gpus())
def test_every_gpu_loads(key):
    g = hdb.load_gpu(key)
    assert isinstance(g, GPUSpec) and g.key == key
    assert g.mem_bytes > 1e9 and g.mem_bw_gbytes_per_s > 100 and g.tdp_w > 0
    assert g.peak("bf16") > 0 and g.source
    assert g.price_usd_per_hour >= 0
    assert set(g.peak_tflops) <= {"fp32", "tf32", "bf16", "fp16", "fp8"}
    hdb.default_node_for_gpu(key)


@pytest.mark.parametrize("key", loaders.list_links())
def test_every_link_loads(key):
    link = hdb.load_link(key)
    assert isinstance(link, LinkSpec) and isinstance(link.kind, LinkKind)
    assert link.bandwidth_gbytes_per_s > 0 and link.latency_us >= 0 and link.source


@pytest.mark.parametrize("key", loaders.list_nodes())
def test_every_node_loads(key):
    n = hdb.load_node(key)
    assert isinstance(n, NodeSpec) and n.source
    assert n.scale_up_domain_gpus % n.gpus_per_node == 0
    assert n.nics_per_node > 0 and n.nic.kind in SCALE_OUT_KINDS


def test_datasheet_values_spot_checks():
    h100 = hdb.load_gpu("h100-sxm")
    assert h100.peak_tflops["bf16"] == 989.5 and h100.mem_bytes == 80e9
    assert h100.mem_bw_gbytes_per_s == pytest.approx(3350)
    assert hdb.load_gpu("a100-sxm-40gb").mem_bw_gbytes_per_s == pytest.approx(1555)
    assert hdb.load_link("nvlink3").bandwidth_gbytes_per_s == 300
    assert hdb.load_link("nvlink5-nvl72").bandwidth_gbytes_per_s == 900
    assert hdb.load_link("ib-ndr").bandwidth_gbytes_per_s == 50
    assert hdb.load_link("xgmi-mi300x").kind is LinkKind.XGMI


def test_nvls_flags():
    for key in ("dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72"):
        assert hdb.load_node(key).in_switch_reduction
    for key in ("dgx-a100", "dgx-a100-40gb", "mi300x-8", "dgx-2"):
        assert not hdb.load_node(key).in_switch_reduction


def test_default_nodes():
    expect = {"a100-sxm-80gb": "dgx-a100", "a100-sxm-40gb": "dgx-a100-40gb", "h100-sxm": "dgx-h100",
              "h200-sxm": "hgx-h200", "b200": "dgx-b200", "gb200": "gb200-nvl72", "mi300x": "mi300x-8"}
    for gpu, node in expect.items():
        n = hdb.default_node_for_gpu(gpu)
        assert n.key == node and n.gpu_key == gpu
    v = hdb.default_node_for_gpu("v100-sxm-32gb")
    assert v.scale_up.kind is LinkKind.NVLINK and v.gpus_per_node >= 8
    nvl = hdb.default_node_for_gpu("gb200")
    assert (nvl.gpus_per_node, nvl.scale_up_domain_gpus, nvl.nics_per_node) == (4, 72, 4)


# ---- keys, aliases and errors ------------------------------------------------------------
def test_aliases():
    assert hdb.load_gpu("h100").key == "h100-sxm"
    assert hdb.load_gpu("A100").key == "a100-sxm-80gb"
    assert hdb.load_gpu("H100_SXM").key == "h100-sxm"
    assert hdb.load_node("DGX_H100").key == "dgx-h100"


@pytest.mark.parametrize("name,table", [("gpus", "gpus"), ("links", "links"), ("nodes", "nodes")])
def test_aliases_unambiguous(name, table):
    entries = json.loads((DATA / f"{name}.json").read_text())[table]
    seen: dict[str, str] = {}
    for key, e in entries.items():
        for a in e.get("aliases", []):
            assert a not in entries, f"alias {a} shadows a key"
            assert seen.setdefault(a, key) == key, f"alias {a} is ambiguous"


@pytest.mark.parametrize("fn,field", [(hdb.load_gpu, "gpu"), (hdb.load_link, "link"),
                                      (hdb.load_node, "node"), (hdb.default_node_for_gpu, "gpu")])
def test_unknown_key_raises(fn, field):
    with pytest.raises(InvalidInputError) as ei:
        fn("tpu-v9000")
    assert ei.value.field == field and ei.value.value == "tpu-v9000"
    assert "," in ei.value.valid  # lists the valid keys


def test_load_profile_missing_or_present():
    profiles = hdb.list_profiles()
    missing = next(k for k in hdb.list_gpus() if k not in profiles)
    with pytest.raises(CalibrationMissingError, match=missing):
        hdb.load_profile(missing)
    for key in profiles:
        if key in hdb.list_gpus():
            try:
                assert hdb.load_profile(key).device_key
            except ProfileError:  # another engineer's file mid-edit
                pass


# ---- build_cluster -------------------------------------------------------------------
def test_build_cluster_defaults():
    c = hdb.build_cluster("h100-sxm", 64)
    assert isinstance(c, ClusterSpec) and c.n_nodes == 8 and c.node.key == "dgx-h100"
    assert c.nic_gbytes_per_s_per_gpu == 50 and c.graph is None      # symbolic by default
    assert (c.leaf_down_ports, c.switch_radix, c.pcie_gbytes_per_s) == (32, 64, 63.0)
    assert c.net_ll_protocol and not c.in_network_reduction
    assert hdb.build_cluster("h100-sxm", 64, build_graph=True).graph is not None
    efa = hdb.build_cluster("b200", 32, node="aws-p6-b200")
    assert efa.node.nic.kind is LinkKind.EFA and not efa.net_ll_protocol


def test_build_cluster_nic_override():
    c = hdb.build_cluster("h100-sxm", 16, nic_gbits_per_s=800)
    assert c.node.nic.bandwidth_gbytes_per_s == 100 and c.node.nic.kind is LinkKind.INFINIBAND
    c = hdb.build_cluster("h100-sxm", 16, nic_gbits_per_s=123)
    assert c.node.nic.bandwidth_gbytes_per_s == pytest.approx(123 / 8) and "override" in c.node.nic.source
    c = hdb.build_cluster("a100", 16, nics_per_node=4, nic_gbits_per_s=100, nic_kind="omnipath")
    assert c.node.nic.key == "omnipath-100" and c.node.nics_per_node == 4
    assert c.nic_gbytes_per_s_per_gpu == pytest.approx(4 * 12.5 / 8)
    assert hdb.build_cluster("a100", 16, nic_gbits_per_s=100).node.nic.kind is LinkKind.INFINIBAND
    assert hdb.build_cluster("h100", 16, nic_kind="roce").node.nic.key == "roce-400"


def test_build_cluster_scale_up_override():
    c = hdb.build_cluster("b200", 144, scale_up="nvlink5-nvl72", gpus_per_node=4, build_graph=True)
    assert c.node.scale_up_domain_gpus == 72 and c.node.in_switch_reduction
    assert sum(1 for v in c.graph if v[0] == "nvswitch") == 2
    c = hdb.build_cluster("h100", 8, scale_up="nvlink3")
    assert c.node.scale_up.bandwidth_gbytes_per_s == 300 and not c.node.in_switch_reduction
    c = hdb.build_cluster("gb200", 144, gpus_per_node=72)
    assert c.n_nodes == 2 and c.node.scale_up_domain_gpus == 72


@pytest.mark.parametrize("gpu,named,key,gbytes", [
    ("h800", "nvlink4", "nvlink4-h800", 200.0),       # the H800's own NVLink 4, cut
    ("h800", "NVLink4.0", "nvlink4-h800", 200.0),
    ("a800", "nvlink3", "nvlink3-a800", 200.0),
    ("a800", "nvswitch", "nvlink3-a800", 200.0),
    ("gh200", "nvlink4", "nvlink4-gh200-quad", 450.0),
    ("a100", "nvlink3", "nvlink3", 300.0),
    ("a800", "nvlink4", "nvlink4", 450.0),            # another generation: taken as named
])
def test_a_named_generation_keeps_the_gpus_own_cut_down_variant(gpu, named, key, gbytes):
    """A row about H800s that says "nvlink4" means the H800's NVLink 4 (links.json
    ``variant_of``), 200 GB/s per direction, not the H100's 450."""
    c = hdb.build_cluster(gpu, 16, scale_up=named)
    assert c.node.scale_up.key == key and c.node.scale_up.bandwidth_gbytes_per_s == gbytes


def test_a800_is_an_a100_with_its_nvlink_cut():
    a100, a800 = hdb.load_gpu("a100-sxm-80gb"), hdb.load_gpu("A800")
    assert a800.key == "a800-sxm-80gb"
    assert a800.peak_tflops == a100.peak_tflops and a800.mem_bytes == a100.mem_bytes
    assert a800.mem_bw_gbytes_per_s == a100.mem_bw_gbytes_per_s
    c = hdb.build_cluster("a800", 16)
    assert c.node.scale_up.bandwidth_gbytes_per_s == 200.0 and not c.node.in_switch_reduction
    assert c.node.gpus_per_node == 8 and c.node.nic.key == "ib-hdr"


def test_mi250x_is_one_gcd_of_the_card():
    """A rank drives one GCD: the card's datasheet row (gpus.csv 'Instinct MI250X') halved;
    a Frontier / LUMI-G node is 8 GCDs with 4 Slingshot-11 NICs (one per card)."""
    g = hdb.load_gpu("MI250X")
    assert g.key == "mi250x" and g.sm_count == 110 and g.mem_bytes == 64e9
    assert g.devices_per_card == 2 and "fp8" not in g.peak_tflops
    c = hdb.build_cluster("mi250x", 64)
    assert c.node.gpus_per_node == 8 and c.node.nics_per_node == 4
    assert c.node.nic.key == "slingshot-200" and c.node.nic.bandwidth_gbytes_per_s == 25.0
    assert c.node.scale_up.pair_gbytes_per_s == 200.0 and c.node.scale_up.mesh


def test_mi250x_datasheet_is_the_card_row_halved():
    """gpus.csv 'Instinct MI250X' (../shared, beside the checkout) is the two-GCD card."""
    import csv
    sheet = PUBLISHED.parents[1] / "hardware" / "gpus.csv"
    if not sheet.is_file():
        pytest.skip("../shared/hardware/gpus.csv is not beside this checkout")
    card = next(r for r in csv.DictReader(sheet.open()) if r["name"] == "Instinct MI250X")
    g = hdb.load_gpu("mi250x")
    assert g.peak_tflops["bf16"] == pytest.approx(float(card["bf16_tflops"]) / 2)
    assert g.mem_bw_gbytes_per_s == pytest.approx(float(card["mem_bw_tbps"]) * 1000 / 2)
    assert g.mem_bytes == pytest.approx(float(card["mem_gb"]) * 1e9 / 2)


def test_build_cluster_other_node_keeps_fabric():
    c = hdb.build_cluster("a100-sxm-40gb", 16, node="dgx-a100")
    assert c.gpu.key == "a100-sxm-40gb" and c.node.gpu_key == "a100-sxm-40gb"


@pytest.mark.parametrize("kwargs,field", [
    (dict(gpu="h100", n_gpus=0), "n_gpus"),
    (dict(gpu="h100", n_gpus=12), "n_gpus"),
    (dict(gpu="h100", n_gpus=16, gpus_per_node=0), "gpus_per_node"),
    (dict(gpu="h100", n_gpus=16, nics_per_node=-1), "nics_per_node"),
    (dict(gpu="h100", n_gpus=16, nic_gbits_per_s=0), "nic_gbits_per_s"),
    (dict(gpu="h100", n_gpus=16, nic_kind="carrier-pigeon"), "nic_kind"),
    (dict(gpu="h100", n_gpus=16, scale_up="ib-ndr"), "scale_up"),
    (dict(gpu="h100", n_gpus=16, scale_up="nvlink9"), "scale_up"),
    (dict(gpu="h100", n_gpus=16, oversubscription=0.5), "oversubscription"),
    (dict(gpu="gb200", n_gpus=140, gpus_per_node=7), "gpus_per_node"),
    (dict(gpu="nope", n_gpus=8), "gpu"),
    (dict(gpu="h100", n_gpus=8, node="nope"), "node"),
])
def test_build_cluster_invalid(kwargs, field):
    with pytest.raises(InvalidInputError) as ei:
        hdb.build_cluster(**kwargs)
    assert ei.value.field == field


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="published_runs.csv not available")
def test_published_runs_clusters_build():
    for row in csv.DictReader(PUBLISHED.open()):
        c = hdb.build_cluster(row["gpu"], int(row["n_gpus"]), gpus_per_node=int(row["gpus_per_node"]),
                              nics_per_node=int(row["nics_per_node"]),
                              nic_gbits_per_s=float(row["nic_gbps"]), scale_up=row["scale_up"],
                              build_graph=False)
        assert c.node.nic_gbits_per_s == pytest.approx(float(row["nic_gbps"]))


# ---- topology --------------------------------------------------------------------------
def _count(g: nx.Graph, kind: str) -> int:
    return sum(1 for v in g if v[0] == kind)


def test_graph_counts_rail_optimized():
    c = hdb.build_cluster("h100", 8 * 40, build_graph=True)  # 40 nodes -> 2 pods of <= 32 nodes
    g = c.graph
    assert _count(g, "gpu") == 320 and _count(g, "nic") == 320 and _count(g, "nvswitch") == 40
    assert _count(g, "leaf") == 2 * 8 and _count(g, "spine") == 1
    for _, _, d in g.edges(data=True):
        assert set(d) == {"kind", "bandwidth_gbytes_per_s", "latency_us", "tier"}
        assert d["bandwidth_gbytes_per_s"] > 0 and d["tier"] in ("scale_up", "pcie", "nic", "spine")
    leaf_bw = {d["bandwidth_gbytes_per_s"] for u, v, d in g.edges(data=True) if d["tier"] == "spine"}
    assert leaf_bw == {32 * 50.0, 8 * 50.0}


def test_graph_not_rail_optimized_and_oversubscription():
    c = hdb.build_cluster("h100", 64, rail_optimized=False, oversubscription=2.0, build_graph=True)
    g = c.graph
    assert _count(g, "leaf") == 2  # 32 ports / 8 NICs = 4 nodes per leaf
    nics_of_node0 = [v for v in g if v[0] == "nic" and v[1] == 0]
    assert len({next(u for u in g[n] if u[0] == "leaf") for n in nics_of_node0}) == 1
    spine_bw = [d["bandwidth_gbytes_per_s"] for _, _, d in g.edges(data=True) if d["tier"] == "spine"]
    assert spine_bw == [4 * 8 * 50 / 2.0] * 2


def test_paths_intra_and_inter_node():
    g = hdb.build_cluster("h100", 32, build_graph=True).graph
    intra = hdb.path_links(g, 0, 7)
    assert intra and all(d["tier"] == "scale_up" for d in intra)
    same_rail = hdb.path_links(g, 0, 8)
    assert [d["tier"] for d in same_rail] == ["pcie", "nic", "nic", "pcie"]
    cross = hdb.path_links(g, 0, 9)
    assert [d["tier"] for d in cross].count("nic") == 2 and "spine" in [d["tier"] for d in cross]
    assert hdb.path_links(g, 3, 3) == []


def test_paths_nvl72_and_mesh():
    g = hdb.build_cluster("gb200", 144, build_graph=True).graph
    assert all(d["tier"] == "scale_up" for d in hdb.path_links(g, 0, 71))  # different trays
    assert "nic" in [d["tier"] for d in hdb.path_links(g, 0, 72)]
    g = hdb.build_cluster("mi300x", 16, build_graph=True).graph
    p = hdb.path_links(g, 0, 5)
    assert len(p) == 1 and p[0]["kind"] == "xgmi" and p[0]["bandwidth_gbytes_per_s"] == pytest.approx(64)
    assert g.degree[("gpu", 0)] == 7 + 1


def test_route_matches_graph_shortest_length():
    g = hdb.build_cluster("h100", 64, build_graph=True).graph
    for a, b in [(0, 1), (0, 8), (0, 9), (5, 63)]:
        path = hdb.route(g, a, b)
        assert nx.is_path(g, path)
        assert len(path) - 1 == nx.shortest_path_length(g, ("gpu", a), ("gpu", b))


def test_bad_rank_raises():
    g = hdb.build_cluster("h100", 8, build_graph=True).graph
    with pytest.raises(InvalidInputError):
        hdb.path_links(g, 0, 8)


def test_graph_is_frozen_and_cached():
    c1 = hdb.build_cluster("h100", 16, build_graph=True)
    c2 = hdb.build_cluster("h100", 16, build_graph=True)
    assert c1.graph is c2.graph and nx.is_frozen(c1.graph)


def test_16k_gpus_builds():
    """Structure only; how fast it builds is measured by benchmarks/simulate_speed.py."""
    topology._cached.cache_clear()
    c = hdb.build_cluster("h100", 16384, build_graph=True)
    assert _count(c.graph, "gpu") == 16384 and _count(c.graph, "leaf") == 64 * 8


GPU_KEYS = st.sampled_from(["h100-sxm", "a100-sxm-80gb", "gb200", "mi300x", "v100-sxm-32gb", "b200"])


@settings(max_examples=40, deadline=None)
@given(gpu=GPU_KEYS, n_nodes=st.integers(1, 80), rail=st.booleans(),
       over=st.sampled_from([1.0, 2.0, 3.5]))
def test_property_tree_to_spine_and_counts(gpu, n_nodes, rail, over):
    node = hdb.default_node_for_gpu(gpu)
    n = n_nodes * node.gpus_per_node
    c = hdb.build_cluster(gpu, n, rail_optimized=rail, oversubscription=over, build_graph=True)
    g = c.graph
    assert _count(g, "gpu") == n and _count(g, "nic") == c.n_nodes * node.nics_per_node
    assert _count(g, "spine") == 1
    # Without scale-up edges the scale-out side is a tree: every GPU has exactly one path to the spine.
    up = nx.Graph((u, v) for u, v, d in g.edges(data=True) if d["tier"] != "scale_up")
    assert nx.is_tree(up)
    for r in range(0, n, max(1, n // 7)):
        assert len(list(nx.all_simple_paths(up, ("gpu", r), ("spine",)))) == 1
    # Downlinks into the spine tier equal NIC bandwidth / oversubscription.
    spine_bw = sum(d["bandwidth_gbytes_per_s"] for _, _, d in g.edges(("spine",), data=True))
    assert spine_bw == pytest.approx(c.n_nodes * node.nics_per_node * node.nic.bandwidth_gbytes_per_s / over)


@settings(max_examples=40, deadline=None)
@given(gpu=GPU_KEYS, n_nodes=st.integers(1, 40), data=st.data())
def test_property_paths(gpu, n_nodes, data):
    node = hdb.default_node_for_gpu(gpu)
    n = n_nodes * node.gpus_per_node
    g = hdb.build_cluster(gpu, n, build_graph=True).graph
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(0, n - 1))
    tiers = [d["tier"] for d in hdb.path_links(g, a, b)]
    if a // node.scale_up_domain_gpus == b // node.scale_up_domain_gpus:
        assert set(tiers) <= {"scale_up"}
    else:
        assert tiers.count("nic") == 2 and tiers[0] == tiers[-1] == "pcie"


# ---- import hygiene ------------------------------------------------------------------------
def test_hardware_db_imports_only_allowed_modules():
    allowed_top = {"simulator", "networkx", "hardware_db"}
    import sys
    stdlib = set(sys.stdlib_module_names)
    for path in Path(hdb.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib or top in allowed_top, f"{path.name} imports {name}"
                if top == "simulator":
                    # simulator.boundary: the typed value checks and size limits the data
                    # files' load-time schema (hardware_db.schema) applies; rank 1, below specs
                    assert name in ("simulator.hardware.specs", "simulator.errors",
                                    "simulator.hardware.profile", "simulator.network.topology",
                                    "simulator.boundary.values", "simulator.boundary.limits"), name
