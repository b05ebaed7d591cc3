"""Load-time schema of the hardware data files (``data/gpus.json``, ``links.json``,
``nodes.json``, ``topology.json``).

A corrupted or hand-edited file (a zero or negative bandwidth, a missing or misspelt
field, a string where a number belongs, ``NaN``, a node naming a link that does not
exist) is refused when it is first read, in one ``InvalidInputError`` that names the entry
and field (``links.nvlink4.bandwidth_gbytes_per_s``), the bad value, what would be valid,
and the file (in its ``detail``), instead of a ``KeyError`` or ``TypeError`` deep inside
the simulator. Single values are checked with ``simulator.boundary.values``; this module
only says which check applies to which field and checks the references between files.

Units as in ``hardware_db.loaders``: ``_tflops`` 10^12 FLOP/s, ``_bytes`` SI bytes,
``_gbytes_per_s`` 10^9 bytes/s per direction, ``_us`` microseconds, ``_w`` watts.
Zeros that mean "unknown" are kept: ``sm_count``, ``l2_bytes``, ``price_usd_per_hour``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from simulator.boundary.limits import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NICS_PER_NODE
from simulator.boundary.values import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_mapping,
    check_str,
)
from simulator.errors import InvalidInputError
from simulator.hardware.specs import Dtype, LinkKind

Check = Callable[[str, Any], Any]
Reader = Callable[[str], Mapping[str, Any]]
_KEY = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


# ---- single fields (each a simulator.boundary.values check) ------------------------------
def _positive(field: str, v: Any) -> float:
    return check_float(field, v, 0.0, lo_open=True)


def _non_negative(field: str, v: Any) -> float:
    return check_float(field, v, 0.0)


def _count(lo: int, hi: int | None = None) -> Check:
    return lambda field, v: check_int(field, v, lo, hi)


def _text(field: str, v: Any) -> str:
    return check_str(field, v)


def _maybe_text(field: str, v: Any) -> str:
    return check_str(field, v, nonempty=False)


def _texts(field: str, v: Any) -> None:
    if not isinstance(v, list):
        raise InvalidInputError(field, v, "a list of strings")
    for i, x in enumerate(v):
        check_str(f"{field}[{i}]", x)


def _sources(field: str, v: Any) -> None:
    for k, x in check_mapping(field, v).items():
        check_str(f"{field}.{k}", x)


def _peaks(field: str, v: Any) -> None:
    """Dense peak TFLOP/s per dtype: at least one, every one > 0."""
    if not check_mapping(field, v):
        raise InvalidInputError(field, v, "at least one dtype peak in TFLOP/s")
    for k, x in v.items():
        check_choice(f"{field} key", k, [d.value for d in Dtype])
        _positive(f"{field}.{k}", x)


def _choice(*options: str) -> Check:
    return lambda field, v: check_choice(field, v, options)


# name: (check, required)
GPU_FIELDS: dict[str, tuple[Check, bool]] = {
    "name": (_text, True), "vendor": (_text, True), "year": (_count(1950, 2200), False),
    "aliases": (_texts, False), "peak_tflops": (_peaks, True),
    "mem_bytes": (_positive, True), "mem_bw_gbytes_per_s": (_positive, True),
    "tdp_w": (_positive, True), "sm_count": (_count(0), True),
    "l2_bytes": (_non_negative, True), "price_usd_per_hour": (_non_negative, True),
    "price_date": (_maybe_text, False), "pcie_link": (_text, False),
    "source": (_text, True), "sources": (_sources, True), "attention_kernels": (_texts, False),
    "devices_per_card": (_count(1, 8), False), "nic_on_die": (check_bool, False),
}
LINK_FIELDS: dict[str, tuple[Check, bool]] = {
    "kind": (_choice(*(k.value for k in LinkKind)), True), "aliases": (_texts, False),
    "bandwidth_gbytes_per_s": (_positive, True), "latency_us": (_non_negative, True),
    "sources": (_sources, True), "fabric": (_choice("switch", "mesh"), False),
    "in_switch_reduction": (check_bool, False), "domain_gpus": (_count(1, MAX_GPUS), False),
    "hw_latency_us": (_non_negative, False), "nccl_ll": (check_bool, False),
    "variant_of": (_text, False), "pair_gbytes_per_s": (_positive, False),
    "note": (_text, False),
}
NODE_FIELDS: dict[str, tuple[Check, bool]] = {
    "gpu_key": (_text, True), "gpus_per_node": (_count(1, MAX_GPUS_PER_NODE), True),
    "scale_up": (_text, True), "scale_up_domain_gpus": (_count(1, MAX_GPUS), True),
    "in_switch_reduction": (check_bool, True),
    "nics_per_node": (_count(1, MAX_NICS_PER_NODE), True), "nic": (_text, True),
    "aliases": (_texts, False), "sources": (_sources, True), "note": (_text, False),
}
TOPOLOGY_FIELDS: dict[str, tuple[Check, bool]] = {
    "_doc": (_text, False), "leaf_down_ports": (_count(1, 1 << 16), True),
    "switch_radix": (_count(2, 1 << 16), True), "sources": (_sources, True),
}


def check_entry(where: str, entry: Any, fields: Mapping[str, tuple[Check, bool]]) -> None:
    """Every field of one entry (``where`` = ``table.key``): none unknown, none required
    missing, each value through its check."""
    check_mapping(where, entry)
    for name in entry:
        if name not in fields:
            raise InvalidInputError(f"{where}.{name}", entry[name],
                                    "no such field; known fields: " + ", ".join(fields))
    for name, (check, required) in fields.items():
        if name in entry:
            check(f"{where}.{name}", entry[name])
        elif required:
            raise InvalidInputError(f"{where}.{name}", None, "a required field (it is missing)")


def _table(data: Any, name: str, fields: Mapping[str, tuple[Check, bool]]
           ) -> Mapping[str, Any]:
    """The file's ``name`` table, every entry checked (keys as loaders look them up)."""
    top = check_mapping("file", data)
    if name not in top:
        raise InvalidInputError(name, None, f"a top-level {name!r} object (it is missing)")
    table = check_mapping(name, top[name])
    if not table:
        raise InvalidInputError(name, {}, "at least one entry")
    for key, entry in table.items():
        if not _KEY.match(key):
            raise InvalidInputError(f"{name} key", key, "a lowercase key of letters, digits, "
                                    "'-' and '.' (how keys are looked up)")
        check_entry(f"{name}.{key}", entry, fields)
    return table


def _ref(field: str, value: str, keys: Mapping[str, Any] | list[str], what: str) -> None:
    if value not in keys:
        raise InvalidInputError(field, value, f"a key of {what}: {', '.join(sorted(keys))}")


# ---- whole files ------------------------------------------------------------------------
def check_gpus(data: Any, read: Reader) -> None:
    links = read("links")["links"]
    pcie = [k for k, e in links.items() if e["kind"] == LinkKind.PCIE.value]
    for key, e in _table(data, "gpus", GPU_FIELDS).items():
        if "pcie_link" in e:
            _ref(f"gpus.{key}.pcie_link", e["pcie_link"], pcie, "links.json of kind pcie")


def check_links(data: Any, read: Reader) -> None:
    links = _table(data, "links", LINK_FIELDS)
    for key, e in links.items():
        if "pair_gbytes_per_s" in e and (e.get("fabric") != "mesh"
                                         or e["pair_gbytes_per_s"] >= e["bandwidth_gbytes_per_s"]):
            raise InvalidInputError(f"links.{key}.pair_gbytes_per_s", e["pair_gbytes_per_s"],
                                    "the package-sibling share of a mesh link, below its "
                                    "bandwidth_gbytes_per_s")
        if "variant_of" in e:         # a GPU's own wiring of a named generation
            _ref(f"links.{key}.variant_of", e["variant_of"], links, "links.json")
            base = links[e["variant_of"]]
            if base["kind"] != e["kind"] or e["variant_of"] == key or "fabric" not in base:
                raise InvalidInputError(f"links.{key}.variant_of", e["variant_of"],
                                        f"another scale-up link of the same kind ({e['kind']})")


def check_nodes(data: Any, read: Reader) -> None:
    gpus, links = read("gpus")["gpus"], read("links")["links"]
    scale_up = [k for k, e in links.items() if "fabric" in e]
    nics = [k for k, e in links.items() if "fabric" not in e]
    nodes = _table(data, "nodes", NODE_FIELDS)
    for key, e in nodes.items():
        where = f"nodes.{key}"
        _ref(f"{where}.gpu_key", e["gpu_key"], gpus, "gpus.json")
        _ref(f"{where}.scale_up", e["scale_up"], scale_up, "links.json with a fabric (scale-up)")
        _ref(f"{where}.nic", e["nic"], nics, "links.json without a fabric (scale-out NIC)")
        if e["scale_up_domain_gpus"] % e["gpus_per_node"]:
            raise InvalidInputError(f"{where}.scale_up_domain_gpus", e["scale_up_domain_gpus"],
                                    f"a multiple of gpus_per_node={e['gpus_per_node']}")
    defaults = check_mapping("default_for_gpu", data.get("default_for_gpu", {}))
    for gpu, node in defaults.items():
        _ref("default_for_gpu key", gpu, gpus, "gpus.json")
        _ref(f"default_for_gpu.{gpu}", node, nodes, "nodes")
        if nodes[node]["gpu_key"] != gpu:
            raise InvalidInputError(f"default_for_gpu.{gpu}", node,
                                    f"a node whose gpu_key is {gpu!r} (it has "
                                    f"{nodes[node]['gpu_key']!r})")


def check_topology(data: Any, read: Reader) -> None:
    check_entry("topology", data, TOPOLOGY_FIELDS)


CHECKS: dict[str, Callable[[Any, Reader], None]] = {
    "gpus": check_gpus, "links": check_links, "nodes": check_nodes, "topology": check_topology,
}


def parse(path: Path) -> Any:
    """The JSON of a data file (``NaN`` parses here and is refused by the field checks,
    which can name the field)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError("hardware data file", str(path), "a readable UTF-8 JSON file",
                                str(exc)) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInputError("hardware data file", str(path), "valid JSON", str(exc)) from None


def load(name: str, path: Path, read: Reader) -> Mapping[str, Any]:
    """Parse and check ``data/<name>.json``; ``read`` gives the (already checked) files it
    refers to. One ``InvalidInputError`` naming field and value, with the file in its
    detail."""
    data = parse(path)
    check = CHECKS.get(name)
    if check is None:
        return data
    try:
        check(data, read)
    except InvalidInputError as exc:
        if exc.detail.startswith("in hardware data file"):    # from a file it refers to
            raise
        raise InvalidInputError(exc.field, exc.value, exc.valid,
                                f"in hardware data file {path}") from None
    return data
