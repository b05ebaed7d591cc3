"""Host model of the reference GPU profiles (``Profile.host``), from published host-time
measurements and this repository's own CPU probe.

The published quantity is the CPU time of one ``torch.nn.Linear`` forward in eager PyTorch
on the GPU's host (``host_overhead.csv``: 13.48 us on a DGX H100's Xeon 8480C, line 6;
37.08 us on GB200's Grace, line 2; TransformerEngine issue #2053). A Linear is one op of
the simulator's op graph (its GEMM, with the module call, autograd recording and kernel
launch around it), so it is taken as the host time per op-graph op forward: assumed for the
other ops of a layer (norms, attention, activations, residual adds), which the CPU probe
finds within a factor ~2 of a lone Linear call depending on how warm the dispatcher's caches
are. Backward per op = forward x the backward/forward ratio of the host probe on a CPU
build (``calibrate.bench_framework``, rows "eager_probe" of ``host_mechanisms.csv``).
Every x86 server host is taken to cost what the Xeon 8480C does (no per-op figure is
published for the DGX A100's EPYC 7742 or the others).
"""
from __future__ import annotations

import statistics
from typing import Sequence

from simulator.hardware.profile import Coefficient, HostModel

from .csvrows import Row, cite, load_rows, select

GRACE_HOSTS = ("gb200", "gb300")


def _linear_row(key: str, rows: Sequence[Row]) -> Row:
    want = "GB200" if key in GRACE_HOSTS else "GH200" if key == "gh200" else \
        "H100 SXM (DGX, Xeon 8480C host)"
    return select(rows, lambda d: d["gpu"] == want
                  and d["kernel"].startswith("torch.nn.Linear forward"))[0]


def _probe(mech: Sequence[Row]) -> dict[str, list[Row]]:
    """The latest date's probe rows (one per run), by what they measure."""
    probe = select(mech, lambda d: d["mechanism"] == "eager_probe")
    last = max(r.data["date"] for r in probe)
    out: dict[str, list[Row]] = {}
    for r in probe:
        if r.data["date"] == last:
            m = r.data["metric"]
            key = "linear" if "Linear" in m else "backward" if "backward" in m else "forward"
            out.setdefault(key, []).append(r)
    return out


def _median(rows: Sequence[Row]) -> float:
    return statistics.median(float(r.data["value_us"]) for r in rows)


def host_for(key: str) -> HostModel:
    rows, mech = load_rows("host_overhead.csv"), load_rows("host_mechanisms.csv")
    lin = _linear_row(key, rows)
    p = _probe(mech)
    base = float(lin.data["value"])
    host = "Grace (GB200)" if key in GRACE_HOSTS else "Grace (GH200)" if key == "gh200" \
        else "x86 (Xeon 8480C, DGX H100)"
    x86 = "" if key in ("gb200", "h100-sxm", "gh200") else \
        "; GB300's Grace host assumed as fast as GB200's" if key in GRACE_HOSTS else \
        "; every x86 server host assumed as fast as the Xeon 8480C"
    fwd_src = (f"{base} us CPU time per torch.nn.Linear forward in eager PyTorch on a {host} "
               f"host ({cite([lin])}, TransformerEngine #2053), taken as the host time of an "
               f"average op-graph op forward (assumed for the non-GEMM ops){x86}")
    ratio = _median(p["backward"]) / _median(p["forward"])
    bwd_src = (f"forward {base} us x {ratio:.3f}, the backward/forward ratio of host time per "
               f"op-graph op measured by the host probe on a CPU build (medians of "
               f"{cite(p['forward'] + p['backward'])}); transferred, assumed to hold on "
               f"this host{x86}")
    return HostModel(op_fwd_us=Coefficient(base, "us", fwd_src),
                     op_bwd_us=Coefficient(round(base * ratio, 2), "us", bwd_src),
                     synchronous=False)
