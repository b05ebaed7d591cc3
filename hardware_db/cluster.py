"""``build_cluster``: a reference node for a GPU, user overrides, validation, topology graph."""
from __future__ import annotations

import dataclasses
import math

from simulator.errors import InvalidInputError
from simulator.hardware.specs import (
    SCALE_OUT_KINDS,
    ClusterSpec,
    LinkKind,
    LinkSpec,
    NodeSpec,
)

from . import loaders

_NIC_KIND_ALIASES = {
    "ib": "infiniband", "infiniband": "infiniband", "roce": "roce", "rocev2": "roce",
    "omnipath": "omnipath", "omni-path": "omnipath", "opa": "omnipath", "efa": "efa",
    "ethernet": "ethernet", "eth": "ethernet", "tcp": "ethernet",
}


def _positive_int(field: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInputError(field, value, "a positive integer")


def _nic_kind(nic_kind: str | None) -> LinkKind | None:
    if nic_kind is None:
        return None
    k = _NIC_KIND_ALIASES.get(str(nic_kind).strip().lower())
    if k is None:
        raise InvalidInputError("nic_kind", nic_kind,
                                f"one of {', '.join(k.value for k in SCALE_OUT_KINDS)}")
    return LinkKind(k)


def _pick_nic(base: LinkSpec, kind: LinkKind | None, gbits: float | None) -> LinkSpec:
    """NIC LinkSpec of ``kind`` at ``gbits`` Gb/s: a catalogue entry when one matches, else
    ``base`` (or a catalogue entry of that kind) with the bandwidth replaced."""
    if gbits is not None and (isinstance(gbits, bool) or not gbits > 0):
        raise InvalidInputError("nic_gbits_per_s", gbits, "a positive bandwidth in Gb/s")
    if gbits is None and (kind is None or kind == base.kind):
        return base                              # the node's own NIC, key and sources kept
    kind = kind or base.kind
    gbytes = base.bandwidth_gbytes_per_s if gbits is None else float(gbits) / 8.0
    same_kind = [loaders.load_link(k) for k in loaders.list_nic_links()
                 if loaders.link_entry(k)["kind"] == kind.value]
    for link in same_kind:
        if abs(link.bandwidth_gbytes_per_s - gbytes) < 1e-9:
            return link
    template = base if base.kind == kind else (same_kind[0] if same_kind else base)
    return dataclasses.replace(
        template, key=f"{kind.value}-{gbytes * 8:g}g", kind=kind, bandwidth_gbytes_per_s=gbytes,
        source=f"user override: {gbytes * 8:g} Gb/s {kind.value}; latency from {template.key}")


# a link family named without its generation ("nvlink" in a row about H100s): the GPU's own
# reference node's link of that family
_FAMILY_NAMES = {"nvlink": LinkKind.NVLINK, "nvswitch": LinkKind.NVLINK,
                 "xgmi": LinkKind.XGMI, "infinity-fabric": LinkKind.XGMI,
                 "pcie": LinkKind.PCIE}


def _family_default(node: NodeSpec, scale_up: str | None) -> str | None:
    """``scale_up`` unchanged, or None (keep the node's own link) when it names only the
    family of that link, or the generation the node's link is the GPU's own wiring of
    (links.json ``variant_of``: "nvlink4" in a row about H800s is the H800's 200 GB/s NVLink,
    not the H100's 450; about GH200s, their 4-GPU mesh); a family the GPU's node does not use
    is an error naming the field."""
    if scale_up is None:
        return None
    kind = _FAMILY_NAMES.get(loaders._norm(scale_up))
    if kind is None:
        own = loaders.link_entry(node.scale_up.key).get("variant_of")
        named = loaders.load_link(scale_up, field="scale_up").key
        return None if named == own else scale_up     # "nvlink4" about H800s: its own cut link
    if node.scale_up.kind != kind:
        raise InvalidInputError("scale_up", scale_up,
                                f"a link this GPU's nodes use ({node.scale_up.key}) or a "
                                f"named generation ({', '.join(loaders.list_scale_up_links())})")
    return None


def _apply_scale_up(node: NodeSpec, scale_up: str | None, gpn: int) -> NodeSpec:
    """Node with a new GPUs-per-node count and/or scale-up link; keeps the domain consistent.
    A family name ("nvlink", "xgmi", "pcie") keeps the node's own link of that family."""
    per_node_domain = node.scale_up_domain_gpus == node.gpus_per_node
    domain = gpn if per_node_domain else node.scale_up_domain_gpus
    link, isr = node.scale_up, node.in_switch_reduction
    scale_up = _family_default(node, scale_up)
    if scale_up is not None:
        valid = loaders.list_scale_up_links()
        link = loaders.load_link(scale_up, field="scale_up")
        if link.key not in valid:
            raise InvalidInputError("scale_up", scale_up, f"a scale-up link: {', '.join(valid)}")
        entry = loaders.link_entry(link.key)
        domain = int(entry.get("domain_gpus", gpn))
        isr = bool(entry.get("in_switch_reduction", False))
    if domain < gpn or domain % gpn:
        raise InvalidInputError("gpus_per_node", gpn,
                                f"a divisor of the scale-up domain size {domain}")
    return dataclasses.replace(node, gpus_per_node=gpn, scale_up=link,
                               scale_up_domain_gpus=domain, in_switch_reduction=isr)


def _validate_counts(n_gpus: int, gpn: int, oversubscription: float,
                     field: str = "oversubscription") -> None:
    _positive_int("n_gpus", n_gpus)
    if n_gpus > gpn and n_gpus % gpn:
        raise InvalidInputError("n_gpus", n_gpus, f"a multiple of gpus_per_node={gpn} (whole nodes)")
    if isinstance(oversubscription, bool) or not (
            isinstance(oversubscription, (int, float)) and math.isfinite(oversubscription)
            and oversubscription >= 1.0):
        raise InvalidInputError(field, oversubscription, "a number >= 1 (1 = full bisection)")


def build_cluster(gpu: str, n_gpus: int, gpus_per_node: int | None = None,
                  nics_per_node: int | None = None, nic_gbits_per_s: float | None = None,
                  nic_kind: str | None = None, node: str | None = None,
                  scale_up: str | None = None, oversubscription: float = 1.0,
                  rail_optimized: bool = True, build_graph: bool = False,
                  core_oversubscription: float = 1.0, planes: int = 1,
                  sharp: bool = False) -> ClusterSpec:
    """``n_gpus`` GPUs of type ``gpu`` in nodes of the GPU's default preset (or ``node``).

    Overrides: ``gpus_per_node``; ``nics_per_node``; ``nic_gbits_per_s`` (Gb/s per NIC, same
    NIC kind unless ``nic_kind`` - "infiniband" (default), "roce", "omnipath", "ethernet");
    ``scale_up`` (a link key: "nvlink3", "nvlink4", "nvlink5", "nvlink5-nvl72",
    "nvlink2-nvswitch", "xgmi-mi300x", "pcie-gen5", ...; its ``domain_gpus`` and NVLS flag come
    along). When ``node`` names a preset of another GPU, the preset's fabric is kept and its
    GPU replaced by ``gpu``. Fabric: ``oversubscription`` of the leaf uplinks,
    ``core_oversubscription`` of the third tier (clusters past ``switch_radix`` x
    ``leaf_down_ports`` NIC ports, topology.json), ``rail_optimized``, ``planes``, ``sharp``
    (switches reduce: InfiniBand SHARP / CollNet enabled). The fabric is described by counts
    (``simulator.network.fabric``); ``build_graph`` also attaches hardware_db's networkx graph
    (small clusters and tests). Raises ``InvalidInputError`` naming the offending field.
    """
    gpu_spec = loaders.load_gpu(gpu)
    base = loaders.load_node(node) if node is not None else loaders.default_node_for_gpu(gpu_spec.key)
    _positive_int("gpus_per_node", gpus_per_node)
    _positive_int("nics_per_node", nics_per_node)
    _positive_int("planes", planes)
    gpn = gpus_per_node or base.gpus_per_node
    _validate_counts(n_gpus, gpn, oversubscription)
    _validate_counts(n_gpus, gpn, core_oversubscription, "core_oversubscription")
    spec = _apply_scale_up(dataclasses.replace(base, gpu_key=gpu_spec.key), scale_up, gpn)
    spec = dataclasses.replace(spec, nics_per_node=nics_per_node or spec.nics_per_node,
                               nic=_pick_nic(spec.nic, _nic_kind(nic_kind), nic_gbits_per_s))
    topo = loaders.topology_params()
    cluster = ClusterSpec(gpu=gpu_spec, node=spec, n_gpus=n_gpus, rail_optimized=bool(rail_optimized),
                          oversubscription=float(oversubscription),
                          leaf_down_ports=int(topo["leaf_down_ports"]),
                          switch_radix=int(topo["switch_radix"]),
                          core_oversubscription=float(core_oversubscription), planes=planes,
                          pcie_gbytes_per_s=0.0 if loaders.nic_on_die(gpu_spec.key)
                          else loaders.pcie_link(gpu_spec.key).bandwidth_gbytes_per_s,
                          in_network_reduction=bool(sharp),
                          net_ll_protocol=_runs_ll(spec.nic.kind))
    if not build_graph:
        return cluster
    from .topology import build_graph as _build_graph

    return dataclasses.replace(cluster, graph=_build_graph(cluster))


def _runs_ll(kind: LinkKind) -> bool:
    """Whether NCCL runs its LL protocols over NICs of ``kind`` (links.json ``nccl_ll``)."""
    entries = [loaders.link_entry(k) for k in loaders.list_nic_links()]
    return all(e.get("nccl_ll", True) for e in entries if e["kind"] == kind.value)
