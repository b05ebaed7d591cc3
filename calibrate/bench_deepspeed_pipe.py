"""Host cost of DeepSpeed's pipeline engine on this CPU (``python -m calibrate.bench_framework
--only deepspeed_pipe_engine``).

Timed: ``PipelineEngine.train_batch`` (DeepSpeed 0.19.8, deepspeed/runtime/pipe/engine.py
332-403: ``_exec_schedule`` 1373-1387 runs schedule.py ``TrainSchedule.steps`` 197-258) on
the probe decoder of ``calibrate.bench_host`` (hidden 32, 8 tokens) as a ``PipelineModule``
of ``LayerSpec`` s like Megatron-DeepSpeed's GPT (embedding, blocks, final norm, logits, a
cross-entropy ``loss_fn``; type:Block partition: first stage embedding + 1 block, last 1
block + norm + logits), 2 stages on the fake 2-rank group of the other DeepSpeed benches
(``DS_ACCELERATOR=cpu``, fp32, ZeRO stage 0, a client SGD). The process is rank 0; for the
last stage its module gets a topology with rotated ranks (``topology``). Sends and receives
are no-ops on the fake group; one priming step of both stages in two threads over an
in-process loopback (``prime``) gives them the metadata they receive once, as a peer would.

Against: the bare stage (its layers in an ``nn.Sequential``: each micro-batch's forward and
backward, from a zero gradient or the loss, then the same SGD's ``step`` and ``zero_grad``),
interleaved with the engines and the host probe (thread CPU time, 10th percentile of trials),
at ``MICRO_BATCHES`` (1, 5) per step: the difference's slope is the cost per micro-batch (5
instructions, ``instruction_counts``), its intercept the cost per step (ReduceTiedGrads,
ReduceGrads, OptimizerStep beyond SGD's step, loss aggregation, fill and drain steps) with
DeepSpeed's default gradient clipping (constants.py 203: 1.0; engine.py 3505-3511), also
timed alone. ``instruction_us`` times each instruction and the bare passes, interleaved.

Tensor-parallel hand-offs (``tp_measure``, a child process: a fake group of 4): a pipe 2 x
model 2 grid, where activations and gradients go as ``PartitionedTensor`` s (engine.py 137-138
``is_pipe_partitioned`` / ``is_grad_partitioned``, default on; ``to_meta`` 743-750, 1078-1080;
``from_meta`` + ``full()`` 711-717, 816-821, 831-835, 1169-1173), against the same grid with
them off, with the child's own probe; the model itself is not tensor-parallel. ``host_reads``
lists DeepSpeed's reads of tensor values (``.item()``, ``.tolist()``, ``.to('cpu')`` ...),
moves to the device (from host memory PyTorch's CUDA copy without ``non_blocking``
synchronizes the stream) and ``synchronize()`` calls in a step. Without DeepSpeed (not a
dependency: ``pip install deepspeed``) the bench is skipped with a message.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .bench_deepspeed import _quiet, available, version
from .bench_deepspeed_pipe_step import slope_intercept, step_rows
from .bench_host import HOST_LAYERS, probe_spec

MECHANISM = "deepspeed_pipe_engine"
STAGES = 2
BLOCKS_PER_STAGE = 1
MICRO_BATCHES = (1, 5)
TP = 2
LR = 1e-4
TRIALS = 40                             # bench_host.time_interleaved's trials
INSTRUMENT_STEPS = 40                   # steps of instruction_us
PASSES = ("ForwardPass", "BackwardPass")
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
         "__format__")
ROOT = Path(__file__).resolve().parent.parent
TP_TIMEOUT_S = 900
SLOW = 1.5                              # a probe this much over the host's recorded median
CSV = ROOT / "hardware_db" / "data" / "measurements" / "host_mechanisms.csv"


# ---- the schedule's instructions and the arithmetic (pure) ----------------------------------
def instruction_counts(micro_batches: int, stage: int, stages: int = STAGES) -> dict[str, int]:
    """Instructions by class name that DeepSpeed's own ``TrainSchedule`` gives ``stage`` of
    ``stages`` for one step of ``micro_batches``, and its schedule steps (``steps``)."""
    from collections import Counter

    from deepspeed.runtime.pipe.schedule import TrainSchedule
    steps = list(TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage))
    return {**Counter(type(c).__name__ for cmds in steps for c in cmds), "steps": len(steps)}


def per_unit(counts: dict[int, dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Per micro-batch and per step (slope, intercept) of each count in ``counts`` (e.g.
    ``instruction_counts``) at the two ``MICRO_BATCHES``, zeros left out."""
    lo, hi = MICRO_BATCHES
    per = {k: slope_intercept(counts[lo].get(k, 0), counts[hi].get(k, 0), lo, hi)
           for k in sorted(set(counts[lo]) | set(counts[hi]))}
    return ({k: s for k, (s, _) in per.items() if s}, {k: c for k, (_, c) in per.items() if c})


def stage_costs(t: dict, kind: str, ref: str, stage: int) -> dict[str, float]:
    """Us of case ``kind`` beyond case ``ref`` on ``stage``, from whole-step timings ``t``
    keyed ``(kind, stage, micro-batches)`` (values (us, ...)): per micro-batch (``per_mb``,
    the slope) and per step (``per_step``, the intercept)."""
    lo, hi = MICRO_BATCHES
    ex = [t[(kind, stage, m)][0] - t[(ref, stage, m)][0] for m in (lo, hi)]
    return dict(zip(("per_mb", "per_step"), slope_intercept(*ex, lo, hi)))


def minus(inst: dict[str, float], ref: dict[str, float]) -> dict[str, float]:
    """Instrumented us per call (``instruction_us``) less ``ref`` 's where it has them."""
    return {k: v - ref.get(k, 0.0) for k, v in inst.items()}


# ---- building the engines -------------------------------------------------------------------
def _launcher_env(world: int) -> None:
    """What a launcher sets for rank 0 of a ``world``-rank job (LOCAL_SIZE 1: no peer for
    DeepSpeed's shared-memory allreduce to wait for), DeepSpeed's loggers quieted."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_SIZE="1")
    _quiet()


def cross_entropy(logits, labels):
    """The probe's fp32 cross-entropy: the last stage's ``loss_fn``."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))


def layer_specs() -> list:
    """The probe decoder as ``LayerSpec`` s: embedding, ``STAGES * BLOCKS_PER_STAGE`` blocks
    (class ``Block``), final norm, logits."""
    from deepspeed.runtime.pipe import LayerSpec
    from torch import nn

    from .torch_model import _block_class
    spec = probe_spec(STAGES * BLOCKS_PER_STAGE)
    return ([LayerSpec(nn.Embedding, spec.vocab, spec.hidden)]
            + [LayerSpec(_block_class(spec)) for _ in range(spec.n_layers)]
            + [LayerSpec(nn.LayerNorm, spec.hidden, bias=False),
               LayerSpec(nn.Linear, spec.hidden, spec.vocab, bias=False)])


def topology(stage: int, tp: int = 1):
    """A pipe ``STAGES`` x model ``tp`` topology with its ranks rotated so that this
    process (rank 0) is pipe stage ``stage``, tensor-parallel rank 0."""
    from deepspeed.runtime.pipe import topology as tpl
    topo = (tpl.PipeModelDataParallelTopology(num_pp=STAGES, num_mp=tp, num_dp=1) if tp > 1
            else tpl.PipeDataParallelTopology(num_pp=STAGES, num_dp=1))
    topo.mapping = {c: (r - stage * tp) % (STAGES * tp) for c, r in topo.mapping.items()}
    return topo


def config(micro_batches: int, partitioned: bool = True, clip: bool = True) -> dict:
    """The engine's config: fp32, ZeRO stage 0, ``micro_batches`` of 1 sample per step;
    DeepSpeed's default partitioned hand-offs (used with tensor parallelism) and gradient
    clipping unless ``partitioned`` / ``clip`` is off."""
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": micro_batches,
           "wall_clock_breakdown": False,
           "pipeline": {"pipe_partitioned": partitioned, "grad_partitioned": partitioned}}
    return cfg if clip else {**cfg, "gradient_clipping": 0.0}


def build_engine(stage: int, micro_batches: int, tp: int = 1, partitioned: bool = True,
                 clip: bool = True):
    """A ``PipelineEngine`` of stage ``stage`` (``topology``) of the probe decoder
    (``layer_specs``) with a client SGD; DeepSpeed's prints swallowed."""
    import contextlib
    import io

    import deepspeed
    import torch
    from deepspeed.runtime.pipe import PipelineModule
    deepspeed.init_distributed()
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        module = PipelineModule(layer_specs(), topology=topology(stage, tp),
                                loss_fn=cross_entropy, partition_method="type:Block")
        opt = torch.optim.SGD(module.parameters(), lr=LR)
        eng, *_ = deepspeed.initialize(model=module, optimizer=opt,
                                       config=config(micro_batches, partitioned, clip))
    return eng


def batches():
    """An endless iterator of the probe's (tokens, targets) micro-batch."""
    from itertools import repeat

    from .torch_model import synthetic_batch
    return repeat(synthetic_batch(probe_spec(1), 1))


def train_step(eng, data):
    """One timed call: ``eng.train_batch(data)``, p2p's module-wide grid set to ``eng``'s
    first (both stages' engines live in this process; p2p keeps the last one built)."""
    from deepspeed.runtime.pipe import p2p
    grid = eng.grid

    def step():
        p2p._grid = grid
        return eng.train_batch(data)
    return step


def bare_passes(eng):
    """(forward, backward, module) of one micro-batch through fresh copies of ``eng``'s
    stage layers in an ``nn.Sequential``: the first stage from the tokens, backward from a
    zero gradient; the last from a zero activation that requires grad, to its loss."""
    import torch

    from .torch_model import synthetic_batch
    specs, parts, s = eng.module._layer_specs, eng.module.parts, eng.stage_id
    torch.manual_seed(0)
    seq = torch.nn.Sequential(*(sp.build() for sp in specs[parts[s]:parts[s + 1]]))
    spec = probe_spec(1)
    tokens, targets = synthetic_batch(spec, 1)
    act = torch.zeros(1, spec.seq_len, spec.hidden)
    if s == 0:
        return (lambda: seq(tokens)), (lambda out: out.backward(act)), seq
    x = act.clone().requires_grad_()

    def bwd(loss):
        loss.backward()
        x.grad = None
    return (lambda: cross_entropy(seq(x), targets)), bwd, seq


def bare_step(eng, micro_batches: int):
    """A bare step of ``eng``'s stage: ``micro_batches`` x ``bare_passes``, SGD's ``step``,
    ``zero_grad(set_to_none=True)``."""
    import torch
    fwd, bwd, seq = bare_passes(eng)
    opt = torch.optim.SGD(seq.parameters(), lr=LR)

    def step():
        for _ in range(micro_batches):
            bwd(fwd())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def prime(pair, data) -> None:
    """One ``train_batch`` of the first and the last stage's engines ``pair`` together, in
    two threads over an in-process loopback (a queue per receiving stage) in place of
    ``p2p.send`` / ``recv``: what they receive once and keep is what the other one sent."""
    import queue
    import threading

    from deepspeed.runtime.pipe import p2p
    wire = {s: queue.Queue() for s in range(STAGES)}
    errors: list[BaseException] = []

    def send(tensor, dest_stage, async_op=False):
        wire[dest_stage].put(tensor.detach().clone())

    def recv(tensor, src_stage, async_op=False):
        tensor.copy_(wire[STAGES - 1 - src_stage].get(timeout=60))

    def run(eng):
        try:
            eng.train_batch(data)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the calling thread)
            errors.append(exc)
    own, (p2p.send, p2p.recv) = (p2p.send, p2p.recv), (send, recv)
    threads = [threading.Thread(target=run, args=(e,)) for e in pair]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        p2p.send, p2p.recv = own
    if errors:
        raise errors[0]


def engine_cases(kinds: dict[str, dict], micro_batches=MICRO_BATCHES, tp: int = 1
                 ) -> tuple[dict, dict]:
    """Timing cases ``(kind, stage, micro-batches)`` of primed engine pairs, one pair per
    ``kinds`` entry (``build_engine`` keywords) and micro-batch count; and the engines."""
    data, cases, engines = batches(), {}, {}
    for kind, kw in kinds.items():
        for m in micro_batches:
            pair = [build_engine(s, m, tp, **kw) for s in range(STAGES)]
            prime(pair, data)
            for s, eng in enumerate(pair):
                engines[(kind, s, m)] = eng
                cases[(kind, s, m)] = (train_step(eng, data), lambda out: None)
    return cases, engines


# ---- timing -----------------------------------------------------------------------------------
def time_cases(cases: dict) -> tuple[dict, float, float]:
    """``cases`` timed interleaved with the host probe (``bench_host.time_interleaved``),
    again while busy (``bench.PRESSURE_MAX``, ``RETRIES``, ``backoff_s``), the quietest kept:
    ({key: (fwd, bwd) us, 10th percentile}, the probe's us per op forward, CPU pressure)."""
    from .bench import PRESSURE_MAX, RETRIES, backoff_s
    from .bench_host import _decoder_fns, graph_ops, time_interleaved
    cases = {**cases, **{("probe", n): _decoder_fns(n)[:2] for n in HOST_LAYERS}}
    best = None
    for attempt in range(RETRIES + 1):
        if attempt:
            time.sleep(backoff_s(attempt - 1))
        r = time_interleaved(cases, trials=TRIALS)
        pressure = next(iter(r.values()))[0].pressure
        best = (r, pressure) if best is None or pressure < best[1] else best
        if pressure <= PRESSURE_MAX:
            break
    t = {k: (f.p10_s * 1e6, b.p10_s * 1e6) for k, (f, b, _, _) in best[0].items()}
    lo, hi = HOST_LAYERS
    op = (t[("probe", hi)][0] - t[("probe", lo)][0]) / (graph_ops(hi)[0] - graph_ops(lo)[0])
    return t, op, best[1]


def instruction_us(engines: dict, bare: dict, calls: int = INSTRUMENT_STEPS) -> dict:
    """{key: {instruction: median thread CPU us per call}} of ``engines`` ({key: engine}, its
    ``_INSTRUCTION_MAP`` shadowed by wrappers timing each method, clock reads included) and of
    ``bare`` ({key: (forward, backward)}, as ForwardPass / BackwardPass), ``calls`` of their
    ``train_step`` s and passes interleaved one by one after 3 untimed."""
    import statistics
    samples: dict = {k: {} for k in (*engines, *bare)}

    def timed(key, name, fn):
        def run(*a, **kw):
            t0 = time.thread_time()
            out = fn(*a, **kw)
            samples[key].setdefault(name, []).append(time.thread_time() - t0)
            return out
        return run
    for k, eng in engines.items():
        eng._INSTRUCTION_MAP = {c: timed(k, c.__name__, f)
                                for c, f in type(eng)._INSTRUCTION_MAP.items()}
    passes = {k: [timed(k, n, fn) for n, fn in zip(PASSES, pair)] for k, pair in bare.items()}
    data = batches()
    calls_of = [train_step(e, data) for e in engines.values()] + [
        (lambda p=p: p[1](p[0]())) for p in passes.values()]
    try:
        for i in range(3 + calls):
            samples.update({k: {} for k in samples} if i == 3 else {})
            for call in calls_of:
                call()
    finally:
        for eng in engines.values():
            del eng._INSTRUCTION_MAP
    return {k: {n: statistics.median(v) * 1e6 for n, v in d.items()} for k, d in samples.items()}


def _site(frame) -> str:
    """The innermost caller outside torch from ``frame`` on, as ``path:line`` (from
    site-packages or this repository) and its source line."""
    import linecache
    while frame.f_back is not None and f"{os.sep}torch{os.sep}" in frame.f_code.co_filename:
        frame = frame.f_back
    path = frame.f_code.co_filename
    short = path.split("site-packages" + os.sep)[-1].replace(str(ROOT) + os.sep, "")
    return f"{short}:{frame.f_lineno} {linecache.getline(path, frame.f_lineno).strip()}"


def host_reads(step, calls: int = 1) -> dict[str, int]:
    """Counts by what and where (``_site``) during ``calls`` of ``step``: reads of tensor
    values into Python (``READS``, ``to`` where the line names 'cpu'), moves to the device
    (``to(device)``, ``tensor(device)``) and the accelerator's ``synchronize()``."""
    from collections import Counter

    from deepspeed.accelerator import get_accelerator
    from torch.overrides import TorchFunctionMode
    seen: Counter = Counter()

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in READS or name in ("to", "tensor"):
                where = _site(sys._getframe(1))
                cpu = "'cpu'" in where or '"cpu"' in where
                seen[f"{name if name in READS or cpu else name + '(device)'} at {where}"] += 1
            return func(*args, **(kwargs or {}))
    acc = get_accelerator()
    own = acc.synchronize

    def sync(*a, **k):
        seen[f"synchronize at {_site(sys._getframe(1))}"] += 1
        return own(*a, **k)
    acc.synchronize = sync
    try:
        with Reads():
            for _ in range(calls):
                step()
    finally:
        del acc.synchronize
    return dict(seen)


def reads_per_unit(engines: dict, kind: str, data) -> dict[int, dict[str, list[float]]]:
    """``host_reads`` of ``kind``'s engines, per stage, split into per micro-batch and per
    step: {stage: {what at where: [per micro-batch, per step]}}."""
    out = {}
    for s in range(STAGES):
        mb, st = per_unit({m: host_reads(train_step(engines[(kind, s, m)], data))
                           for m in MICRO_BATCHES})
        out[s] = {k: [mb.get(k, 0.0), st.get(k, 0.0)] for k in {*mb, *st}}
    return out


def reads_text(reads: dict) -> str:
    """``reads_per_unit`` as text for the rows' method."""
    parts = []
    for s, found in reads.items():
        items = [f"{k.split(' at ')[0]} {mb:g}/micro-batch {st:+g}/step at "
                 f"{k.split(' at ')[1].split(' ')[0]}" for k, (mb, st) in sorted(found.items())]
        parts.append(f"stage {s}: " + ("; ".join(items) or "none"))
    return ("DeepSpeed's reads of tensor values, device moves (to(device), tensor(device)) "
            "and synchronize() in a step (on this CPU every tensor is on the host: which would "
            "cross to or from a GPU is read from the source): " + " | ".join(parts))


# ---- the two measurements -------------------------------------------------------------------
def measure_pipe() -> dict:
    """On the fake 2-rank group (up already: ``bench_framework``): the engines (``pipe``;
    ``noclip``, one micro-batch, gradient clipping off) and the bare stages' steps timed with
    the host probe; per stage its ``stage_costs``, clipping's cost, the instrumented
    instructions, the passes less the bare ones (``minus``), and the ``reads_per_unit``."""
    import torch
    torch.set_num_threads(1)
    _launcher_env(STAGES)
    cases, engines = engine_cases({"pipe": {}})
    cases.update(engine_cases({"noclip": {"clip": False}}, micro_batches=(1,))[0])
    for (_, s, m), eng in engines.items():
        cases[("bare", s, m)] = (bare_step(eng, m), lambda out: None)
    t, op, pressure = time_cases(cases)
    hi = MICRO_BATCHES[-1]
    inst = instruction_us({s: engines[("pipe", s, hi)] for s in range(STAGES)},
                          {("pass", s): bare_passes(engines[("pipe", s, hi)])[:2]
                           for s in range(STAGES)})
    out = {"op": op, "pressure": pressure, "stages": {}}
    for s in range(STAGES):
        out["stages"][s] = {**stage_costs(t, "pipe", "bare", s),
                            "clip": t[("pipe", s, 1)][0] - t[("noclip", s, 1)][0],
                            "tensors": sum(1 for _ in engines[("pipe", s, hi)].module.parameters()),
                            "instructions": minus(inst[s], inst[("pass", s)])}
    return {**out, "reads": reads_per_unit(engines, "pipe", batches())}


def tp_measure() -> dict:
    """In a child process, on a fake group of ``STAGES * TP`` ranks (this one rank 0): both
    stages' engines on a pipe x model grid with partitioned hand-offs (``part``) and without
    (``unpart``), timed with the child's own host probe; per stage the partitioned engine's
    ``stage_costs`` over the unpartitioned one and its instrumented extra per instruction,
    and its ``reads_per_unit``, as JSON-ready data."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    torch.set_num_threads(1)
    os.environ["DS_ACCELERATOR"] = "cpu"
    _launcher_env(STAGES * TP)
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=STAGES * TP)
    cases, engines = engine_cases({"part": {}, "unpart": {"partitioned": False}}, tp=TP)
    t, op, pressure = time_cases(cases)
    hi = MICRO_BATCHES[-1]
    inst = instruction_us({(k, s): engines[(k, s, hi)] for k in ("part", "unpart")
                           for s in range(STAGES)}, {})
    out = {"op": op, "pressure": pressure, "stages": {}}
    for s in range(STAGES):
        out["stages"][str(s)] = {**stage_costs(t, "part", "unpart", s),
                                 "instructions": minus(inst[("part", s)], inst[("unpart", s)])}
    reads = reads_per_unit(engines, "part", batches())
    return {**out, "reads": {str(s): v for s, v in reads.items()}}


def tp_results() -> dict | None:
    """``tp_measure`` in a child Python (``python -m calibrate.bench_deepspeed_pipe
    --tp-json``, at this process's ``TRIALS``); None, with its error on stderr, if it fails."""
    import json
    import subprocess
    import tempfile
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tp.json"
        r = subprocess.run([sys.executable, "-m", __name__, "--tp-json", str(path), "--trials",
                            str(TRIALS)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=TP_TIMEOUT_S, check=False)
        if r.returncode or not path.exists():
            print(f"{MECHANISM}: tensor-parallel hand-offs skipped, the child failed (rc "
                  f"{r.returncode}): {r.stderr[-3000:]}", file=sys.stderr)
            return None
        return json.loads(path.read_text())


# ---- rows -------------------------------------------------------------------------------------
STAGE_NAMES = {0: ("first stage", "LoadMicroBatch, ForwardPass, SendActivation, RecvGrad, "
                   + "BackwardPass"),
               1: ("last stage", "RecvActivation, LoadMicroBatch (labels), ForwardPass with "
                   + "loss, BackwardPass, SendGrad")}
TP_TAG = f"TP {TP} partitioned hand-offs (PartitionedTensor)"
SUFFIX = {**dict.fromkeys(PASSES, ", beyond the bare stage's pass"), "ReduceGrads": ", per step",
          "ReduceTiedGrads": ", per step", "OptimizerStep": ", per step, SGD's step included"}


def _suspect(res: dict, host: str, what: str) -> str:
    """'' on a quiet host; else a warning on stderr, and the rows' tag: busy (CPU pressure
    over ``bench.PRESSURE_SUSPECT``) or slowed beyond what PSI sees (the probe over ``SLOW``
    x the median probe of this host's rows in ``CSV``)."""
    import csv
    import statistics

    from .bench import PRESSURE_SUSPECT
    rows = csv.DictReader(CSV.read_text().splitlines()) if CSV.exists() else []
    ops = [float(r["op_fwd_us_same_run"]) for r in rows if r["host"] == host]
    med = statistics.median(ops) if ops else res["op"]
    why = ([f"busy, {res['pressure']:.0%} CPU pressure"] * (res["pressure"] > PRESSURE_SUSPECT)
           + [f"slow, probe {res['op']:.1f} us > {SLOW:g} x {med:.1f}"] * (res["op"] > SLOW * med))
    if why:
        print(f"{MECHANISM}: host {'; '.join(why)} during {what}, rows suspect", file=sys.stderr)
    return f"SUSPECT (host {'; '.join(why)}); " if why else ""


def schedule_text() -> str:
    """Each stage's instructions per micro-batch and per step, from ``TrainSchedule``."""
    parts = []
    for s in range(STAGES):
        mb, st = per_unit({m: instruction_counts(m, s) for m in MICRO_BATCHES})
        parts.append(f"stage {s}: per micro-batch " + ", ".join(f"{k} {v:g}" for k, v in
                     mb.items()) + "; per step " + ", ".join(f"{k} {v:g}" for k, v in st.items()))
    return f"TrainSchedule ({STAGES} stages, 'steps': its schedule steps) " + " | ".join(parts)


def values(res: dict, tp: bool = False) -> list[tuple[str, float]]:
    """(metric, us) of ``measure_pipe``'s result, or (``tp``) of ``tp_measure``'s."""
    vals = []
    for s, c in res["stages"].items():
        name, instr = STAGE_NAMES[int(s)]
        mb, st = per_unit({m: instruction_counts(m, int(s)) for m in MICRO_BATCHES})
        inst = sorted(c["instructions"].items())
        if tp:
            vals += [(f"{TP_TAG}, per micro-batch, {name}, beyond unpartitioned", c["per_mb"]),
                     (f"{TP_TAG}, per step, {name}, beyond unpartitioned", c["per_step"])]
            vals += [(f"{TP_TAG}, instrumented {k} per call, {name}, beyond unpartitioned", v)
                     for k, v in inst if k in mb]
            continue
        n = sum(v for k, v in mb.items() if k != "steps")
        vals += [(f"per micro-batch, {name} ({instr}), beyond the bare model, fwd+bwd",
                  c["per_mb"]),
                 (f"per instruction, {name}, per micro-batch cost / {n:g} instructions",
                  c["per_mb"] / n),
                 (f"per step, rest, {name} (ReduceTiedGrads, ReduceGrads, OptimizerStep beyond "
                  + "SGD's step with gradient clipping, loss aggregation, fill and drain steps)",
                  c["per_step"]),
                 (f"per step, gradient clipping at DeepSpeed's default 1.0, {name}, "
                  + f"{c['tensors']} parameter tensors", c["clip"])]
        vals += [(f"instrumented {k} per call, {name}{SUFFIX.get(k, '')}", v) for k, v in inst
                 if k in mb or k in st]
    return vals


def _method(op: float, pressure: float, tp: bool, reads: str) -> str:
    lo, hi = MICRO_BATCHES
    grid = (f"fake pg x{STAGES * TP} in a child process, grid pipe {STAGES} x model {TP}, "
            "partitioned (DeepSpeed's default) - pipe_partitioned/grad_partitioned off"
            if tp else f"fake pg x{STAGES}, each stage - the bare stage (nn.Sequential of its "
            "layers: M x forward+backward, then SGD step and zero_grad); gradient clipping = "
            "the engine - the engine with gradient_clipping 0, at M 1")
    return (f"DeepSpeed {version()} PipelineEngine.train_batch (DS_ACCELERATOR=cpu, fp32, ZeRO "
            "stage 0, client SGD, steps_per_print None), probe decoder (hidden 32, seq 8) as a "
            f"PipelineModule of LayerSpecs in {STAGES} stages (first: embedding + "
            f"{BLOCKS_PER_STAGE} block, last: {BLOCKS_PER_STAGE} block + final norm + logits, "
            "cross-entropy loss_fn), rank 0 placed at each stage by a rotated topology; "
            f"{grid}; M = {lo} and {hi} micro-batches per step: slope per micro-batch, "
            "intercept per step; sends/receives no-ops on the fake group after one priming "
            "step over an in-process loopback; timed interleaved with the host probe (fwd op "
            f"{op:.2f} us, CPU pressure {pressure:.2f}); instrumented: each _INSTRUCTION_MAP "
            f"method timed in the schedule at M {hi} (and the bare passes), all interleaved "
            f"call by call, median per call; {schedule_text()}; {reads}")


def rows(base: dict) -> list[dict]:
    """``deepspeed_pipe_engine`` rows: the pipeline engine's (``measure_pipe``), its TP
    hand-offs' (``tp_results``), its per-step cost per tensor's (``step_rows``), each in the
    eager ops of its own run's probe; none, with a message on stderr, without DeepSpeed."""
    from .bench_dp import _mechanism_rows
    why = available()
    if why:
        print(f"{MECHANISM} skipped: {why}", file=sys.stderr)
        return []
    out = []
    for res, tp in ((measure_pipe(), False), (tp_results(), True)):
        if res is None:
            continue
        tag = _suspect(res, base.get("host", ""), "the TP timing" if tp else "the timing")
        how = tag + _method(res["op"], res["pressure"], tp, reads_text(res["reads"]))
        out += _mechanism_rows({**base, "op_fwd_us_same_run": round(res["op"], 2)}, res["op"],
                               MECHANISM, how, values(res, tp))
    return out + step_rows(base, sys.modules[__name__])     # per tensor, per step


def main(argv: list[str] | None = None) -> int:
    """The child of ``tp_results``: ``tp_measure``'s result as JSON into ``--tp-json``."""
    import argparse
    import json
    global TRIALS
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_deepspeed_pipe")
    ap.add_argument("--tp-json", required=True, help="write tp_measure()'s result here")
    ap.add_argument("--trials", type=int, default=TRIALS)
    args = ap.parse_args(argv)
    TRIALS = args.trials
    Path(args.tp_json).write_text(json.dumps(tp_measure()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
