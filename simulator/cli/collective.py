"""``complexity collective``: one collective (or a size sweep, like nccl-tests) on a cluster,
priced by the flow-level network model; and the fabric flags every cluster command shares."""
from __future__ import annotations

import argparse
import re

from ..api.catalog import load_profile_for, make_cluster
from ..boundary import json_out
from ..errors import InvalidInputError
from ..network.collectives import Collective
from ..network.fabric import fabric_of
from ..network.flows import Algo
from ..network.price import CollectiveCost, cluster_collective
from .registry import command

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}
ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "nvls", "sharp")


# ---- shared cluster / fabric flags -----------------------------------------------------------
def add_fabric_args(p: argparse.ArgumentParser, oversubscription: bool = True) -> None:
    """Fat-tree flags: how the NICs are wired (``hardware_db.build_cluster``)."""
    g = p.add_argument_group("fabric")
    if oversubscription:
        g.add_argument("--oversubscription", type=float, default=1.0,
                       help="leaf-to-spine oversubscription (1 = full bisection)")
    g.add_argument("--rail-optimized", action=argparse.BooleanOptionalAction, default=True,
                   help="NIC j of every node on rail j's leaf (default) or all NICs of a few "
                        "nodes on one leaf")
    g.add_argument("--core-oversubscription", type=float, default=1.0,
                   help="spine-to-core oversubscription (clusters past 2,048 NIC ports)")
    g.add_argument("--planes", type=int, default=1, help="independent leaf/spine planes")
    g.add_argument("--sharp", action="store_true",
                   help="switches reduce (InfiniBand SHARP / CollNet enabled)")


def fabric_kwargs(a: argparse.Namespace) -> dict:
    return {"rail_optimized": a.rail_optimized, "core_oversubscription": a.core_oversubscription,
            "planes": a.planes, "sharp": a.sharp}


def parse_bytes(text: str, field: str = "size") -> int:
    """``1048576``, ``64K``, ``16MiB``, ``1G`` (binary units, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise InvalidInputError(field, text, "a byte count such as 1048576, 64K, 16MiB or 1G")
    v = int(float(m.group(1)) * _UNITS[unit])
    if v <= 0:
        raise InvalidInputError(field, text, "a positive byte count")
    return v


def parse_sizes(text: str) -> list[int]:
    """One size, a list ``1M,4M``, or a doubling sweep ``1K..1G`` (``1K..1G:4`` steps x4)."""
    out = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*([^.:]+)\.\.([^:]+)(?::(\d+))?\s*", part)
        if not m:
            out.append(parse_bytes(part))
            continue
        lo, hi = parse_bytes(m.group(1)), parse_bytes(m.group(2))
        step = int(m.group(3) or 2)
        if hi < lo or step < 2:
            raise InvalidInputError("size", text, "a sweep LO..HI[:FACTOR] with LO <= HI, FACTOR >= 2")
        while lo <= hi:
            out.append(lo)
            lo *= step
    return out


# ---- the command --------------------------------------------------------------------------
@command("collective", "Time one collective on a cluster (nccl-tests style; --size sweeps a curve).")
def _collective_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", required=True, choices=[c.value for c in Collective],
                   help="the collective to price")
    p.add_argument("--size", required=True,
                   help="bytes (nccl-tests' size: all-reduce input, all-gather output, ...): "
                        "1G, 64MiB, a list 1M,4M or a sweep 1K..1G")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    p.add_argument("--gpu", required=True, help="GPU key, e.g. h100-sxm")
    p.add_argument("--group", type=int, help="ranks per communicator (default: every GPU; 2 for "
                   "send_recv); every such group runs at once")
    p.add_argument("--stride", type=int, default=1,
                   help="rank stride inside a group (send_recv: how far the peer is, e.g. 8 = "
                        "the next node of 8 GPUs)")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS,
                   help="auto = NCCL's tuner choice; nvls = NVLSTree across nodes")
    p.add_argument("--node", help="node preset, e.g. dgx-h100, aws-p6-b200, gb200-nvl72")
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--nics-per-node", type=int)
    p.add_argument("--nic-gbps", type=float, help="NIC line rate in Gb/s")
    p.add_argument("--nic-kind", help="infiniband, roce, omnipath, efa, ethernet")
    p.add_argument("--scale-up", help="scale-up link key, e.g. nvlink4, nvlink5-nvl72")
    add_fabric_args(p)
    p.add_argument("--profile", help="calibration profile JSON (default: shipped reference)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_collective)


def run_collective(a: argparse.Namespace) -> int:
    cluster = make_cluster(a.gpu, a.gpus, a.gpus_per_node, a.nics_per_node, a.nic_gbps,
                           a.nic_kind, a.scale_up, a.node, a.oversubscription, **fabric_kwargs(a))
    prof = load_profile_for(cluster.gpu.key, a.profile, a.allow_profile_mismatch)
    sizes = parse_sizes(a.size)
    group = a.group or (2 if a.op == Collective.SEND_RECV.value else None)
    costs = [cluster_collective(cluster, a.op, s, prof, Algo(a.algorithm), group, a.stride)
             for s in sizes]
    desc = fabric_of(cluster).describe()
    if a.json:
        rows = [_row(c, cluster) for c in costs]
        out = rows[0] if len(rows) == 1 else {"op": a.op, "fabric": desc, "rows": rows}
        if len(rows) == 1:
            out["fabric"] = desc
        print(json_out.dumps(out, indent=2, sort_keys=True))
        return 0
    print(_table(costs, cluster, desc))
    return 0


def _bottleneck(c: CollectiveCost, cluster) -> str:
    if c.bottleneck in ("-", ""):
        return "-"
    kind = cluster.node.scale_up.kind.value if c.bottleneck == "scale-up" else cluster.node.nic.kind.value
    return f"{c.bottleneck} ({kind})" + (", latency-bound" if c.latency_bound else "")


def _row(c: CollectiveCost, cluster) -> dict:
    return {"op": c.op.value, "size_bytes": c.size_bytes, "n_ranks": c.n, "time_s": c.time_s,
            "algbw_gbytes_per_s": c.algbw_gbytes_per_s if c.time_s > 0 else 0.0,
            "busbw_gbytes_per_s": c.busbw_gbytes_per_s if c.time_s > 0 else 0.0,
            "algorithm": c.algorithm, "protocol": c.protocol,
            "bottleneck": _bottleneck(c, cluster), "latency_s": c.latency_s,
            "tier_busy_s": dict(c.tier_busy_s)}


def _table(costs: list[CollectiveCost], cluster, desc: str) -> str:
    c0 = costs[0]
    lines = [f"{c0.op.value} over {c0.n} ranks of {cluster.n_gpus} x {cluster.gpu.key}; {desc}",
             f"{'size (B)':>14} {'time (us)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}  "
             f"{'algorithm':<13}{'proto':<8}bottleneck"]
    for c in costs:
        alg = c.algbw_gbytes_per_s if c.time_s > 0 else 0.0
        bus = c.busbw_gbytes_per_s if c.time_s > 0 else 0.0
        lines.append(f"{c.size_bytes:14.0f} {c.time_s * 1e6:11.2f} {alg:11.2f} {bus:11.2f}  "
                     f"{c.algorithm:<13}{c.protocol:<8}{_bottleneck(c, cluster)}")
    return "\n".join(lines)
