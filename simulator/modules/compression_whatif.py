"""DDP gradient-compression what-if: each option (none, fp16, bf16, PowerSGD ranks) played
on the DDP step simulation, with its speed-up and the link bandwidth below which it pays
off. Step formulas and bucket messages live in ``compression``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from .compression import DEFAULT_OPTIONS, CompressionSpec


@dataclass(frozen=True)
class CompressionRow:
    option: str
    message_bytes: float             # all-reduce buffer bytes per step (sum of messages)
    wire_bytes_per_rank: float       # bytes each rank sends (ring)
    messages: int
    comm_s: float                    # all-reduce time, summed (overlapped or not)
    extra_compute_s: float           # compression compute beyond the default hook
    exposed_comm_s: float
    step_s: float
    speedup: float                   # vs no compression
    pays_off: bool
    pays_off_below_gbytes_per_s: float | None = None   # DP link bandwidth break-even


@dataclass(frozen=True)
class CompressionReport:
    model: str
    dp: int
    bandwidth_note: str
    rows: tuple[CompressionRow, ...]
    verdicts: tuple[str, ...]

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return {"model": self.model, "dp": self.dp, "bandwidth": self.bandwidth_note,
                "rows": [asdict(r) for r in self.rows], "verdicts": list(self.verdicts)}


def compression_whatif(graph, times, comm, cfg, gpu: GPUSpec, prof: Profile,
                       options: Sequence[CompressionSpec] = DEFAULT_OPTIONS,
                       optimizer: str = "adam", min_gain: float = 0.02,
                       break_even: bool = True) -> CompressionReport:
    """Step time of ``graph`` under DDP (``cfg``, group ``comm``) with each hook in
    ``options``, against no compression; says which pay off, why, and (``break_even``)
    below which DP link bandwidth each would."""
    from dataclasses import replace

    from .ddp import simulate_ddp
    run = lambda spec: simulate_ddp(graph, times, comm, replace(cfg, compression=spec), gpu,
                                    prof, optimizer=optimizer)
    base = run(CompressionSpec("none"))
    specs = [CompressionSpec("none")] + [s for s in options if s.hook != "none"]
    rows = []
    for spec in specs:
        res = base if spec.hook == "none" else run(spec)
        msgs = [m for b in res.buckets for m in b.messages]
        speed = base.step_time_s / res.step_time_s if res.step_time_s > 0 else 1.0
        rows.append(CompressionRow(spec.label, float(sum(msgs)), sum(comm.wire_bytes(m) for m in msgs),
                                   len(msgs), res.comm_s,
                                   max(0.0, res.hook_compute_s - base.hook_compute_s),
                                   res.exposed_comm_s, res.step_time_s, speed,
                                   spec.hook != "none" and speed >= 1 + min_gain))
    if break_even:
        rows = [rows[0]] + [replace(r, pays_off_below_gbytes_per_s=_break_even(
            graph, times, comm, cfg, gpu, prof, spec, optimizer, min_gain))
            for r, spec in zip(rows[1:], specs[1:])]
    verdicts = tuple(_verdict(r, rows[0], base) for r in rows)
    return CompressionReport(graph.name, comm.size, comm.describe(), tuple(rows), verdicts)


def _break_even(graph, times, comm, cfg, gpu, prof, spec, optimizer, min_gain) -> float:
    """DP link bandwidth (GB/s, bottleneck link) below which ``spec`` gains ``min_gain``;
    ``inf`` if it pays off across 1/1024x..1024x today's bandwidth, 0 if nowhere."""
    from dataclasses import replace

    from .ddp import simulate_ddp

    def gain(log2f: float) -> float:
        c = comm.scaled(2.0 ** log2f)
        step = lambda sp: simulate_ddp(graph, times, c, replace(cfg, compression=sp), gpu,
                                       prof, optimizer=optimizer).step_time_s
        return step(CompressionSpec("none")) / step(spec) - (1 + min_gain)
    lo, hi = -10.0, 10.0
    if gain(hi) >= 0:
        return float("inf")
    if gain(lo) < 0:
        return 0.0
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(mid) >= 0 else (lo, mid)
    return comm.bottleneck_gbytes_per_s() * 2.0 ** lo


def _verdict(row: CompressionRow, none: CompressionRow, base) -> str:
    if row.option == "none":
        frac = base.exposed_comm_s / base.step_time_s if base.step_time_s else 0.0
        return (f"no compression: {100 * frac:.0f} % of the step is exposed all-reduce "
                f"({base.exposed_comm_s * 1e3:.2f} ms of {base.step_time_s * 1e3:.2f} ms)")
    saved = none.exposed_comm_s - row.exposed_comm_s
    be = row.pays_off_below_gbytes_per_s
    where = ("" if be is None else " at any bandwidth tried" if be == float("inf") else
             " at any bandwidth tried" if be == 0 else f"; pays off below {be:.3g} GB/s")
    if row.pays_off:
        return (f"{row.option}: pays off, {row.speedup:.2f}x ({saved * 1e3:.2f} ms less exposed "
                f"communication, {row.extra_compute_s * 1e3:.2f} ms extra compute)"
                + ("" if be == float("inf") else where))
    why = ("communication is already hidden behind backward"
           if none.exposed_comm_s < 0.05 * none.step_s else
           "the extra compute and message latency eat the bandwidth saved")
    if be == 0:
        where = " (not at any bandwidth tried)"
    return f"{row.option}: does not pay off here ({row.speedup:.2f}x): {why}{where}"
