"""Host cost of DeepSpeed's ZeRO stage 3 optimizer step, measured on this CPU
(``python -m calibrate.bench_deepspeed_zero3_step [--runs 3] [--write]``; mechanism
``deepspeed_zero3_optimizer``).

What runs (DeepSpeed 0.19.8): ``engine.step()`` at the gradient-accumulation boundary of a
ZeRO-3 engine, ``DeepSpeedZeroOptimizer_Stage3.step`` (runtime/zero/stage3.py 2873-2949)
inside the engine's ``_take_model_step`` (runtime/engine.py 3505-3565), on the probe decoder
of ``calibrate.bench_host`` as ``bench_deepspeed_step`` builds it (``LAYERS`` layers, blocks of
6 and 9 parameter tensors, hidden 32 and 8) on the same fake 2-rank group (DS_ACCELERATOR=cpu,
rank 0; every collective a call only). ``KINDS``: bf16 or fp16 (dynamic loss scale from
2^``FP16_SCALE_POWER``), the client ``torch.optim.AdamW(fused=True)`` or DeepSpeed's FusedAdam
(``"optimizer": {"type": "AdamW"}``); ``contiguous_gradients`` and ``overlap_comm`` at their
stage-3 defaults (both on; the CPU accelerator's streams are no-ops), ``sub_group_size`` its
default 1e9 (one sub-group here and for any model below 1e9 partition elements),
``gradient_clipping`` 1.0, ``steps_per_print`` inf, the bucket sizes of HF's "auto" at the
hidden size (``bench_deepspeed.config``), ``memory_efficient_linear`` off (it replaces
``F.linear`` process-wide, which would slow the host probe; the step does not use it).
``stage3_param_persistence_threshold`` is ``PERSIST`` x hidden, so that, as at real sizes
under DeepSpeed's default 1e5, the norms persist and every matrix is partitioned; each size
also runs with the threshold 0 (nothing persistent), so that the per-persistent-tensor work
(``partition_all_parameters`` releases every parameter, ``_post_step`` all-gathers the
persistent ones again) is told apart from the per-tensor work.

The step in its pieces (``UNIT``; ``step_parts``), in source order: ``pre_step``
(``_pre_step`` 2539-2571), ``partition_all`` (``_partition_all_parameters`` 3322: every
parameter released, partitioned again where it was whole), ``overflow``
(``_overflow_check_and_loss_scale_update(update_scale=False)`` 2811-2820: fp16 only),
``grad_norm`` (``_get_norm_groups`` 2573-2584, ``get_grad_norm_direct`` 2419-2486 over every
tensor's gradient partition, ``combine_grad_norm_groups``, ``is_invalid_grad_norm``),
``scale`` (``_loss_scale_update_and_overflow_cleanup`` and the stashed norm), ``zero_grad_in_step``
(2905-2907), per sub-group ``prepare`` (``_prepare_sub_group``: the gradient partitions
flattened into the fp32 gradient), ``unscale_clip``, ``inner_step`` (``_optimizer_step``:
the client optimizer on the one flat fp32 partition), ``copy_back``
(``_reassign_or_swap_out_partitioned_parameters``: the fp32 partition copied to the 16-bit
one, whose per-tensor views are put back) and ``release``; ``post_step`` (``_post_step``
2835-2851: the persistent parameters' all-gather, ``invalidate_secondary_tensor``),
``alloc_check`` (2933-2949: the accelerator's ``memory_stats()``, here the CPU accelerator's
psutil read); then the engine's ``zero_grad`` (engine.py 3527-3534 calls the optimizer's
again) and ``glue`` (``engine.step()`` with the optimizer's ``step`` and ``zero_grad`` done:
``bench_deepspeed_step._glue``). ``engine.step()`` whole is timed in the same round (check).
GPU-only Python timed alongside as stand-ins (``STANDINS``, not in the pieces' sum):
``record_streams`` (``_prepare_fp32_grad_for_sub_group`` 2695-2697: on a GPU, where the
device is not synchronized, a filter with ``on_accelerator`` and a ``record_stream`` per
gradient partition; here the filter and a Python call in place of ``record_stream``) and
``cuda_memory_stats`` (``torch.cuda.memory_stats()``'s flattening and sort of the caching
allocator's nested statistics, ``CUDA_STATS``' 122 values, in place of the CPU accelerator's
psutil read; the C++ call that builds the dictionary is not timed).

Fits (``phase_fits``): per piece least squares over the sizes: fixed + per tensor of each
unit the piece loops over (``model``: the model's parameter tensors, every rank holds a
partition of each; ``persistent``: the persistent ones) + per 1000 elements of rank 0's fp32
partition (this CPU's elementwise arithmetic, device time on a GPU, kept apart).

Host syncs (``host_syncs``; stage3.py and runtime/utils.py 0.19.8): utils.py 233 ``bool()`` in
``is_invalid_grad_norm`` from stage3.py 2888; stage3.py 2483 ``torch.tensor(-1.0,
device=...)``; fp16 only: stage3.py 3042 ``overflow_gpu[0].item()``; utils/timer.py 256
``ThroughputTimer.stop``'s ``synchronize()`` from engine.py 3622. Not seen on this CPU: zero/
partition_parameters.py 2127-2128 ``synchronize()`` at the end of ``_allgather_params_coalesced``
(the persistent parameters' all-gather in ``_post_step``) where the accelerator does not
resolve data dependencies, as a GPU's does not.
DeepSpeed is not a dependency (``pip install deepspeed``): without it the bench is skipped.
"""
from __future__ import annotations

import argparse
import sys

from . import bench_deepspeed_step as st

MECHANISM = "deepspeed_zero3_optimizer"
LAYERS, HIDDENS, BLOCKS = st.LAYERS, st.HIDDENS, st.BLOCKS
PERSISTS = (True, False)                 # norms persistent / nothing persistent
PERSIST = 2                              # threshold = PERSIST x hidden: the norms, no matrix
CHECK_SIZE = (LAYERS[-1], True, HIDDENS[0], True)
CLIP, FP16_SCALE_POWER, LABEL = st.CLIP, st.FP16_SCALE_POWER, st.LABEL
TRIALS, REPEATS, WARM = 30, 2, 1
KINDS = {"z3_bf16": ("bf16", "torch"), "z3_fp16": ("fp16", "torch"),
         "z3_bf16_ds": ("bf16", "fusedadam")}
RUN = ("z3_bf16",)                      # the rest: --kinds
TAGS = {k: f"ZeRO-3 {dt}, {st.OPTIMIZERS[opt]}" for k, (dt, opt) in KINDS.items()}
# each piece with the tensors its loops walk (model / persistent), in source order
UNIT = {"pre_step": (), "partition_all": ("model", "persistent"), "overflow": (),
        "grad_norm": ("model",), "scale": (), "zero_grad_in_step": ("model",),
        "prepare": ("model",), "unscale_clip": (), "inner_step": (), "copy_back": ("model",),
        "release": (), "post_step": ("model", "persistent"), "alloc_check": (),
        "zero_grad": ("model",), "glue": ()}
PIECES = tuple(UNIT)
STANDINS = {"record_streams": ("model",), "cuda_memory_stats": ()}
CPU_ONLY = ("alloc_check",)              # replaced by cuda_memory_stats on a GPU
_POOLS = {p: dict.fromkeys(("current", "peak", "allocated", "freed"), 0)
          for p in ("all", "small_pool", "large_pool")}
CUDA_STATS = {**{k: 0 for k in ("num_alloc_retries", "num_ooms", "max_split_size",
                                "num_sync_all_streams", "num_device_alloc", "num_device_free")},
              **{k: {p: dict(v) for p, v in _POOLS.items()} for k in (
                  "allocation", "segment", "active", "inactive_split", "allocated_bytes",
                  "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")},
              **{k: dict(_POOLS["all"]) for k in ("oversize_allocations", "oversize_segments")}}


def available() -> str:
    return st.available()


def config(kind: str, hidden: int, persist: bool) -> dict:
    """``kind``'s ZeRO-3 config (``KINDS``) at ``hidden``: ``bench_deepspeed.config(3)`` with
    DeepSpeed's own overlap_comm default, memory_efficient_linear off, the persistence
    threshold ``PERSIST`` x hidden (0 unless ``persist``), the dtype, clipping, optimizer."""
    from .bench_deepspeed import config as ds_config
    dtype, opt = KINDS[kind]
    cfg = ds_config(3, hidden)
    zero = cfg["zero_optimization"]
    del zero["overlap_comm"]
    zero.update(memory_efficient_linear=False,
                stage3_param_persistence_threshold=PERSIST * hidden if persist else 0)
    return st.step_config(cfg, dtype, opt)


def engine(kind: str, layers: int, split: bool, hidden: int, persist: bool = True):
    """A ZeRO-3 DeepSpeed engine of ``kind`` on the probe decoder (``st.spec_of``)."""
    import deepspeed
    import torch

    from .torch_model import build_model
    model = build_model(st.spec_of(layers, hidden), split=split)
    model.spec = st.spec_of(layers, hidden)
    opt = None if KINDS[kind][1] == "fusedadam" else torch.optim.AdamW(
        model.parameters(), lr=1e-4, fused=True)
    eng, *_ = deepspeed.initialize(model=model, optimizer=opt,
                                   config=config(kind, hidden, persist))
    return eng


def _record_stream(*_a) -> None:
    """Stands in for ``Tensor.record_stream`` (no CPU kernel)."""


def cuda_memory_stats():
    """``torch.cuda.memory_stats`` (torch's own code) with its C++ call replaced by the
    prebuilt ``CUDA_STATS``: its flattening and sort of the allocator's statistics."""
    import types

    import torch.cuda.memory as cm
    return types.FunctionType(cm.memory_stats.__code__, {
        **cm.memory_stats.__globals__, "memory_stats_as_nested_dict": lambda device: CUDA_STATS},
        "memory_stats", cm.memory_stats.__defaults__)


def standin_parts(eng) -> dict:
    """``STANDINS``' calls: the GPU path's ``record_stream`` loop over the gradient
    partitions (before ``prepare`` frees them) and ``cuda_memory_stats()``."""
    from deepspeed.accelerator import get_accelerator
    o, acc = eng.optimizer, get_accelerator()

    def record_streams():
        for i in range(len(o.fp16_groups)):
            for g in filter(lambda g: acc.on_accelerator(g), o.averaged_gradients.get(i, ())):
                _record_stream(g, acc.current_stream())
    return {"record_streams": record_streams, "cuda_memory_stats": cuda_memory_stats()}


def step_parts(eng) -> list[tuple[str, object]]:
    """``engine.step()`` at the boundary in ``PIECES`` (stage3.py ``step`` 2873-2949 without
    offload, swapping or Muon; engine.py ``_take_model_step``): the same calls in the same
    order; after an overflow (``scale``) the rest of the step's pieces are skipped, as
    ``step`` returns."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.utils import combine_grad_norm_groups, is_invalid_grad_norm
    from deepspeed.runtime.zero.stage3 import OPTIMIZER_STEP_TIMER
    o, held = eng.optimizer, {"skip": False}
    subs = range(len(o.fp16_groups))

    def grad_norm():
        held["norm"] = None
        if not o.overflow:
            o._apply_muon_to_accumulated_grads()
            held["norm"] = norm = combine_grad_norm_groups(o._get_norm_groups())
            if is_invalid_grad_norm(norm):
                o.overflow = True

    def scale():
        held["skip"] = o._loss_scale_update_and_overflow_cleanup()
        if not held["skip"]:
            o._global_grad_norm = held["norm"] / o.loss_scale
            held["timers"] = {OPTIMIZER_STEP_TIMER}
            o.timers(OPTIMIZER_STEP_TIMER).start()

    def prepare():
        for i in subs:
            o._prepare_sub_group(i, held["timers"])
            if o._muon_update_lacks_loss_scale(i):
                o.fp32_partitioned_groups_flat[i].grad.mul_(o.loss_scale)

    def release():
        for i in subs:
            o._release_sub_group(i, held["timers"])
        o.timers(OPTIMIZER_STEP_TIMER).stop()

    def alloc_check():
        retries = get_accelerator().memory_stats().get("num_alloc_retries") or 0
        if retries > o.n_caching_allocator_flushes:
            o.n_caching_allocator_flushes = retries

    def live(fn):
        return lambda: None if held["skip"] else fn()
    fn = {"pre_step": o._pre_step, "partition_all": o._partition_all_parameters,
          "overflow": lambda: o._overflow_check_and_loss_scale_update(update_scale=False),
          "grad_norm": grad_norm, "scale": scale,
          "zero_grad_in_step": live(lambda: o.zero_grad(set_to_none=True)),
          "prepare": live(prepare),
          "unscale_clip": live(lambda: [o.unscale_and_clip_grads(i, held["norm"]) for i in subs]),
          "inner_step": live(lambda: [o._optimizer_step(i) for i in subs]),
          "copy_back": live(lambda: [o._reassign_or_swap_out_partitioned_parameters(i)
                                     for i in subs]),
          "release": live(release), "post_step": live(lambda: o._post_step(held["timers"])),
          "alloc_check": live(alloc_check), "zero_grad": o.zero_grad,
          "glue": lambda: st._glue(eng)}
    return [(p, fn[p]) for p in PIECES]


def engine_phases(kind: str, layers: int, split: bool, hidden: int, persist: bool = True
                  ) -> tuple[list, dict]:
    """(one round's phases, ``counts``): forward, backward, the step in ``step_parts`` with
    ``STANDINS`` beside them (``record_streams`` before ``prepare``, ``cuda_memory_stats``
    after ``alloc_check``); forward, backward, ``engine.step()`` whole (``step``)."""
    eng = engine(kind, layers, split, hidden, persist)
    fwd, bwd = st._passes(eng.module, eng, eng.backward)
    passes = [("_fwd", fwd), ("_bwd", bwd)]
    extra = standin_parts(eng)
    parts = []
    for name, f in step_parts(eng):
        parts += [("record_streams", extra["record_streams"])] * (name == "prepare")
        parts.append((name, f))
        parts += [("cuda_memory_stats", extra["cuda_memory_stats"])] * (name == "alloc_check")
    return passes + parts + passes + [("step", eng.step)], counts(eng)


def counts(eng) -> dict:
    """The engine's optimizer classes, its parameter tensors (``model``: every rank holds a
    partition of each), the persistent ones, sub-groups, the elements of rank 0's fp32
    partition and of the model."""
    o = eng.optimizer
    return {"model": sum(len(g) for g in o.fp16_groups),
            "persistent": len(o.persistent_parameters), "sub_groups": len(o.fp16_groups),
            "elements": sum(p.numel() for p in o.fp32_partitioned_groups_flat),
            "model_elements": sum(p.ds_numel for p in eng.module.parameters()),
            "optimizer": type(o).__name__, "inner": type(o.optimizer).__name__}


def sizes() -> list[tuple[int, bool, int, bool]]:
    return [(n, s, h, p) for p in PERSISTS for h in HIDDENS for s in BLOCKS for n in LAYERS]


def setups(kinds=RUN) -> tuple[dict, dict]:
    """(phases, counts) of every setup, keyed (kind, layers, split, hidden, persist), and the
    host probe's (``bench_mcore_ddp``'s keys). Needs the fake group up."""
    from .bench_deepspeed import _launcher_env
    from .bench_mcore_ddp import _probe_phases
    _launcher_env()
    out, cnt = {("probe", n, False): _probe_phases(n) for n in (1, 5)}, {}
    for size in sizes():
        for kind in kinds:
            out[(kind, *size)], cnt[(kind, *size)] = engine_phases(kind, *size)
    return out, cnt


# ---- measuring -------------------------------------------------------------------------------
def host_syncs(built: dict, kind: str, size: tuple) -> dict[str, dict[str, int]]:
    """``bench_deepspeed_step.host_syncs`` of the engine set up as ``(kind, *size)``."""
    return st.host_syncs({(kind, *size[:3]): built[(kind, *size)]}, kind, size[:3])


def measure(kinds=RUN, trials: int = TRIALS, repeats: int = REPEATS) -> dict | None:
    """One run: timings (us per phase per setup), ``counts``, the probe's us per op, noise,
    ``host_syncs`` per kind; None, with a message on stderr, without DeepSpeed. The setups'
    objects are frozen out of the cyclic garbage collector (``gc.freeze``) while timed: the
    24 engines built in one process otherwise slowed every op, the probe's too (a check on
    this CPU: the probe at 24 us per op alone, 40 with 12 of the engines built, 24 again
    with them frozen), which a training process of one engine does not see."""
    import gc
    why = available()
    if why:
        print(f"{MECHANISM} skipped: {why}", file=sys.stderr)
        return None
    from .bench_dp import _init_fake_pg
    from .bench_mcore_host import one_thread_no_warnings
    _init_fake_pg()
    with one_thread_no_warnings():
        built, cnt = setups(kinds)
        gc.collect()
        gc.freeze()                  # the setups' objects out of the cyclic GC's scans
        try:
            res, attempts = st._time_quiet(built, trials, repeats, WARM, MECHANISM)
        finally:
            gc.unfreeze()
        syncs = {k: host_syncs(built, k, CHECK_SIZE) for k in kinds}
    return st.run_result(built, cnt, kinds, (res, attempts, syncs), (trials, repeats))


# ---- deriving --------------------------------------------------------------------------------
def phase_fits(t: dict, c: dict, kind: str, units: dict) -> dict[str, dict[str, float]]:
    """Per phase of ``units`` ({phase: the tensor counts it loops over}), over ``kind``'s
    setups, least squares: {'fixed': us, <unit>: us per tensor, 'kelements': us per 1000
    fp32 partition elements}."""
    keys = [k for k in c if k[0] == kind]
    out = {}
    for ph, us in units.items():
        xs = [tuple(c[k][u] for u in us) + (c[k]["elements"] / 1e3,) for k in keys]
        coef = st.fit(xs, [t[k][ph] for k in keys])
        out[ph] = dict(zip(("fixed", *us, "kelements"), coef))
    return out


WHAT = {"fixed": "per step, fixed", "model": "per model parameter tensor",
        "persistent": "per persistent parameter tensor",
        "kelements": "per 1000 fp32 partition elements (this CPU's elementwise compute)"}


def _sums(f: dict, names) -> dict[str, float]:
    return {u: sum(f[p].get(u, 0.0) for p in names) for u in WHAT}


def step_values(t: dict, c: dict, kind: str) -> list[tuple[str, float]]:
    """(metric, us) rows of one kind: ``engine.step()`` whole, each piece and stand-in
    (fixed, per tensor of its units), the pieces' sums, the GPU path's sums (pieces less
    ``CPU_ONLY`` plus ``STANDINS``), the check at ``CHECK_SIZE``."""
    whole = phase_fits(t, c, kind, {"step": ("model", "persistent")})["step"]
    rows = [(f"engine.step() at the boundary, {WHAT[u]}", v) for u, v in whole.items()]
    f = phase_fits(t, c, kind, {**UNIT, **STANDINS})
    for p in (*UNIT, *STANDINS):
        rows += [(f"{p}, {WHAT[u]}", v) for u, v in f[p].items() if u != "kelements"]
    gpu = [p for p in PIECES if p not in CPU_ONLY] + list(STANDINS)
    rows += [(f"pieces summed, {WHAT[u]}", v) for u, v in _sums(f, PIECES).items()]
    rows += [(f"GPU path summed (pieces less {', '.join(CPU_ONLY)}, plus "
              f"{', '.join(STANDINS)}), {WHAT[u]}", v) for u, v in _sums(f, gpu).items()]
    size = (kind, *CHECK_SIZE)
    return rows + [(f"check: pieces summed at {_size_text(CHECK_SIZE)}",
                    sum(t[size][p] for p in PIECES)),
                   (f"check: engine.step() at {_size_text(CHECK_SIZE)}", t[size]["step"])]


def _size_text(size: tuple) -> str:
    n, split, h, persist = size
    return (f"{n} layers of {9 if split else 6} tensors, hidden {h}, "
            + ("norms persistent" if persist else "nothing persistent"))


# ---- rows ------------------------------------------------------------------------------------
def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may): ``bench_deepspeed_step``'s
    reasons, and more than one sub-group."""
    return st.problems(m) + sorted({f"{k[0]}: {v['sub_groups']} sub-groups"
                                    for k, v in m["counts"].items() if v["sub_groups"] != 1})


def _method(m: dict, kind: str) -> str:
    from .bench_deepspeed import version
    c = m["counts"][(kind, *CHECK_SIZE)]
    return (f"DeepSpeed {version()} {TAGS[kind]} ({c['optimizer']} over {c['inner']}; "
            "DS_ACCELERATOR=cpu, fake pg x2 rank 0, contiguous_gradients and overlap_comm at "
            f"their stage-3 defaults (on), sub_group_size default (1 sub-group), "
            f"gradient_clipping {CLIP}, steps_per_print inf, fp16 initial_scale_power "
            f"{FP16_SCALE_POWER}, HF 'auto' bucket sizes, memory_efficient_linear off, "
            f"stage3_param_persistence_threshold {PERSIST} x hidden (norms persistent) or 0) "
            f"on the probe decoder at {LAYERS} layers x blocks of 6 / 9 tensors x hidden "
            f"{HIDDENS} x both thresholds (at {_size_text(CHECK_SIZE)}: {c['model']} tensors, "
            f"{c['persistent']} persistent, {c['elements']} fp32 partition elements); warm "
            f"protocol: per trial each setup in turn, {WARM} untimed round(s) then "
            f"{m['repeats']} timed, back to back; a round: fwd, bwd at the boundary, the step "
            "in pieces (stage3.py step 2873-2949, engine.py _take_model_step 3505-3565) with "
            "GPU stand-ins beside (record_streams: the record_stream loop's filter, a Python "
            "call for record_stream; cuda_memory_stats: torch.cuda.memory_stats() over 122 "
            "prebuilt values), fwd, bwd, engine.step() whole; thread CPU time, the host "
            f"probe's decoders timed alike in the same trials (p10 of {m['trials']} trials of "
            f"the mean of {m['repeats']} rounds; bwd op {m['op']['bwd']:.2f} us; CPU pressure "
            f"{m['pressure']:.2f}, foreign load {m['foreign']:.2f}, attempts "
            f"{len(m['attempts'])}); least squares fixed + per tensor of the piece's loops "
            "(model / persistent) + per 1000 fp32 partition elements; "
            "calibrate.bench_deepspeed_zero3_step; "
            + st.syncs_text(m["syncs"][kind]).replace(
                st._size_text(st.CHECK_SIZE), _size_text(CHECK_SIZE)))


def rows_of(m: dict, base: dict) -> list[dict]:
    """CSV rows (``bench_framework.COLUMNS``) in the run's own probe units, per kind (metric
    ``LABEL`` + its ``TAGS`` + the value's name)."""
    from .bench_dp import _mechanism_rows
    op = m["op"]["fwd"]
    b = {**base, "op_fwd_us_same_run": round(op, 2)}
    out = []
    for kind in m["kinds"]:
        out += _mechanism_rows(b, op, MECHANISM, _method(m, kind), [
            (f"{LABEL}{TAGS[kind]}, {k}", v) for k, v in step_values(m["t"], m["counts"], kind)])
    return out


def print_table(m: dict, out=sys.stderr) -> None:
    op = m["op"]["fwd"]
    print(f"probe fwd {op:.2f} us/op, bwd {m['op']['bwd']:.2f}; pressure {m['pressure']:.2f}, "
          f"foreign {m['foreign']:.2f}; attempts: "
          f"{' | '.join(a or 'quiet' for a in m['attempts'])}", file=out)
    for kind in m["kinds"]:
        for k, v in step_values(m["t"], m["counts"], kind):
            print(f"{v / op:8.3f} eo {v:9.2f} us  {TAGS[kind]}, {k}", file=out)
        print(st.syncs_text(m["syncs"][kind]), file=out)


def rows(base: dict) -> list[dict]:
    """A ``bench_framework``-style entry: one run's rows; none, with a message, without
    DeepSpeed or when the run is unfit (``bench.checked_rows``)."""
    from .bench import checked_rows
    return checked_rows(MECHANISM, sys.modules[__name__], base)


def main(argv: list[str] | None = None) -> int:
    """``--runs`` fit runs (``bench_mcore_optimizer.fit_runs``: an unfit run is measured
    again, up to ``--tries`` in all), each appended to ``--out`` with ``--write``."""
    from .bench_framework import CSV
    from .bench_mcore_optimizer import fit_runs
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_deepspeed_zero3_step")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tries", type=int, default=6)
    ap.add_argument("--trials", type=int, default=TRIALS)
    ap.add_argument("--kinds", default=",".join(RUN))
    ap.add_argument("--write", action="store_true", help="append each fit run's rows")
    ap.add_argument("--out", default=str(CSV))
    args = ap.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    return fit_runs(sys.modules[__name__], lambda: measure(kinds, args.trials), args.runs,
                    args.tries, args.write, args.out)


if __name__ == "__main__":
    sys.exit(main())
