"""Collective coefficients of the reference profiles, from collectives.csv (with sources)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

from simulator.hardware.profile import Coefficient, LinkCoefficients
from simulator.network.collectives import Collective

from .csvrows import Row, cite, select
from .fit import FitResult, LinkPoint, busbw_to_time_s, fit_link, link_coefficients
from .reference_data import NET_HOP_US, NVLINK_HOP_SRC, NVLINK_HOP_US

AR = Collective.ALL_REDUCE


@dataclass(frozen=True)
class LinkFit:
    """Coefficients for one link kind plus the fit behind them (None when not fitted)."""

    coefs: LinkCoefficients
    fit: FitResult | None = None


def _points(rows: Sequence[Row]) -> list[LinkPoint]:
    """All-reduce points; time from ``time_us`` or, if absent, from ``busbw`` (nccl-tests)."""
    pts = []
    for r in rows:
        n, size = int(r.data["gpus"]), float(r.data["message_bytes"])
        if r.data["time_us"]:
            t = float(r.data["time_us"]) * 1e-6
        else:
            t = busbw_to_time_s(AR, n, size, float(r.data["busbw_GBps"]))
        pts.append(LinkPoint(size, t, AR, n))
    return pts


def _ratio(num: Row, den: Row, unit: str, what: str) -> Coefficient:
    a, b = float(num.data["busbw_GBps"]), float(den.data["busbw_GBps"])
    return Coefficient(a / b, unit, f"{what}: {a} / {b} GB/s busbw "
                       f"({num.file} lines {num.line}, {den.line})")


def _plateau_eff(row: Row, bw: float, what: str) -> Coefficient:
    """Large-message bw_eff = busbw / B (busbw equals the per-rank wire rate of a ring)."""
    b = float(row.data["busbw_GBps"])
    return Coefficient(b / bw, "fraction", f"{what}: ring busbw {b} GB/s / {bw} GB/s per "
                       f"direction ({row.file} line {row.line}); message large enough that "
                       f"base latency is negligible")


SMALL_MAX_BYTES = 1 << 20      # the latency (LL) regime is fitted on messages <= 1 MiB
LARGE_MIN_BYTES = 16 << 20     # the bandwidth regime on 16 MiB .. 1 GiB: the TP, DP-bucket
LARGE_MAX_BYTES = 1 << 30      # and pipeline messages of training


def _fit_sweep(rows: Sequence[Row], bw: float, bw_eff: Coefficient, scale: float,
               what: str, speedup: Coefficient | None) -> LinkFit:
    """Two-stage fit of one sweep: the latency regime on small messages, then the bandwidth
    regime (``base_us``, ``bw_eff`` both free) on the sizes training actually sends.

    A single joint fit with ``bw_eff`` pinned to the multi-GB plateau underestimated the
    16 MiB - 256 MiB band by 14-23% on the A100 sweep (NCCL's bus bandwidth keeps ramping up
    to GB sizes); fitting that band directly keeps it within ~10%. ``bw_eff`` is then the
    effective large-message efficiency of that band, and the plateau row is kept as a check.
    """
    pts = _points(rows)
    small = [p for p in pts if p.size_bytes <= SMALL_MAX_BYTES]
    large = [p for p in pts if LARGE_MIN_BYTES <= p.size_bytes <= LARGE_MAX_BYTES]
    fit_s = fit_link(small, bw, NVLINK_HOP_US, scale,
                     fixed={"base_us": 1e6, "bw_eff": bw_eff.value}) if len(small) >= 3 else None
    fixed = {"alpha_us": fit_s.values["alpha_us"], "small_bw_eff": fit_s.values["small_bw_eff"]} \
        if fit_s else {}
    fit = fit_link(large if len(large) >= 3 else pts, bw, NVLINK_HOP_US, scale, fixed=fixed)
    base = (f"ring_steps_and_traffic + alpha_beta_time_s (B = {bw} GB/s/dir, hop latency "
            f"{NVLINK_HOP_US} us per step from {NVLINK_HOP_SRC}"
            + (f", bw_scale = in_switch_speedup {scale:.3f}" if scale != 1.0 else "")
            + f") fitted to {cite(rows)} ({what})")
    src_large = (f"bandwidth regime of {base}, messages {LARGE_MIN_BYTES >> 20} MiB-1 GiB "
                 f"(n={len(large)}); multi-GB plateau check: {bw_eff.source} = {bw_eff.value:.3f}")
    src_small = f"latency regime of {base}, messages <= 1 MiB (n={len(small)})"
    coefs = link_coefficients(fit, src_large, speedup,
                              {"alpha_us": src_small, "small_bw_eff": src_small})
    if fit_s:
        coefs = LinkCoefficients(fit_s.coefficient("alpha_us", "us", src_small),
                                 fit_s.coefficient("small_bw_eff", "fraction", src_small),
                                 coefs.base_us, coefs.bw_eff, speedup)
    return LinkFit(coefs, fit)


def nvlink_a100(coll: Sequence[Row]) -> LinkFit:
    """A100 8-GPU nccl-tests sweep with times, 32 KB..16 GB; B = 300 GB/s (no NVLS)."""
    rows = select(coll, lambda d: d["system"].startswith("8x A100 SXM") and d["time_us"] != "")
    big = max(rows, key=lambda r: float(r.data["message_bytes"]))
    eff = _plateau_eff(big, 300.0, "A100 NVLink3 16 GiB all-reduce plateau")
    return _fit_sweep(rows, 300.0, eff, 1.0, "8x A100 nccl-tests all_reduce_perf sweep, "
                      "time_us column", None)


def nvlink_h200(coll: Sequence[Row]) -> LinkFit:
    """H200 8-GPU all_reduce_bench sweep (busbw only, NCCL default = NVLS from 2 MiB)."""
    ring = select(coll, lambda d: d["system"] == "8x H200 SXM single node" and
                  d["algorithm"] == "Ring (NCCL_NVLS_ENABLE=0)")[0]
    nvls = select(coll, lambda d: d["system"] == "8x H200 SXM single node" and
                  d["algorithm"] == "NVLS")[0]
    speed = _ratio(nvls, ring, "ratio", "NVLS / ring all-reduce plateau, 8x H200 16 GiB")
    eff = _plateau_eff(ring, 450.0, "8x H200 NVLink4, NCCL_NVLS_ENABLE=0, 16 GiB")
    rows = select(coll, lambda d: "all_reduce_bench.py sweep on an 8x H200" in d["source_locator"])
    return _fit_sweep(rows, 450.0, eff, speed.value,
                      "8x H200 all_reduce_bench.py sweep, busbw -> time by 2(n-1)/n; NCCL "
                      "default used NVLS from 2 MiB, so the fit applies in_switch_speedup as "
                      "the simulator does for NVLS-capable all-reduce; small_bw_eff is therefore "
                      "relative to the scaled bandwidth", speed)


def nvlink_b200(coll: Sequence[Row], h200: LinkFit) -> LinkFit:
    """B200 8-GPU sweep (1x P6-B200 node, NCCL default), B = 900 GB/s.

    The sweep ramps slowly (1-4 GiB reach 723-741 GB/s busbw, 16 GiB 846), which a free
    ``base_us`` turns into ~1 ms; base_us is therefore transferred from the H200 fit (same
    benchmark script and NCCL 2.27.7) and alpha/small_bw_eff are fitted.
    """
    def sharp(alg: str):
        return lambda d: ("'SHARP'" in d["source_locator"] and "B200" in d["source_locator"]
                          and d["gpus"] == "8" and d["algorithm"].startswith(alg))
    nvls = select(coll, sharp("NVLS"))[0]
    ring = select(coll, sharp("Ring (NVLS disabled)"))[0]
    speed = _ratio(nvls, ring, "ratio", "NVLS / ring all-reduce, 8x B200 8 GiB")
    eff = _plateau_eff(ring, 900.0, "8x B200 NVLink5, NCCL_NVLS_ENABLE=0, 8 GiB")
    rows = select(coll, lambda d: "1x P6-B200 node" in d["source_locator"])
    base = h200.coefs.base_us
    fit = fit_link(_points(rows), 900.0, NVLINK_HOP_US, speed.value,
                   fixed={"bw_eff": eff.value, "base_us": base.value})
    src = (f"fit of ring_steps_and_traffic + alpha_beta_time_s (B = 900 GB/s/dir, hop latency "
           f"{NVLINK_HOP_US} us, bw_scale = in_switch_speedup {speed.value:.3f}; bw_eff and "
           f"base_us fixed) to {cite(rows)} (1x P6-B200 all_reduce_bench.py sweep, busbw -> "
           "time; NCCL default used NVLS at large sizes)")
    coefs = link_coefficients(fit, src, speed, {
        "bw_eff": eff.source,
        "base_us": f"transferred from the H200 sweep fit (slow B200 ramp, see docstring): "
                   f"{base.source}"})
    coefs = LinkCoefficients(coefs.alpha_us, coefs.small_bw_eff,
                             Coefficient(base.value, "us", coefs.base_us.source, base.stderr),
                             coefs.bw_eff, speed)
    return LinkFit(coefs, fit)


def nvlink_gb200(coll: Sequence[Row], b200: LinkFit) -> LinkFit:
    """GB200 NVL72: plateau rows (32 GPUs in the NVL domain); latency terms from B200."""
    pick = lambda alg: select(coll, lambda d: d["system"].startswith("GB200 NVL72, NVLink5")
                              and d["algorithm"] == alg)[0]
    ring, nvls = pick(""), select(coll, lambda d: "GB200 NVL72, NVLink5 SHARP" in d["system"])[0]
    speed = _ratio(nvls, ring, "ratio", "NVLS / ring all-reduce, GB200 NVL72 32 GPUs (GTC 2025)")
    eff = _plateau_eff(ring, 900.0, "GB200 NVL72 ring all-reduce plateau, 32 GPUs")
    c = b200.coefs
    why = "GB200 (same NVLink5 generation; no GB200 size sweep)"
    return LinkFit(LinkCoefficients(alpha_us=_xfer(c.alpha_us, why),
                                    small_bw_eff=_xfer(c.small_bw_eff, why),
                                    base_us=_xfer(c.base_us, why), bw_eff=eff,
                                    in_switch_speedup=speed))


def nvlink_v100(coll: Sequence[Row], a100: LinkFit) -> LinkFit:
    """V100 NVLink2: plateau bar (GTC 2024) against 150 GB/s; latency terms from A100."""
    row = select(coll, lambda d: d["system"].startswith("V100 SXM2, NVLink2"))[0]
    eff = _plateau_eff(row, 150.0, "V100 NVLink2 single-node all-reduce bar (GTC 2024)")
    c, why = a100.coefs, "V100 (no V100 size sweep)"
    return LinkFit(LinkCoefficients(alpha_us=_xfer(c.alpha_us, why),
                                    small_bw_eff=_xfer(c.small_bw_eff, why),
                                    base_us=_xfer(c.base_us, why), bw_eff=eff))


def _xfer(c: Coefficient, why: str) -> Coefficient:
    return Coefficient(c.value, c.unit, f"transferred to {why}: {c.source}", c.stderr, None)


def _const(value: float, unit: str, source: str) -> Coefficient:
    return Coefficient(value, unit, source)


# ---- scale-out and host links -------------------------------------------------------------
NCCL_SRC = "links.csv lines 61-70 (NVIDIA/nccl src/graph/tuning.cc constants, nodes.md §3)"


def _rdma_eff(coll: Sequence[Row]) -> Coefficient:
    """busbw / NIC line rate of the GTC 2024 '200/400 Gb/s RDMA (IB/RoCE), 1 NIC' bars."""
    rows = select(coll, lambda d: "RDMA (IB/RoCE), 1 NIC" in d["system"])
    ratios = [float(r.data["busbw_GBps"]) / (int(r.data["system"].split()[0]) / 8) for r in rows]
    txt = ", ".join(f"{r.data['busbw_GBps']} GB/s of {int(r.data['system'].split()[0]) / 8:g}"
                    for r in rows)
    return Coefficient(sum(ratios) / len(ratios), "fraction",
                       f"mean busbw / NIC line rate of {cite(rows)} (NVIDIA GTC 2024 S62129 "
                       f"slide 12, 1-NIC RDMA all-reduce bars: {txt})")


def network(coll: Sequence[Row], bw_eff: Coefficient, why: str = "") -> LinkCoefficients:
    """RDMA network coefficients: measured bandwidth efficiency; latency terms mapped from
    NCCL's documented cost-model constants (the simulator already adds the 2.7 us network
    per-hop latency of hardware_db's IB/RoCE links to every ring step)."""
    pre = f"{why}: " if why else ""
    alpha = Coefficient(1.0, "us", pre + f"NCCL network post overhead per step on x86 hosts, "
                        f"1.0 us ({NCCL_SRC}); the LL per-hop {NET_HOP_US} us is the link's "
                        "hop latency, added by the simulator")
    small = Coefficient(round(0.5 * bw_eff.value, 4), "fraction",
                        pre + "assumed: NCCL's LL protocol carries 4 data bytes per 8-byte line, "
                        "so small messages get at most half the large-message efficiency "
                        f"(0.5 x bw_eff {bw_eff.value:.3f})")
    base = Coefficient(8.4 + 2 * (14.0 - NET_HOP_US), "us",
                       pre + f"NCCL Simple ring model: base 8.4 us + 14.0 us per network hop "
                       f"({NCCL_SRC}), minus the {NET_HOP_US} us/hop the simulator adds, for "
                       "the 2 network steps of a 2-node ring (underestimates larger rings)")
    return LinkCoefficients(alpha_us=alpha, small_bw_eff=small, base_us=base,
                            bw_eff=Coefficient(bw_eff.value, bw_eff.unit, pre + bw_eff.source))


def ib_sharp_speedup(coll: Sequence[Row]) -> Coefficient:
    """SHARP (NVLS + IB SHARP) / ring all-reduce over 4x DGX H100 (GTC 2025 bars)."""
    rows = select(coll, lambda d: d["system"].startswith("DGX H100 x4"))
    ring = next(r for r in rows if r.data["algorithm"] == "")
    sharp = next(r for r in rows if r.data["algorithm"] == "NVLS")
    return _ratio(sharp, ring, "ratio", "SHARP / ring all-reduce, 4x DGX H100 (32 GPUs)")


def scale_out_links(coll: Sequence[Row], sharp: Coefficient | None) -> dict[str, LinkCoefficients]:
    """infiniband, roce, omnipath, efa, ethernet."""
    rdma = _rdma_eff(coll)
    ib = network(coll, rdma)
    if sharp is not None:
        ib = LinkCoefficients(ib.alpha_us, ib.small_bw_eff, ib.base_us, ib.bw_eff, sharp)
    eth_row = select(coll, lambda d: d["system"].startswith("100GbE TCP/IP"))[0]
    eth_eff = Coefficient(float(eth_row.data["busbw_GBps"]) / 12.5, "fraction",
                          f"{eth_row.data['busbw_GBps']} GB/s busbw / 12.5 GB/s (100 Gb/s) "
                          f"({eth_row.file} line {eth_row.line}, GTC 2024 '100GbE TCP/IP sockets')")
    return {
        "infiniband": ib,
        "roce": network(coll, rdma, "RoCE (the measured bars are labelled 'IB/RoCE')"),
        "omnipath": network(coll, rdma, "transferred from InfiniBand to Omni-Path (no Omni-Path "
                            "row in shared data)"),
        "efa": network(coll, rdma, "transferred from InfiniBand RDMA to AWS EFA (SRD; the 4x "
                       "P6-B200 rows, collectives.csv lines 86-106, are held out to check it: their "
                       "16 GiB plateau is 0.955 of the NICs' line rate); EFA runs NCCL's Simple "
                       "protocol only, so the LL terms are unused"),
        "ethernet": network(coll, eth_eff, "Ethernet/TCP: latency terms assumed equal to RDMA "
                            "(TCP sockets are slower; no small-message row)"),
    }


def pcie(coll: Sequence[Row], nvlink_ref: LinkFit) -> LinkCoefficients:
    """PCIe Gen4/Gen5 multi-GPU all-reduce bars vs 31.5 / 63 GB/s per direction."""
    rows = select(coll, lambda d: d["system"].startswith("PCIe Gen4 (multi")
                  or d["system"].startswith("PCIe Gen5 (multi"))
    ratios = [float(r.data["busbw_GBps"]) / (31.5 if "Gen4" in r.data["system"] else 63.0)
              for r in rows]
    eff = Coefficient(sum(ratios) / len(ratios), "fraction",
                      f"mean busbw / per-direction rate of {cite(rows)} (GTC 2024 slide 12: "
                      "Gen4 24 of 31.5, Gen5 48 of 63 GB/s; links.csv lines 21-22)")
    c, why = nvlink_ref.coefs, "PCIe (no PCIe size sweep; simulator adds 1.0 us/hop)"
    return LinkCoefficients(_xfer(c.alpha_us, why), _xfer(c.small_bw_eff, why),
                            _xfer(c.base_us, why), eff)


def host_from(pcie_coefs: LinkCoefficients) -> LinkCoefficients:
    """GPU reference profiles: processes on one host assumed to behave like PCIe."""
    why = "host (assumed like PCIe; GPU profiles rarely route collectives over host memory)"
    p = pcie_coefs
    return LinkCoefficients(_xfer(p.alpha_us, why), _xfer(p.small_bw_eff, why),
                            _xfer(p.base_us, why), _xfer(p.bw_eff, why))


def xgmi_from(nvlink_ref: LinkFit, gpu: str = "MI300X") -> LinkCoefficients:
    c, why = nvlink_ref.coefs, f"{gpu} xGMI (assumed: no RCCL microbenchmark row in shared data)"
    return LinkCoefficients(_xfer(c.alpha_us, why), _xfer(c.small_bw_eff, why),
                            _xfer(c.base_us, why), _xfer(c.bw_eff, why))


def transferred_link(fit: LinkFit, why: str) -> LinkFit:
    """A sibling GPU's fitted link coefficients carried over unchanged, each saying so."""
    c = fit.coefs
    return LinkFit(LinkCoefficients(**{f.name: (_xfer(getattr(c, f.name), why)
                                                if getattr(c, f.name) is not None else None)
                                       for f in fields(c)}))
