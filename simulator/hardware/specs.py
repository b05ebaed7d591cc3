"""Hardware spec types the simulator consumes (values come from ``hardware_db``).

Units are in every field name: ``_tflops`` (10^12 FLOP/s, dense), ``_bytes`` (SI bytes),
``_gbytes_per_s`` (10^9 bytes/s, one direction), ``_gbits_per_s`` (10^9 bits/s), ``_us``
(microseconds), ``_w`` (watts), ``_usd_per_hour``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from ..errors import InvalidInputError


class Dtype(str, Enum):
    """Numeric formats a GEMM can run in."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def bytes(self) -> int:
        return {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[self.value]


class LinkKind(str, Enum):
    """Physical link families; collective coefficients are keyed by these."""

    NVLINK = "nvlink"          # point-to-point or through NVSwitch inside a scale-up domain
    XGMI = "xgmi"              # AMD Infinity Fabric mesh
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ROCE = "roce"
    OMNIPATH = "omnipath"
    EFA = "efa"                # AWS Elastic Fabric Adapter (SRD, through aws-ofi-nccl)
    ETHERNET = "ethernet"      # TCP sockets
    HOST = "host"              # processes on one CPU host (shared memory / loopback)


SCALE_OUT_KINDS = (LinkKind.INFINIBAND, LinkKind.ROCE, LinkKind.OMNIPATH, LinkKind.EFA,
                   LinkKind.ETHERNET)


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator (or a CPU socket treated as one device) from its datasheet."""

    key: str
    name: str
    vendor: str
    peak_tflops: Mapping[str, float]          # dense peak per Dtype value
    mem_bytes: float
    mem_bw_gbytes_per_s: float
    tdp_w: float
    sm_count: int = 0                         # SMs / CUs (0 = unknown); drives wave quantization
    l2_bytes: float = 0.0
    price_usd_per_hour: float = 0.0           # on-demand cloud ballpark (0 = unknown)
    source: str = ""
    # attention kernel families the device runs (``AttentionImpl`` values); () = not stated
    attention_kernels: tuple[str, ...] = ()
    # devices (ranks) on one card: MI250X's two GCDs are two devices; a run that counts
    # cards counts half the ranks (``simulator.validation.predict``)
    devices_per_card: int = 1

    def supports_precision(self, dtype: str) -> bool:
        """Whether the datasheet gives a peak for ``dtype`` (a chip without FP8 tensor cores
        has no ``fp8`` entry); a device with no peak table says nothing and is not refused."""
        return not self.peak_tflops or dtype in self.peak_tflops

    def peak(self, dtype: Dtype | str) -> float:
        """Dense peak TFLOP/s for ``dtype``; FP8 falls back to FP16 where the chip has none."""
        d = Dtype(dtype).value
        if d in self.peak_tflops and self.peak_tflops[d] > 0:
            return float(self.peak_tflops[d])
        fallback = {"fp8": "bf16", "bf16": "fp16", "fp16": "bf16", "tf32": "fp32"}.get(d)
        if fallback and self.peak_tflops.get(fallback, 0) > 0:
            return float(self.peak_tflops[fallback])
        raise InvalidInputError("dtype", d, f"{self.key} has peaks for {sorted(self.peak_tflops)}")


@dataclass(frozen=True)
class LinkSpec:
    """A link class: datasheet per-direction bandwidth and one-hop latency."""

    key: str
    kind: LinkKind
    bandwidth_gbytes_per_s: float             # per direction, per port/GPU as the key says
    latency_us: float
    source: str = ""
    # a scale-up fabric wired GPU to GPU without a switch (xGMI, a 4-GPU NVLink mesh): each
    # peer gets bandwidth / (domain - 1), so a group of m members in the domain reaches
    # (m - 1) / (domain - 1) of it (``network.price``)
    mesh: bool = False
    # a mesh whose GPUs come in packages of two (MI250X: two GCDs per OAM): the bandwidth to
    # the package sibling (ranks 2k, 2k + 1 of a domain); the rest of bandwidth_gbytes_per_s
    # is spread over the other domain - 2 peers. 0: every peer gets the same share
    pair_gbytes_per_s: float = 0.0


@dataclass(frozen=True)
class NodeSpec:
    """A server (or rack-scale NVLink domain) type."""

    key: str
    gpu_key: str
    gpus_per_node: int
    scale_up: LinkSpec                        # per-GPU aggregate into the intra-node fabric
    scale_up_domain_gpus: int                 # GPUs reachable over scale_up (8, or 72 for NVL72)
    in_switch_reduction: bool                 # NVLS / NVLink SHARP available
    nics_per_node: int
    nic: LinkSpec                             # one NIC; bandwidth is per direction
    source: str = ""

    @property
    def nic_gbits_per_s(self) -> float:
        return self.nic.bandwidth_gbytes_per_s * 8.0


@dataclass(frozen=True)
class ClusterSpec:
    """``n_gpus`` GPUs in nodes of one type joined by a (rail-optimized) fat tree.

    The fabric is described by counts and capacities, never by a graph per GPU
    (``simulator.network.fabric`` derives its tiers from these fields):
    ``leaf_down_ports`` NIC ports hang under one leaf switch (0 = one switch holds every
    NIC, no spine); leaves reach a spine tier whose uplinks are thinned by
    ``oversubscription`` (1 = full bisection); beyond ``switch_radix * leaf_down_ports``
    NIC ports a third (core) tier joins blocks of ``switch_radix / 2`` leaves, thinned by
    ``core_oversubscription`` (``switch_radix`` 0 = never a third tier). ``planes``: NIC
    ports per node spread over that many independent leaf/spine planes.
    ``pcie_gbytes_per_s``: the GPU's PCIe link to its NIC, per direction (0 = not
    limiting). ``in_network_reduction``: the switches reduce (InfiniBand SHARP / CollNet
    enabled). ``net_ll_protocol``: the NIC transport runs NCCL's low-latency protocols (EFA
    does not: Simple only). ``graph`` is an optional networkx topology that ``hardware_db.topology``
    builds for small clusters and tests; the simulator never needs it.
    """

    gpu: GPUSpec
    node: NodeSpec
    n_gpus: int
    rail_optimized: bool = True
    oversubscription: float = 1.0
    leaf_down_ports: int = 0
    switch_radix: int = 0
    core_oversubscription: float = 1.0
    planes: int = 1
    pcie_gbytes_per_s: float = 0.0
    in_network_reduction: bool = False
    net_ll_protocol: bool = True
    graph: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.n_gpus <= 0:
            raise InvalidInputError("gpus", self.n_gpus, "a positive GPU count")
        if self.node.gpus_per_node <= 0:
            raise InvalidInputError("gpus_per_node", self.node.gpus_per_node, "a positive count")
        if self.n_gpus > self.node.gpus_per_node and self.n_gpus % self.node.gpus_per_node:
            raise InvalidInputError(
                "gpus", self.n_gpus,
                f"a multiple of gpus_per_node={self.node.gpus_per_node} (whole nodes)")

    @property
    def gpus_per_node(self) -> int:
        return min(self.node.gpus_per_node, self.n_gpus)

    @property
    def n_nodes(self) -> int:
        return max(1, self.n_gpus // self.node.gpus_per_node)

    @property
    def nic_gbytes_per_s_per_gpu(self) -> float:
        """Scale-out bandwidth one GPU owns, per direction."""
        return self.node.nics_per_node * self.node.nic.bandwidth_gbytes_per_s / self.node.gpus_per_node
