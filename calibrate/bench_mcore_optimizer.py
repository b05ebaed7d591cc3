"""Host cost of Megatron-Core's optimizer step without the distributed optimizer (Megatron's
ZeRO stage 0: ``Float16OptimizerWithFloat16Params`` for bf16, in a ``ChainedOptimizer`` in
0.16.1) and the training loop's calls around it, measured on this CPU
(``python -m calibrate.bench_mcore_optimizer [--runs 3] [--write]``; mechanism
``mcore_fp16_optimizer``).

What runs: ``bench_mcore_ddp``'s ``Float16Module(GPTModel)`` (local spec, hidden 32, 16 tokens,
bf16) in ``megatron.core.distributed.DistributedDataParallel`` with
``DistributedDataParallelConfig(use_distributed_optimizer=False, overlap_grad_reduce=True,
grad_reduce_in_fp32=True)`` (no parameter gather: that needs the distributed optimizer) and
``get_megatron_optimizer(OptimizerConfig(optimizer='adam', bf16=True,
use_distributed_optimizer=False, clip_grad=1.0))`` on the fake 2-rank group and
``bench_mcore_ddp``'s CPU stand-ins. A step does what ``train_step`` and the no-pipelining
schedule do: ``zero_grad_buffer()``, ``optimizer.zero_grad()``, ``MICRO`` micro-batches (all
but the last under ``no_sync()``; forward and backward untimed), ``finalize_model_grads``, then
``ChainedOptimizer.step`` in its pieces (``bench_mcore_ddp._opt_parts``: the same calls in the
same order): ``prepare_grads`` (``_copy_model_grads_to_main_grads``: per bf16 tensor
``main_param.grad = model_param.main_grad.float()``, with fp32 contiguous gradient buffers no
copy, and ``model_param.grad = None``), ``get_main_grads_for_grad_norm``, ``get_grad_norm_fp32``
(the CPU fallback and a one-call stand-in for ``multi_tensor_l2norm``),
``clip_grad_by_total_norm_fp32`` (no scaling: norm < 1), the inner ``step`` (torch AdamW
single-tensor on this CPU, not used: a GPU runs TE's or apex's FusedAdam),
``_copy_main_params_to_model_params`` (bf16 has no multi-tensor copy: a ``copy_`` per tensor
on a GPU too). One setup runs ``optimizer.step()`` whole (a check). Every phase is timed alone
(thread CPU time) in the warm protocol (per trial each setup runs ``WARM`` untimed steps, then
``REPEATS`` timed ones), interleaved with the host probe's decoders
(``bench_mcore_ddp.time_phases``), 10th percentile of ``TRIALS`` trials, re-timed while the
host is busy (``bench_deepspeed_step._time_quiet``: ``bench_hf_host.noise``). Fixed and per
parameter tensor (without the distributed optimizer a rank steps every tensor of the model):
the least-squares line over 1, 5 and 17 layers, with and without linear biases;
``finalize_model_grads`` per model module, as ``bench_mcore_ddp`` fits it.

Run on its own (``main``: each fit run appended under ``flock /tmp/hm_csv.lock``), not through
``bench_framework``. The mechanism is named ``mcore_fp16_optimizer`` (after the class it
times) because ``bench_framework --only mcore_optimizer`` writes ``bench_dp.
mcore_optimizer_loop_us``'s older, unrelated one-row measurement of the distributed
optimizer's loop as ``mcore_optimizer`` (host_mechanisms.csv line 143; not used by
frameworks.json).
"""
from __future__ import annotations

import argparse
import sys

from . import bench_mcore_ddp as d

MECHANISM = "mcore_fp16_optimizer"
SIZES = ((1, False), (1, True), (5, False), (5, True), (d.BIG, False))   # (layers, bias)
WHOLE = (5, False)                  # the setup also timed with optimizer.step() whole
TRIALS, REPEATS, WARM = 30, 3, 1
PARTS = d.OPT_PARTS + d.STEP_PARTS
GPU = ("prepare_grads", "grads_for_norm", "grad_norm_onecall", "clip", "copy_params",
       "zero_grad")                 # what a GPU host runs as this one does (no inner step)
FIT_BY = {"finalize": "model_modules"}          # the rest: per model parameter tensor
UNIT = {"model_tensors": "model parameter tensor", "model_modules": "model module"}
LOCK = "/tmp/hm_csv.lock"


def available() -> str:
    """'' when Megatron-Core imports, else why not."""
    return d.available()


# ---- the model, the wrapper, the optimizer ---------------------------------------------------
def wrapped(layers: int, bias: bool):
    """(DDP model, ChainedOptimizer of a Float16OptimizerWithFloat16Params) without the
    distributed optimizer."""
    from megatron.core.distributed import DistributedDataParallel as DDP
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    model, cfg = d._model(layers, bias)
    ddp_cfg = DistributedDataParallelConfig(use_distributed_optimizer=False,
                                            overlap_grad_reduce=True, grad_reduce_in_fp32=True)
    ddp = DDP(cfg, ddp_cfg, model)
    with d.cuda_type_names():
        opt = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", bf16=True, use_distributed_optimizer=False,
                            clip_grad=d.CLIP, lr=1e-4), [ddp], use_gloo_process_groups=False)
    return ddp, opt


def counts(ddp, opt) -> dict:
    """Parameter tensors and modules of the model, tensors the optimizer steps (its bf16
    and fp32 groups), per layer, gradient buckets, the inner optimizer's class."""
    inner = opt.chained_optimizers[0]
    layer = ddp.module.module.decoder.layers[0]
    return {"model_tensors": sum(1 for _ in ddp.module.parameters()),
            "stepped_tensors": sum(len(g) for g in inner.float16_groups
                                   + inner.fp32_from_fp32_groups),
            "model_modules": sum(1 for _ in ddp.module.modules()),
            "layer_tensors": sum(1 for _ in layer.parameters()),
            "buckets": len(ddp.bucket_groups), "optimizers": len(opt.chained_optimizers),
            "inner": type(inner).__name__}


def step_phases(layers: int, bias: bool, whole: bool = False) -> tuple[list, dict]:
    """(phases of one training step, ``counts``): the loop's calls, ``d.MICRO`` micro-batches
    (names starting '_' run untimed), then the optimizer step in pieces (``whole``: in one
    call)."""
    from megatron.core.distributed import finalize_model_grads
    ddp, opt = wrapped(layers, bias)
    fwd, bwd = d._fwd_bwd(ddp, list(ddp.module.parameters()))
    ctx = {}

    def enter():
        ctx["cm"] = ddp.no_sync()
        ctx["cm"].__enter__()
    passes = [(f"_{p}{k}", fn) for k in range(d.MICRO - 1) for p, fn in (("fwd", fwd),
                                                                        ("bwd", bwd))]
    tail = [("step", opt.step)] if whole else d._opt_parts(opt)
    return ([("zero_grad_buffer", ddp.zero_grad_buffer), ("zero_grad", opt.zero_grad),
             ("no_sync_enter", enter)] + passes
            + [("no_sync_exit", lambda: ctx.pop("cm").__exit__(None, None, None)),
               ("_fwd_last", fwd), ("_bwd_last", bwd),
               ("finalize", lambda: finalize_model_grads([ddp]))] + tail), counts(ddp, opt)


def setups(sizes=SIZES, whole=WHOLE) -> tuple[dict, dict]:
    """(every timed setup's phases, their ``counts``), keyed (kind, layers, bias): the host
    probe's decoders, ``step`` (pieces) per size, ``whole`` at ``whole``."""
    out, cnt = {("probe", n, False): d._probe_phases(n) for n in (1, 5)}, {}
    for n, bias in sizes:
        out[("step", n, bias)], cnt[("step", n, bias)] = step_phases(n, bias)
    out[("whole", *whole)], cnt[("whole", *whole)] = step_phases(*whole, whole=True)
    return out, cnt


# ---- deriving --------------------------------------------------------------------------------
def fits(t: dict, c: dict) -> dict[str, tuple[float, float]]:
    """(fixed us, us per model tensor / module) of every piece: the least-squares line over
    the ``step`` setups."""
    keys = [k for k in c if k[0] == "step"]
    return {ph: d.fit_line([c[k][FIT_BY.get(ph, "model_tensors")] for k in keys],
                           [t[k][ph] for k in keys]) for ph in PARTS}


def values(t: dict, c: dict, whole=WHOLE) -> list[tuple[str, float]]:
    """(metric, us) rows of ``mcore_fp16_optimizer``."""
    f = fits(t, c)
    rows = []
    for ph in PARTS:
        rows += [(f"{ph}, per step, fixed", f[ph][0]),
                 (f"{ph}, per {UNIT[FIT_BY.get(ph, 'model_tensors')]}", f[ph][1])]
    gpu = "GPU-path sum (no inner step, one-call norm)"
    rows += [(f"{gpu}, per step, fixed", sum(f[p][0] for p in GPU)),
             (f"{gpu}, per model parameter tensor", sum(f[p][1] for p in GPU))]
    n = whole[0]
    pieces = sum(t[("step", *whole)][p] for p in d.OPT_PARTS if p != "grad_norm_onecall")
    return rows + [(f"optimizer.step() whole at {n} layers (check)", t[("whole", *whole)]["step"]),
                   (f"sum of its pieces at {n} layers (CPU norm; check)", pieces)]


# ---- measuring -------------------------------------------------------------------------------
def measure(trials: int = TRIALS, repeats: int = REPEATS, sizes=SIZES, whole=WHOLE
            ) -> dict | None:
    """One run: timings, ``counts``, the probe's us per op, CPU pressure, foreign load, each
    attempt's noise; None, with a message on stderr, without Megatron-Core."""
    why = available()
    if why:
        print(f"{MECHANISM} skipped: {why}", file=sys.stderr)
        return None
    from .bench_deepspeed_step import _time_quiet
    from .bench_mcore_host import one_thread_no_warnings
    with one_thread_no_warnings():
        built, cnt = setups(sizes, whole)
        res, attempts = _time_quiet(built, trials, repeats, WARM, MECHANISM)
    return {**res, "counts": cnt, "attempts": attempts, "trials": trials, "repeats": repeats,
            "whole": tuple(whole)}


def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may)."""
    op = m["op"]["fwd"]
    bad = [f"noisy: {m['attempts'][-1]}"] * bool(m["attempts"][-1])
    bad += [f"probe per-op cost {op:.2f} us out of range"] * (not 0 < op < 1e3)
    bad += [f"{k}: optimizer steps {v['stepped_tensors']} of {v['model_tensors']} tensors"
            for k, v in m["counts"].items() if v["stepped_tensors"] != v["model_tensors"]]
    f = fits(m["t"], m["counts"])
    return bad + [f"{p} per tensor not positive" for p in GPU if f[p][1] <= 0]


def method(m: dict) -> str:
    import megatron.core
    c = m["counts"]
    sizes = ", ".join(f"{n}L{'+bias' if b else ''} {c[(k, n, b)]['model_tensors']}"
                      for k, n, b in c if k == "step")
    return (f"megatron-core {megatron.core.__version__} GPTModel local spec in Float16Module "
            f"(bf16), hidden {d.HIDDEN}, {d.TOKENS} tokens, DDP(overlap_grad_reduce, "
            "grad_reduce_in_fp32; no distributed optimizer) on a fake 2-rank group, "
            f"get_megatron_optimizer(adam, bf16, clip_grad {d.CLIP}, use_distributed_optimizer "
            "False): ChainedOptimizer of Float16OptimizerWithFloat16Params, its step in pieces "
            f"after {d.MICRO} micro-batches (all but the last under no_sync) and "
            "finalize_model_grads; warm protocol (per trial each setup "
            f"{WARM} untimed step then {m['repeats']} timed), thread CPU time interleaved with "
            f"the host probe (p10 of {m['trials']} trials; bwd op {m['op']['bwd']:.2f} us; CPU "
            f"pressure {m['pressure']:.2f}, foreign load {m['foreign']:.2f}, attempts "
            f"{len(m['attempts'])}); fixed + per model parameter tensor (every tensor is "
            f"stepped; finalize per model module) = least-squares line over {sizes} tensors; "
            "inner step = torch.optim.AdamW single-tensor on this CPU (TE/apex FusedAdam on a "
            "GPU); grad_norm_cpu = local_multi_tensor_l2_norm fallback, grad_norm_onecall = "
            "one call in place of multi_tensor_l2norm; no clip scaling (norm < 1); "
            "calibrate.bench_mcore_optimizer")


def rows_of(m: dict, base: dict) -> list[dict]:
    """CSV rows (``bench_framework.COLUMNS``) in the run's own probe units."""
    from .bench_dp import probe_rows
    return probe_rows(m, base, MECHANISM, method(m), values(m["t"], m["counts"], m["whole"]))


def rows(base: dict) -> list[dict]:
    """A ``bench_framework``-style entry: one run's rows; none, with a message, without
    Megatron-Core or when the run is unfit (``bench.checked_rows``)."""
    from .bench import checked_rows
    return checked_rows(MECHANISM, sys.modules[__name__], base)


def print_table(m: dict, out=sys.stderr) -> None:
    """Every setup's phases (us), counts and the derived rows in eager ops."""
    op = m["op"]
    print(f"probe: fwd {op['fwd']:.2f} us/op, bwd {op['bwd']:.2f} us/op; pressure "
          f"{m['pressure']:.2f}, foreign {m['foreign']:.2f}; attempts: "
          f"{' | '.join(a or 'quiet' for a in m['attempts'])}", file=out)
    for key, ph in m["t"].items():
        cnt = m["counts"].get(key, {})
        print(f"{key}: " + ", ".join(f"{n} {v:.1f}" for n, v in ph.items())
              + (f"  | {cnt}" if cnt else ""), file=out)
    for k, v in values(m["t"], m["counts"], m["whole"]):
        print(f"{v / op['fwd']:9.3f} eo {v:9.2f} us  {k}", file=out)


# ---- writing ---------------------------------------------------------------------------------
def append_locked(path, new: list[dict]) -> tuple[int, int]:
    """Append ``new`` to the CSV ``path`` holding ``LOCK`` (flock, as ``flock LOCK`` does);
    the (first, last) line numbers written."""
    import fcntl
    from pathlib import Path

    from .bench_optimizer_host import _append
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _append(Path(path), new)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _base() -> dict:
    import datetime as dt

    import torch

    from .bench_hf_host import _host_name
    torch.set_num_threads(1)
    return {"host": _host_name(), "torch": torch.__version__,
            "date": dt.date.today().isoformat()}


def fit_runs(bench, measure, runs: int, tries: int, write: bool, out: str) -> int:
    """``runs`` fit runs of ``bench`` (a module with ``MECHANISM``, ``print_table``,
    ``problems``, ``rows_of``; ``measure()``: one run, None without the framework), a run
    found unfit measured again, up to ``tries`` in all; each printed and, with ``write``,
    appended to ``out`` under the lock as soon as it is done; then each row's eager ops over
    the runs (median and spread). Exit status: 0 when all ``runs`` were fit."""
    import statistics
    base, good = _base(), []
    for _ in range(tries):
        m = measure()
        if m is None:
            return 1
        bench.print_table(m)
        bad = bench.problems(m)
        if bad:
            print(f"{bench.MECHANISM}: run not fit ({'; '.join(bad)}); measuring again",
                  file=sys.stderr)
            continue
        new = bench.rows_of(m, base)
        if write:
            first, last = append_locked(out, new)
            print(f"appended {len(new)} rows to {out}: lines {first}-{last}", file=sys.stderr)
        good.append(new)
        if len(good) == runs:
            break
    for i, r in enumerate(good[0] if good else []):
        v = [float(run[i]["eager_ops"]) for run in good]
        med = statistics.median(v)
        spread = (max(v) - min(v)) / abs(med) if med else 0.0
        print(f"{med:9.3f} eo median of {', '.join(f'{x:.3f}' for x in v)} "
              f"(spread {spread:.0%})  {r['metric']}", file=sys.stderr)
    return 0 if len(good) == runs else 2


def main(argv: list[str] | None = None) -> int:
    """``--runs`` fit runs (``fit_runs``), each appended to ``--out`` with ``--write``."""
    from .bench_framework import CSV
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_mcore_optimizer")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tries", type=int, default=6)
    ap.add_argument("--trials", type=int, default=TRIALS)
    ap.add_argument("--write", action="store_true", help="append each fit run's rows")
    ap.add_argument("--out", default=str(CSV))
    args = ap.parse_args(argv)
    return fit_runs(sys.modules[__name__], lambda: measure(args.trials), args.runs,
                    args.tries, args.write, args.out)


if __name__ == "__main__":
    sys.exit(main())
