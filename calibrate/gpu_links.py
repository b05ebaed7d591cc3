"""Link and overlap coefficients of a GPU calibration, and what it transfers from the
shipped reference profile because one node cannot measure it.

Scale-up link (NVLink / xGMI / PCIe, the node's ``scale_up`` kind): fitted to the NCCL
all-reduce sweep over every GPU of the node with the simulator's own collective model
(``ring_steps_and_traffic`` + ``alpha_beta_time_s``, ``B`` = the node's datasheet
per-direction bandwidth, hop latency = its datasheet latency, as the simulator evaluates
it), in the two regimes ``calibrate.reference_links`` uses: the latency regime on messages
<= 1 MiB, the bandwidth regime on 16 MiB..1 GiB. Where the node reduces in the switch
(NVLS), the ring sweep (``NCCL_NVLS_ENABLE=0``) gives the coefficients and the ratio of the
default to the ring bus bandwidth at the largest size the ``in_switch_speedup``; without a
ring sweep the default sweep is fitted with the reference profile's speedup (said so).

NIC kinds (InfiniBand, RoCE, Ethernet, Omni-Path), PCIe and host links cannot be measured
inside one node: they are transferred from ``hardware_db/data/profiles/<gpu>.json`` (the
h100-sxm one for a GPU without a reference) and every coefficient's source says so. The
same holds for the scale-up link and the overlap slowdown on a single-GPU host.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any, Mapping, Sequence

from simulator.hardware.profile import Coefficient, LinkCoefficients, Profile
from simulator.hardware.specs import NodeSpec
from simulator.network.collectives import Collective

from .fit import (
    FitResult,
    InterferencePoint,
    LinkPoint,
    fit_interference,
    fit_link,
    link_coefficients,
    link_model,
)

SMALL_MAX_BYTES = 1 << 20
LARGE_MIN_BYTES, LARGE_MAX_BYTES = 16 << 20, 1 << 30
AR = Collective.ALL_REDUCE


def restamp(obj: Any, prefix: str) -> Any:
    """A copy of a Coefficient (or a dataclass / mapping of them) whose sources start with
    ``prefix`` (e.g. "transferred from ...: ")."""
    if isinstance(obj, Coefficient):
        return replace(obj, source=prefix + obj.source)
    if isinstance(obj, Mapping):
        return {k: restamp(v, prefix) for k, v in obj.items()}
    if is_dataclass(obj) and not isinstance(obj, type):
        return replace(obj, **{f.name: restamp(getattr(obj, f.name), prefix)
                               for f in fields(obj) if getattr(obj, f.name) is not None
                               and not isinstance(getattr(obj, f.name), (str, int, float))})
    return obj


def _points(rows: Sequence[Mapping[str, Any]]) -> list[LinkPoint]:
    return [LinkPoint(float(r["size_bytes"]), float(r["median_s"]), Collective(r["op"]),
                      int(r["n_ranks"])) for r in rows]


def _busbw_at_largest(rows: Sequence[Mapping[str, Any]], size: float) -> float:
    return max(float(r["busbw_gbytes_per_s"]) for r in rows if float(r["size_bytes"]) == size)


def in_switch_speedup(default: Sequence[Mapping[str, Any]], ring: Sequence[Mapping[str, Any]],
                      src: str) -> Coefficient | None:
    """Default (NVLS) over ring all-reduce bus bandwidth at the largest size both have."""
    common = {float(r["size_bytes"]) for r in default} & {float(r["size_bytes"]) for r in ring}
    if not common:
        return None
    size = max(common)
    a, b = _busbw_at_largest(default, size), _busbw_at_largest(ring, size)
    return Coefficient(a / b, "ratio", f"NCCL default (NVLS) / ring (NCCL_NVLS_ENABLE=0, "
                       f"NCCL_ALGO=Ring) all-reduce bus bandwidth at {size / 2 ** 20:.0f} MiB: "
                       f"{a:.1f} / {b:.1f} GB/s; {src}")


def fit_sweep(rows: Sequence[Mapping[str, Any]], bw: float, hop_us: float, scale: float,
              speedup: Coefficient | None, src: str) -> tuple[LinkCoefficients, dict]:
    """Two regimes of one all-reduce sweep: first the bandwidth regime (``base_us``,
    ``bw_eff``) on 16 MiB..1 GiB with the small-message regime switched off, then the
    latency regime (``alpha_us``, ``small_bw_eff``) on <= 1 MiB with the bandwidth regime
    held: the simulator takes the faster of the two, so the small regime only has to explain
    what the large one does not (a latency-regime fit first could claim a small-message
    bandwidth above the large-message one and take over every size)."""
    pts = _points(rows)
    small = [p for p in pts if p.size_bytes <= SMALL_MAX_BYTES]
    large = [p for p in pts if LARGE_MIN_BYTES <= p.size_bytes <= LARGE_MAX_BYTES]
    top = max(rows, key=lambda r: float(r["size_bytes"]))
    off = {"alpha_us": 1e5, "small_bw_eff": 1e-4}
    fit_l = fit_link(large if len(large) >= 3 else pts, bw, hop_us, scale, fixed=off)
    held = {"base_us": fit_l.values["base_us"], "bw_eff": fit_l.values["bw_eff"]}
    fit_s = fit_link(small, bw, hop_us, scale, fixed=held) if len(small) >= 3 else None
    base = (f"ring_steps_and_traffic + alpha_beta_time_s (B = {bw:g} GB/s/dir, hop latency "
            f"{hop_us:g} us" + (f", bw_scale = in_switch_speedup {scale:.3f}" if scale != 1.0
                                else "") + f") fitted to {src}")
    s_large = (f"bandwidth regime of {base}, messages 16 MiB-1 GiB (n={len(large)}); largest "
               f"message {float(top['size_bytes']) / 2 ** 20:.0f} MiB at busbw "
               f"{float(top['busbw_gbytes_per_s']):.1f} GB/s = "
               f"{float(top['busbw_gbytes_per_s']) / (bw * scale):.3f} of B")
    s_small = (f"latency regime of {base}, messages <= 1 MiB (n={len(small)}), bandwidth "
               "regime held")
    coefs = link_coefficients(fit_l, s_large, speedup)
    fits = {"large": fit_l}
    if fit_s is not None:
        coefs = replace(coefs, alpha_us=fit_s.coefficient("alpha_us", "us", s_small),
                        small_bw_eff=fit_s.coefficient("small_bw_eff", "fraction", s_small))
        fits["small"] = fit_s
    else:
        coefs = replace(coefs, alpha_us=Coefficient(1e5, "us", "no message <= 1 MiB measured: "
                                                    "latency regime off"),
                        small_bw_eff=Coefficient(1e-4, "fraction", "no message <= 1 MiB "
                                                 "measured: latency regime off"))
    return coefs, fits


def scale_up_link(rows: Sequence[Mapping[str, Any]], node: NodeSpec, ref: Profile,
                  src: str) -> tuple[LinkCoefficients, dict[str, FitResult]] | None:
    """Coefficients of the node's scale-up link from the all-reduce rows, or None."""
    ar = [r for r in rows if r["op"] == "all_reduce"]
    default = [r for r in ar if r.get("algo", "default") == "default"]
    ring = [r for r in ar if r.get("algo") == "ring"]
    bw, hop = node.scale_up.bandwidth_gbytes_per_s, node.scale_up.latency_us
    kind = node.scale_up.kind.value
    if node.in_switch_reduction and ring and default:
        speed = in_switch_speedup(default, ring, src)
        coefs, fits = fit_sweep(ring, bw, hop, 1.0, speed, f"{src}, ring sweep")
        return coefs, {f"{kind}_ring_{k}": f for k, f in fits.items()}
    if not default:
        return None
    speed, scale = None, 1.0
    if node.in_switch_reduction:
        old = ref.links.get(kind)
        if old is not None and old.in_switch_speedup is not None:
            speed = restamp(old.in_switch_speedup, f"transferred from the reference profile "
                            f"{ref.name!r} (no ring sweep measured): ")
            scale = speed.value
    coefs, fits = fit_sweep(default, bw, hop, scale, speed, f"{src}, NCCL default sweep")
    return coefs, {f"{kind}_{k}": f for k, f in fits.items()}


def other_ops_mape_pct(rows: Sequence[Mapping[str, Any]], coefs: LinkCoefficients,
                       node: NodeSpec) -> dict[str, float]:
    """MAPE (%) of the fitted ring model on the measured collectives other than all-reduce."""
    model = link_model(node.scale_up.bandwidth_gbytes_per_s, node.scale_up.latency_us, 1.0)
    vals = {n: getattr(coefs, n).value for n in ("alpha_us", "small_bw_eff", "base_us", "bw_eff")}
    out: dict[str, list[float]] = {}
    for p, r in zip(_points(rows), rows):
        if r["op"] != "all_reduce":
            out.setdefault(r["op"], []).append(abs(model(vals, p) - p.time_s) / p.time_s * 100)
    return {op: sum(v) / len(v) for op, v in sorted(out.items())}


def overlap(rows: Sequence[Mapping[str, Any]], src: str) -> tuple[Coefficient, FitResult]:
    """Overlap slowdown from the GEMM-loop interference rows (``mode`` "span")."""
    pts = [InterferencePoint(r["alone_s"], r["median_s"], r["comm_alone_s"]) for r in rows]
    f = fit_interference(pts)
    return f.coefficient("slowdown", "multiplier", f"{src}: a bf16 torch.mm loop lasting ~2x "
                         "an NCCL all-reduce, timed (CUDA events) alone and with the all-reduce "
                         "in flight (async, as DDP overlaps buckets); slowdown - 1 = extra "
                         "compute time / overlapped time"), f


def transferred_links(ref: Profile, keep: Mapping[str, LinkCoefficients], why: str
                      ) -> dict[str, LinkCoefficients]:
    """Every link kind of the reference profile not in ``keep``, sources restamped."""
    out = dict(keep)
    for kind, lc in sorted(ref.links.items()):
        if kind not in out:
            out[kind] = restamp(lc, f"transferred from the reference profile {ref.name!r} "
                                f"({why}): ")
    return out
