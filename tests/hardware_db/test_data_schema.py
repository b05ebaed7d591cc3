"""hardware_db's load-time schema: a corrupted data file gives one InvalidInputError that
names the file, the entry and field, and the bad value; the shipped files all pass."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

import hardware_db as hdb
from hardware_db import loaders, schema
from simulator.cli import main as cli_main
from simulator.errors import InvalidInputError

FILES = ("gpus", "links", "nodes", "topology")
SHIPPED = Path(hdb.__file__).resolve().parent / "data"


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A copy of the data files the loaders read instead of the shipped ones."""
    for name in FILES:
        shutil.copy(SHIPPED / f"{name}.json", tmp_path / f"{name}.json")
    monkeypatch.setattr(loaders, "DATA_DIR", tmp_path)
    loaders._read.cache_clear()
    yield tmp_path
    loaders._read.cache_clear()


def _corrupt(directory: Path, name: str, edit: Callable[[dict], Any]) -> Path:
    path = directory / f"{name}.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))          # NaN is written as the bare token NaN
    return path


def _set(*keys: str, value: Any) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


def _drop(*keys: str) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return edit


def _link_case(link: str, field: str, value: Any) -> tuple:
    return ("links", _set("links", link, field, value=value), f"links.{link}.{field}",
            repr(value))


# (file, edit, field named in the error, text of the bad value in the message)
CASES = [
    ("gpus", _set("gpus", "h100-sxm", "mem_bw_gbytes_per_s", value=-3350.0),
     "gpus.h100-sxm.mem_bw_gbytes_per_s", "-3350.0"),
    ("gpus", _set("gpus", "h100-sxm", "mem_bytes", value="80e9"),
     "gpus.h100-sxm.mem_bytes", "'80e9'"),
    ("gpus", _set("gpus", "a100-sxm-80gb", "tdp_w", value=math.nan),
     "gpus.a100-sxm-80gb.tdp_w", "nan"),
    ("gpus", _set("gpus", "b200", "peak_tflops", "bf16", value=0.0),
     "gpus.b200.peak_tflops.bf16", "0.0"),
    ("gpus", _set("gpus", "b200", "peak_tflops", "bf17", value=100.0),
     "gpus.b200.peak_tflops key", "'bf17'"),
    ("gpus", _drop("gpus", "mi300x", "peak_tflops"), "gpus.mi300x.peak_tflops", "None"),
    ("gpus", _set("gpus", "h100-sxm", "sm_count", value=132.5),
     "gpus.h100-sxm.sm_count", "132.5"),
    ("gpus", _set("gpus", "h100-sxm", "pcie_link", value="pcie-gen9"),
     "gpus.h100-sxm.pcie_link", "'pcie-gen9'"),
    ("gpus", _set("gpus", "h100-sxm", "mem_bw_gbps", value=3350.0),
     "gpus.h100-sxm.mem_bw_gbps", "3350.0"),
    ("links", _set("links", "nvlink4", "bandwidth_gbytes_per_s", value=0.0),
     "links.nvlink4.bandwidth_gbytes_per_s", "0.0"),
    ("links", _set("links", "ib-ndr", "bandwidth_gbytes_per_s", value=-50.0),
     "links.ib-ndr.bandwidth_gbytes_per_s", "-50.0"),
    ("links", _set("links", "ib-ndr", "latency_us", value="2.7"),
     "links.ib-ndr.latency_us", "'2.7'"),
    ("links", _set("links", "nvlink3", "bandwidth_gbytes_per_s", value=math.inf),
     "links.nvlink3.bandwidth_gbytes_per_s", "inf"),
    ("links", _set("links", "roce-400", "kind", value="warp-drive"),
     "links.roce-400.kind", "'warp-drive'"),
    ("links", _drop("links", "pcie-gen5", "latency_us"), "links.pcie-gen5.latency_us", "None"),
    ("links", _set("links", "xgmi-mi300x", "fabric", value="ring"),
     "links.xgmi-mi300x.fabric", "'ring'"),
    # a GPU's own wiring of a named generation, and a packaged mesh's sibling share
    *(_link_case(link, field, value) for link, field, value in (
        ("nvlink4-h800", "variant_of", "nvlink9"), ("nvlink3-a800", "variant_of", "pcie-gen4"),
        ("nvlink3-a800", "variant_of", "nvlink3-a800"),
        ("xgmi-mi250x", "pair_gbytes_per_s", 400.0), ("nvlink4", "pair_gbytes_per_s", 100.0),
        ("xgmi-mi250x", "pair_gbytes_per_s", -1.0))),
    ("nodes", _set("nodes", "dgx-h100", "scale_up", value="nvlink9"),
     "nodes.dgx-h100.scale_up", "'nvlink9'"),
    ("nodes", _set("nodes", "dgx-h100", "nic", value="nvlink4"),
     "nodes.dgx-h100.nic", "'nvlink4'"),
    ("nodes", _set("nodes", "dgx-a100", "gpus_per_node", value=0),
     "nodes.dgx-a100.gpus_per_node", "0"),
    ("nodes", _set("nodes", "dgx-a100", "gpus_per_node", value="8"),
     "nodes.dgx-a100.gpus_per_node", "'8'"),
    ("nodes", _set("nodes", "dgx-a100", "in_switch_reduction", value="yes"),
     "nodes.dgx-a100.in_switch_reduction", "'yes'"),
    ("nodes", _set("nodes", "gb200-nvl72", "scale_up_domain_gpus", value=70),
     "nodes.gb200-nvl72.scale_up_domain_gpus", "70"),
    ("nodes", _set("nodes", "dgx-b200", "gpu_key", value="b9000"),
     "nodes.dgx-b200.gpu_key", "'b9000'"),
    ("nodes", _drop("nodes", "dgx-2", "nic"), "nodes.dgx-2.nic", "None"),
    ("nodes", _set("default_for_gpu", "h100-sxm", value="dgx-a100"),
     "default_for_gpu.h100-sxm", "'dgx-a100'"),
    ("topology", _set("leaf_down_ports", value=0), "topology.leaf_down_ports", "0"),
    ("topology", _set("leaf_down_ports", value="32"), "topology.leaf_down_ports", "'32'"),
    ("topology", _drop("switch_radix"), "topology.switch_radix", "None"),
]


@pytest.mark.parametrize("name,edit,field,shown", CASES,
                         ids=[f"{c[0]}:{c[2]}={c[3]}" for c in CASES])
def test_a_corrupted_file_gives_one_error_naming_file_entry_and_field(
        data_dir, name, edit, field, shown):
    path = _corrupt(data_dir, name, edit)
    with pytest.raises(InvalidInputError) as ei:
        loaders._read(name)
    err = ei.value
    assert err.field == field
    assert str(path) in err.detail
    msg = str(err)
    assert "\n" not in msg and f"invalid {field}={shown}:" in msg
    assert err.valid                              # says what would be valid


def test_a_bad_file_is_refused_through_the_public_loaders(data_dir):
    _corrupt(data_dir, "links", _set("links", "nvlink4", "bandwidth_gbytes_per_s", value=-1.0))
    for call in (lambda: hdb.load_link("nvlink4"), lambda: hdb.load_node("dgx-h100"),
                 lambda: hdb.build_cluster("h100-sxm", 16), lambda: hdb.list_gpus()):
        with pytest.raises(InvalidInputError, match="links.nvlink4.bandwidth_gbytes_per_s"):
            call()


def test_an_error_in_a_referenced_file_names_that_file(data_dir):
    links = _corrupt(data_dir, "links", _set("links", "ib-ndr", "latency_us", value=-2.7))
    with pytest.raises(InvalidInputError) as ei:
        loaders._read("nodes")
    assert ei.value.field == "links.ib-ndr.latency_us" and str(links) in ei.value.detail


@pytest.mark.parametrize("text", ["{\"gpus\": {", "", "[1, 2]"])
def test_a_file_that_is_not_a_json_object_names_the_file(data_dir, text):
    (data_dir / "gpus.json").write_text(text)
    with pytest.raises(InvalidInputError) as ei:
        loaders._read("gpus")
    assert str(data_dir / "gpus.json") in str(ei.value)


def test_a_missing_file_names_the_file(data_dir):
    (data_dir / "topology.json").unlink()
    with pytest.raises(InvalidInputError, match="topology.json"):
        loaders._read("topology")


def test_the_cli_prints_one_line_and_exits_2(data_dir, capsys):
    _corrupt(data_dir, "gpus", _set("gpus", "h100-sxm", "tdp_w", value=-700.0))
    assert cli_main.main(["list", "gpus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gpus.h100-sxm.tdp_w=-700.0" in err
    assert "gpus.json" in err


def test_each_file_is_parsed_and_checked_once_per_process(data_dir, monkeypatch):
    calls: list[str] = []
    parse = schema.parse
    monkeypatch.setattr(schema, "parse", lambda p: calls.append(p.name) or parse(p))
    for _ in range(3):
        hdb.list_gpus()
        hdb.load_node("dgx-h100")
        loaders.topology_params()
    assert sorted(calls) == ["gpus.json", "links.json", "nodes.json", "topology.json"]


@pytest.mark.parametrize("name", FILES)
def test_the_shipped_files_pass(name):
    data = schema.load(name, SHIPPED / f"{name}.json", loaders._read)
    assert data == json.loads((SHIPPED / f"{name}.json").read_text())


def test_every_shipped_field_is_in_the_schema():
    """An unknown field is refused, so the schema must list every field the data uses."""
    tables = {"gpus": schema.GPU_FIELDS, "links": schema.LINK_FIELDS,
              "nodes": schema.NODE_FIELDS}
    for name, fields in tables.items():
        for key, entry in json.loads((SHIPPED / f"{name}.json").read_text())[name].items():
            assert set(entry) <= set(fields), (name, key, set(entry) - set(fields))
