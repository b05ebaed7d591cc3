"""Host work HuggingFace transformers' ``Trainer`` adds per micro-batch and per optimizer step
beyond the model's own forward and backward, in eager ops of this host, and where it reads
device scalars back to the host (``hf_trainer_loop``).

``python -m calibrate.bench_hf_trainer [--runs 3]`` trains ``calibrate.bench_hf_host``'s tiny
``LlamaForCausalLM`` (1 and 5 layers, 32 tokens, micro-batch 1; kernels nearly free) with the
real ``Trainer`` (adamw_torch_fused, max_grad_norm 1.0, report_to none, no eval, saving,
logging step or tqdm, use_cpu, no DataLoader workers) at gradient_accumulation_steps 1 and 4,
each in a thread paused at ``on_step_begin``; meanwhile a bare loop trains the same model
(separate models differ by per cents) with the same optimizer: forward, backward, clip,
step, zero_grad. Both are timed interleaved with the host probe (``calibrate.bench_host``), in
thread CPU time between marks: the model's forward hooks, the backward call, torch's clip,
the optimizer step, zero_grad, the Trainer's training_step, get_batch_samples and its
num_items_in_batch count. Per micro-batch (the 2nd to 4th of 4): the Trainer's time outside
the model's forward and backward less the bare loop's (fwd side: training_step's prologue,
``model.train()``, compute_loss; bwd side: accelerator.backward's wrapper, ``loss.detach()``;
loop: the NaN/Inf loss check, ``floating_point_ops``, callbacks; get_batch_samples per batch),
plus the windows' difference at 1 layer (the loss-scaling ops). Per step: the rest but clip
and optimizer step. Host reads: each ``aten._local_scalar_dense`` of a real run, located. A
run is unfit to write when noisy (``bench_hf_host.noise``) or a total is not positive.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import io
import sys
import threading
import time
from statistics import fmean as _mean

from .bench import until_quiet

MECHANISM = "hf_trainer_loop"
LAYERS = (1, 5)
ACCUM = (1, 4)
TRIALS = 30
REPEATS = 3                  # optimizer steps (probe: calls) per case and trial
WARMUP, MAX_NORM = 4, 1.0     # steps before timing; the clip norm (TrainingArguments')
WAIT_S = 300.0               # of pauses while re-measuring on a busy host
COLUMNS = ["mechanism", "metric", "value_us", "op_fwd_us_same_run", "eager_ops", "host",
           "torch", "date", "method"]             # host_mechanisms.csv's
DATASET_LEN, NEVER = 1 << 15, 10 ** 9


def available() -> str:
    """'' when transformers and accelerate import, else why not."""
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"transformers/accelerate not importable ({type(exc).__name__}: {exc})"
    return ""


_LOCAL = threading.local()          # .marks: where this thread's marks go (None: nowhere)


def _mark(name: str) -> None:
    marks = getattr(_LOCAL, "marks", None)
    if marks is not None:
        marks.append((name, time.thread_time()))


@contextlib.contextmanager
def marking(marks: list | None):
    """This thread's marks into ``marks`` while inside."""
    old = getattr(_LOCAL, "marks", None)
    _LOCAL.marks = marks
    try:
        yield marks
    finally:
        _LOCAL.marks = old


def _wrap(obj, attr: str, before: str, after: str) -> None:
    """``obj.attr`` replaced on the object by a call marked around."""
    fn = getattr(obj, attr)

    def marked(*args, **kwargs):
        _mark(before)
        out = fn(*args, **kwargs)
        _mark(after)
        return out
    setattr(obj, attr, marked)


def split_steps(marks: list) -> list[dict[str, list[float]]]:
    """The marks of each step, ``s`` to ``s_end``: {name: [times in order]}."""
    steps, cur = [], None
    for name, t in marks:
        cur = {} if name == "s" else cur
        if cur is not None:
            cur.setdefault(name, []).append(t)
            if name == "s_end":
                steps.append(cur)
                cur = None
    return steps


def segments(m: dict[str, list[float]]) -> dict[str, float]:
    """Seconds of one step's parts: per micro-batch (all but the first, colder after the
    optimizer part) fwd, mid, bwd, pre / post (Trainer) or free (bare graph drop), between
    (to the next micro-batch); per step clip, opt, zero, period, inner (the micro-batches)
    and the Trainer's gbs / nib (get_batch_samples, its num_items_in_batch count)."""
    spans = {"fwd": ("f0", "f1"), "mid": ("f1", "b0"), "bwd": ("b0", "b1")}
    trainer = "t0" in m
    start, end = ("t0", "t1") if trainer else ("f0", "x1")
    steps = {"clip": ("c0", "c1"), "opt": ("p0", "p1"), "zero": ("z0", "z1"),
             "period": ("s", "s_end"), "inner": (start, end)}
    spans.update({"pre": ("t0", "f0"), "post": ("b1", "t1")} if trainer else
                 {"free": ("b1", "x1")})
    steps.update({"gbs": ("g0", "g1"), "nib": ("n0", "n1")} if trainer else {})
    first = 1 if len(m["f0"]) > 1 else 0
    out = {k: _mean(y - x for x, y in zip(m[a][first:], m[b][first:]))
           for k, (a, b) in spans.items()}
    out.update({k: m[b][-1] - m[a][0] for k, (a, b) in steps.items()})
    if len(m[start]) > 1:
        out["between"] = _mean(s - e for e, s in zip(m[end][:-1], m[start][1:]))
    return out


def _step_means(marks: list) -> dict[str, float]:
    """``segments`` averaged over the steps but the first (after a pause)."""
    per = [segments(s) for s in split_steps(marks)[1:]]
    return {k: _mean(p[k] for p in per) for k in per[0]}


def _dataset() -> list[dict]:
    """``DATASET_LEN`` items cycling over 8 random sequences."""
    import torch

    from .bench_hf_host import TOKENS, VOCAB
    ids = torch.randint(0, VOCAB, (8, TOKENS))
    items = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r} for r in ids]
    return items * (DATASET_LEN // len(items))


def make_trainer(layers: int, accum: int, out_dir: str, logging_steps: int = NEVER):
    """A marked ``Trainer`` on a fresh ``bench_hf_host`` model."""
    import transformers

    from .bench_hf_host import _model
    transformers.logging.set_verbosity_error()
    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=1, max_steps=NEVER,
        gradient_accumulation_steps=accum, use_cpu=True, report_to="none",
        save_strategy="no", eval_strategy="no", logging_steps=logging_steps,
        dataloader_num_workers=0, disable_tqdm=True, optim="adamw_torch_fused",
        max_grad_norm=MAX_NORM)
    tr = transformers.Trainer(model=_model(layers, False), args=args, train_dataset=_dataset())
    for obj, attr, a, b in ((tr, "training_step", "t0", "t1"), (tr, "get_batch_samples", "g0",
                            "g1"), (tr, "_get_num_items_in_batch", "n0", "n1"),
                            (tr.accelerator, "backward", "b0", "b1"),
                            (tr.model, "zero_grad", "z0", "z1")):
        _wrap(obj, attr, a, b)
    tr.model.register_forward_pre_hook(lambda *_: _mark("f0"))
    tr.model.register_forward_hook(lambda *_: _mark("f1"))

    class WrapStep(transformers.TrainerCallback):       # the optimizer exists from here on
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            _wrap(optimizer.optimizer, "step", "p0", "p1")
    tr.add_callback(WrapStep())
    return tr


class PausedTrainer:
    """``Trainer.train()`` in a thread, paused at every ``on_step_begin`` until ``steps(n)``
    lets ``n`` steps run and returns their marks (``s_end`` / ``s`` around each pause)."""

    def __init__(self, layers: int, accum: int) -> None:
        import tempfile

        import transformers
        self.marks: list = []
        self._dir = tempfile.TemporaryDirectory()
        self.trainer = make_trainer(layers, accum, self._dir.name)
        outer = self

        class Pause(transformers.TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                return outer._pause(control)
        self.trainer.add_callback(Pause())
        self._go, self._done = threading.Semaphore(0), threading.Semaphore(0)
        self.budget, self.stop, self.error, self.finished = 0, False, None, False
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()
        self._wait()

    def _train(self) -> None:
        try:
            with marking(self.marks):
                self.trainer.train()
        except BaseException as exc:         # handed to the caller by _wait
            self.error = exc
        self.finished = True
        self._done.release()

    def _pause(self, control):
        _mark("s_end")
        if self.budget == 0 and not self.stop:
            # accelerate's GradientState is one per process: kept across the pause
            shared = self.trainer.accelerator.gradient_state.__dict__
            saved = dict(shared)
            self._done.release()
            self._go.acquire()
            shared.update(saved)
        if self.stop:
            control.should_training_stop = True
            return control
        self.budget -= 1
        _mark("s")
        return control

    def _wait(self) -> None:
        self._done.acquire()
        if self.error is not None or (self.finished and not self.stop):
            raise RuntimeError("the Trainer thread ended") from self.error

    def steps(self, n: int) -> list:
        self.marks.clear()
        self.budget = n
        self._go.release()
        self._wait()
        return list(self.marks)

    def close(self) -> None:
        self.stop = True
        with contextlib.redirect_stdout(io.StringIO()):     # the final metrics' print
            self._go.release()
            self._done.acquire()
            self._thread.join(60)
        self._dir.cleanup()


def bare_step(paused: PausedTrainer, accum: int):
    """A bare step on the paused Trainer's model and torch optimizer (their marks shared):
    per micro-batch forward, backward (b0 / b1), graph dropped (x1); clip, step, zero_grad."""
    import torch
    from transformers.data.data_collator import default_data_collator
    model, opt = paused.trainer.model, paused.trainer.optimizer.optimizer
    batches = [default_data_collator([item]) for item in _dataset()[:accum]]
    params = list(model.parameters())

    def step() -> None:
        _mark("s")
        for b in batches:
            loss = model(**b).loss
            _mark("b0")
            loss.backward()
            _mark("b1")
            del loss                # the graph, freed at training_step's return there
            _mark("x1")
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        model.zero_grad()
        _mark("s_end")
    return step


def build_cases(layers=LAYERS, accum=ACCUM) -> tuple[dict, list]:
    """{case: run(repeats) -> {segment: seconds}}, warmed up, and the Trainers to close."""
    from .bench_host import HOST_LAYERS, _decoder_fns
    cases, paused = {}, []
    for n in layers:
        for k in accum:
            p = PausedTrainer(n, k)
            paused.append(p)
            step = bare_step(p, k)
            p.steps(WARMUP)
            _bare_run(step, WARMUP)
            cases[("trainer", n, k)] = lambda r, p=p: _step_means(p.steps(r + 1))
            cases[("bare", n, k)] = lambda r, s=step: _bare_run(s, r)
    for n in HOST_LAYERS:
        fwd, bwd = _decoder_fns(n)[:2]
        _probe_run(fwd, bwd, 3)
        cases[("probe", n, 0)] = lambda r, f=fwd, b=bwd: _probe_run(f, b, r)
    return cases, paused


def _bare_run(step, repeats: int) -> dict[str, float]:
    with marking([]) as marks:
        for _ in range(repeats + 1):
            step()
    return _step_means(marks)


def _probe_run(fwd, bwd, repeats: int) -> dict[str, float]:
    sf = sb = 0.0
    for _ in range(repeats):
        t0, out = time.thread_time(), fwd()
        t1, _ = time.thread_time(), bwd(out)
        sf, sb = sf + t1 - t0, sb + time.thread_time() - t1
    return {"fwd": sf / repeats, "bwd": sb / repeats}


def interleave(cases: dict, trials: int, repeats: int = REPEATS) -> tuple[dict, float]:
    """Every case ``repeats`` times per trial (cyclic GC between trials only): {case:
    {segment: 10th percentile over trials, us}} and the CPU pressure."""
    import gc

    import numpy as np

    from .store import PressureMeter
    got: dict = {k: [] for k in cases}
    meter = PressureMeter().start()
    gc.disable()
    try:
        for _ in range(trials):
            gc.collect()
            for name, run in cases.items():
                got[name].append(run(repeats))
    finally:
        gc.enable()
    return ({k: {s: float(np.percentile([v[s] for v in vs], 10)) * 1e6 for s in vs[0]}
             for k, vs in got.items()}, meter.stop())


def measure(trials: int = TRIALS) -> dict:
    """One run, re-measured after a backoff pause while noisy (``bench_hf_host.noise``: CPU
    pressure, other processes' load, a slow probe) within ``WAIT_S``: segments (us), the
    probe's us per op forward, each attempt's noise ('' when quiet), the host reads."""
    import os

    import torch

    from .bench_hf_host import _host_name, _recorded_probe_us, noise
    from .bench_host import HOST_LAYERS, graph_ops
    from .store import ForeignLoadMeter
    torch.set_num_threads(1)
    cpus, (lo, hi) = os.sched_getaffinity(0), HOST_LAYERS
    os.sched_setaffinity(0, {min(cpus)})    # every thread on one CPU, the Trainers' too
    usual = _recorded_probe_us(_host_name())
    clip = torch.nn.utils.clip_grad_norm_          # accelerate calls it by that name
    _wrap(torch.nn.utils, "clip_grad_norm_", "c0", "c1")

    def attempt():
        meter = ForeignLoadMeter().start()
        us, pressure = interleave(cases, trials)
        foreign = meter.foreign(meter.stop()[0])
        op = ((us[("probe", hi, 0)]["fwd"] - us[("probe", lo, 0)]["fwd"])
              / (graph_ops(hi)[0] - graph_ops(lo)[0]))
        return (us, op, pressure, foreign), noise(pressure, foreign, op, usual)
    try:
        cases, paused = build_cases()
        try:
            (us, op, pressure, foreign), attempts = until_quiet(attempt, WAIT_S)
        finally:
            for p in paused:
                p.close()
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
        os.sched_setaffinity(0, cpus)
    reads = {(k, lg): trainer_reads(1, k, 1 if lg else NEVER) for k in ACCUM for lg in (0, 1)}
    return {"us": us, "op_fwd_us": op, "pressure": pressure, "foreign": foreign,
            "attempts": attempts, "trials": trials, "reads": reads}


def per_layers(us: dict, layers: int, accum=ACCUM) -> dict[str, float]:
    """At ``layers`` layers, us: per micro-batch pre, mid (less the bare mid and between),
    post (less the bare graph drop), loop, count, fetch, fwdwin / bwdwin (the windows less the
    bare ones); per step: step (the period less the micro-batches, clip, optimizer step,
    get_batch_samples' per-batch part, one loop and the bare loop's own Python; step_k1 from
    the smaller accumulation), zero; slope (of period less clip and step, less the bare's)."""
    k1, k = min(accum), max(accum)
    tr, bare = us[("trainer", layers, k)], us[("bare", layers, k)]
    tr1, bare1 = us[("trainer", layers, k1)], us[("bare", layers, k1)]
    batch = (tr["gbs"] - tr1["gbs"]) / (k - k1)
    out = {"pre": tr["pre"], "mid": tr["mid"] - bare["mid"] - bare["between"],
           "post": tr["post"] - bare["free"], "loop": tr["between"],
           "count": (tr["nib"] - tr1["nib"]) / (k - k1), "fwdwin": tr["fwd"] - bare["fwd"],
           "bwdwin": tr["bwd"] - bare["bwd"], "zero": tr["zero"]}
    out["fetch"] = batch - out["count"]

    def step(t: dict, b: dict, n: int) -> float:
        own = b["period"] - b["inner"] - b["clip"] - b["opt"] - b["zero"]
        return t["period"] - t["inner"] - t["clip"] - t["opt"] - n * batch - out["loop"] - own
    out["step"], out["step_k1"] = step(tr, bare, k), step(tr1, bare1, k1)

    def net(c: dict) -> float:
        return c["period"] - c["clip"] - c["opt"]
    out["slope"] = ((net(tr) - net(tr1)) - (net(bare) - net(bare1))) / (k - k1)
    return out


def coefficients(m: dict) -> dict[str, tuple[float, float]]:
    """(fixed, per layer) us of every ``per_layers`` quantity and of the rows: fwd (pre + mid
    + the forward window's difference at the smallest size, constant), bwd (post + the
    backward window's), loop, count and fetch (mean over the sizes), total, step, zero. The
    windows' change with layers (the Trainer's walks over the modules warm them) is left out."""
    import numpy as np
    by = {n: per_layers(m["us"], n) for n in LAYERS}
    c = {q: tuple(np.polyfit(LAYERS, [by[n][q] for n in LAYERS], 1)[::-1])
         for q in by[LAYERS[0]]}
    first = by[LAYERS[0]]
    out = {"fwd": (c["pre"][0] + c["mid"][0] + first["fwdwin"], c["pre"][1] + c["mid"][1]),
           "bwd": (c["post"][0] + first["bwdwin"], c["post"][1]), "loop": c["loop"],
           **{q: (_mean(by[n][q] for n in LAYERS), 0.0) for q in NO_LAYER_TERM}}
    out["total"] = tuple(sum(v[i] for v in out.values()) for i in (0, 1))
    return {**c, **out}


def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may)."""
    c, op = coefficients(m), m["op_fwd_us"]
    bad = [f"noisy: {m['attempts'][-1]}"] * bool(m["attempts"][-1])
    bad += [f"probe per-op cost {op:.2f} us out of range"] * (not 0 < op < 1e3)
    return bad + [f"{q} at {n} layers not positive" for n in LAYERS for q in ("total", "step")
                  if c[q][0] + c[q][1] * n <= 0]


def trainer_reads(layers: int, accum: int, logging_steps: int = NEVER, steps: int = 4
                  ) -> tuple[list[tuple[int, int, str, str]], int]:
    """A real Trainer run's reads, placed (``place_reads``), and the steps counted."""
    import tempfile
    import traceback

    import torch
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode
    reads: list = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                site = next((f for f in reversed(traceback.extract_stack()) if "/torch/"
                             not in f.filename and not f.filename.endswith(__file__)), None)
                reads.append((len(marks), f"{site.filename.split('site-packages/')[-1]}:"
                               f"{site.lineno} {site.name}" if site else "?"))
            return func(*args, **(kwargs or {}))

    class Steps(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            _mark("s")
            control.should_training_stop = state.global_step >= steps
            return control
    with tempfile.TemporaryDirectory() as d, marking([]) as marks:
        (tr := make_trainer(layers, accum, d, logging_steps)).add_callback(Steps())
        with Reads(), contextlib.redirect_stdout(io.StringIO()):
            tr.train()
    return place_reads(marks, reads), max(0, sum(1 for n, _ in marks if n == "s") - 2)


def place_reads(marks: list, reads: list) -> list[tuple[int, int, str, str]]:
    """(step, micro-batch, last mark, location) of each (mark position, location) read in a
    complete step (one with a next) after the first."""
    starts = [i for i, (name, _) in enumerate(marks) if name == "s"]
    placed = []
    for pos, where in reads:
        step = sum(1 for s in starts if s < pos) - 1
        if 1 <= step < len(starts) - 1:
            mb = sum(1 for name, _ in marks[starts[step]:pos] if name == "t0") - 1
            placed.append((step, mb, marks[pos - 1][0], where))
    return placed


PHASE = {"t0": "in training_step before the forward", "f0": "in the model's forward",
         "f1": "after the forward", "b0": "in the backward", "b1": "after the backward",
         "t1": "after training_step (before the next one or the optimizer part)",
         "p0": "in the optimizer step", "z1": "after zero_grad (the step's end, logging)"}


def reads_per(reads: dict, k: int, log_every: bool, where=None) -> float:
    """Reads per complete step (at ``where``: (location, last mark))."""
    rs, steps = reads[(k, log_every)]
    return sum(1 for _, _, m, w in rs if where in (None, (w, m))) / max(steps, 1)


def reads_text(reads: dict) -> str:
    """Reads per step at each (accumulation, logging), in all and by location."""
    keys = sorted(reads)
    cols = "/".join(f"accumulation {k}{', logging every step' * lg}" for k, lg in keys)
    parts = [f"per step at {cols}: " + "/".join(f"{reads_per(reads, *key):g}" for key in keys)]
    for w, m in sorted({(w, m) for rs, _ in reads.values() for _, _, m, w in rs}):
        parts.append(f"{w} {PHASE.get(m, 'after mark ' + m)}: "
                     + "/".join(f"{reads_per(reads, *key, (w, m)):g}" for key in keys))
    return "; ".join(parts)


WHAT = {"fwd": "fwd side (training_step prologue, compute_loss, the loss-scaling ops)",
        "bwd": "bwd side (accelerator.backward, loss.detach)",
        "loop": "after the backward, before the next training_step (loss NaN/Inf check, "
                "_tr_loss, floating_point_ops, callbacks)",
        "count": "get_batch_samples' num_items_in_batch count",
        "fetch": "DataLoader fetch (in-memory dataset, default_data_collator)",
        "total": "total (fwd + bwd + after the backward + count + fetch)",
        "step": "beyond clip_grad_norm_ and optimizer.step() (incl. zero_grad)",
        "zero": "model.zero_grad() alone (included in the step row)"}
NO_LAYER_TERM = ("count", "fetch")      # not model-size work: the mean of the two sizes


def metric_values(m: dict) -> list[tuple[str, float]]:
    """(metric, us) of every row."""
    out, c = [], coefficients(m)
    for q, (fixed, per) in ((q, c[q]) for q in WHAT):
        what = f"per {'optimizer step' if q in ('step', 'zero') else 'micro-batch'}, {WHAT[q]}"
        out += ([(what, fixed + per * _mean(LAYERS))] if q in NO_LAYER_TERM else
                [(f"{what}, fixed", fixed), (f"{what}, per decoder layer", per)])
    return out


def _method(m: dict) -> str:
    import transformers
    q, t = {n: per_layers(m["us"], n) for n in LAYERS}, coefficients(m)["total"]
    checks = "; ".join(
        f"{n} layers: slope {q[n]['slope']:.0f} us vs total {t[0] + t[1] * n:.0f}"
        f" us, step at accumulation {min(ACCUM)} {q[n]['step_k1']:.0f} vs {q[n]['step']:.0f}, "
        f"windows fwd {q[n]['fwdwin']:.0f} bwd {q[n]['bwdwin']:.0f} us" for n in LAYERS)
    return (f"transformers {transformers.__version__} Trainer (adamw_torch_fused, max_grad_norm "
            "1.0, use_cpu, report_to none, no eval/save/logging step, disable_tqdm) on "
            f"bench_hf_host's LlamaForCausalLM ({'/'.join(map(str, LAYERS))} layers, 32 tokens, "
            "micro-batch 1, input_ids + attention_mask + labels), gradient_accumulation_steps "
            f"{'/'.join(map(str, ACCUM))}, paused at on_step_begin in a thread, against a bare "
            "loop (forward, backward, clip_grad_norm_(1.0), step, zero_grad) on the same model "
            "and optimizer, interleaved trial by trial with the host probe (thread CPU time, "
            f"one CPU, 10th percentile of {m['trials']} trials x {REPEATS} steps, first after a "
            "pause dropped, cyclic GC off); per micro-batch (2nd-4th of 4): the Trainer's time "
            "outside the model's forward and backward less the bare loop's, plus the windows' "
            f"difference at {LAYERS[0]} layer; per step: the period less the micro-batches, "
            "clip, optimizer step, get_batch_samples per batch, one loop and the bare loop's "
            f"Python; fixed and per decoder layer from the two sizes; checks: {checks}; CPU "
            f"pressure {m['pressure']:.2f}, foreign load {m['foreign']:.2f}; calibrate.bench_hf_"
            f"trainer; host reads (aten._local_scalar_dense): {reads_text(m['reads'])}")


def rows_of(m: dict) -> list[dict]:
    """The CSV rows of one run (``COLUMNS``)."""
    import torch

    from .bench_dp import _mechanism_rows
    from .bench_hf_host import _host_name
    op = m["op_fwd_us"]
    base = {"op_fwd_us_same_run": round(op, 2), "torch": torch.__version__,
            "host": _host_name(), "date": dt.date.today().isoformat()}
    return _mechanism_rows(base, op, MECHANISM, _method(m), metric_values(m))


def rows(base: dict | None = None) -> list[dict]:
    """One run's rows for ``calibrate.bench_framework`` (their own probe; ``base`` unused);
    none, with a message, without transformers or when the run is unfit."""
    if available():
        print(f"{MECHANISM} skipped: {available()}", file=sys.stderr)
        return []
    m = measure()
    if problems(m):
        print(f"{MECHANISM} rows not written: " + "; ".join(problems(m)), file=sys.stderr)
    return [] if problems(m) else rows_of(m)


def print_table(m: dict, out=sys.stderr) -> None:
    """Every case's segments, each size's quantities (us), the fit (us, eager ops)."""
    op = m["op_fwd_us"]
    print(f"probe {op:.2f} us per op forward; CPU pressure {m['pressure']:.2f}, foreign load "
          f"{m['foreign']:.2f}; attempts: {' | '.join(a or 'quiet' for a in m['attempts'])}",
          file=out)
    for case, seg in [*sorted(m["us"].items()), *((n, per_layers(m["us"], n)) for n in LAYERS)]:
        print(f"{str(case):18s}" + " ".join(f"{k}={v:.1f}" for k, v in seg.items()), file=out)
    for k, (a, b) in coefficients(m).items():
        print(f"{k:7s} fixed {a:7.1f} us {a / op:6.2f} eo, per layer {b:6.1f} us {b / op:5.2f} eo",
              file=out)
    print("host reads: " + reads_text(m["reads"]), file=out)


def main(argv: list[str] | None = None) -> int:
    """``--runs`` runs; the fit ones' rows as CSV on stdout, their spread on stderr."""
    import statistics
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_hf_trainer")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trials", type=int, default=TRIALS)
    args = ap.parse_args(argv)
    if available():
        print(f"{MECHANISM}: {available()}", file=sys.stderr)
        return 1
    good = []
    for i in range(args.runs):
        m = measure(args.trials)
        print(f"==== run {i + 1}", file=sys.stderr)
        print_table(m)
        bad = problems(m)
        print("run unfit to write: " + "; ".join(bad) if bad else "run fit", file=sys.stderr)
        good += [] if bad else [rows_of(m)]
    for i, r in enumerate(good[0] if good else []):        # the spread over the runs
        v = [run[i]["eager_ops"] for run in good]
        print(f"{r['metric']}: {', '.join(f'{x:.2f}' for x in v)} (median "
              f"{statistics.median(v):.2f})", file=sys.stderr)
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS)
    w.writeheader()
    for r in good:
        w.writerows(r)
    return 0 if good else 2


if __name__ == "__main__":
    sys.exit(main())
