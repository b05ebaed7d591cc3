"""Coefficients of the multi-tier network model (``Profile.network``) for the reference
profiles: NCCL's tuner constants, NVLS efficiencies from single-node plateau rows, the
NVLSTree latency fitted to the GTC 2024 NVLSTree sweep (collectives.csv lines 107-129)
with every GPU count held out in turn, SHARP efficiency from the GTC 2025 bars.

Every fit runs the simulator's own pricing (``simulator.network.price``) on the reference
fabric (DGX H100 class: 8 GPUs and 8 x NDR 400 Gb/s per node, rail-optimized fat tree of
64-port switches, hardware_db/data/topology.json), so the coefficients mean exactly what
the simulator does with them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from simulator.hardware.profile import Coefficient, LinkCoefficients, NetworkModel, StepLatency
from simulator.network.collectives import Collective
from simulator.network.fabric import Fabric, group_shape
from simulator.network.flows import Algo
from simulator.network.price import Coefs, price_with

from .csvrows import Row, cite, select
from .fit import FitResult, _Spec, busbw_to_time_s, robust_fit
from .reference_data import (
    DATASHEET,
    LEAF_DOWN_PORTS,
    NCCL_LATENCY,
    NCCL_SRC,
    NCCL_TUNING,
    NDR_GBYTES_PER_S,
    PCIE_GEN5_GBYTES_PER_S,
    SWITCH_RADIX,
)

AR = Collective.ALL_REDUCE
PLATEAU_BYTES = 16 << 30


def reference_fabric(n_gpus: int, sharp: bool = False) -> Fabric:
    """DGX H100 class nodes (``reference_data.NDR_SRC``; NVLink4 450 GB/s, ``DATASHEET``)."""
    return Fabric(n_gpus=n_gpus, gpus_per_node=8, domain_gpus=8, scale_up_kind="nvlink",
                  scale_up_gbytes_per_s=DATASHEET["h100-sxm"].nvlink_gbytes_per_s,
                  in_switch=True, nics_per_node=8, nic_kind="infiniband",
                  nic_gbytes_per_s=NDR_GBYTES_PER_S, pcie_gbytes_per_s=PCIE_GEN5_GBYTES_PER_S,
                  leaf_down_ports=LEAF_DOWN_PORTS, switch_radix=SWITCH_RADIX, sharp=sharp,
                  scale_up_latency_us=0.6, nic_latency_us=2.7)


def _nccl() -> dict:
    unit = {"ring_simple_factor": "multiplier", "tree_eff": "fraction", "ll128_eff": "fraction"}
    out: dict = {name: Coefficient(v, unit.get(name, "us"), src)
                 for name, (v, src) in NCCL_TUNING.items()}
    for (alg, proto), (base, intra, net) in NCCL_LATENCY.items():
        what = f"{NCCL_SRC}: {alg.capitalize()} {proto}"
        out[f"{alg}_{proto.lower()}"] = StepLatency(
            Coefficient(base, "us", f"{what} baseLatencies (l.151)"),
            Coefficient(intra, "us", f"{what} hwLatencies NVLINK (l.159)"),
            Coefficient(net, "us", f"{what} hwLatencies NET (l.171)"))
    return out


A2A_PEER = Coefficient(
    NCCL_LATENCY[("ring", "LL")][2], "us",
    "NCCL's network hop latency (" + NCCL_SRC + " l.171: hwLatencies NET Ring LL) per peer of a "
    "pairwise all-to-all, not fitted; held-out check: collectives_more.csv line 42 (8 nodes x "
    "8 H800, 8 MiB, 337.8 us) is predicted within 5 % (tests/simulator/network)")
PCIE_EFF = Coefficient(
    0.9, "fraction",
    "assumed: RDMA through the GPU's PCIe x16 link reaches ~90 % of its line rate (NICs are sized "
    "to PCIe Gen5 x16). Binds only where NIC x bw_eff exceeds 0.9 x PCIe (e.g. an 800 Gb/s NIC "
    "behind a Gen5 GPU, a 400 Gb/s NIC behind Gen4); the PCIe all-reduce bw_eff (0.76) is not "
    "used for this hop (it measures GPU-to-GPU rings, collectives.csv lines 2-3)")


# ---- NVLS efficiency --------------------------------------------------------------------
NVLS_ROWS = {   # (system prefix or locator text, row filter on GPU count, datasheet key)
    "h100-sxm": ("8x H200 SXM single node", "NVLS", "h200-sxm"),
    "h200-sxm": ("8x H200 SXM single node", "NVLS", "h200-sxm"),
    "h800": ("8x H200 SXM single node", "NVLS", "h200-sxm"),   # assumed: same NVSwitch gen3
    "b200": ("8x B200 (NVLink5 + NVSwitch), AWS p6-b200", "NVLS", "b200"),
    "b300": ("8x B200 (NVLink5 + NVSwitch), AWS p6-b200", "NVLS", "b200"),   # same switch
    "gb200": ("GB200 NVL72, NVLink5 SHARP", "NVLS", "gb200"),
    "gb300": ("GB200 NVL72, NVLink5 SHARP", "NVLS", "gb200"),   # same NVL72 domain
}


def nvls_eff(key: str, coll: Sequence[Row]) -> Coefficient | None:
    """Efficiency of a GPU's NVLink port under NVLS: the port carries ``S (1 + 1/m)`` per
    direction, so busbw = ``2(m-1)/(m+1) x e x B`` (sjeaugey, nccl-tests #212 / PR #239)."""
    if key not in NVLS_ROWS:
        return None
    system, alg, ds = NVLS_ROWS[key]
    rows = select(coll, lambda d: d["system"].startswith(system) and d["algorithm"] == alg)
    row = max(rows, key=lambda r: (int(r.data["gpus"]), r.line))
    m, bus = int(row.data["gpus"]), float(row.data["busbw_GBps"])
    bw = DATASHEET[ds].nvlink_gbytes_per_s
    e = bus / (2 * (m - 1) / (m + 1) * bw)
    carried = "" if ds == key or key == "h100-sxm" else \
        f"transferred to {key} (the same NVSwitch generation; no {key} NVLS row): "
    return Coefficient(round(e, 4), "fraction",
                       f"{carried}NVLS all-reduce plateau {bus} GB/s busbw on {m} GPUs "
                       f"({cite([row])}) = 2(m-1)/(m+1) x e x {bw:g} GB/s")


# ---- NVLSTree latency -------------------------------------------------------------------
@dataclass(frozen=True)
class TreePoint:
    line: int
    n: int
    k: int
    size_bytes: float
    busbw: float
    time_s: float
    bw_time_s: float          # the simulator's time with zero NVLSTree latency


def _tree_points(coll: Sequence[Row], coefs: Coefs) -> list[TreePoint]:
    rows = select(coll, lambda d: d["algorithm"] == "NVLSTree")
    out = []
    for r in rows:
        n, k = int(r.data["gpus"]), int(r.data["nodes"])
        size, bus = float(r.data["message_bytes"]), float(r.data["busbw_GBps"])
        fab = reference_fabric(n)
        bw = price_with(AR, size, group_shape(fab, n, 1), fab, coefs, Algo.NVLS_TREE).time_s
        out.append(TreePoint(r.line, n, k, size, bus, busbw_to_time_s(AR, n, size, bus), bw))
    return out


def _tree_model(p: Mapping[str, float], r: TreePoint) -> float:
    return r.bw_time_s + (p["nvls_tree_base_us"] + p["nvls_tree_level_us"] * math.log2(r.k)) * 1e-6


TREE_SPEC = _Spec(("nvls_tree_base_us", "nvls_tree_level_us"), (25.0, 40.0), (0.0, 0.0),
                  (2000.0, 1000.0))


def _busbw_err_pct(p: Mapping[str, float], pts: Sequence[TreePoint]) -> list[float]:
    """Signed busbw error per point (busbw is inverse to time)."""
    return [100.0 * (r.time_s / _tree_model(p, r) - 1.0) for r in pts]


# NVLS inside the node: NCCL's NVLink latency of NVLSTree (tuning.cc l.161), kept fixed;
# a free base runs to zero on these rows (it is not identifiable next to the per-level term).
TREE_FIXED = {"nvls_tree_base_us": 25.0}


def fit_nvls_tree(coll: Sequence[Row], coefs: Coefs) -> tuple[FitResult, float, list[TreePoint]]:
    """Fit, plus the busbw MAPE with each GPU count held out of the fit in turn."""
    pts = _tree_points(coll, coefs)
    key = lambda r: (r.n, r.size_bytes)  # noqa: E731
    fit = robust_fit(TREE_SPEC, _tree_model, pts, TREE_FIXED, size_key=key)
    held = []
    for n in sorted({r.n for r in pts}):
        train = [r for r in pts if r.n != n]
        part = robust_fit(TREE_SPEC, _tree_model, train, TREE_FIXED, size_key=key)
        held += [abs(e) for e in _busbw_err_pct(part.values, [r for r in pts if r.n == n])]
    return fit, sum(held) / len(held), pts


# ---- SHARP ------------------------------------------------------------------------------
def sharp_eff(coll: Sequence[Row], coefs: Coefs) -> Coefficient:
    """Measured / predicted (efficiency 1) SHARP all-reduce plateau, 4x DGX H100."""
    row = select(coll, lambda d: d["system"].startswith("DGX H100 x4: SHARP"))[0]
    n = int(row.data["gpus"])
    fab = reference_fabric(n, sharp=True)
    one = replace(coefs, model=replace(coefs.model, sharp_eff=Coefficient(1.0, "fraction", "")))
    pred = price_with(AR, PLATEAU_BYTES, group_shape(fab, n, 1), fab, one, Algo.SHARP)
    meas = float(row.data["busbw_GBps"])
    return Coefficient(round(meas / pred.busbw_gbytes_per_s, 4), "fraction",
                       f"SHARP (NVLS + IB SHARP) all-reduce bar {meas} GB/s busbw on {n} H100 "
                       f"({cite([row])}) over the flow model's {pred.busbw_gbytes_per_s:.1f} GB/s "
                       "at efficiency 1 (NVLS port-bound); NCCL's tuner derates CollNet by 0.85 on "
                       "sm90 (tuning.cc l.348)")


# ---- assembly ---------------------------------------------------------------------------
@dataclass(frozen=True)
class NetworkRef:
    """The parts shared by every GPU's profile (fitted once on the H100 fabric)."""

    base: NetworkModel
    fit: FitResult
    heldout_pct: float


def network_reference(coll: Sequence[Row], h100_links: Mapping[str, LinkCoefficients]) -> NetworkRef:
    zero = Coefficient(0.0, "us", "")
    model = NetworkModel(**_nccl(), nvls_tree_base_us=zero, nvls_tree_level_us=zero,
                         a2a_peer_us=A2A_PEER, sharp_eff=Coefficient(1.0, "fraction", ""),
                         pcie_eff=PCIE_EFF, nvls_eff=nvls_eff("h100-sxm", coll))
    coefs = Coefs(h100_links["nvlink"], h100_links["infiniband"], model)
    fit, held, pts = fit_nvls_tree(coll, coefs)
    rows = [r for r in select(coll, lambda d: d["algorithm"] == "NVLSTree")]
    src = (f"NVLSTree all-reduce latency 25 us + level x log2(nodes), level fitted (log-time least squares) "
           f"to {cite(rows)} (GTC 2024 S62129 slide 35, H100 + 8x NDR, 32-8192 GPUs, digitized) "
           "with the bandwidth term of simulator.network on the reference fabric; held-out busbw "
           f"MAPE {held:.1f} % (each GPU count left out in turn; train {fit.train_mape_pct:.1f} % "
           "in time). NCCL's own constants (25 + 2 x 20.9 x log2 k us, tuning.cc l.161, 173) "
           "underestimate the measured per-level cost ~2x")
    base = Coefficient(TREE_FIXED["nvls_tree_base_us"], "us",
                       "NCCL NVLink latency of NVLSTree (tuning.cc l.161), held fixed in the fit "
                       "of nvls_tree_level_us")
    level = replace(fit.coefficient("nvls_tree_level_us", "us", src),
                    heldout_error_pct=round(held, 2))
    model = replace(model, nvls_tree_base_us=base, nvls_tree_level_us=level)
    model = replace(model, sharp_eff=sharp_eff(coll, replace(coefs, model=model)))
    return NetworkRef(model, fit, held)


def network_for(key: str, coll: Sequence[Row], ref: NetworkRef) -> NetworkModel:
    """One GPU's ``NetworkModel``: its own NVLS efficiency, the rest from ``ref``."""
    why = f"transferred to {key} from the H100 InfiniBand fabric fit: "
    m = ref.base
    if key not in ("h100-sxm", "h200-sxm"):
        m = replace(m, **{f: replace(getattr(m, f), source=why + getattr(m, f).source)
                          for f in ("nvls_tree_base_us", "nvls_tree_level_us", "sharp_eff")})
    return replace(m, nvls_eff=nvls_eff(key, coll))
