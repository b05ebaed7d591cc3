"""Record a Kineto (``torch.profiler``) trace of training steps: ``validate-run --trace-out``.

The trace covers steps run right after the timed ones, in the same process on the same
tensors: the timed steps stay unprofiled, so validate-run's measured step (and its error)
is what it would be without ``--trace-out``; the profiler's own per-op cost shows in the
traced steps instead. The trace is what ``torch.profiler.profile(record_shapes=True)``
exports (CPU activity, plus CUDA where torch has a GPU), one ``ProfilerStep#N`` annotation
per step, with one extra top-level key ``"complexity"`` that other readers ignore: the run's
model and plan, the unprofiled median step, and each traced step's wall time and host CPU
pressure (so a reader can skip steps other load disturbed and correct for the profiler's
overhead, also measured on its own: ``profiler_s_per_event``). With several ranks each writes its own file (``FILE`` for rank 0,
``STEM.rank<r>SUFFIX`` for rank ``r``). ``FILE`` ending in ``.gz`` is written gzipped.
"""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from .store import PressureMeter

META_KEY = "complexity"
WARMUP_STEPS = 1          # one profiled-but-discarded step (the profiler's own warm-up)
COST_OPS = 1000           # operators per round of the profiler-cost microbenchmark
COST_ROUNDS = 9


def rank_path(path: str | Path, rank: int) -> Path:
    """``trace.json`` -> ``trace.json`` (rank 0), ``trace.rank1.json`` (rank 1); a
    ``.json.gz`` suffix is kept whole."""
    p = Path(path)
    if rank == 0:
        return p
    name = p.name
    for suf in (".json.gz", ".json"):
        if name.endswith(suf):
            return p.with_name(f"{name[:-len(suf)]}.rank{rank}{suf}")
    return p.with_name(f"{name}.rank{rank}")


def _activities():
    import torch
    from torch.profiler import ProfilerActivity
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def profiler_cost_s_per_event() -> float | None:
    """What the profiler adds per recorded operator (``record_shapes=True``): a loop of
    ``COST_OPS`` small ``torch.add`` calls timed with and without it (fastest of
    ``COST_ROUNDS`` interleaved rounds each), divided by the events the profiled loop
    recorded; None when other load hid the difference. The trace fit takes
    ``events x this`` out of a traced step's host time."""
    import torch
    from torch.profiler import profile
    a, b = torch.ones(16), torch.ones(16)

    def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(COST_OPS):
            torch.add(a, b)
        return time.perf_counter() - t0
    plain, traced, events = [], [], 0
    for _ in range(COST_ROUNDS):
        plain.append(loop())
        with profile(activities=_activities(), record_shapes=True) as prof:
            traced.append(loop())
        events = max(events, len(prof.events()))
    cost = (min(traced) - min(plain)) / max(events, 1)
    return cost if cost > 0 else None


def record_trace(step: Callable[[], Any], n_steps: int, path: str | Path,
                 meta: Mapping[str, Any], sync: Callable[[], None] | None = None) -> Path:
    """Run ``n_steps`` profiled steps (after ``WARMUP_STEPS`` profiled warm-up steps) and
    write the trace to ``path`` with ``meta`` plus per-step wall time and pressure under
    ``"complexity"``. ``sync`` (e.g. ``torch.cuda.synchronize``) runs before each step's
    clock stops."""
    from torch.profiler import profile, schedule
    out = Path(path)
    raw = out.with_name(out.name + ".raw.json")
    steps: list[dict[str, float]] = []

    def ready(prof) -> None:
        prof.export_chrome_trace(str(raw))
    sched = schedule(wait=0, warmup=WARMUP_STEPS, active=n_steps, repeat=1)
    with profile(activities=_activities(), record_shapes=True, schedule=sched,
                 on_trace_ready=ready) as prof:
        for i in range(WARMUP_STEPS + n_steps):
            meter = PressureMeter().start()
            t0 = time.perf_counter()
            step()
            if sync is not None:
                sync()
            dt = time.perf_counter() - t0
            if i >= WARMUP_STEPS:
                steps.append({"wall_s": dt, "pressure": meter.stop()})
            prof.step()
    data = json.loads(raw.read_text())
    raw.unlink()
    data[META_KEY] = {**dict(meta), "traced_steps": steps,
                      "profiler_s_per_event": profiler_cost_s_per_event()}
    write_trace_json(data, out)
    return out


def write_trace_json(data: Mapping[str, Any], path: Path) -> None:
    """JSON, gzipped when the name ends in ``.gz``; written atomically."""
    text = json.dumps(data)
    tmp = path.with_name(path.name + ".tmp")
    if path.name.endswith(".gz"):
        with gzip.open(tmp, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        tmp.write_text(text)
    tmp.replace(path)
