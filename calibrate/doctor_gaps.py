"""The doctor's ranked gaps: each row where the measured step and the prediction part, with a
one-line explanation and the what-if that would close it.

Two kinds of gap are ranked together by the seconds they cost: *run* gaps (time the run
spends that a better configuration would not: exposed communication, host-bound time,
operators outside the model) and *model* gaps (a family the profile prices faster or slower
than this run measured: the what-if is to refit the profile from this trace). Exposed
communication and host time count whole (the time at stake: an ideal step exposes neither),
whether or not the prediction for the same plan has them too; the what-if for exposed
communication depends on how much of it could hide behind backward compute.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.hardware.profile import Profile
from simulator.parallel.plan import Plan

from .trace_fit import HOST_FOLDED_KEY
from .trace_import import KinetoTrace

Diagnosis = Any          # calibrate.doctor.Diagnosis (which imports this module)

MIN_GAP_FRACTION = 0.01
UNPRICED_WHATIF = {
    "ddp bucket copy": "DistributedDataParallel(gradient_as_bucket_view=True): gradients live "
                       "in the buckets, nothing is copied in and out",
    "cat": "none in the run (the backward of a split, e.g. the fused QKV projection); the op "
           "graph does not price it yet",
}


@dataclass(frozen=True)
class Gap:
    what: str
    gap_s: float
    measured_s: float
    predicted_s: float
    explanation: str
    whatif: str


def host_us_per_op(prof: Profile, key: str = HOST_FOLDED_KEY) -> float:
    """Host time per launch a trace-fitted profile folded into its launch costs (0: none)."""
    try:
        return float(prof.fingerprint.get(key, "0") or 0.0)
    except ValueError:
        return 0.0
SMALL_BUCKET_BYTES = 4e6          # mean collective below this, several per step: latency-bound
MANY_COLLECTIVES = 8
BUCKETS_TO_OVERLAP = 4            # what-if: this many buckets, all but the last hide


def _mb(x: float) -> str:
    return f"{x / 1e6:.1f} MB"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def comm_gap(d: Diagnosis, trace: KinetoTrace, plan: Plan) -> Gap | None:
    c = d.comm
    exposed = c["measured_exposed_s"]
    if exposed <= 0:
        return None
    recs = [r for r in trace.comms if r.where == "device" and r.size_bytes > 0]
    n = c.get("collectives_per_step", 0.0) or 1.0
    size = sum(r.size_bytes for r in recs) / max(1, len(recs)) if recs else 0.0
    possible = c["measured_overlap_possible_s"]
    achieved = c["measured_overlapped_s"]
    what = (f"gradient {'all-reduce' if any(r.collective == 'all_reduce' for r in recs) else 'communication'}"
            f" ({int(n)} per step{', ' + _mb(size) + ' each' if size else ''})")
    hideable = max(0.0, min(exposed, possible - achieved))
    expl = (f"{what} exposed {_ms(exposed)}: overlap achieved {_ms(achieved)} of "
            f"{_ms(possible)} possible behind backward compute ({_ms(hideable)} more could hide)")
    if n >= MANY_COLLECTIVES and 0 < size < SMALL_BUCKET_BYTES:
        whatif = (f"larger DDP buckets (bucket_cap_mb 25 instead of ~{size / 2 ** 20:.0f}): "
                  "fewer collectives, less fixed latency per step")
    elif hideable >= 0.5 * exposed and n >= BUCKETS_TO_OVERLAP:
        whatif = (f"{int(n)} buckets, yet they reduce after backward: look for a slower rank "
                  "(collectives wait for it; compare the ranks' traces) or gradients that "
                  "become ready only at the end of backward (DDP static_graph=True keeps the "
                  "ready order)")
    elif hideable >= 0.5 * exposed:
        cap = max(1, round(size * n / BUCKETS_TO_OVERLAP / 2 ** 20))
        whatif = (f"overlap the reduction with backward: smaller DDP buckets (bucket_cap_mb="
                  f"{cap}, ~{BUCKETS_TO_OVERLAP} buckets) so reduction starts while backward "
                  "runs, or --overlap-grad-reduce in Megatron")
    else:
        whatif = ("more compute per step to hide it behind (larger micro-batch or gradient "
                  "accumulation), a faster link, or gradient compression "
                  "(complexity compression-whatif)")
    return Gap("comm exposed", exposed, exposed, c["predicted_exposed_s"], expl, whatif)


def host_gap(d: Diagnosis, trace: KinetoTrace, prof: Profile) -> Gap | None:
    row = next(r for r in d.rows if r.what == "host")
    if row.measured_s <= 0:
        return None
    if trace.has_gpu:
        expl = (f"GPU idle {_ms(row.measured_s)} while the host dispatches (host-bound: no "
                "kernel queued)")
        whatif = "CUDA graphs or torch.compile (fewer, fused launches), or a larger micro-batch"
    else:
        expl = (f"host time {_ms(row.measured_s)} outside operators (Python, autograd, "
                f"dispatch, views), predicted {_ms(row.predicted_s)}")
        whatif = ("refit with `complexity calibrate --from-trace` (the profile then carries "
                  "host time per op)" if host_us_per_op(prof) == 0 else
                  "fewer, larger operators (fused kernels, torch.compile) or a larger micro-batch")
    return Gap("host", row.measured_s, row.measured_s, row.predicted_s, expl, whatif)


def family_gaps(d: Diagnosis, prof: Profile) -> list[Gap]:
    """Unpriced operators; and, for a profile not fitted from this very trace, each family
    the profile prices differently from this run (for one fitted from it, those differences
    are the fit's own residuals: shown in the table, not ranked)."""
    own = prof.fingerprint.get("trace") == d.trace
    out = []
    for r in d.rows:
        if r.what in ("host", "comm exposed", "profiler (tracing)") or (
                own and not r.what.startswith("unpriced")):
            continue
        if r.what.startswith("unpriced: "):
            op = r.what.split(": ", 1)[1]
            out.append(Gap(r.what, r.gap_s, r.measured_s, 0.0,
                           f"operators the simulator does not price: {op} took {_ms(r.measured_s)}",
                           UNPRICED_WHATIF.get(op, "none in the run; the op graph does not "
                                               "price this operator yet")))
            continue
        ratio = r.measured_s / r.predicted_s if r.predicted_s > 0 else float("inf")
        out.append(Gap(r.what, r.gap_s, r.measured_s, r.predicted_s,
                       f"{r.what} ran {_ms(r.measured_s)}, the profile prices {_ms(r.predicted_s)}"
                       f" (x{ratio:.2f})",
                       f"`complexity calibrate --from-trace {d.trace}` refits {r.what} from this "
                       "run"))
    return out


def rank_gaps(d: Diagnosis, trace: KinetoTrace, prof: Profile, plan: Plan) -> list[Gap]:
    """Gaps larger than MIN_GAP_FRACTION of the step, largest first."""
    gaps = [g for g in (comm_gap(d, trace, plan), host_gap(d, trace, prof)) if g is not None]
    gaps += family_gaps(d, prof)
    floor = MIN_GAP_FRACTION * d.measured_step_s
    return sorted((g for g in gaps if abs(g.gap_s) >= floor), key=lambda g: -abs(g.gap_s))
