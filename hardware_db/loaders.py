"""Load the hardware data files into ``simulator.hardware.specs`` spec dataclasses.

Data lives in ``hardware_db/data/*.json``; every numeric field there has an entry in the
entry's ``sources`` map. Units follow ``simulator.hardware.specs``: ``_tflops`` dense 10^12 FLOP/s,
``_bytes`` SI bytes, ``_gbytes_per_s`` 10^9 bytes/s per direction, ``_us`` microseconds.

Keys are matched case-insensitively with ``_`` and spaces read as ``-``. A few forgiving
aliases are listed in the data (``"h100"`` -> ``"h100-sxm"``, ``"a100"`` -> ``"a100-sxm-80gb"``,
``"v100"`` -> ``"v100-sxm-32gb"``, ...); an alias maps to exactly one key (a test checks it).
An unknown key raises ``InvalidInputError`` naming the field and listing the valid keys.
Each file is checked against ``hardware_db.schema`` when first read.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from simulator.errors import CalibrationMissingError, InvalidInputError
from simulator.hardware.specs import GPUSpec, LinkKind, LinkSpec, NodeSpec

from . import schema

DATA_DIR = Path(__file__).resolve().parent / "data"
PROFILE_DIR = DATA_DIR / "profiles"


@lru_cache(maxsize=None)
def _read(name: str) -> Mapping[str, Any]:
    """Parsed and checked ``data/<name>.json`` (``hardware_db.schema``; read and checked once
    per process, cached; callers must not mutate it). A corrupted file raises one
    ``InvalidInputError`` naming the entry, field, value and file."""
    return schema.load(name, DATA_DIR / f"{name}.json", _read)


def _norm(key: str) -> str:
    return str(key).strip().lower().replace("_", "-").replace(" ", "-")


def _resolve(key: Any, table: Mapping[str, Mapping[str, Any]], field: str) -> str:
    """Canonical key for ``key`` in ``table`` (exact key, then alias), else InvalidInputError."""
    k = _norm(key) if isinstance(key, str) else key
    if isinstance(k, str):
        if k in table:
            return k
        for canon, entry in table.items():
            if k in entry.get("aliases", ()):
                return canon
    raise InvalidInputError(field, key, f"one of {', '.join(sorted(table))}")


def _joined_sources(sources: Mapping[str, str]) -> str:
    return "; ".join(f"{f}: {s}" for f, s in sources.items())


# ---- GPUs ---------------------------------------------------------------------------
def _gpus() -> Mapping[str, Mapping[str, Any]]:
    return _read("gpus")["gpus"]


def list_gpus() -> list[str]:
    """Canonical GPU keys, sorted."""
    return sorted(_gpus())


_VENDOR_PREFIXES = ("nvidia-", "amd-", "tesla-", "intel-")


def resolve_gpu_key(key: str) -> str:
    """Canonical GPU key for ``key`` or an alias of it; a vendor prefix as the driver
    reports names ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X") is dropped."""
    try:
        return _resolve(key, _gpus(), "gpu")
    except InvalidInputError:
        k = _norm(key) if isinstance(key, str) else ""
        for p in _VENDOR_PREFIXES:
            if k.startswith(p):
                try:
                    return _resolve(k[len(p):], _gpus(), "gpu")
                except InvalidInputError:
                    break
        raise


def gpu_entry(key: str) -> Mapping[str, Any]:
    """Raw data-file entry of a GPU (includes ``sources``, ``price_date``, ``pcie_link``)."""
    return _gpus()[resolve_gpu_key(key)]


def load_gpu(key: str) -> GPUSpec:
    """``GPUSpec`` for a GPU key; dense peaks in TFLOP/s, memory in SI bytes."""
    canon = resolve_gpu_key(key)
    e = _gpus()[canon]
    return GPUSpec(
        key=canon, name=e["name"], vendor=e["vendor"],
        peak_tflops={d: float(v) for d, v in e["peak_tflops"].items()},
        mem_bytes=float(e["mem_bytes"]), mem_bw_gbytes_per_s=float(e["mem_bw_gbytes_per_s"]),
        tdp_w=float(e["tdp_w"]), sm_count=int(e["sm_count"]), l2_bytes=float(e["l2_bytes"]),
        price_usd_per_hour=float(e["price_usd_per_hour"]),
        source=f"{e['source']} || {_joined_sources(e['sources'])}",
        attention_kernels=tuple(e.get("attention_kernels", ())),
        devices_per_card=int(e.get("devices_per_card", 1)))


# ---- links --------------------------------------------------------------------------
def _links() -> Mapping[str, Mapping[str, Any]]:
    return _read("links")["links"]


def list_links() -> list[str]:
    """Link-class keys, sorted."""
    return sorted(_links())


def link_entry(key: str) -> Mapping[str, Any]:
    """Raw data-file entry of a link (includes ``fabric``, ``domain_gpus``, ``sources``)."""
    return _links()[_resolve(key, _links(), "link")]


def load_link(key: str, field: str = "link") -> LinkSpec:
    """``LinkSpec`` for a link key (bandwidth per direction in GB/s, latency in us)."""
    canon = _resolve(key, _links(), field)
    e = _links()[canon]
    return LinkSpec(key=canon, kind=LinkKind(e["kind"]),
                    bandwidth_gbytes_per_s=float(e["bandwidth_gbytes_per_s"]),
                    latency_us=float(e["latency_us"]), source=_joined_sources(e["sources"]),
                    mesh=e.get("fabric") == "mesh",
                    pair_gbytes_per_s=float(e.get("pair_gbytes_per_s", 0.0)))


def list_scale_up_links() -> list[str]:
    """Link keys usable as a node's scale-up fabric (they carry a ``fabric`` kind)."""
    return sorted(k for k, e in _links().items() if "fabric" in e)


def list_nic_links() -> list[str]:
    """Link keys usable as a NIC (scale-out kinds)."""
    return sorted(k for k, e in _links().items() if "fabric" not in e)


# ---- nodes --------------------------------------------------------------------------
def _nodes() -> Mapping[str, Mapping[str, Any]]:
    return _read("nodes")["nodes"]


def list_nodes() -> list[str]:
    """Node preset keys, sorted."""
    return sorted(_nodes())


def node_entry(key: str) -> Mapping[str, Any]:
    """Raw data-file entry of a node preset."""
    return _nodes()[_resolve(key, _nodes(), "node")]


def load_node(key: str) -> NodeSpec:
    """``NodeSpec`` for a node preset key (e.g. ``"dgx-h100"``, ``"gb200-nvl72"``)."""
    canon = _resolve(key, _nodes(), "node")
    e = _nodes()[canon]
    return NodeSpec(
        key=canon, gpu_key=e["gpu_key"], gpus_per_node=int(e["gpus_per_node"]),
        scale_up=load_link(e["scale_up"]), scale_up_domain_gpus=int(e["scale_up_domain_gpus"]),
        in_switch_reduction=bool(e["in_switch_reduction"]),
        nics_per_node=int(e["nics_per_node"]), nic=load_link(e["nic"]),
        source=_joined_sources(e["sources"]))


def default_node_key(gpu_key: str) -> str:
    """Key of the reference node preset for a GPU."""
    canon = resolve_gpu_key(gpu_key)
    defaults = _read("nodes")["default_for_gpu"]
    if canon not in defaults:
        raise InvalidInputError("gpu", gpu_key, f"a GPU with a default node: {', '.join(sorted(defaults))}")
    return defaults[canon]


def default_node_for_gpu(gpu_key: str) -> NodeSpec:
    """Reference node for a GPU: a100-sxm-80gb -> dgx-a100, h100-sxm -> dgx-h100, gb200 -> gb200-nvl72, ..."""
    return load_node(default_node_key(gpu_key))


def topology_params() -> Mapping[str, Any]:
    """Fat-tree builder parameters (``leaf_down_ports``) with their sources."""
    return _read("topology")


# ---- profiles -----------------------------------------------------------------------
def list_profiles() -> list[str]:
    """GPU keys that have a shipped reference profile in ``data/profiles``."""
    if not PROFILE_DIR.is_dir():
        return []
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(gpu_key: str):
    """Shipped reference ``simulator.hardware.profile.Profile`` for a GPU (``data/profiles/<key>.json``)."""
    from simulator.hardware.profile import (
        Profile,  # local: keeps `import hardware_db` light
    )

    canon = resolve_gpu_key(gpu_key)
    path = PROFILE_DIR / f"{canon}.json"
    if not path.is_file():
        raise CalibrationMissingError(
            f"no reference profile for GPU {canon!r} (looked for {path}); shipped profiles: "
            f"{', '.join(list_profiles()) or 'none'}. Run `complexity calibrate` on that GPU "
            "or pass a profile JSON explicitly.")
    return Profile.read_json(path)


def nic_on_die(gpu_key: str) -> bool:
    """Whether the device's scale-out ports are on the chip (gpus.json ``nic_on_die``:
    Gaudi's RoCE ports), so no PCIe link stands between it and the network."""
    try:
        return bool(gpu_entry(gpu_key).get("nic_on_die", False))
    except InvalidInputError:
        return False


def pcie_link(gpu_key: str) -> LinkSpec:
    """The GPU's PCIe link (gpus.json ``pcie_link``; Gen4 for devices not listed)."""
    try:
        key = gpu_entry(gpu_key).get("pcie_link", "pcie-gen4")
    except InvalidInputError:
        key = "pcie-gen4"
    return load_link(key)
