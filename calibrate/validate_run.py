"""`complexity validate-run`: train a real PyTorch decoder for a few steps on this machine,
predict the same step with a calibrated profile, and report the signed error.

The run: ``calibrate.torch_model`` builds the decoder from the same ``TransformerSpec`` the
simulator prices; AdamW (fused CPU/GPU kernel where torch has one) on synthetic tokens;
single process, or ``nproc`` data-parallel processes (torch DDP over gloo on localhost,
``bucket_cap_mb`` = 25), each with ``max(1, cores // nproc)`` intra-op threads. Each step is
``zero_grad(set_to_none=True)``, forward, cross-entropy, backward, ``optimizer.step()``;
after ``warmup`` untimed steps, ``steps`` steps are timed (wall clock; with several ranks
the slowest rank's time per step) and the median is reported with its spread.

The prediction: ``simulator.engine.simulate.simulate`` with ``Plan(dp=nproc, micro_batch=B,
global_batch=B*nproc, precision=fp32, attention=flash (SDPA), zero_stage=0, dp_overlap,
dp_bucket_bytes=25 MiB, 1f1b)`` on ``ClusterSpec(profile.device, profile.node, nproc)``.
torch's DDP makes its first bucket 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``); the
simulator splits the gradients into equal buckets of at most 25 MiB — noted in the output.
The profile must have been measured with the run's threads per process (calibrate writes
``profile.json`` at torch's default threads and ``profile_<t>thread.json``); a sibling
file with the right thread count is used in place of a mismatching one, else an error.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from simulator import progress
from simulator.errors import ComplexityError, InvalidInputError, ProfileError
from simulator.hardware.profile import Profile
from simulator.hardware.specs import ClusterSpec
from simulator.parallel.plan import Plan
from simulator.workload import resolve_model
from simulator.workload.spec import TransformerSpec

from .store import PressureMeter

DDP_BUCKET_MB = 25
DDP_FIRST_BUCKET_BYTES = 1024 * 1024     # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
LR = 1e-4
CLEAN_PRESSURE_1 = 0.10
CLEAN_PRESSURE_DDP = 0.30
MAX_STEP_FACTOR = 4
TRACE_STEPS = 5           # --trace-out profiles at most this many steps after the timed ones
TRACE_WAIT_QUIET_S = 30.0  # ... after waiting up to this long for other load to stop


class RunError(ComplexityError):
    """The training run itself failed (e.g. a DDP worker died)."""


@dataclass(frozen=True)
class RunSpec:
    """What to train and how."""

    model: TransformerSpec
    nproc: int
    micro_batch: int
    steps: int
    warmup: int
    threads: int
    trace_out: str = ""                    # also record a Kineto trace here (trace_record)
    bucket_cap_mb: int = DDP_BUCKET_MB      # DDP bucket_cap_mb
    trace_wait_s: float = 0.0              # wait this long for quiet before the trace


@dataclass(frozen=True)
class Measured:
    """Per-step wall times (seconds) after warm-up, and their summary."""

    step_times_s: tuple[float, ...]
    median_s: float
    p25_s: float
    p75_s: float
    min_s: float
    max_s: float
    loss_first: float
    loss_last: float
    optimizer: str
    pressure: tuple[float, ...] = ()       # host CPU pressure (PSI) per timed step
    minor_faults_per_step: float = 0.0     # rank 0: fresh pages touched per step (4 KiB)
    n_clean: int = 0                       # steps with pressure <= clean_limit
    all_median_s: float = 0.0              # median over every timed step, clean or not
    clean_limit: float = 0.0

    @property
    def clean(self) -> bool:
        return self.n_clean >= 3


@dataclass(frozen=True)
class ValidationResult:
    model: str
    nproc: int
    micro_batch: int
    seq_len: int
    steps: int
    warmup: int
    threads_per_process: int
    profile: str
    measured_step_time_s: float
    predicted_step_time_s: float
    error_pct: float
    measured: Measured
    predicted_breakdown_s: dict[str, float]
    params: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        m = d.pop("measured")
        d["measured_spread"] = {k: m[k] for k in ("p25_s", "p75_s", "min_s", "max_s")}
        d["measured_iqr_pct"] = 100.0 * (m["p75_s"] - m["p25_s"]) / m["median_s"]
        d["measured_step_times_s"] = list(m["step_times_s"])
        d["measured_step_pressure"] = list(m["pressure"])
        d["measured_clean_steps"] = m["n_clean"]
        d["measured_minor_faults_per_step"] = m["minor_faults_per_step"]
        d["measured_all_steps_median_s"] = m["all_median_s"]
        d["clean_pressure_limit"] = m["clean_limit"]
        d["loss_first_last"] = [m["loss_first"], m["loss_last"]]
        d["optimizer"] = m["optimizer"]
        return d

    def line(self) -> str:
        m = self.measured
        iqr = 100.0 * (m.p75_s - m.p25_s) / m.median_s
        return (f"{self.model} nproc={self.nproc} micro_batch={self.micro_batch} "
                f"seq={self.seq_len}: measured {m.median_s * 1e3:.2f} ms (median of "
                f"{m.n_clean if m.clean else len(m.step_times_s)} "
                f"{'clean ' if m.clean else ''}steps, IQR {iqr:.1f}%, min {m.min_s * 1e3:.2f}, max "
                f"{m.max_s * 1e3:.2f}), predicted {self.predicted_step_time_s * 1e3:.2f} ms, "
                f"error {self.error_pct:+.1f}%")


# ---- inputs ----------------------------------------------------------------------------------
def _positive(name: str, v: int, least: int = 1) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise InvalidInputError(name, v, f"an integer >= {least}")


def profile_threads(prof: Profile) -> int | None:
    t = prof.fingerprint.get("threads")
    try:
        return int(t) if t not in (None, "") else None
    except ValueError:
        return None


def threads_per_process(nproc: int, cores: int | None = None) -> int:
    return max(1, (cores or os.cpu_count() or 1) // nproc)


def load_profile(path: str | Path, threads: int) -> tuple[Profile, Path, list[str]]:
    """The profile measured with ``threads`` threads per process: ``path`` itself, or its
    sibling ``profile.json`` / ``profile_<threads>thread.json`` when ``path`` was measured
    with another thread count. One-line errors otherwise."""
    p = Path(path)
    prof = Profile.read_json(p)
    if prof.device is None or prof.node is None:
        raise ProfileError("profile", str(p), "a profile measured on this host by `complexity "
                           "calibrate` (it carries the device and node)",
                           "datasheet/reference profiles have none")
    have = profile_threads(prof)
    if have in (None, threads):
        return prof, p, []
    for cand in (p.parent / f"profile_{threads}thread.json", p.parent / "profile.json"):
        if cand.is_file() and cand.resolve() != p.resolve():
            other = Profile.read_json(cand)
            if profile_threads(other) == threads and other.device is not None:
                return other, cand, [f"{p.name} was measured with {have} thread(s); using "
                                     f"{cand.name} ({threads} thread(s) per process)"]
    raise ProfileError("profile", str(p), f"a profile measured with {threads} thread(s) per "
                       f"process (this one used {have})",
                       f"no sibling profile_{threads}thread.json either; re-run `complexity "
                       "calibrate` on this host")


def run_spec(model: str, nproc: int, micro_batch: int, seq_len: int, steps: int,
             warmup: int, trace_out: str | Path | None = None,
             bucket_cap_mb: int = DDP_BUCKET_MB) -> RunSpec:
    _positive("nproc", nproc)
    _positive("bucket_cap_mb", bucket_cap_mb)
    _positive("micro_batch", micro_batch)
    _positive("seq_len", seq_len)
    _positive("steps", steps)
    _positive("warmup", warmup, 0)
    cores = os.cpu_count() or 1
    if nproc > cores:
        raise InvalidInputError("nproc", nproc, f"at most the {cores} logical cores of this host "
                                "(one rank per core or fewer)")
    spec = resolve_model(model, seq_len=seq_len)
    if spec.moe is not None:
        raise InvalidInputError("model", model, "a dense decoder (validate-run does not build MoE)")
    return RunSpec(spec, nproc, micro_batch, steps, warmup, threads_per_process(nproc, cores),
                   _trace_path(trace_out), bucket_cap_mb)


def _trace_path(trace_out: str | Path | None) -> str:
    if not trace_out:
        return ""
    p = Path(trace_out)
    if p.is_dir() or not p.parent.is_dir():
        raise InvalidInputError("trace_out", str(p), "a file path in an existing directory")
    return str(p.resolve())


# ---- prediction ------------------------------------------------------------------------------
def plan_for(rs: RunSpec) -> Plan:
    """The run as a plan; with several processes, torch DDP's per-parameter hooks and bucket
    copies (``frameworks.json`` host mechanism ``ddp_param_hooks``)."""
    return Plan(dp=rs.nproc, micro_batch=rs.micro_batch, global_batch=rs.micro_batch * rs.nproc,
                precision="fp32", attention="flash", zero_stage=0, dp_overlap=True,
                dp_bucket_bytes=rs.bucket_cap_mb * 1024 * 1024, schedule="1f1b",
                host_mechanisms=("ddp_param_hooks",) if rs.nproc > 1 else ())


def predict(rs: RunSpec, prof: Profile):
    from simulator.engine.simulate import simulate
    cluster = ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=rs.nproc)
    return simulate(rs.model, plan_for(rs), cluster, prof)


# ---- measurement -----------------------------------------------------------------------------
def _optimizer(params):
    from .torch_model import make_optimizer
    return make_optimizer(params, LR)


def _step_fn(rs: RunSpec, rank: int, ddp: bool):
    """(one training step callable returning the loss, optimizer name)."""
    import torch

    from .torch_model import build_model, synthetic_batch
    torch.set_num_threads(rs.threads)
    model = build_model(rs.model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, bucket_cap_mb=rs.bucket_cap_mb)
    opt, opt_name = _optimizer(model.parameters())
    tokens, targets = synthetic_batch(rs.model, rs.micro_batch, seed=1000 + rank)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        opt.step()
        return loss
    return step, opt_name


def clean_threshold(nproc: int) -> float:
    """Largest CPU pressure (PSI, fraction of the step) of a step counted as clean: a lone
    process sees ~0; DDP ranks see their own gloo threads (~0.1 here)."""
    return CLEAN_PRESSURE_1 if nproc == 1 else CLEAN_PRESSURE_DDP


def train_steps(rs: RunSpec, rank: int = 0, ddp: bool = False) -> dict[str, Any]:
    """Warm-up, then timed steps until ``rs.steps`` clean ones (at most
    ``MAX_STEP_FACTOR * rs.steps``). With DDP each step's time and pressure are the max over
    ranks (exchanged after the step, outside the timed window) so all ranks agree."""
    import torch
    step, opt_name = _step_fn(rs, rank, ddp)
    bar = progress.open_task("validate-run: warm-up and timed steps", rs.warmup + rs.steps)
    for _ in range(rs.warmup):
        step()
        bar.update(1)
    limit, out = clean_threshold(rs.nproc), {"times": [], "pressure": [], "losses": []}
    clean, faults0 = 0, _minor_faults()
    while clean < rs.steps and len(out["times"]) < MAX_STEP_FACTOR * rs.steps:
        meter = PressureMeter().start()
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        pr = meter.stop()
        if ddp:
            import torch.distributed as dist
            v = torch.tensor([dt, pr], dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            dt, pr = float(v[0]), float(v[1])
        out["times"].append(dt)
        out["pressure"].append(pr)
        out["losses"].append(float(loss.detach()))
        clean += pr <= limit
        bar.update(int(pr <= limit))                   # the bar counts clean steps
    bar.close()
    out["optimizer"] = opt_name
    out["minor_faults_per_step"] = (_minor_faults() - faults0) / len(out["times"])
    if rs.trace_out:
        _trace(rs, rank, step, out)
    return out


def _trace(rs: RunSpec, rank: int, step, rec: Mapping[str, Any]) -> None:
    """``--trace-out``: profile ``min(steps, TRACE_STEPS)`` more steps (calibrate.trace_record)."""
    from .trace_record import rank_path, record_trace
    s = summarize(rec, clean_threshold(rs.nproc))
    meta = {"model": rs.model.name, "micro_batch": rs.micro_batch, "seq_len": rs.model.seq_len,
            "nproc": rs.nproc, "rank": rank, "threads_per_process": rs.threads,
            "bucket_cap_mb": rs.bucket_cap_mb, "optimizer": rec["optimizer"],
            "unprofiled_median_step_s": s.median_s, "unprofiled_clean_steps": s.n_clean}
    if rs.trace_wait_s > 0:                  # the traced steps, too, away from other load
        wait_quiet(rs.trace_wait_s, clean_threshold(rs.nproc))
    record_trace(step, min(rs.steps, TRACE_STEPS), rank_path(rs.trace_out, rank), meta)


def _minor_faults() -> int:
    """Page faults served without I/O so far in this process (first touches of fresh pages)."""
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    except (ImportError, OSError):
        return 0


def _ddp_worker(rank: int, rs: RunSpec, port: int, out_dir: str) -> None:
    import warnings

    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=rs.nproc, timeout=timedelta(seconds=300))
    try:
        dist.barrier()
        rec = train_steps(rs, rank, ddp=True)
        if rank == 0:
            Path(out_dir, "rank0.json").write_text(json.dumps(rec))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_ddp(rs: RunSpec) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from .bench_comm import free_port
    with tempfile.TemporaryDirectory(prefix="validate-run-") as tmp:
        try:
            mp.start_processes(_ddp_worker, args=(rs, free_port(), tmp), nprocs=rs.nproc,
                               join=True, start_method="spawn")
        except Exception as exc:   # noqa: BLE001 - one line, never a traceback
            lines = str(exc).strip().splitlines()
            raise RunError(f"DDP training run failed: {lines[-1] if lines else type(exc).__name__}"
                           ) from None
        return json.loads(Path(tmp, "rank0.json").read_text())


def wait_quiet(max_s: float, limit: float = CLEAN_PRESSURE_1) -> float:
    """Wait (up to ``max_s``) until a 1-second window of this host has CPU pressure below
    ``limit``; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        meter = PressureMeter().start()
        time.sleep(1.0)
        if meter.stop() < limit:
            break
    return time.perf_counter() - t0


def measure(rs: RunSpec) -> Measured:
    try:
        import torch
    except ImportError:
        raise ComplexityError("validate-run needs torch (pip install "
                              "'complexity-framework[torch]')") from None
    if rs.nproc == 1:
        old = torch.get_num_threads()
        try:
            rec = train_steps(rs)
        finally:
            torch.set_num_threads(old)
    else:
        rec = _run_ddp(rs)
    return summarize(rec, clean_threshold(rs.nproc))


def summarize(rec: Mapping[str, Any], limit: float) -> Measured:
    """Median over the clean steps (CPU pressure <= ``limit``) when there are at least 3,
    else over all steps (and say so)."""
    times, pressure = rec["times"], rec["pressure"]
    clean = [t for t, p in zip(times, pressure) if p <= limit]
    use = clean if len(clean) >= 3 else list(times)
    q = statistics.quantiles(use, n=4, method="inclusive") if len(use) > 1 else [use[0]] * 3
    return Measured(tuple(times), statistics.median(use), q[0], q[2], min(use), max(use),
                    rec["losses"][0], rec["losses"][-1], rec["optimizer"],
                    tuple(pressure), rec.get("minor_faults_per_step", 0.0), len(clean),
                    statistics.median(times), limit)


# ---- the command -----------------------------------------------------------------------------
def validate_run(model: str, profile: str | Path, nproc: int = 1, micro_batch: int = 1,
                 seq_len: int = 128, steps: int = 10, warmup: int = 3,
                 wait_quiet_s: float = 60.0, trace_out: str | Path | None = None,
                 bucket_cap_mb: int = DDP_BUCKET_MB) -> ValidationResult:
    """Measure and predict one training step; everything the CLI prints. ``trace_out``:
    also write a Kineto trace of a few steps run after the timed ones."""
    rs = run_spec(model, nproc, micro_batch, seq_len, steps, warmup, trace_out, bucket_cap_mb)
    rs = replace(rs, trace_wait_s=min(wait_quiet_s, TRACE_WAIT_QUIET_S))
    if not (wait_quiet_s >= 0):
        raise InvalidInputError("wait_quiet", wait_quiet_s, "seconds >= 0")
    prof, prof_path, notes = load_profile(profile, rs.threads)
    res = predict(rs, prof)                    # before the run: bad input fails fast
    with progress.task("validate-run: waiting for a quiet host"):
        waited = wait_quiet(wait_quiet_s) if wait_quiet_s > 0 else 0.0
    with progress.task(f"validate-run: training ({rs.nproc} process"
                       f"{'es, DDP' if rs.nproc > 1 else ''})"):
        meas = measure(rs)
    err = 100.0 * (res.step_time_s - meas.median_s) / meas.median_s
    notes += _notes(rs, meas, waited)
    return ValidationResult(
        model=rs.model.name, nproc=nproc, micro_batch=micro_batch, seq_len=rs.model.seq_len,
        steps=steps, warmup=warmup, threads_per_process=rs.threads, profile=str(prof_path),
        measured_step_time_s=meas.median_s, predicted_step_time_s=res.step_time_s,
        error_pct=err, measured=meas, predicted_breakdown_s=res.breakdown.as_dict(),
        params=rs.model.total_params(), notes=notes)


def _notes(rs: RunSpec, meas: Measured, waited: float) -> list[str]:
    out = []
    if waited >= 2.0:
        out.append(f"waited {waited:.0f} s for the host to go quiet before the run")
    n = len(meas.step_times_s)
    if not meas.clean:
        out.append(f"host busy: only {meas.n_clean} of {n} timed steps ran with CPU pressure "
                   f"<= {meas.clean_limit:.0%}; the median is over all steps and includes "
                   "other load")
    elif meas.n_clean < n:
        out.append(f"{n - meas.n_clean} of {n} timed steps ran while other load held the CPU "
                   f"(pressure > {meas.clean_limit:.0%}) and were left out; median of all steps "
                   f"{meas.all_median_s * 1e3:.2f} ms")
    if rs.nproc > 1:
        out.append(f"DDP buckets: torch uses a first bucket of {DDP_FIRST_BUCKET_BYTES} bytes "
                   f"then <= {rs.bucket_cap_mb} MiB; the simulator uses equal buckets of <= "
                   f"{rs.bucket_cap_mb} MiB")
    if rs.trace_out:
        out.append(f"Kineto trace of {min(rs.steps, TRACE_STEPS)} steps run after the timed "
                   f"ones: {rs.trace_out}" + (" (one file per rank)" if rs.nproc > 1 else ""))
    return out
