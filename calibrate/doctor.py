"""``complexity doctor``: play the traced step in the simulator and explain the gap.

Measured (one representative step of the trace, ``calibrate.trace_stats``) and predicted
(``simulate`` for the same model and plan, and the simulator's own op list priced per family,
``calibrate.sim_ops``) side by side: time per op family, host time, collectives exposed and
overlapped, per GPU stream where the trace has kernels. Gaps are ranked by size, each with a
one-line explanation and the what-if that would close it.

``explained_fraction`` = (time of the families the simulator prices + host dispatch time +
exposed communication) / measured step, both without the profiler's own cost (its own
row): the share of the measured step the table maps onto something the simulator prices
(host time per op included: on a CPU it is folded into the launch costs of a trace-fitted
profile). ``priced_fraction`` leaves host time out. What is
left is operators the simulator does not price and time no operator covers on the device.

Host time of a profile not fitted from a trace: a profile with a synchronous host model
(``Profile.host``, a CPU calibrated by ``calibrate``) predicts the host's dispatch time the
engine puts on the compute stream (``Breakdown.host_s``); any other profile whose
fingerprint has no ``host_us_per_op_folded`` prices no host time here (predicted 0): that
gap is the one the doctor reports.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simulator.engine.simulate import simulate
from simulator.hardware.profile import Profile
from simulator.hardware.specs import ClusterSpec
from simulator.parallel.plan import Plan
from simulator.workload.spec import TransformerSpec

from .doctor_gaps import Gap, host_us_per_op, rank_gaps
from .trace_fit import HOST_GEMM_FOLDED_KEY
from .sim_ops import SimOp, predicted_family_s, step_ops
from .trace_import import SIM_FAMILIES, KinetoTrace, load_trace
from .trace_stats import (
    StepMeasure,
    clean_steps,
    event_cost,
    measure_step,
    median_wall_s,
    representative,
)



PROFILER_ROW = "profiler (tracing)"


@dataclass(frozen=True)
class Row:
    what: str                    # family, "host", "comm exposed", "unpriced: <op>"
    measured_s: float
    predicted_s: float

    @property
    def gap_s(self) -> float:
        return self.measured_s - self.predicted_s


@dataclass(frozen=True)
class Diagnosis:
    trace: str
    step: str
    measured_step_s: float
    measured_median_step_s: float
    predicted_step_s: float
    measured_less_profiler_s: float
    explained_fraction: float
    priced_fraction: float
    rows: list[Row]
    gaps: list[Gap]
    comm: dict[str, float]
    streams_s: dict[str, float]
    step_index: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [{**asdict(r), "gap_s": r.gap_s} for r in self.rows]
        return d


def predicted_rows(ops: list[SimOp], prof: Profile, cluster: ClusterSpec
                   ) -> tuple[dict[str, float], float]:
    """Per family without the host time a trace-fitted profile folds into its launch
    costs, and that host time per step."""
    fam = predicted_family_s(ops, cluster.gpu, prof)
    per = {"gemm": host_us_per_op(prof, HOST_GEMM_FOLDED_KEY) * 1e-6}
    rest = host_us_per_op(prof) * 1e-6
    host = {}
    for s in ops:
        host[s.family] = host.get(s.family, 0.0) + s.launches * per.get(s.family, rest)
    return {f: t - host.get(f, 0.0) for f, t in fam.items()}, sum(host.values())


def _rows(m: StepMeasure, fam_pred: dict[str, float], host_pred: float, comm_pred: float
          ) -> list[Row]:
    rows = [Row(f, m.family_s.get(f, 0.0), fam_pred.get(f, 0.0)) for f in SIM_FAMILIES
            if m.family_s.get(f, 0.0) > 0 or fam_pred.get(f, 0.0) > 0]
    rows.append(Row("host", m.host_s, host_pred))
    rows.append(Row("comm exposed", m.comm_exposed_s, comm_pred))
    rows += [Row(f"unpriced: {k}", v, 0.0) for k, v in sorted(m.other_s.items(),
                                                              key=lambda kv: -kv[1]) if v > 0]
    if m.profiler_s > 0:
        rows.append(Row(PROFILER_ROW, m.profiler_s, 0.0))
    return rows


def diagnose(trace: KinetoTrace, model: TransformerSpec, plan: Plan, prof: Profile,
             cluster: ClusterSpec) -> tuple[Diagnosis, Any, list[SimOp]]:
    steps, note = clean_steps(trace)
    cost, how = (0.0, "") if trace.has_gpu else event_cost(trace, steps)
    measures = [measure_step(trace, s, cost) for s in steps]
    m = representative(measures)
    res = simulate(model, plan, cluster, prof, keep_timeline=True)
    ops = step_ops(model, plan)
    fam_pred, host_pred = predicted_rows(ops, prof, cluster)
    bd = res.breakdown
    if host_pred == 0.0 and prof.host is not None and prof.host.synchronous:
        host_pred = bd.host_s                # the host's dispatch time on the compute stream
    comm_pred = bd.dp_comm_s + bd.tp_comm_s + bd.cp_comm_s + bd.ep_comm_s + bd.pp_comm_s
    rows = _rows(m, fam_pred, host_pred, comm_pred)
    comm_total_pred = sum(t["end_s"] - t["start_s"] for t in res.timeline
                          if t.get("kind") == "dp_comm")
    comm = {"measured_in_flight_s": m.comm_s, "measured_exposed_s": m.comm_exposed_s,
            "measured_overlapped_s": m.comm_overlapped_s,
            "measured_overlap_possible_s": min(m.comm_s, m.bwd_compute_s),
            "predicted_in_flight_s": comm_total_pred, "predicted_exposed_s": comm_pred,
            "predicted_overlapped_s": max(0.0, comm_total_pred - comm_pred),
            "collectives_per_step": float(sum(1 for c in trace.comms if c.step == m.step
                                              and c.where == "device") or
                                          sum(1 for c in trace.comms if c.step == m.step)),
            **{f"measured_{k}_s": v for k, v in m.comm_by_op.items()}}
    mapped = m.priced_s + m.host_s + m.comm_exposed_s
    wall = max(m.wall_s - m.profiler_s, 1e-12)          # the step as it runs unprofiled
    diag = Diagnosis(Path(trace.path).name, f"step {m.step} of {note}", m.wall_s,
                     median_wall_s(measures), res.step_time_s, m.wall_s - m.profiler_s,
                     min(1.0, mapped / wall),
                     m.priced_s / wall, rows, [], comm, m.streams_s, m.step,
                     list(trace.notes) + ([f"the profiler's own cost is its own row: {how}"]
                                          if m.profiler_s > 0 else []))
    diag.gaps.extend(rank_gaps(diag, trace, prof, plan))
    if prof.fingerprint.get("trace") == diag.trace:
        diag.notes.append("the profile was fitted from this trace: per-family differences are "
                          "the fit's residuals (noise between steps, costs a family model does "
                          "not capture) and are not ranked as gaps")
    return diag, res, ops


def doctor(trace_path: str | Path, model: TransformerSpec, plan: Plan, prof: Profile,
           cluster: ClusterSpec) -> tuple[Diagnosis, KinetoTrace, Any, list[SimOp]]:
    tr = load_trace(trace_path)
    diag, res, ops = diagnose(tr, model, plan, prof, cluster)
    return diag, tr, res, ops
