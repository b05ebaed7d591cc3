"""Host work Megatron's training loop adds per micro-batch outside the model, on this CPU
(``python -m calibrate.bench_framework --only mcore_train_loop`` appends one run's rows;
``python -m calibrate.bench_mcore_loop [--runs 3]`` prints runs and their spread).

Megatron-Core's own ``get_forward_backward_func()`` (pp 1: ``forward_backward_no_pipelining``)
drives ``bench_mcore_ddp``'s bare ``Float16Module(GPTModel)`` (bf16; DDP left out: its hooks
are ``mcore_ddp_hooks``, its ``no_sync`` / ``finalize_model_grads`` ``mcore_dist_optimizer``,
so ``config.no_sync_func`` / ``finalize_model_grads_func`` stay None) with the config fields
Megatron-LM's ``train`` sets, and a ``forward_step_func`` re-expressing core_r0.8.0's
``pretrain_gpt`` ``forward_step`` / ``get_batch`` / ``loss_func`` (line numbers at each
function) over a torch ``DataLoader`` built as ``data_samplers.py`` builds it, on an
in-memory dataset of ``GPTDataset`` items (attention mask included: r0.8.0's default).
CPU stand-ins: ``.cuda(non_blocking=True)`` = a CPU ``_to_copy``; ``pin_memory=True`` is a
no-op without an accelerator (no pin thread: the main thread unpickles the workers'
batches); broadcasts and all-reduces are calls into a fake 2-rank group (tp 1, dp 2).
Timed (thread CPU time, interleaved with the host probe, ``bench_mcore_ddp.time_phases``):
the schedule on a null forward (one multiply: the schedule never looks inside the model)
with a trivial step against the same forward + ``sum().backward()`` called directly, and
with the script's step, at 1 and 4 micro-batches; the script's pieces called alone; checks
with the real model. A noisy run is re-timed after a pause (``bench_hf_host.noise``).
"""
from __future__ import annotations

import argparse
import functools
import sys
import types

from .bench_mcore_ddp import HIDDEN, TOKENS, VOCAB

MECHANISM = "mcore_train_loop"
MICRO = (1, 4)                 # micro-batches per step: per step vs per micro-batch
WORKERS = 2                    # Megatron's default --num-workers (r0.8.0 arguments.py L1545)
TRIALS, REPEATS = 40, 3
CALLS = 10                     # calls of a piece per timed phase
WAIT_S = 300.0                 # of pauses while re-measuring on a busy host
ITEMS, SAMPLES = 8, 1 << 24    # distinct sequences; the sampler's sample count (never reached)
ARGS = types.SimpleNamespace(  # get_args() of a pp 1, tp 1, cp 1 run with r0.8.0's defaults
    micro_batch_size=1, seq_length=TOKENS, pipeline_model_parallel_size=1,
    context_parallel_size=1, check_for_nan_in_loss_and_grad=True,
    create_attention_mask_in_dataloader=True)


def available() -> str:
    """'' when Megatron-Core imports, else why not."""
    from .bench_mcore_host import available as mc_available
    return mc_available()


def get_args():            # megatron.training.get_args
    return ARGS


# ---- the data path: dataset, sampler, loader -------------------------------------------------
class InMemoryGPTData:
    """Item ``i``: ``GPTDataset.__getitem__``'s dict (r0.8.0 gpt_dataset.py L161-232)."""

    def __init__(self, items: list[dict], length: int = SAMPLES) -> None:
        self.items, self.length = items, length

    def __len__(self) -> int:                   # not read by a batch_sampler's DataLoader
        return self.length

    def __getitem__(self, idx: int) -> dict:
        return self.items[idx % len(self.items)]


def sample_items(n: int = ITEMS) -> list[dict]:
    import torch
    gen = torch.Generator().manual_seed(0)
    mask = torch.tril(torch.ones(1, TOKENS, TOKENS)) < 0.5       # utils.py L227: True = masked
    out = []
    for _ in range(n):
        text = torch.randint(0, VOCAB, (TOKENS + 1,), generator=gen)
        out.append({"tokens": text[:-1].clone(), "labels": text[1:].clone(),
                    "attention_mask": mask, "loss_mask": torch.ones(TOKENS),
                    "position_ids": torch.arange(TOKENS)})
    return out


class PretrainingSampler:
    """``MegatronPretrainingSampler`` (legacy/data/data_samplers.py L54-100): of every
    ``micro_batch x dp`` consecutive indices, this data-parallel rank's ``micro_batch``."""

    def __init__(self, total: int, consumed: int, micro_batch: int, dp_rank: int,
                 dp_size: int) -> None:
        self.total, self.consumed, self.mb = total, consumed, micro_batch
        self.dp_rank, self.step = dp_rank, micro_batch * dp_size

    def __iter__(self):
        batch, lo = [], self.dp_rank * self.mb
        for idx in range(self.consumed, self.total):
            batch.append(idx)
            if len(batch) == self.step:
                yield batch[lo:lo + self.mb]
                batch = []


def data_iterator(workers: int):
    """``iter(DataLoader)`` as r0.8.0 builds it (data_samplers.py L47-52; ``--dataloader-type
    single``), data-parallel rank 0 of 2."""
    import torch
    loader = torch.utils.data.DataLoader(
        InMemoryGPTData(sample_items()), batch_sampler=PretrainingSampler(
            SAMPLES, 0, ARGS.micro_batch_size, 0, 2),
        num_workers=workers, pin_memory=True, persistent_workers=workers > 0)
    return iter(loader)


def worker_cpu_s(it) -> float:
    """CPU seconds the iterator's worker processes have used (``/proc/<pid>/stat``)."""
    import os
    total = 0.0
    for w in getattr(it, "_workers", []):
        try:
            with open(f"/proc/{w.pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


# ---- the training script's per-micro-batch code, re-expressed from core_r0.8.0 ---------------
def to_device(t):
    """Stand-in for ``t.cuda(non_blocking=True)``: a copy through the same ``_to_copy``."""
    return t.to("cpu", non_blocking=True, copy=True)


def _broadcast(item) -> None:
    """utils.py L306-308: a tensor-parallel broadcast from the group's source rank."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    if item is not None:
        dist.broadcast(item, mpu.get_tensor_model_parallel_src_rank(),
                       group=mpu.get_tensor_model_parallel_group())


def _src_batch(data_iterator) -> dict:
    """utils.py L312-323: the next batch and its five copies to the device."""
    data = next(data_iterator) if data_iterator is not None else None
    return {"tokens": to_device(data["tokens"]), "labels": to_device(data["labels"]),
            "loss_mask": to_device(data["loss_mask"]),
            "attention_mask": None if "attention_mask" not in data
            else to_device(data["attention_mask"]),
            "position_ids": to_device(data["position_ids"])}


def _empty_batch(args) -> dict:
    """utils.py L344-353: a non-source rank's receive buffers."""
    import torch
    mb, s = args.micro_batch_size, args.seq_length
    return {"tokens": torch.empty((mb, s), dtype=torch.int64, device="cpu"),
            "labels": torch.empty((mb, s), dtype=torch.int64, device="cpu"),
            "loss_mask": torch.empty((mb, s), dtype=torch.float32, device="cpu"),
            "attention_mask": torch.empty((mb, 1, s, s), dtype=torch.bool, device="cpu")
            if args.create_attention_mask_in_dataloader else None,
            "position_ids": torch.empty((mb, s), dtype=torch.int64, device="cpu")}


BROADCASTS = {"all": ("tokens", "labels", "loss_mask", "attention_mask", "position_ids"),
              "first": ("tokens", "attention_mask", "position_ids"),
              "last": ("labels", "loss_mask", "attention_mask")}     # utils.py L325-340


def batch_on_tp_rank(data_iterator, src: bool = True) -> dict:
    """``get_batch_on_this_tp_rank`` (utils.py L302-386): the tensor-parallel source rank
    reads and copies the batch, the others allocate buffers; then the stage's broadcasts
    (with pp > 1 a non-source rank also sets the unused ones None, L362-376: left out)."""
    from megatron.core import parallel_state as mpu
    args = get_args()
    batch = _src_batch(data_iterator) if src else _empty_batch(args)
    stage = "all" if args.pipeline_model_parallel_size == 1 else (
        "first" if mpu.is_pipeline_first_stage() else "last")
    for name in BROADCASTS[stage]:
        _broadcast(batch[name])
    return batch


def batch_on_cp_rank(batch: dict) -> dict:
    """``get_batch_on_this_cp_rank`` (utils.py L232-262) at context parallel size 1."""
    assert get_args().context_parallel_size == 1, "cp > 1 is not re-expressed here"
    return batch


def get_batch(data_iterator):
    """pretrain_gpt.py L96-109: middle stages return early; tensor- then context-parallel
    slices."""
    from megatron.core import parallel_state as mpu
    if not mpu.is_pipeline_first_stage() and not mpu.is_pipeline_last_stage():
        return None, None, None, None, None
    return batch_on_cp_rank(batch_on_tp_rank(data_iterator)).values()


def loss_func(loss_mask, output_tensor):
    """The tensor work of r0.8.0's ``loss_func`` (pretrain_gpt.py L112-152), written here as
    a list of the same torch calls (not its code): both inputs to fp32, the masked loss sum
    and the token count in one 2-vector, the context-parallel all-reduce (cp > 1 only), the
    NaN assertion (its ``bool`` is a device sync on a GPU), a detached copy all-reduced over
    data parallelism for reporting, the local token count as int."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    cfg = get_args()
    per_token, weight = output_tensor.float().view(-1), loss_mask.view(-1).float()
    pair = torch.cat([(per_token * weight).sum().view(1), weight.sum().view(1)])
    if cfg.context_parallel_size > 1:
        dist.all_reduce(pair, group=mpu.get_context_parallel_group())
    if cfg.check_for_nan_in_loss_and_grad and bool(pair[0].isnan()):
        raise FloatingPointError(f"rank {dist.get_rank()}: NaN loss")
    shown = pair.clone().detach()
    dist.all_reduce(shown, group=mpu.get_data_parallel_group())
    tokens = pair[1].clone().detach().to(torch.int)
    return pair[0] * cfg.context_parallel_size, tokens, {"lm loss": (shown[0], shown[1])}


@functools.cache
def _timers_and_stimer():
    from megatron.core.timers import Timers
    from megatron.core.utils import StragglerDetector
    return Timers(0, "minmax"), StragglerDetector()     # --timing-log-level 0, its default


def pretrain_step(call):
    """pretrain_gpt.py L155-177 ``forward_step``, the model call being ``call(model, tokens,
    position_ids, attention_mask, labels)``."""
    def forward_step(data_iterator, model):
        timers, stimer = _timers_and_stimer()
        get_args()
        timers("batch-generator", log_level=2).start()
        with stimer(bdata=True):
            tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator)
        timers("batch-generator").stop()
        with stimer:
            output_tensor = call(model, tokens, position_ids, attention_mask, labels)
        return output_tensor, functools.partial(loss_func, loss_mask)
    return forward_step


def average_losses(losses_reduced: list[dict]) -> dict:
    """The arithmetic of r0.8.0's ``train_step`` on the last stage (training.py L633-651),
    not its code: per key, the micro-batches' reported (sum, count) pairs added up and
    divided (a plain value counts 1)."""
    def pair(v):
        return (v[0], v[1]) if isinstance(v, (tuple, list)) else (v, 1)
    out = {}
    for key in losses_reduced[0]:
        total = count = 0
        for a, b in (pair(x[key]) for x in losses_reduced):
            total, count = total + a, count + b
        out[key] = total / count
    return out


# ---- the model, the schedule, the timed phases -----------------------------------------------
@functools.cache
def _loop_shims() -> None:
    """``bench_mcore_ddp``'s stand-ins and parallel state (fake 2-rank group: tp 1, dp 2),
    and the schedules' ``torch.zeros(..., device='cuda')`` on the CPU."""
    import megatron.core.pipeline_parallel.schedules as sch

    from . import bench_mcore_ddp as dd
    dd._shims()
    sch.torch = dd.torch_on_cpu()


def train_model(layers: int = 1):
    """``bench_mcore_ddp``'s bare ``Float16Module(GPTModel)`` with the config fields
    Megatron-LM's ``train`` sets (training.py L992-1010, arguments.py L619)."""
    import torch

    from .bench_mcore_ddp import _model
    _loop_shims()
    model, cfg = _model(layers, False)
    scale_one = torch.tensor([1.0])                      # optimizer.py L328-333 (bf16)
    cfg.grad_scale_func = lambda loss: scale_one * loss  # optimizer.py L190-192 scale_loss
    cfg.timers = _timers_and_stimer()[0]
    cfg.deallocate_pipeline_outputs = True
    cfg.no_sync_func = cfg.finalize_model_grads_func = None   # bare model; see the docstring
    return model


def model_calls():
    """(null, real, batch, leaf): ``call(model, tokens, position_ids, attention_mask,
    labels)`` as one multiply of ``leaf`` (per-token loss shape) or the model; a batch."""
    import torch

    from .bench_mcore_ddp import _batch
    ids, pos, mask = _batch()
    leaf = torch.zeros(1, TOKENS, requires_grad=True)

    def null(model, tokens, position_ids, attention_mask, labels):
        return leaf * 1.0

    def real(model, tokens, position_ids, attention_mask, labels):
        return model(tokens, position_ids, attention_mask, labels=labels)
    return null, real, (ids, pos, mask, ids), leaf


def trivial_step(call, batch):
    """A ``forward_step_func``: the forward and a trivial loss (sum, token count, {})."""
    import torch
    tokens = torch.tensor(TOKENS, dtype=torch.int)

    def trivial_loss(output_tensor):
        return output_tensor.sum(), tokens, {}

    def forward_step(data_iterator, model):
        return call(model, *batch), trivial_loss
    return forward_step


def direct(call, model, batch, k: int):
    """``k`` micro-batches without the schedule: the forward, ``sum().backward()``."""
    def run():
        for _ in range(k):
            call(model, *batch).sum().backward()
    return run


def scheduled(step_func, model, it, k: int):
    """One ``train_step``'s ``forward_backward_func`` call (training.py L589-598)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def run():
        fbf = get_forward_backward_func()
        return fbf(forward_step_func=step_func, data_iterator=it, model=[model],
                   num_microbatches=k, seq_length=TOKENS, micro_batch_size=1,
                   decoder_seq_length=None, forward_only=False)
    return run


def _repeat(fn, n: int = CALLS):
    def run():
        for _ in range(n):
            fn()
    return run


def _piece_phases(model1, model5, real, batch, it0) -> list[tuple[str, object]]:
    """get_batch, its parts, loss_func, loss averaging, set_current_microbatch (x ``CALLS``)."""
    import itertools

    import megatron.core.pipeline_parallel.schedules as sch
    data = next(it0)
    held = batch_on_tp_rank(itertools.repeat(data))
    out = real(model1, *batch)                      # per-token losses, requiring grad
    stores = {k: [loss_func(held["loss_mask"], out)[2] for _ in range(k)] for k in MICRO}

    def broadcasts():
        for name in BROADCASTS["all"]:
            _broadcast(held[name])
    return ([("next_w0", _repeat(lambda: next(it0))),
             ("copies", _repeat(lambda: _src_batch(itertools.repeat(data)))),
             ("broadcasts", _repeat(broadcasts)),
             ("get_batch_w0", _repeat(lambda: get_batch(it0))),
             ("get_batch_tp_other", _repeat(lambda: batch_on_tp_rank(None, src=False))),
             ("loss_func", _repeat(lambda: loss_func(held["loss_mask"], out)))]
            + [(f"avg{k}", _repeat(functools.partial(average_losses, stores[k])))
               for k in MICRO]
            + [("set_mb1", _repeat(lambda: sch.set_current_microbatch(model1, 0))),
               ("set_mb5", _repeat(lambda: sch.set_current_microbatch(model5, 0)))])


LOOP, MODEL, PIECES = ("loop", 1, False), ("model", 1, False), ("pieces", 1, False)


def setups() -> tuple[dict, list]:
    """(timed setups, data iterators to close): ``LOOP`` (null forward), ``MODEL`` (real model;
    the workers' loader between long phases: prefetch refilled), ``PIECES``; '_' untimed."""
    from .bench_mcore_ddp import _probe_phases
    model1, model5 = train_model(1), train_model(5)
    null, real, batch, leaf = model_calls()
    it0, it2 = data_iterator(0), data_iterator(WORKERS)
    params = list(model1.parameters())

    def zero():
        for p in params:
            p.grad = None
        leaf.grad = None
    z, hi = ("_zero", zero), MICRO[-1]
    loop = []
    for k in MICRO:
        loop += [z, (f"direct{k}", direct(null, model1, batch, k)),
                 z, (f"triv{k}", scheduled(trivial_step(null, batch), model1, None, k)),
                 z, (f"full{k}", scheduled(pretrain_step(null), model1, it0, k))]
    warm = ("_warm", direct(real, model1, batch, 1))     # the model's code warm again
    real_loop = [z, (f"full{hi}_w2", scheduled(pretrain_step(null), model1, it2, hi)), warm,
                 z, (f"direct{hi}_m", direct(real, model1, batch, hi)),
                 z, (f"triv{hi}_m", scheduled(trivial_step(real, batch), model1, None, hi)),
                 ("next_w2", lambda: next(it2)), warm,
                 z, (f"full{hi}_m", scheduled(pretrain_step(real), model1, it0, hi)),
                 ("get_batch_w2", lambda: get_batch(it2))]
    out = {("probe", n, False): _probe_phases(n) for n in (1, 5)}
    out.update({LOOP: loop, MODEL: real_loop,
                PIECES: _piece_phases(model1, model5, real, batch, it0)})
    return out, [it0, it2]


def op_counts(built: dict) -> dict[str, int]:
    """Aten ops (not views; each a kernel on a GPU) each timed phase dispatches, once."""
    from .bench_host import aten_kernel_ops
    out = {}
    for key in (LOOP, PIECES):
        for name, fn in built[key]:
            n = aten_kernel_ops(fn)
            if not name.startswith("_"):
                out[name] = n / (CALLS if key == PIECES else 1)
    return out


def per_call(t: dict) -> dict[str, float]:
    """Us per call of every phase (``PIECES``' phases run ``CALLS`` calls)."""
    return {**t[LOOP], **t[MODEL], **{k: v / CALLS for k, v in t[PIECES].items()}}


def _line(u: dict, a: str, b: str) -> tuple[float, float]:
    """(per micro-batch, per step) of phase ``a{k}`` minus ``b{k}`` over ``MICRO``."""
    (lo, hi), d = MICRO, {k: u[f"{a}{k}"] - (u[f"{b}{k}"] if b else 0.0) for k in MICRO}
    per = (d[hi] - d[lo]) / (hi - lo)
    return per, d[lo] - lo * per


def values(u: dict) -> list[tuple[str, float]]:
    """(metric, us) rows from ``per_call`` timings."""
    hi, w, g, gb = MICRO[-1], WORKERS, "get_batch alone", u["get_batch_w0"]
    sched, full, avg = _line(u, "triv", "direct"), _line(u, "full", "triv"), _line(u, "avg", "")
    workers = (u[f"full{hi}_w2"] - u[f"full{hi}"]) / hi
    return [("schedule (forward_backward_no_pipelining: forward_step/backward_step wrappers, "
             "loss scaling, data store), per micro-batch", sched[0]),
            ("schedule, per step (finalize_model_grads and no_sync excluded)", sched[1]),
            ("forward_step + get_batch (workers 0) + loss_func fwd and bwd beyond a trivial "
             "step, in the schedule, per micro-batch", full[0]),
            ("same, per step (check: about 0)", full[1]),
            (f"DataLoader num_workers {w} over 0 in the schedule, main thread, per micro-batch",
             workers),
            (f"{g}, TP source rank, num_workers 0 (next + 5 copies + 5 broadcasts)", gb),
            (f"{g}, DataLoader next, num_workers 0", u["next_w0"]),
            (f"{g}, 5 .cuda(non_blocking) copies (CPU stand-in)", u["copies"]),
            (f"{g}, 5 TP broadcasts (fake group calls)", u["broadcasts"]),
            (f"{g}, rest (stage checks, dict, cp slice)",
             gb - u["next_w0"] - u["copies"] - u["broadcasts"]),
            (f"{g}, num_workers {w} over 0, main thread", u["get_batch_w2"] - gb),
            (f"DataLoader next alone, num_workers {w}, main thread", u["next_w2"]),
            (f"{g}, TP non-source rank (5 torch.empty + 5 broadcasts)", u["get_batch_tp_other"]),
            ("loss_func alone, forward ops (incl. isnan check, DP all_reduce call)",
             u["loss_func"]),
            ("train_step loss averaging (last stage), per micro-batch", avg[0]),
            ("train_step loss averaging (last stage), per step", avg[1]),
            ("set_current_microbatch, per decoder layer (core 0.16.1 only)",
             (u["set_mb5"] - u["set_mb1"]) / 4),
            (f"check: schedule per micro-batch with the real model ({hi} micro-batches)",
             (u[f"triv{hi}_m"] - u[f"direct{hi}_m"] - sched[1]) / hi),
            (f"check: script's step over trivial per micro-batch with the real model ({hi})",
             (u[f"full{hi}_m"] - u[f"triv{hi}_m"] - full[1]) / hi),
            (f"total per micro-batch (pp 1, TP source rank, num_workers {w}): schedule + "
             "script's step + workers + loss averaging", sched[0] + full[0] + workers + avg[0])]


def op_text(n: dict) -> str:
    """Aten ops per micro-batch of the pieces (``op_counts``)."""
    s, f = _line(n, "triv", "direct"), _line(n, "full", "triv")
    return (f"aten ops (not views) per micro-batch: schedule {s[0]:g} (+{s[1]:g} per step), "
            f"script's step over trivial {f[0]:g}, get_batch {n['get_batch_w0']:g} (next "
            f"{n['next_w0']:g}, copies {n['copies']:g}), loss_func {n['loss_func']:g}")


# ---- measuring -------------------------------------------------------------------------------
def _time_quiet(built: dict, iters: list, trials: int, repeats: int,
                label: str = MECHANISM) -> tuple[dict, list]:
    """``bench_mcore_ddp.time_phases`` of ``built`` (``iters``: DataLoader iterators whose
    workers' CPU time is the run's own), re-timed after a backoff pause while noisy
    (``bench_hf_host.noise``) within ``WAIT_S``: (timings, each attempt's noise)."""
    from .bench import until_quiet
    from .bench_hf_host import _host_name, _recorded_probe_us, noise
    from .bench_mcore_ddp import probe_op, time_phases
    from .store import ForeignLoadMeter
    usual = _recorded_probe_us(_host_name())

    def attempt():
        meter, w0 = ForeignLoadMeter().start(), sum(map(worker_cpu_s, iters))
        t, pressure = time_phases(built, trials, repeats)
        own = meter.stop()[0] + sum(map(worker_cpu_s, iters)) - w0
        res = {"t": t, "op": probe_op(t), "pressure": pressure, "foreign": meter.foreign(own)}
        return res, noise(pressure, res["foreign"], res["op"]["fwd"], usual)
    return until_quiet(attempt, WAIT_S, f"{label}: ")


def measure(trials: int = TRIALS, repeats: int = REPEATS) -> dict | None:
    """One run (timings, us per call, probe, noise, aten ops); None without Megatron-Core."""
    why = available()
    if why:
        print(f"{MECHANISM} skipped: {why}", file=sys.stderr)
        return None
    from .bench_mcore_host import one_thread_no_warnings
    with one_thread_no_warnings():
        built, iters = setups()
        try:
            res, attempts = _time_quiet(built, iters, trials, repeats)
            counts = op_counts(built)
        finally:
            for it in iters:
                getattr(it, "_shutdown_workers", lambda: None)()
    return {**res, "u": per_call(res["t"]), "attempts": attempts, "counts": counts,
            "trials": trials, "repeats": repeats}


def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may)."""
    v, op = dict(values(m["u"])), m["op"]["fwd"]
    bad = [f"noisy: {m['attempts'][-1]}"] * bool(m["attempts"][-1])
    bad += [f"probe per-op cost {op:.2f} us out of range"] * (not 0 < op < 1e3)
    return bad + [f"{k} not positive" for k, x in v.items()
                  if x <= 0 and k.startswith(("schedule (", "forward_step +", "get_batch alone,"
                                              " TP source", "loss_func"))]


def _method(m: dict) -> str:
    import megatron.core
    return (f"megatron-core {megatron.core.__version__} get_forward_backward_func() (pp 1) on "
            f"the bare Float16Module(GPTModel) local spec (bf16, hidden {HIDDEN}, {TOKENS} "
            "tokens) with grad_scale_func, Timers(0), deallocate_pipeline_outputs; "
            "forward_step_func = core_r0.8.0 pretrain_gpt forward_step/get_batch/loss_func "
            "re-expressed (calibrate.bench_mcore_loop), DataLoader(MegatronPretrainingSampler "
            f"re-expressed, pin_memory=True: no-op without an accelerator, num_workers 0 and "
            f"{WORKERS}) over an in-memory GPTDataset-style dict with attention_mask; .cuda() = "
            "CPU _to_copy; TP broadcasts and DP all_reduce on a fake 2-rank group (tp 1, dp 2; "
            "calls only); schedule on a null forward (one multiply), 1 vs "
            f"{MICRO[-1]} micro-batches, checked with the real model; thread CPU time "
            f"interleaved with the host probe (p10 of {m['trials']} trials x {m['repeats']}; "
            f"bwd op {m['op']['bwd']:.2f} us; CPU pressure {m['pressure']:.2f}, foreign load "
            f"{m['foreign']:.2f}, attempts {len(m['attempts'])}); {op_text(m['counts'])}")


def rows_of(m: dict, base: dict) -> list[dict]:
    from .bench_dp import probe_rows
    return probe_rows(m, base, MECHANISM, _method(m), values(m["u"]))


def rows(base: dict) -> list[dict]:
    """``bench_framework``'s entry: one run's rows in its own probe's units; none, with a
    message, without Megatron-Core or when the run is unfit."""
    from .bench import checked_rows
    return checked_rows(MECHANISM, sys.modules[__name__], base)


def print_table(m: dict, out=sys.stderr) -> None:
    op = m["op"]["fwd"]
    print(f"probe fwd {op:.2f} us/op; pressure {m['pressure']:.2f}, foreign {m['foreign']:.2f}"
          f"; attempts: {' | '.join(a or 'quiet' for a in m['attempts'])}", file=out)
    print("us per call: " + ", ".join(f"{k} {v:.1f}" for k, v in m["u"].items()), file=out)
    for k, v in values(m["u"]):
        print(f"{v / op:8.3f} eo {v:9.2f} us  {k}", file=out)
    print(op_text(m["counts"]), file=out)


def main(argv: list[str] | None = None) -> int:
    """``--runs`` runs printed, then each row's eager ops over the fit runs; nothing is
    written (``calibrate.bench_framework --only mcore_train_loop`` appends one run)."""
    import statistics
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_mcore_loop")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trials", type=int, default=TRIALS)
    args = ap.parse_args(argv)
    good = []
    for _ in range(args.runs):
        m = measure(args.trials)
        if m is None:
            return 1
        print_table(m)
        good += [] if problems(m) else [[(k, v / m["op"]["fwd"]) for k, v in values(m["u"])]]
    for i, (metric, _) in enumerate(good[0] if good else []):
        v = [run[i][1] for run in good]
        print(f"{statistics.median(v):8.3f} eo median of {', '.join(f'{x:.3f}' for x in v)}"
              f"  {metric}")
    return 0 if good else 2


if __name__ == "__main__":
    sys.exit(main())
