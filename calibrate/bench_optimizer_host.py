"""Host cost of the optimizer step and of gradient clipping as the frameworks issue them,
per parameter tensor and per step, in eager ops of this host.

``python -m calibrate.bench_optimizer_host [--write]`` builds N = 8, 32 and 128 fp32
parameter tensors of 16x32 (the 2-rank FSDP2 shard of a 32x32 weight; the kernels are nearly
free, so what is timed is host work), gradients set, the optimizer's state created, and
times one step and one clip of:

(a) ``optimizer_step_foreach``: ``torch.optim.AdamW(foreach=True)`` (torch 2.13
    torch/optim/adam.py ``_multi_tensor_adam``) and ``torch.nn.utils.clip_grad_norm_(
    foreach=True)`` on plain tensors: HF Trainer, plain PyTorch, DDP; FSDP1 with
    use_orig_params=False too, whose optimizer sees one flat parameter per unit (N = units).
(b) ``optimizer_step_fsdp2_dtensor``: the same AdamW, and torchtitan's ``clip_grad_norm_``
    (torchtitan/distributed/utils.py @ b5bcd76 L594-672 with PP and EP off: get_total_norm,
    ``full_tensor()`` of the partial norm, clip_grads_with_norm_; trainer.py L919-925 calls
    it with foreach=True), on FSDP2 (``fully_shard``) DTensor parameters over the fake 2-rank
    process group of ``calibrate.bench_framework``. Written as DTensor minus the plain
    tensors of (a) at the same N (same local shapes): the DTensor Python (sharding
    propagation, unwrapping, re-wrapping), which transfers to a GPU host. Also for
    ``fused=True``, torchtitan's default implementation (optimizer.py ``implementation``).
(c) ``optimizer_step_decoupled_adamw``: Composer's ``DecoupledAdamW`` (llm-foundry's
    ``decoupled_adamw``), re-created from composer/optim/decoupled_weight_decay.py @ 64051888
    (the same code as v0.16.3 L215-321): ``__init__`` L215-232, the per-tensor loop
    ``adamw`` L268-295, ``step`` L297-373; llm-foundry's pretraining yamls' lr 6e-4,
    betas (0.9, 0.95), eps 1e-8, weight_decay 0.0; and Composer's clipping by norm,
    composer/algorithms/gradient_clipping/gradient_clipping.py @ 64051888 L59
    (``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``, default foreach; under
    FSDP1 it calls FSDP's own clip_grad_norm_ instead, L45-53: not timed here).
(extra) ``optimizer_step_fused``: ``AdamW(fused=True)`` on plain tensors, HF Trainer 5.x's
    default optimizer with torch >= 2.8 (training_args.py ``default_optim``).

Counted: every aten call a ``TorchDispatchMode`` sees in one step and one clip at each N
(a DTensor call is counted as ``dtensor:<op>`` and handed on to DTensor, whose local calls
are then counted too), fitted as fixed + per tensor, and written into the rows' method text:
the ``eager_ops`` column stays a time.

Timed: the calling thread's CPU time per call (``bench_host.time_interleaved``: every case
at every N interleaved trial by trial with the host probe's 1- and 5-layer decoders; the
10th percentile over 40 trials of 5 calls); fixed and per-tensor costs are the least-squares
line through the three N, and are divided by the probe's host time per op-graph op forward
from the same run (``op_fwd_us_same_run``): eager ops.

Transfer to a CUDA host. On the CPU a ``_foreach_*`` op runs its slow path, a loop calling
the per-tensor op through the dispatcher inside the one dispatch; on CUDA it is one
``multi_tensor_apply`` launch per chunk. The CPU per-tensor cost of (a) therefore overstates
a CUDA host's; the ``CUDA estimate`` rows subtract the slow path: every call of the step
(clip) that takes a tensor of more than 0 dimensions is recorded once and replayed alone at
each N, and its per-tensor slope is taken off (the replay's per-tensor list handling, which
CUDA has too, goes with it: the estimate is a little low). The step counters stay on the CPU
on a CUDA host (AdamW without capturable or fused: adam.py ``_init_group``), so their
``_foreach_add_`` and the two ``.item()`` per tensor of the bias corrections run on a CUDA
host as here and are kept. The 'meta' device is no stand-in: its foreach kernels are Python
per tensor (about 600 us per tensor on this host, 20x the CPU). (b) is a difference of like
calls, and in (c) every op is one dispatch per tensor on either device: both transfer as
they are.

Host syncs: Composer's loop reads ``state_steps[i].item()`` (L272) from a step counter it
creates on the parameter's device (L338): on a GPU one device-to-host sync per parameter
tensor per step, so the host cannot run ahead of the device through the optimizer step.
torch's AdamW reads ``.item()`` only from CPU step counters (no sync); fused AdamW and
clip_grad_norm_ (error_if_nonfinite False) read none; torchtitan reads ``grad_norm.item()``
only on logging steps.

Warm mode: ``calibrate.bench_optimizer_warm`` times the same steps and clips right after the
same model's own forward and backward (rows labelled ``warm: ``).

The run is refused for writing when the host was busy (CPU pressure over
``bench.PRESSURE_SUSPECT`` after re-measuring with backoff) or a per-tensor cost came out
not positive.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import functools
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from .bench import PRESSURE_MAX, PRESSURE_SUSPECT, backoff_s
from .bench_dp import _mechanism_rows, replay
from .bench_framework import COLUMNS, CSV, _cpu_model, _init_fake_pg
from .bench_host import HOST_LAYERS, _decoder_fns, graph_ops, time_interleaved

N_TENSORS = (8, 32, 128)
WORLD = 2
SHAPE = (32, 32)                             # a weight; FSDP2 shards dim 0 over WORLD ranks
LOCAL = (SHAPE[0] // WORLD, SHAPE[1])
GRAD = 1e-3                                  # every gradient element: total norm < MAX_NORM
MAX_NORM = 1.0
TORCH_ADAMW = {"lr": 8e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
COMPOSER_ADAMW = {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
TRIALS = 40
RETRY_BUDGET_S = 30.0
FOREACH, FSDP2 = "optimizer_step_foreach", "optimizer_step_fsdp2_dtensor"
COMPOSER, FUSED = "optimizer_step_decoupled_adamw", "optimizer_step_fused"


# ---- counting ----------------------------------------------------------------------------
def count_calls(fn: Callable[[], object]) -> Counter:
    """Aten calls one run of ``fn`` dispatches, by op name (views included). A call on
    DTensors is counted as ``dtensor:<op>`` and handed to DTensor (a mode returning
    NotImplemented stays active), so the local calls its handler issues are counted too."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    seen: Counter = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if any(issubclass(t, DTensor) for t in types):
                seen["dtensor:" + name] += 1
                return NotImplemented
            seen[name] += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return seen


def fit_line(ns, ys) -> tuple[float, float]:
    """(fixed, per tensor): the least-squares line through the points (ns, ys)."""
    mx, my = sum(ns) / len(ns), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(ns, ys))
             / sum((x - mx) ** 2 for x in ns))
    return my - slope * mx, slope


def count_fit(by_n: dict[int, Counter]) -> dict[str, tuple[float, float]]:
    """(fixed, per tensor) calls of each op name and of ``total`` / ``dtensor`` (the DTensor
    level) / ``local`` (the rest), from the counts at several N."""
    ns = sorted(by_n)
    names = {k for c in by_n.values() for k in c}
    fits = {k: fit_line(ns, [by_n[n][k] for n in ns]) for k in names}
    for label, keep in (("total", lambda k: True), ("dtensor", lambda k: k.startswith("dtensor:")),
                        ("local", lambda k: not k.startswith("dtensor:"))):
        fits[label] = fit_line(ns, [sum(v for k, v in by_n[n].items() if keep(k)) for n in ns])
    return fits


def count_text(fits: dict[str, tuple[float, float]]) -> str:
    """One line of a ``count_fit``: totals, then the ops that grow per tensor."""
    def g(v: float) -> str:
        return f"{round(v, 2):g}"
    per = ", ".join(f"{k} {g(p)}" for k, (_, p) in sorted(fits.items())
                    if abs(p) > 1e-9 and k not in ("total", "dtensor", "local"))
    head = f"{g(fits['total'][0])} + {g(fits['total'][1])}/tensor"
    if fits["dtensor"][0] or fits["dtensor"][1]:
        head += (f" (DTensor-level {g(fits['dtensor'][0])} + {g(fits['dtensor'][1])}/tensor, "
                 f"local {g(fits['local'][0])} + {g(fits['local'][1])}/tensor)")
    n_foreach = sum(f for k, (f, _) in fits.items()
                    if k.startswith(("_foreach_", "_fused_")))
    return f"{head}; foreach/fused calls {g(n_foreach)} per step; per tensor: {per or 'none'}"


# ---- the cases -----------------------------------------------------------------------------
def plain_params(n: int, shape=LOCAL) -> list:
    """``n`` fp32 parameters of ``shape``, each with its gradient (all ``GRAD``)."""
    import torch
    ps = [torch.nn.Parameter(torch.randn(shape)) for _ in range(n)]
    for p in ps:
        p.grad = torch.full_like(p, GRAD)
    return ps


@functools.cache
def _mesh():
    from torch.distributed.device_mesh import init_device_mesh
    _init_fake_pg()
    return init_device_mesh("cpu", (WORLD,))


def dtensor_params(n: int) -> list:
    """The parameters of ``n`` bias-free 32x32 Linears, each ``fully_shard``-ed (and the
    root) on the fake 2-rank mesh: FSDP2's DTensors (Shard(0), local 16x32), gradients set."""
    import torch
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Sequential(*[torch.nn.Linear(*SHAPE, bias=False) for _ in range(n)])
    for lin in model:
        fully_shard(lin, mesh=_mesh())
    fully_shard(model, mesh=_mesh())
    ps = list(model.parameters())
    for p in ps:
        p.grad = torch.full_like(p, GRAD)
    return ps


def adamw_step(params: list, **impl) -> Callable[[], object]:
    """``torch.optim.AdamW(params, **TORCH_ADAMW, **impl).step``, stepped twice (state made)."""
    import torch
    opt = torch.optim.AdamW(params, **TORCH_ADAMW, **impl)
    opt.step()
    opt.step()
    return opt.step


def torchtitan_clip(parameters, max_norm: float, foreach: bool | None = True):
    """torchtitan/distributed/utils.py ``clip_grad_norm_`` @ b5bcd76 (L594-672), PP and EP
    off, as trainer.py L919-925 calls it (foreach=True)."""
    import torch
    from torch.distributed.tensor import DTensor
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm(grads, 2.0, False, foreach)
    if isinstance(total_norm, DTensor):
        total_norm = total_norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


def _composer_adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *,
                    amsgrad, beta1, beta2, lr, initial_lr, weight_decay, eps) -> None:
    """Composer ``DecoupledAdamW.adamw`` (decoupled_weight_decay.py @ 64051888 L268-295)."""
    import torch
    for i, param in enumerate(params):
        grad = grads[i]
        exp_avg = exp_avgs[i]
        exp_avg_sq = exp_avg_sqs[i]
        step = state_steps[i].item()
        if weight_decay != 0:
            decay_factor = (lr / initial_lr) if initial_lr else 1.0
            param.mul_(1 - decay_factor * weight_decay)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            denom = (max_exp_avg_sqs[i].sqrt() / math.sqrt(bias_correction2)).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
        step_size = lr / bias_correction1
        param.addcdiv_(exp_avg, denom, value=-step_size)


def _composer_step(self, closure=None):
    """Composer ``DecoupledAdamW.step`` (L297-373; run under torch.no_grad as L297)."""
    import torch
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    for group in self.param_groups:
        params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = (
            [], [], [], [], [], [])
        amsgrad = group['amsgrad']
        beta1, beta2 = group['betas']
        eps = group['eps']
        lr = group['lr']
        if 'initial_lr' not in group:
            group['initial_lr'] = lr
        initial_lr = group['initial_lr']
        weight_decay = group['weight_decay']
        for p in group['params']:
            if p.grad is None or not p.requires_grad:
                continue
            params_with_grad.append(p)
            if p.grad.is_sparse:
                raise RuntimeError('AdamW does not support sparse gradients')
            grads.append(p.grad)
            state = self.state[p]
            if 'step' not in state:
                state['step'] = torch.zeros((), dtype=torch.float, device=p.device)
                state['exp_avg'] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state['max_exp_avg_sq'] = torch.zeros_like(
                        p, memory_format=torch.preserve_format)
            exp_avgs.append(state['exp_avg'])
            exp_avg_sqs.append(state['exp_avg_sq'])
            if amsgrad:
                max_exp_avg_sqs.append(state['max_exp_avg_sq'])
            state['step'] += 1
            state_steps.append(state['step'])
        self.adamw(params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                   state_steps, amsgrad=amsgrad, beta1=beta1, beta2=beta2, lr=lr,
                   initial_lr=initial_lr, weight_decay=weight_decay, eps=eps)
    return loss


@functools.cache
def decoupled_adamw_class() -> type:
    """Composer's ``DecoupledAdamW(AdamW)`` (L181-373; its metric-reporting methods left
    out): torch's AdamW ``__init__``, ``initial_lr`` per group (L229-232), Composer's step."""
    import torch

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-5,
                 amsgrad=False):
        torch.optim.AdamW.__init__(self, params=params, lr=lr, betas=betas, eps=eps,
                                   weight_decay=weight_decay, amsgrad=amsgrad)
        for group in self.param_groups:
            group['initial_lr'] = group['lr']
        self.amsgrad = amsgrad
    return type("DecoupledAdamW", (torch.optim.AdamW,), {
        "__init__": __init__, "adamw": staticmethod(_composer_adamw),
        "step": torch.no_grad()(_composer_step)})


def composer_step(params: list, **hyper) -> Callable[[], object]:
    """``DecoupledAdamW(params, **(COMPOSER_ADAMW | hyper)).step``, stepped twice."""
    opt = decoupled_adamw_class()(params, **{**COMPOSER_ADAMW, **hyper})
    opt.step()
    opt.step()
    return opt.step


def cases(n: int) -> dict[str, Callable[[], object]]:
    """Every timed case at ``n`` parameter tensors, warmed up; ``*_slow``: the replays."""
    import torch
    clip_plain = plain_params(n)
    dt, dt_fused, comp = dtensor_params(n), dtensor_params(n), plain_params(n)
    return {
        "foreach_step": adamw_step(plain_params(n), foreach=True),
        "foreach_clip": lambda: torch.nn.utils.clip_grad_norm_(clip_plain, MAX_NORM,
                                                               foreach=True),
        "foreach_step_slow": replay(adamw_step(plain_params(n), foreach=True)),
        "foreach_clip_slow": replay(functools.partial(
            torch.nn.utils.clip_grad_norm_, plain_params(n), MAX_NORM, foreach=True)),
        "fused_step": adamw_step(plain_params(n), fused=True),
        "fused_step_slow": replay(adamw_step(plain_params(n), fused=True), True),
        "dtensor_step": adamw_step(dt, foreach=True),
        "dtensor_clip": functools.partial(torchtitan_clip, dt, MAX_NORM, True),
        "dtensor_fused_step": adamw_step(dt_fused, fused=True),
        "composer_step": composer_step(comp),
        "composer_clip": lambda: torch.nn.utils.clip_grad_norm_(iter(comp), MAX_NORM),
    }


# ---- measuring ---------------------------------------------------------------------------
def _timed_quietly(timed: dict, trials: int) -> tuple[dict, float]:
    """``time_interleaved`` of ``timed``: {case: 10th-percentile us (fwd, bwd)} and the CPU
    pressure of the run; re-run with backoff (within ``RETRY_BUDGET_S`` of pauses) while
    other load held the CPU (> ``PRESSURE_MAX``), keeping the least contaminated run."""
    best: tuple[dict, float] | None = None
    left, attempt = RETRY_BUDGET_S, 0
    while True:
        r = time_interleaved(timed, trials=trials)
        pressure = max(f.pressure for f, _, _, _ in r.values())
        if best is None or pressure < best[1]:
            best = ({k: (f.p10_s * 1e6, b.p10_s * 1e6) for k, (f, b, _, _) in r.items()},
                    pressure)
        if best[1] <= PRESSURE_MAX or left <= 0:
            return best
        pause = min(backoff_s(attempt), left)
        print(f"host busy ({pressure:.0%} CPU pressure): re-measuring in {pause:.0f} s",
              file=sys.stderr)
        time.sleep(pause)
        left, attempt = left - pause, attempt + 1


def measure(trials: int = TRIALS, ns=N_TENSORS) -> dict:
    """Counts (per case and N) and interleaved timings (us per call) of every case, the
    probe's us per op-graph op forward, and the CPU pressure of the timing."""
    import torch
    torch.set_num_threads(1)
    _init_fake_pg()
    built = {n: cases(n) for n in ns}
    for fn in (f for cs in built.values() for f in cs.values()):
        fn(), fn()                     # DTensor's sharding-propagation cache warm
    counts = {(name, n): count_calls(fn) for n, cs in built.items() for name, fn in cs.items()
              if not name.endswith("_slow")}
    timed: dict = {(name, n): (fn, lambda _: None) for n, cs in built.items()
                   for name, fn in cs.items()}
    timed.update({("probe", k): _decoder_fns(k)[:2] for k in HOST_LAYERS})
    us, pressure = _timed_quietly(timed, trials)
    lo, hi = HOST_LAYERS
    op = (us[("probe", hi)][0] - us[("probe", lo)][0]) / (graph_ops(hi)[0] - graph_ops(lo)[0])
    return {"us": {k: v[0] for k, v in us.items() if k[0] != "probe"}, "counts": counts,
            "op_fwd_us": op, "pressure": pressure, "ns": tuple(ns)}


PAIRS = {"dtensor_step": "foreach_step", "dtensor_clip": "foreach_clip",
         "dtensor_fused_step": "fused_step"}


def costs(m: dict) -> dict[str, tuple[float, float]]:
    """(fixed, per tensor) us of every case, and derived: ``<case>_cuda`` (the per-tensor
    cost less its replayed slow path's) and ``<dtensor case>_over`` (minus its plain pair)."""
    ns = m["ns"]
    names = sorted({name for name, _ in m["us"]})
    out = {k: fit_line(ns, [m["us"][(k, n)] for n in ns]) for k in names}
    for k in ("foreach_step", "foreach_clip", "fused_step"):
        out[k + "_cuda"] = (out[k][0], out[k][1] - out[k + "_slow"][1])
    for d, plain in PAIRS.items():
        out[d + "_over"] = (out[d][0] - out[plain][0], out[d][1] - out[plain][1])
    return out


def residual(m: dict, name: str) -> float:
    """Largest deviation of ``name``'s timings from its line, as a fraction of the largest."""
    ns = m["ns"]
    ys = [m["us"][(name, n)] for n in ns]
    a, b = fit_line(ns, ys)
    return max(abs(y - a - b * n) for n, y in zip(ns, ys)) / max(ys)


def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may)."""
    c = costs(m)
    bad = [f"host busy: {m['pressure']:.0%} CPU pressure (> {PRESSURE_SUSPECT:.0%})"
           for _ in [0] if m["pressure"] > PRESSURE_SUSPECT]
    if not 0 < m["op_fwd_us"] < 1e3:
        bad.append(f"probe per-op cost {m['op_fwd_us']:.2f} us out of range")
    # every per-tensor figure a coefficient is built from: the raw cases, their CUDA
    # estimates and the DTensor-minus-plain differences
    raw = [k for k in ("foreach_step", "foreach_clip", "fused_step", "dtensor_step",
                       "dtensor_clip", "dtensor_fused_step", "composer_step", "composer_clip",
                       "foreach_step_cuda", "foreach_clip_cuda", "fused_step_cuda",
                       *(d + "_over" for d in PAIRS)) if k in c]
    bad += [f"{k}: per-tensor cost {c[k][1]:.2f} us not positive" for k in raw if c[k][1] <= 0]
    return bad


# ---- rows ----------------------------------------------------------------------------------
def _calls(m: dict, case: str) -> str:
    return count_text(count_fit({n: m["counts"][(case, n)] for n in m["ns"]}))


def _common(m: dict) -> str:
    import torch
    ns = "/".join(map(str, m["ns"]))
    return (f"on N = {ns} parameter tensors (fp32, local 16x32), torch {torch.__version__}, "
            "thread CPU time interleaved with the host probe (10th percentile of 40 trials x "
            "5 calls), fixed and per tensor = the least-squares line through the N; CPU "
            f"pressure {m['pressure']:.2f}; calibrate.bench_optimizer_host")


def _methods(m: dict) -> dict[str, str]:
    """The rows' method text of each mechanism, with the counted aten calls per step."""
    cuda = ("CUDA estimate = per tensor minus the per-tensor slope of the calls on "
            "parameter-shaped tensors replayed alone (the CPU's per-tensor slow path; the CPU "
            "step counters' _foreach_add_ and .item() kept)")
    adamw = "lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 (torchtitan default_adamw)"
    return {
        FOREACH: f"torch.optim.AdamW(foreach=True, {adamw}).step() and torch.nn.utils."
                 f"clip_grad_norm_(max_norm 1, foreach=True) {_common(m)}; {cuda}; aten calls "
                 f"per step (TorchDispatchMode): step {_calls(m, 'foreach_step')}; clip "
                 f"{_calls(m, 'foreach_clip')}",
        FUSED: f"torch.optim.AdamW(fused=True, {adamw}).step() {_common(m)}; CUDA estimate "
               "= per tensor minus the per-tensor slope of the step's tensor calls replayed "
               "alone (_foreach_add_ of the step counters, on the device under fused, and "
               "_fused_adamw_, whose CPU kernel loops over the tensors); aten calls per step: "
               f"{_calls(m, 'fused_step')}",
        FSDP2: "FSDP2 fully_shard DTensor parameters (bias-free 32x32 Linears, one unit each "
               "and the root, Shard(0) on a fake 2-rank mesh) minus plain tensors of the local "
               f"shape: AdamW(foreach=True / fused=True, {adamw}) step, and torchtitan "
               "clip_grad_norm_ (distributed/utils.py @ b5bcd76 L594-672, PP/EP off, "
               "foreach=True, full_tensor() all-reduce on the fake group) minus torch "
               f"clip_grad_norm_(foreach=True), {_common(m)}; aten calls per step: foreach "
               f"step {_calls(m, 'dtensor_step')}; fused step {_calls(m, 'dtensor_fused_step')}"
               f"; clip {_calls(m, 'dtensor_clip')}",
        COMPOSER: "Composer DecoupledAdamW re-created from composer/optim/decoupled_weight_decay"
                  ".py @ 64051888 (__init__ L215-232, per-tensor loop L268-295, step L297-373;"
                  " lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.0 as llm-foundry's "
                  "pretraining yamls) and clip_grad_norm_(model.parameters(), 1.0) as "
                  "algorithms/gradient_clipping/gradient_clipping.py @ 64051888 L59 (default "
                  f"foreach) {_common(m)}; every op one dispatch per tensor on either device; "
                  "the step counter is on the parameter's device (L338), so on a GPU its "
                  ".item() (L272) is a device-to-host sync per tensor; aten calls per step: "
                  f"step {_calls(m, 'composer_step')}; clip {_calls(m, 'composer_clip')}",
    }


def metric_values(c: dict) -> list[tuple[str, str, float]]:
    """(mechanism, metric, us) of every row, from ``costs``."""
    cuda = "CUDA estimate (CPU slow path removed)"
    out = [(FOREACH, "per parameter tensor, step", c["foreach_step"][1]),
           (FOREACH, "per step, fixed", c["foreach_step"][0]),
           (FOREACH, f"per parameter tensor, step, {cuda}", c["foreach_step_cuda"][1]),
           (FOREACH, "per parameter tensor, clip_grad_norm_", c["foreach_clip"][1]),
           (FOREACH, "per step, fixed, clip_grad_norm_", c["foreach_clip"][0]),
           (FOREACH, f"per parameter tensor, clip_grad_norm_, {cuda}", c["foreach_clip_cuda"][1]),
           (FUSED, "per parameter tensor, step", c["fused_step"][1]),
           (FUSED, "per step, fixed", c["fused_step"][0]),
           (FUSED, f"per parameter tensor, step, {cuda}", c["fused_step_cuda"][1])]
    for case, what in (("dtensor_step", "step"), ("dtensor_clip", "clip_grad_norm_"),
                       ("dtensor_fused_step", "fused step")):
        fixed, per = c[case + "_over"]
        out += [(FSDP2, f"per parameter tensor, {what}, DTensor minus plain", per),
                (FSDP2, f"per step, fixed, {what}, DTensor minus plain", fixed)]
    return out + [(COMPOSER, "per parameter tensor, step", c["composer_step"][1]),
                  (COMPOSER, "per step, fixed", c["composer_step"][0]),
                  (COMPOSER, "per parameter tensor, clip_grad_norm_", c["composer_clip"][1]),
                  (COMPOSER, "per step, fixed, clip_grad_norm_", c["composer_clip"][0])]


def rows(m: dict, how: dict | None = None, label: str = "", extra=()) -> list[dict]:
    """The CSV rows of one run (``COLUMNS``): ``metric_values`` and ``extra`` ((mechanism,
    metric, us)), metrics prefixed with ``label``, methods ``how`` (default ``_methods``)."""
    import torch
    op = m["op_fwd_us"]
    base = {"op_fwd_us_same_run": round(op, 2), "torch": torch.__version__,
            "host": f"{_cpu_model()} ({torch.get_num_threads()} thread)",
            "date": dt.date.today().isoformat()}
    how = how or _methods(m)
    return [r for mech, metric, us in [*metric_values(costs(m)), *extra]
            for r in _mechanism_rows(base, op, mech, how[mech], [(label + metric, us)])]


def print_table(m: dict, out=sys.stdout) -> None:
    """Every case: us per call at each N, the line (fixed, per tensor) in us and eager ops,
    and how far the points stray from it; then the aten calls per step."""
    op, ns, c = m["op_fwd_us"], m["ns"], costs(m)
    print(f"probe: {op:.2f} us per op-graph op forward; CPU pressure {m['pressure']:.2f}",
          file=out)
    print(f"{'case':30s}" + "".join(f"{f'N={n}':>10s}" for n in ns)
          + f"{'fixed us':>10s}{'per-t us':>10s}{'fixed eo':>10s}{'per-t eo':>10s}{'resid':>7s}",
          file=out)
    for k, (fixed, per) in sorted(c.items()):
        pts = "".join(f"{m['us'][(k, n)]:10.1f}" if (k, n) in m["us"] else f"{'':10s}"
                      for n in ns)
        res = f"{residual(m, k):7.2f}" if (k, ns[0]) in m["us"] else ""
        print(f"{k:30s}{pts}{fixed:10.1f}{per:10.2f}{fixed / op:10.2f}{per / op:10.3f}{res}",
              file=out)
    for case in sorted({k for k, _ in m["counts"]}):
        print(f"aten calls, {case}: {_calls(m, case)}", file=out)


def _append(path: Path, new: list[dict]) -> tuple[int, int]:
    """Append ``new`` to the CSV at ``path``; the (first, last) line numbers written."""
    before = path.read_text().count("\n") if path.exists() else 0
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        if not before:
            w.writeheader()
            before = 1
        w.writerows(new)
    return before + 1, before + len(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_optimizer_host")
    ap.add_argument("--write", action="store_true", help="append the rows to --out")
    ap.add_argument("--out", default=str(CSV), help="the CSV (default: host_mechanisms.csv)")
    ap.add_argument("--trials", type=int, default=TRIALS)
    args = ap.parse_args(argv)
    m = measure(args.trials)
    print_table(m)
    return emit(rows(m), problems(m), args.write, args.out)


def emit(new: list[dict], bad: list[str], write: bool, out: str) -> int:
    """Print the rows ``new``; append them to the CSV ``out`` if ``write`` and the run has
    no ``bad`` (why not fit); the exit status (2: refused for writing)."""
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(new)
    if bad:
        print(f"rows {'NOT written' if write else 'not fit to write'}: " + "; ".join(bad),
              file=sys.stderr)
        return 2 if write else 0
    if write:
        first, last = _append(Path(out), new)
        print(f"appended {len(new)} rows to {out}: lines {first}-{last}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
