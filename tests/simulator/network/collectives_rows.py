"""collectives.csv rows as ``complexity collective`` cases: which cluster, collective and
algorithm each row measured (shared by the accuracy test and ``python -m`` for a table).

Rows left out, and why (also in README "The network model"):

* lines 86 and 88 (4x P6-B200, 32 KiB and 128 KiB): their time *falls* as the size grows
  (32 KiB 6.3 ms, 128 KiB ~1.1 ms, 512 KiB 0.36 ms), which no fixed algorithm does: artefacts
  of the benchmark (``all_reduce_bench.py``: barrier + CUDA events, PyTorch launch) or of the
  AWS tuner, not of the network;
* lines 130-136: point-to-point copies (p2pBandwidthLatencyTest, nvbandwidth, ib_write_bw),
  not NCCL collectives.

Assumptions where a row does not say: bars with no GPU count (lines 2-4, 8-13) are 8 GPUs per
node and, multi-node, 4 nodes (the GTC 2025 slide's 32 GPUs); the 1-NIC and TCP bars are
H100 nodes with one NIC; "2x 200Gb, 32 GPUs" (line 17) is 4 H100 nodes with 2 NICs each;
the PCIe bars are 8 GPUs on a PCIe switch (A100 on Gen4, H100 on Gen5, B200 on Gen6); the 4x
P6-B200 rows ran Ring (``EFA_ALGORITHM``).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "hardware_db" / "data" / "measurements" / "collectives.csv"
EXCLUDED = {86: "EFA 32 KiB: time falls with size (benchmark/tuner artefact)",
            88: "EFA 128 KiB: time falls with size (benchmark/tuner artefact)"}


@dataclass(frozen=True)
class Case:
    line: int
    multi_node: bool
    gpu: str
    n_gpus: int
    op: str
    size_bytes: float
    busbw: float
    algorithm: str = "auto"
    cluster: dict = field(default_factory=dict)


PLATEAU = float(16 << 30)
# The 4x P6-B200 rows ran AWS's ofi tuner, whose choice there is not logged; on p5en the same
# tuner chose Ring (forced NVLSTree was 15 % slower), stas00 network/README.md l.1182/1447 at
# 744d01e, and only Ring's latency (NCCL: 1.4 x (8.4 + 56 x 3.4 + 6 x 14) = 396 us at 32 GPUs)
# matches the rows' ~0.36-0.4 ms floor.
EFA_ALGORITHM = "ring"
BARS = {   # line: (gpu, n, algorithm, cluster overrides)
    2: ("a100-sxm-80gb", 8, "auto", {"scale_up": "pcie-gen4"}),
    3: ("h100-sxm", 8, "auto", {"scale_up": "pcie-gen5"}),
    4: ("v100-sxm-32gb", 8, "auto", {}), 5: ("a100-sxm-80gb", 8, "auto", {}),
    6: ("h100-sxm", 8, "ring", {}), 7: ("h100-sxm", 8, "nvls", {}),
    8: ("h100-sxm", 32, "auto", {"nics_per_node": 1, "nic_gbps": 100, "nic_kind": "ethernet"}),
    9: ("h100-sxm", 32, "auto", {"nics_per_node": 1, "nic_gbps": 200}),
    10: ("h100-sxm", 32, "auto", {"nics_per_node": 1, "nic_gbps": 400}),
    11: ("a100-sxm-80gb", 32, "auto", {}), 12: ("h100-sxm", 32, "ring", {}),
    13: ("h100-sxm", 32, "sharp", {"sharp": True}),
    14: ("b200", 8, "auto", {"scale_up": "pcie-gen6"}),
    15: ("b200", 8, "ring", {}), 16: ("b200", 8, "nvls", {}),
    17: ("h100-sxm", 32, "auto", {"nics_per_node": 2, "nic_gbps": 200}),
    18: ("a100-sxm-80gb", 32, "auto", {}), 19: ("h100-sxm", 32, "ring", {}),
    20: ("h100-sxm", 32, "sharp", {"sharp": True}),
    21: ("gb200", 32, "ring", {}), 22: ("gb200", 32, "nvls", {}),
    23: ("h100-sxm", 8, "ring", {}), 24: ("h100-sxm", 8, "nvls", {}),
}


def _algorithm(text: str) -> str:
    t = text.lower()
    if "nvlstree" in t:
        return "nvls"
    if "disabled" in t or "nvls_enable=0" in t or "nvls off" in t or t.startswith("ring"):
        return "ring"
    if t.startswith("nvls"):
        return "nvls"
    return "auto"


def _gpu(system: str) -> str:
    s = system.lower()
    for key, gpu in (("a100", "a100-sxm-80gb"), ("h200", "h200-sxm"), ("b200", "b200"),
                     ("h100", "h100-sxm"), ("h800", "h100-sxm")):
        if key in s:
            return gpu
    raise LookupError(system)


def _case(line: int, r: dict) -> Case | None:
    if line in BARS:
        gpu, n, alg, cl = BARS[line]
        return Case(line, n > 8 and gpu != "gb200", gpu, n, "all_reduce", PLATEAU,
                    float(r["busbw_GBps"]), alg, cl)
    if not r["collective"].startswith(("all_reduce", "all_gather", "reduce_scatter")):
        return None
    try:
        size = float(r["message_bytes"])
    except ValueError:
        return None
    op = r["collective"].split()[0]
    n = int(r["gpus"])
    alg = _algorithm(r["algorithm"])
    cl = {}
    if "P6-B200 x4" in r["system"]:
        cl, alg = {"node": "aws-p6-b200"}, EFA_ALGORITHM
    return Case(line, r["nodes"] not in ("1", ""), _gpu(r["system"]), n, op, size,
                float(r["busbw_GBps"]), alg, cl)


def cases(include_excluded: bool = False) -> list[Case]:
    with open(CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = [_case(i, r) for i, r in enumerate(rows, start=2)]
    return [c for c in out if c is not None and (include_excluded or c.line not in EXCLUDED)]


def predict_busbw(c: Case) -> float:
    import hardware_db
    from simulator.network.fabric import fabric_of, group_shape
    from simulator.network.price import collective_cost
    kw = dict(c.cluster)
    cluster = hardware_db.build_cluster(
        c.gpu, c.n_gpus, nics_per_node=kw.get("nics_per_node"),
        nic_gbits_per_s=kw.get("nic_gbps"), nic_kind=kw.get("nic_kind"), node=kw.get("node"),
        scale_up=kw.get("scale_up"), sharp=kw.get("sharp", False))
    fab = fabric_of(cluster)
    cost = collective_cost(c.op, c.size_bytes, group_shape(fab, c.n_gpus, 1), fab,
                           hardware_db.load_profile(c.gpu), c.algorithm)
    return cost.busbw_gbytes_per_s


def errors(multi: bool, include_excluded: bool = False) -> list[tuple[Case, float, float]]:
    """(case, predicted busbw, signed error %) for the multi- or single-node rows."""
    out = []
    for c in cases(include_excluded):
        if c.multi_node == multi:
            p = predict_busbw(c)
            out.append((c, p, 100.0 * (p - c.busbw) / c.busbw))
    return out


def mape(errs) -> float:
    return sum(abs(e) for _, _, e in errs) / len(errs)


if __name__ == "__main__":
    for multi in (True, False):
        errs = errors(multi)
        for c, p, e in errs:
            print(f"line {c.line:4d} {c.gpu:14s} n={c.n_gpus:5d} {c.op:14s} {c.algorithm:5s} "
                  f"size={c.size_bytes:14.0f} meas={c.busbw:7.2f} pred={p:7.2f} err={e:+7.1f}%")
        print(f"{'multi' if multi else 'single'}-node rows: {len(errs)}, busbw MAPE {mape(errs):.1f}%")
