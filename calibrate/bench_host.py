"""Host (dispatch) cost per op: eager PyTorch's Python, dispatcher and autograd work around
every op a transformer layer issues, measured where the kernels themselves are nearly free.

Two decoders of the same tiny shape (``calibrate.torch_model``, hidden 32, sequence 8: every
GEMM is < 0.1 MFLOP) with ``HOST_LAYERS`` layers are timed forward (with autograd
recording) and backward; the difference over the extra layers, divided by the ops the
simulator's op graph has in those layers (``simulator.workload.ops``, counted as
``simulator.cost.host.op_count``), is the host time per op-graph op, forward and backward.
Embedding, loss and the per-call fixed costs cancel in the difference. A ``torch.nn.Linear``
forward on the same tiny input is timed too: the quantity published for GPU hosts (CPU time
per ``nn.Linear`` forward, ``hardware_db/data/measurements/host_overhead.csv``), so the
reference profiles can transfer it to a per-op cost with the ratio measured here.
Kernel-launching aten ops (non-view) are counted with ``TorchDispatchMode`` and stored for
the notes. Times are the calling thread's CPU time (the host time the published GPU-host
figures also report), so other load on a shared host hardly moves them. About 1 s per thread
count.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

from .bench import BusyRetry, Plan, _threads, thread_counts
from .store import PressureMeter, Progress, Stats, Store, stats_of

HOST_LAYERS = (1, 5)
HOST_SHAPE = {"hidden": 32, "ffn_hidden": 128, "n_heads": 2, "n_kv_heads": 2, "vocab": 64,
              "seq_len": 8}
REPEATS = 5
TRIALS = 40
RETRY_BUDGET_S = 4.0


def probe_spec(layers: int):
    from simulator.workload.spec import TransformerSpec
    return TransformerSpec(f"host-probe-{layers}l", n_layers=layers, source="calibrate "
                           "host probe", **HOST_SHAPE)


def probe_shape(spec):
    """The probe's ``LayerShape``: validate-run's plan (micro-batch 1, fp32, flash attention,
    no dropout, no recompute)."""
    from simulator.workload.ops import LayerShape
    return LayerShape(micro_batch=1, seq_len=spec.seq_len, dtype="fp32", flash=True,
                      attention_kernel="flash", dropout=False)


def graph_ops(layers: int) -> tuple[int, int]:
    """(forward, backward) op-graph ops of the probe decoder's layers (``probe_shape``)."""
    from simulator.cost.host import op_count
    from simulator.workload.ops import backward_ops, layer_ops
    spec = probe_spec(layers)
    sh = probe_shape(spec)
    f = [o for i in range(layers) for o in layer_ops(spec, sh, i)]
    return sum(op_count(o) for o in f), sum(op_count(o) for o in backward_ops(f))


def aten_kernel_ops(fn) -> int:
    """Aten ops ``fn`` dispatches that are not views (each launches a kernel)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            rets = func._schema.returns
            if not any(r.alias_info is not None and not r.alias_info.is_write for r in rets):
                Count.n += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return Count.n


def time_interleaved(cases, trials: int = TRIALS, repeats: int = REPEATS
                     ) -> dict[str, tuple[Stats, Stats, float, float]]:
    """Per-call host CPU time of each case's ``fwd`` and ``bwd(fwd())``: CPU time of the
    calling thread (``time.thread_time``), which a thread does not accumulate while other
    load holds the core, so a busy host inflates it only through shared caches. Cases are
    interleaved trial by trial so that such load hits them alike; each trial's mean over
    ``repeats`` calls; statistics over ``trials``, and the fastest trial (fwd, bwd), which
    is what a quiet host shows: with two threads a busy host still inflates CPU time, as
    the main thread spins at OpenMP barriers while its worker waits for a core)."""
    for fwd, bwd in cases.values():
        for _ in range(3):
            bwd(fwd())
    tf: dict[str, list[float]] = {k: [] for k in cases}
    tb: dict[str, list[float]] = {k: [] for k in cases}
    meter = PressureMeter().start()
    for _ in range(trials):
        for name, (fwd, bwd) in cases.items():
            sf = sb = 0.0
            for _ in range(repeats):
                t0 = time.thread_time()
                out = fwd()
                t1 = time.thread_time()
                bwd(out)
                sf, sb = sf + t1 - t0, sb + time.thread_time() - t1
            tf[name].append(sf / repeats)
            tb[name].append(sb / repeats)
    p = meter.stop()
    return {k: (stats_of(tf[k], p), stats_of(tb[k], p), min(tf[k]), min(tb[k])) for k in cases}


def loss_backward(model, backward=None):
    """A timing case's backward: the loss's backward (``backward(loss)`` where a wrapper
    runs it, e.g. a DeepSpeed engine's), then every gradient of ``model`` dropped
    (``set_to_none``) so the next call starts as the first did."""
    def bwd(loss):
        loss.backward() if backward is None else backward(loss)
        for p in model.parameters():
            p.grad = None
    return bwd


def _decoder_fns(layers: int):
    import torch

    from .torch_model import build_model, synthetic_batch
    spec = probe_spec(layers)
    model = build_model(spec)
    tokens, targets = synthetic_batch(spec, 1)
    return (lambda: model(tokens, targets)), loss_backward(model), torch


def time_step_parts(trials: int = TRIALS, repeats: int = REPEATS) -> dict[int, dict[str, float]]:
    """Per-call host CPU time (fastest trial, as ``time_interleaved``) of the two per-step
    calls outside forward and backward, ``optimizer.step()`` (``torch_model.make_optimizer``,
    the optimizer validate-run trains with) and ``zero_grad(set_to_none=True)``, on each
    decoder probe, keyed by its layers: their costs that do not grow with the layers are
    the per-step fixed host time (``calibrate.cpu_host.step_overhead``)."""
    from .torch_model import build_model, make_optimizer, synthetic_batch
    probes = {}
    for n in HOST_LAYERS:
        spec = probe_spec(n)
        model = build_model(spec)
        tokens, targets = synthetic_batch(spec, 1)
        probes[n] = (model, make_optimizer(model.parameters())[0], tokens, targets)
    best = {n: {"opt": float("inf"), "zero": float("inf")} for n in HOST_LAYERS}
    for _ in range(trials):
        for n, (model, opt, tokens, targets) in probes.items():
            so = sz = 0.0
            for _ in range(repeats):
                model(tokens, targets).backward()
                t0 = time.thread_time()
                opt.step()
                t1 = time.thread_time()
                opt.zero_grad(set_to_none=True)
                so, sz = so + t1 - t0, sz + time.thread_time() - t1
            best[n]["opt"] = min(best[n]["opt"], so / repeats)
            best[n]["zero"] = min(best[n]["zero"], sz / repeats)
    return best


def _linear_fns():
    import torch
    lin = torch.nn.Linear(HOST_SHAPE["hidden"], HOST_SHAPE["hidden"], bias=False)
    x = torch.randn(HOST_SHAPE["seq_len"], HOST_SHAPE["hidden"], requires_grad=True)
    return (lambda: lin(x)), (lambda out: None)


def bench_host(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """Decoder probes with ``HOST_LAYERS`` layers and a ``nn.Linear`` forward, forward and
    backward, interleaved, at each thread count."""
    store = Store(out, "host", env)
    prog = Progress("host", len(thread_counts()), quiet)
    busy = BusyRetry(min(plan.busy_retry_s, RETRY_BUDGET_S))   # CPU time: load matters less
    for thr in thread_counts():
        with _threads(thr) as used:
            if store.has(f"linear:t{used}:fwd"):
                prog.step(f"probes:t{used}", None)
                continue
            cases = {f"decoder{n}": _decoder_fns(n)[:2] for n in HOST_LAYERS}
            cases["linear"] = _linear_fns()
            res: dict[str, tuple] = {}

            def timer():
                res.update(time_interleaved(cases))
                return res[f"decoder{HOST_LAYERS[-1]}"][0]
            st, bad = busy.measure(timer)
            for name, (fwd, _) in cases.items():
                layers = int(name[7:]) if name.startswith("decoder") else 0
                gf, gb = graph_ops(layers) if layers else (1, 0)
                aten = aten_kernel_ops(fwd)
                sf, sb, mf, mb = res[name]
                for pas, s, lo, ops in (("fwd", sf, mf, gf), ("bwd", sb, mb, gb)):
                    store.add(f"{name}:t{used}:{pas}", {
                        "kind": name.rstrip("0123456789"), "layers": layers, "pass": pas,
                        "threads": used, "graph_ops": ops, "aten_kernel_ops_fwd": aten,
                        "min_s": lo}, s, suspect=bad)
            for layers, parts in time_step_parts().items():
                for pas, lo in parts.items():
                    store.add(f"decoder{layers}:t{used}:{pas}", {
                        "kind": "decoder", "layers": layers, "pass": pas, "threads": used,
                        "graph_ops": 0, "aten_kernel_ops_fwd": 0, "min_s": lo},
                        stats_of([lo], 0.0), suspect=bad)
            prog.step(f"probes:t{used}", st)
    return store.path


def per_op_us(rows, threads: int) -> dict[str, float]:
    """Host microseconds per op-graph op (``fwd``, ``bwd``) from the two decoder probes, and
    per ``nn.Linear`` forward (``linear``), at ``threads``: fastest trials (10th percentile
    for files without them)."""
    def t(r):
        return r.get("min_s") or r.get("p10_s") or r["median_s"]
    sel = {(r["kind"], int(r["layers"]), r["pass"]): r for r in rows
           if int(r["threads"]) == threads}
    lo, hi = HOST_LAYERS
    out = {}
    for pas in ("fwd", "bwd"):
        a, b = sel[("decoder", lo, pas)], sel[("decoder", hi, pas)]
        out[pas] = (t(b) - t(a)) / (b["graph_ops"] - a["graph_ops"]) * 1e6
    out["linear"] = t(sel[("linear", 0, "fwd")]) * 1e6
    return out
