"""`complexity collective`, the fabric flags of `simulate`, and fabric alternatives in
`compare` / `search`."""
from __future__ import annotations

import json

import pytest

from simulator.cli.collective import parse_bytes, parse_sizes
from simulator.cli.main import main

COLL = ["collective", "--op", "all_reduce", "--gpus", "32", "--gpu", "h100-sxm"]


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_collective_json_keys_and_nccl_tests_bus_bandwidth(capsys):
    rc, out, _ = run(COLL + ["--size", "1G", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    for key in ("time_s", "algbw_gbytes_per_s", "busbw_gbytes_per_s", "algorithm", "bottleneck"):
        assert key in d
    assert d["algbw_gbytes_per_s"] == pytest.approx((1 << 30) / d["time_s"] / 1e9)
    assert d["busbw_gbytes_per_s"] == pytest.approx(d["algbw_gbytes_per_s"] * 2 * 31 / 32)
    assert d["bottleneck"].startswith("nic")


def test_collective_size_sweep_prints_a_curve(capsys):
    rc, out, _ = run(COLL + ["--size", "1K..1M", "--algorithm", "ring"], capsys)
    lines = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert rc == 0 and len(lines) == 11
    busbw = [float(ln.split()[3]) for ln in lines]
    assert busbw == sorted(busbw)                       # bandwidth ramps up with size
    rc, out, _ = run(COLL + ["--size", "1K..1M:4", "--json"], capsys)
    assert len(json.loads(out)["rows"]) == 6


def test_collective_bad_input_is_one_line(capsys):
    a100 = ["collective", "--op", "all_reduce", "--gpus", "8", "--gpu", "a100-sxm-80gb"]
    for args in (COLL + ["--size", "12Q"], a100 + ["--size", "1G", "--algorithm", "nvls"],
                 COLL + ["--size", "1G", "--group", "64"]):
        rc, _, err = run(args, capsys)
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_size_parsing():
    assert parse_bytes("64K") == 65536 and parse_bytes("16MiB") == 16 << 20
    assert parse_sizes("1M,4M") == [1 << 20, 4 << 20]
    assert parse_sizes("1G..4G") == [1 << 30, 2 << 30, 4 << 30]


def test_send_recv_across_nodes(capsys):
    rc, out, _ = run(["collective", "--op", "send_recv", "--gpus", "16", "--gpu", "h100-sxm",
                      "--size", "1G", "--stride", "8", "--json"], capsys)
    d = json.loads(out)
    # one GPU's NIC: 400 Gb/s x network efficiency
    assert rc == 0 and d["busbw_gbytes_per_s"] == pytest.approx(48, rel=0.02)


def test_simulate_fabric_flags_and_busiest_link(capsys):
    """EP64 over 8 consecutive nodes: one rail-optimized leaf group (no spine crossing); not
    rail-optimized a leaf holds 4 nodes, so a 4:1 spine throttles the expert all-to-all."""
    base = ["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "512",
            "--ep", "64", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--global-batch", "512",
            "--recompute", "full", "--zero-stage", "1", "--json"]
    got = {}
    for extra in ([], ["--oversubscription", "4", "--no-rail-optimized"]):
        rc, out, _ = run(base + extra, capsys)
        assert rc == 0
        got[tuple(extra)] = json.loads(out)
    full, thin = got[()], got[("--oversubscription", "4", "--no-rail-optimized")]
    assert thin["breakdown"]["ep_comm_s"] > 1.5 * full["breakdown"]["ep_comm_s"]
    assert thin["busiest_link"].startswith("leaf-spine") and full["link_busy_s"]["nic"] > 0


def test_compare_prices_fabric_alternatives(capsys):
    rc, out, _ = run(["compare", "--model", "llama2-7b", "--tokens", "1B", "--gpu-list", "h100-sxm",
                      "--gpus-list", "64", "--global-batch", "64", "--oversubscription", "1,4",
                      "--nic-gbps", "200,400", "--micro-batches", "1", "--zero-stages", "1",
                      "--recomputes", "none", "--workers", "1", "--event-top", "1", "--json"],
                     capsys)
    rows = json.loads(out)["rows"]
    assert rc == 0 and len(rows) == 4
    assert {(r["nic_gbps"], r["oversubscription"]) for r in rows} == \
        {(200.0, 1.0), (200.0, 4.0), (400.0, 1.0), (400.0, 4.0)}
    assert all(r["cost_usd"] is None or r["cost_usd"] > 0 for r in rows)
