"""``calibrate.bench_optimizer_host``'s optimizer steps and clips in the warm protocol: each
right after the same model's own forward and backward, as in a training loop
(``python -m calibrate.bench_optimizer_warm [--write]``; rows labelled ``LABEL``).

The tight loop of ``bench_optimizer_host`` times 5 calls of a step in a row, nothing between
them: its caches are warmer than a training loop's, where the step follows the model's
backward. Here every case is a model of N = 8, 32, 128 parameter tensors whose round is
forward, backward (untimed), clip, step, ``zero_grad(set_to_none=True)`` (each timed):

* ``foreach`` / ``fused``: N parallel bias-free Linears of the plain 16x32 weights of
  ``bench_optimizer_host`` (the loss: the sum of their outputs on one input row), torch
  ``AdamW(foreach=True)`` / ``AdamW(fused=True)`` and ``clip_grad_norm_(1.0, foreach=True)``;
* ``foreach_slow`` / ``fused_slow``: the same model, the step's (and for foreach the clip's)
  tensor calls replayed alone (``bench_dp.replay``, as the tight loop's CUDA estimate), on
  the live gradients (zero_grad keeps them: set_to_none=False, untimed);
* ``dtensor`` / ``dtensor_fused``: a chain of N bias-free 32x32 Linears, ``fully_shard``-ed
  each and the root on the fake 2-rank mesh (FSDP2's forward and backward on the fake
  group: local 16x32 DTensors), the foreach / fused AdamW and torchtitan's clip;
* ``composer``: the plain model, Composer's DecoupledAdamW and ``clip_grad_norm_(1.0)``.

Protocol (``bench_deepspeed_step``'s): per trial each setup in turn runs ``WARM`` untimed
rounds then ``REPEATS`` timed ones back to back; the host probe's decoders are setups timed
alike in the same trials (``bench_mcore_ddp.time_phases``); the 10th percentile of
``TRIALS`` trials; re-timed while noisy (``bench_hf_host.noise``). The fits, the CUDA
estimates and the DTensor-minus-plain differences are ``bench_optimizer_host.costs``; every
coefficient of its rows gets a counterpart here, plus zero_grad's and the fused setup's clip.
"""
from __future__ import annotations

import argparse
import sys

from . import bench_optimizer_host as host

LABEL = "warm: "
TRIALS, REPEATS, WARM = 30, 2, 1
CASES = ("foreach", "foreach_slow", "fused", "fused_slow", "dtensor", "dtensor_fused",
         "composer")


def _passes(forward) -> list[tuple[str, object]]:
    """The untimed forward (``forward()``: the loss) and backward phases of a model."""
    held = {}
    return [("_fwd", lambda: held.update(loss=forward())),
            ("_bwd", lambda: held.pop("loss").backward())]


def plain_model(n: int):
    """(forward, parameters): N parallel bias-free Linears of weight ``host.LOCAL``."""
    import torch
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(host.LOCAL) * 0.1) for _ in range(n)]
    x = torch.randn(1, host.LOCAL[1])
    return (lambda: sum(torch.nn.functional.linear(x, p).sum() for p in ps)), ps


def dtensor_model(n: int):
    """(forward, parameters): a chain of N bias-free ``host.SHAPE`` Linears, each and the
    root ``fully_shard``-ed on the fake 2-rank mesh."""
    import torch
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(*host.SHAPE, bias=False) for _ in range(n)])
    for lin in model:
        fully_shard(lin, mesh=host._mesh())
    fully_shard(model, mesh=host._mesh())
    x = torch.randn(1, host.SHAPE[1])
    return (lambda: model(x).sum()), list(model.parameters())


def _round(fwd, ps, opt, clip, slow: bool = False) -> list[tuple[str, object]]:
    """fwd, bwd, then ``clip`` and ``opt`` (a step callable), zero_grad; ``slow``: zero_grad
    keeps the gradients (the replays hold them)."""

    def zero():
        for p in ps:
            if slow:
                p.grad.zero_()
            else:
                p.grad = None
    return _passes(fwd) + [("clip", clip), ("step", opt), ("zero_grad", zero)]


def case_phases(case: str, n: int) -> list[tuple[str, object]]:
    """One round of ``case`` at ``n`` tensors, phases named as ``host.costs`` names the
    cases (``<case>_clip``, ``<case>_step``, ``<case>_zero_grad``; replays ``..._slow``)."""
    import functools

    import torch

    from .bench_dp import replay
    kind = case.removesuffix("_slow")
    fwd, ps = (dtensor_model if kind.startswith("dtensor") else plain_model)(n)
    clip = functools.partial(torch.nn.utils.clip_grad_norm_, ps, host.MAX_NORM, foreach=True)
    if kind.startswith("dtensor"):
        clip = functools.partial(host.torchtitan_clip, ps, host.MAX_NORM, True)
    elif kind == "composer":
        clip = functools.partial(torch.nn.utils.clip_grad_norm_, ps, host.MAX_NORM)
    impl = {"fused": True} if kind.endswith("fused") else {"foreach": True}
    for name, fn in _passes(fwd):
        fn()                                 # gradients there: the optimizer's state made
    step = (host.composer_step(ps) if kind == "composer" else host.adamw_step(ps, **impl))
    if case == "foreach_slow":
        step, clip = replay(step), replay(clip)
    elif case == "fused_slow":
        step = replay(step, True)
    tail = "_slow" if case.endswith("_slow") else ""
    return [(f"{kind}_{ph}{tail}" if not ph.startswith("_") else ph, fn)
            for ph, fn in _round(fwd, ps, step, clip, bool(tail))]


def setups(ns=host.N_TENSORS) -> dict:
    """Every case at every N, keyed (case, n); the probe's decoders (``bench_mcore_ddp``)."""
    from .bench_mcore_ddp import _probe_phases
    host._init_fake_pg()
    out = {("probe", k, False): _probe_phases(k) for k in (1, 5)}
    out.update({(case, n): case_phases(case, n) for n in ns for case in CASES})
    return out


def measure(trials: int = TRIALS, repeats: int = REPEATS, ns=host.N_TENSORS) -> dict:
    """One run in ``bench_optimizer_host.measure``'s shape ({"us": {(phase, n): us}}, "ns",
    "op_fwd_us", "pressure", "counts": none) plus the probe's bwd, foreign load, attempts."""
    from .bench_deepspeed_step import _time_quiet
    from .bench_mcore_host import one_thread_no_warnings
    with one_thread_no_warnings():
        res, attempts = _time_quiet(setups(ns), trials, repeats, WARM,
                                    "bench_optimizer_warm")
    us = {(ph, k[1]): v for k, phases in res["t"].items() if k[0] != "probe"
          for ph, v in phases.items()}
    return {"us": us, "ns": tuple(ns), "op_fwd_us": res["op"]["fwd"], "op": res["op"],
            "pressure": res["pressure"], "foreign": res["foreign"], "attempts": attempts,
            "counts": {}, "trials": trials, "repeats": repeats}


def extra_values(c: dict) -> list[tuple[str, str, float]]:
    """(mechanism, metric, us) beyond ``host.metric_values``: zero_grad's line of each plain
    optimizer, its DTensor-minus-plain, and the fused setup's clip."""
    out = [(host.FUSED, "per parameter tensor, clip_grad_norm_", c["fused_clip"][1]),
           (host.FUSED, "per step, fixed, clip_grad_norm_", c["fused_clip"][0])]
    for mech, case in ((host.FOREACH, "foreach"), (host.FUSED, "fused"),
                       (host.COMPOSER, "composer")):
        fixed, per = c[f"{case}_zero_grad"]
        out += [(mech, "per parameter tensor, zero_grad(set_to_none=True)", per),
                (mech, "per step, fixed, zero_grad(set_to_none=True)", fixed)]
    d, p = c["dtensor_zero_grad"], c["foreach_zero_grad"]
    return out + [(host.FSDP2, "per parameter tensor, zero_grad(set_to_none=True), DTensor "
                   "minus plain", d[1] - p[1]),
                  (host.FSDP2, "per step, fixed, zero_grad(set_to_none=True), DTensor minus "
                   "plain", d[0] - p[0])]


def methods(m: dict) -> dict[str, str]:
    """The rows' method text per mechanism."""
    import torch
    common = (f"warm protocol: per trial each setup in turn {WARM} untimed round(s) then "
              f"{m['repeats']} timed, back to back; a round: the model's forward and backward "
              "(untimed), clip, step, zero_grad(set_to_none=True), each timed; the host "
              f"probe's decoders timed alike in the same trials (p10 of {m['trials']} trials "
              f"of the mean of {m['repeats']} rounds; bwd op {m['op']['bwd']:.2f} us; CPU "
              f"pressure {m['pressure']:.2f}, foreign load {m['foreign']:.2f}, attempts "
              f"{len(m['attempts'])}); N = {'/'.join(map(str, m['ns']))} tensors, torch "
              f"{torch.__version__}, thread CPU time, least squares fixed + per tensor; the "
              "same calls as calibrate.bench_optimizer_host's rows; calibrate."
              "bench_optimizer_warm")
    plain = ("model: N parallel bias-free Linears of fp32 16x32 weights (loss: the sum of "
             "their outputs on one row)")
    cuda = ("CUDA estimate = per tensor minus the per-tensor slope of the same model's step "
            "(clip) tensor calls replayed alone after its backward")
    return {
        host.FOREACH: f"torch AdamW(foreach=True) and clip_grad_norm_(1.0, foreach=True); "
                      f"{plain}; {cuda}; {common}",
        host.FUSED: f"torch AdamW(fused=True), clip_grad_norm_(1.0, foreach=True); {plain}; "
                    f"{cuda}; {common}",
        host.FSDP2: "FSDP2: a chain of N bias-free 32x32 Linears, fully_shard each and the "
                    "root on the fake 2-rank mesh (local 16x32 DTensors, forward and backward "
                    "through FSDP2 on the fake group), AdamW(foreach / fused) and torchtitan "
                    f"clip_grad_norm_, minus the plain model's (foreach / fused); {common}",
        host.COMPOSER: f"Composer DecoupledAdamW (re-created) and clip_grad_norm_(1.0) "
                       f"(default foreach); {plain}; {common}",
    }


def problems(m: dict) -> list[str]:
    """``host.problems`` and a noisy last attempt."""
    return [f"noisy: {m['attempts'][-1]}"] * bool(m["attempts"][-1]) + host.problems(m)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_optimizer_warm")
    ap.add_argument("--write", action="store_true", help="append the rows to --out")
    ap.add_argument("--out", default=str(host.CSV), help="the CSV (host_mechanisms.csv)")
    ap.add_argument("--trials", type=int, default=TRIALS)
    args = ap.parse_args(argv)
    m = measure(args.trials)
    host.print_table(m)
    new = host.rows(m, methods(m), LABEL, extra_values(host.costs(m)))
    return host.emit(new, problems(m), args.write, args.out)

if __name__ == "__main__":
    sys.exit(main())
