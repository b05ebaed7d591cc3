"""Bandwidth-bound microbenchmarks: the kernels a training step runs for each memory-bound op
family of the simulator's op graph, forward and backward, and the optimizer step.

Bytes are counted as ``simulator/workload/ops.py`` counts them for that op (so a fitted
efficiency means the same thing where the simulator uses it, as attention FLOPs are counted
with the simulator's convention): ``MEM_KERNELS`` maps each benchmarked kernel to its family
(``Op.mem_kind``), forward and backward bytes per element and kernel launches; a test checks
the table against ``ops.py``. The backward of a kernel is timed alone
(``torch.autograd.grad(..., retain_graph=True)``, the autograd engine included, as in a step).
``adamw`` times ``torch.optim.AdamW(fused=True).step()`` over a model-like list of fp32
tensors, bytes = ``simulator.engine.step.optimizer_bytes_per_param`` (fp32) per parameter.

Like the GEMMs (calibrate.bench), the kernels run with cold caches (the last-level cache is
rewritten, untimed, before each call): inside a step an op's inputs were written several ops
earlier (saved activations read in backward much earlier), and its output lands in a
recycled buffer that is no longer cached. On this VM a 2M-element GELU ran 0.24 ms hot,
0.58 ms cold and 0.67 ms per call inside a small-6l-512 training step.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from .bench import (
    BusyRetry,
    Plan,
    _threads,
    flush_cache,
    recheck_threads,
    thread_counts,
)
from .store import Progress, Store, time_call

HIDDEN_COLS = 256            # row length of the norm / elementwise points (a hidden size)
VOCAB_COLS = 4096            # row length of the cross-entropy points (a vocabulary)
OPT_TENSORS = 16             # parameter tensors the AdamW points split their params into

# kernel -> (family = Op.mem_kind, fwd bytes/elem, bwd bytes/elem or None, kernels per op)
MEM_KERNELS: dict[str, tuple[str, float, float | None, int]] = {
    "copy": ("copy", 8.0, None, 1),                # embedding lookup class: read + write
    "layernorm": ("norm", 8.0, 16.0, 1),           # ln1/ln2/final_ln: backward = 2x forward
    "gelu": ("elementwise", 8.0, 16.0, 1),         # mlp_act: read f, write f
    "add": ("elementwise", 12.0, 24.0, 1),         # residual: 2 reads + 1 write; bwd = the
                                                   # gradient accumulation autograd runs
    "cross_entropy": ("softmax", 34.0, 22.0, 8),   # head_ops cross_entropy, per logit
    "first_touch": ("first_touch", 4.0, None, 1),  # writing freshly mapped pages (see below)
}
"""``first_touch``: ``torch.ones(n)`` right after ``malloc_trim(0)`` returned the freed heap to
the OS, so every page is faulted in and zeroed by the kernel before it is written: what a
step pays for activation memory that grows through the forward pass (glibc trims the heap
top when backward frees it; tensors >= 32 MiB are mmapped afresh on every allocation). The
op graph has no op for it yet; the efficiency is recorded as ``kind_eff["first_touch"]``."""


# Op-graph family -> (kernel:pass, op-graph bytes per token per hidden unit in one dense layer
# with a 4h GELU MLP). A family's efficiency is the bandwidth its mix achieves as a whole
# (``calibrate.fit.composite_eff``): e.g. "elementwise" covers both mlp_act (GELU on 4h, 8 B
# forward, 16 B backward per element) and the two residual adds (12 B / 24 B on h), which run
# at very different rates on a CPU (GELU's erf is compute-heavy). "activation" and "residual"
# split that family for an op graph that tells them apart.
FAMILY_MIX: dict[str, tuple[tuple[str, float], ...]] = {
    "norm": (("layernorm:fwd", 8.0), ("layernorm:bwd", 16.0)),
    "softmax": (("cross_entropy:fwd", 34.0), ("cross_entropy:bwd", 22.0)),
    "elementwise": (("gelu:fwd", 32.0), ("gelu:bwd", 64.0), ("add:fwd", 24.0),
                    ("add:bwd", 48.0)),
    "activation": (("gelu:fwd", 8.0), ("gelu:bwd", 16.0)),
    "residual": (("add:fwd", 12.0), ("add:bwd", 24.0)),
    "optimizer": (("adamw:step", 1.0),),
    "first_touch": (("first_touch:fwd", 1.0),),
}


def optimizer_bytes_fp32() -> float:
    from simulator.engine.step import optimizer_bytes_per_param
    from simulator.parallel.plan import Plan as SimPlan
    return optimizer_bytes_per_param(SimPlan(precision="fp32"))


def _shape(kernel: str, elems: int, cols: int = 0) -> tuple[int, int]:
    cols = cols or (VOCAB_COLS if kernel == "cross_entropy" else HIDDEN_COLS)
    cols = min(cols, elems)
    return max(1, elems // cols), cols


def mem_fn(kernel: str, elems: int, pas: str, device=None, dtype=None, cols: int = 0):
    """The timed callable of one point (``pas`` "fwd" or "bwd") on ``device`` (default the
    CPU) in ``dtype`` (default fp32), rows of ``cols`` elements (default ``_shape``'s)."""
    import torch
    import torch.nn.functional as F
    kw = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    if kernel == "first_touch":
        return lambda: torch.ones(elems, **kw)
    rows, cols = _shape(kernel, elems, cols)
    x = torch.randn(rows, cols, requires_grad=(pas == "bwd"), **kw)
    if kernel == "copy":
        return lambda: x.clone()
    if kernel == "add":
        y = torch.randn(rows, cols, **kw)
        return lambda: torch.add(x.detach(), y)            # forward add and gradient sum alike
    if kernel == "layernorm":
        w = torch.ones(cols, requires_grad=(pas == "bwd"), **kw)
        f = lambda: F.layer_norm(x, (cols,), w)
        inputs = (x, w)
    elif kernel == "gelu":
        f, inputs = (lambda: F.gelu(x)), (x,)
    elif kernel == "cross_entropy":
        t = torch.randint(0, cols, (rows,), device=device)
        f, inputs = (lambda: F.cross_entropy(x, t)), (x,)
    else:
        raise ValueError(kernel)
    if pas == "fwd":
        return f
    out = f()
    g = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
    return lambda: torch.autograd.grad(out, inputs, g, retain_graph=True)


_LIBC: list = []


def release_heap() -> None:
    """``malloc_trim(0)``: hand freed heap memory back to the OS (glibc; no-op elsewhere)."""
    if not _LIBC:
        import ctypes
        import ctypes.util
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(getattr(lib, "malloc_trim", None))
        except OSError:
            _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)


def mem_points(plan: Plan) -> list[tuple[str, int, str]]:
    """(kernel, elements, pass); cross-entropy also at 2x and 4x the largest size (logits of
    a real vocabulary: 1024 tokens x 8192 logits is 33.6 MB, above glibc's 32 MiB mmap
    threshold, so those buffers are freshly mapped pages on every call, as in a step)."""
    out = []
    for k in plan.memory_kernels:
        fam, fwd, bwd, _ = MEM_KERNELS[k]
        sizes = list(plan.memory_elems)
        if k == "cross_entropy" and sizes:
            sizes += [2 * max(sizes), 4 * max(sizes)]
        for e in sizes:
            out.append((k, e, "fwd"))
            if bwd is not None:
                out.append((k, e, "bwd"))
    return out


def bench_memory(out: Path, env: Mapping[str, str], plan: Plan, quiet: bool = False) -> Path:
    """Memory-bound families (fp32) over sizes, forward and backward; AdamW steps."""
    store = Store(out, "memory", env)
    points = [(k, e, pas, t) for t in thread_counts() for k, e, pas in mem_points(plan)]
    points += [("adamw", n, "step", t) for t in thread_counts() for n in plan.optimizer_params]
    prog = Progress("memory", len(points), quiet)
    busy = BusyRetry(plan.busy_retry_s)
    for kernel, elems, pas, thr in points:
        with _threads(thr) as used:
            key = f"{kernel}:{elems}:{pas}:t{used}"
            if store.has(key):
                prog.step(key, None)
                continue
            fn = adamw_fn(elems) if kernel == "adamw" else mem_fn(kernel, elems, pas)
            cold = plan.cold_cache and kernel not in ("adamw", "first_touch")
            setup = flush_cache if cold else (release_heap if kernel == "first_touch" else None)
            st, bad = busy.measure(lambda: time_call(fn, plan.warmup, plan.repeats,
                                                     plan.budget_s * (2.0 if cold else 1.0),
                                                     setup=setup))
            store.add(key, {"kernel": kernel, "elems": elems, "pass": pas, "threads": used,
                            "cache": "cold" if cold else "hot",
                            **accounting(kernel, elems, pas)}, st, suspect=bad)
            prog.step(key, st)
    recheck_threads(store, plan, _row_fn, quiet)
    return store.path


def accounting(kernel: str, elems: int, pas: str) -> dict[str, object]:
    """Family, op-graph bytes and kernel launches of one point."""
    if kernel == "adamw":
        return {"family": "optimizer", "bytes_moved": optimizer_bytes_fp32() * elems,
                "kernels": 4}
    fam, fwd, bwd, kernels = MEM_KERNELS[kernel]
    per = fwd if pas == "fwd" else bwd
    return {"family": fam, "bytes_moved": float(per * elems), "kernels": kernels}


def _row_fn(r):
    if r["kernel"] == "adamw":
        return adamw_fn(int(r["elems"]))
    return mem_fn(r["kernel"], int(r["elems"]), r.get("pass") or "fwd")


def adamw_fn(n_params: int):
    """One fused AdamW step over ``n_params`` fp32 parameters in ``OPT_TENSORS`` tensors."""
    import torch
    k = max(1, min(OPT_TENSORS, n_params // 1024))
    sizes = [n_params // k] * k
    params = [torch.nn.Parameter(torch.randn(s)) for s in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    try:
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(params, lr=1e-4)
    opt.step()                                  # allocates the state
    return opt.step
