"""Per parameter tensor share of DeepSpeed's pipeline engine's per-step cost
(``calibrate.bench_deepspeed_pipe``'s intercept), run by that bench's ``rows`` (``python -m
calibrate.bench_framework --only deepspeed_pipe_engine``), which hands in its own module as
``pipe`` (this module does not import it: no import circle).

The per-step work loops over every parameter tensor of the stage: gradient clipping's norm
and ``mul_`` per tensor (deepspeed/runtime/utils.py ``clip_grad_norm_``), ReduceGrads'
flatten / unflatten / copy back (engine.py), ``zero_grad``. Varied: the blocks per stage
(``BLOCKS``: the probe decoder of ``STAGES`` x 1 and x 4 blocks, type:Block partition, so
both stages get 1 and then 4 blocks; embedding, final norm and logits unchanged). For each,
the bench's per-step intercept (engine - bare stage at 1 and 5 micro-batches) of each stage;
fitted: per step = fixed + per_tensor x the stage's parameter tensors (``tensor_fit``). All
cases timed interleaved with the host probe in one run, in its eager ops like the bench.
"""
from __future__ import annotations

from types import ModuleType

BLOCKS = (1, 4)                          # blocks per stage, both stages


def slope_intercept(y_lo: float, y_hi: float, m_lo: int, m_hi: int) -> tuple[float, float]:
    """(slope per unit, intercept) of the line through ``y`` at ``m_lo`` and ``m_hi`` units
    (micro-batches in ``bench_deepspeed_pipe``, parameter tensors here)."""
    slope = (y_hi - y_lo) / (m_hi - m_lo)
    return slope, y_lo - m_lo * slope


def tensor_fit(points: dict[int, tuple[int, float]]) -> tuple[float, float]:
    """(fixed us, us per parameter tensor) through the per-step costs ``points``
    ({blocks per stage: (parameter tensors of the stage, per-step us)}) at ``BLOCKS``."""
    (n_lo, y_lo), (n_hi, y_hi) = (points[b] for b in BLOCKS)
    per_tensor, fixed = slope_intercept(y_lo, y_hi, n_lo, n_hi)
    return fixed, per_tensor


def _engines(pipe: ModuleType, blocks: int) -> tuple[dict, dict]:
    """``pipe.engine_cases`` with ``blocks`` blocks per stage, keyed ``(f"pipe{blocks}", stage,
    micro-batches)``, and the bare stages' steps keyed ``(f"bare{blocks}", ...)``."""
    own = pipe.BLOCKS_PER_STAGE
    pipe.BLOCKS_PER_STAGE = blocks           # read by layer_specs while the engines build
    try:
        cases, engines = pipe.engine_cases({f"pipe{blocks}": {}})
    finally:
        pipe.BLOCKS_PER_STAGE = own
    for (_, s, m), eng in engines.items():
        cases[(f"bare{blocks}", s, m)] = (pipe.bare_step(eng, m), lambda out: None)
    return cases, engines


def measure_step(pipe: ModuleType) -> dict:
    """On the fake 2-rank group (up already): both stages' engines and bare steps at each of
    ``BLOCKS``, timed together with the host probe; per stage {blocks: (tensors, per-step
    us)} (``points``) and its ``tensor_fit`` (``fixed``, ``per_tensor``)."""
    import torch
    torch.set_num_threads(1)
    pipe._launcher_env(pipe.STAGES)
    cases, engines = {}, {}
    for b in BLOCKS:
        c, e = _engines(pipe, b)
        cases.update(c)
        engines.update(e)
    t, op, pressure = pipe.time_cases(cases)
    out = {"op": op, "pressure": pressure, "stages": {}}
    for s in range(pipe.STAGES):
        points = {b: (sum(1 for _ in engines[(f"pipe{b}", s, 1)].module.parameters()),
                      pipe.stage_costs(t, f"pipe{b}", f"bare{b}", s)["per_step"])
                  for b in BLOCKS}
        fixed, per_tensor = tensor_fit(points)
        out["stages"][s] = {"points": points, "fixed": fixed, "per_tensor": per_tensor}
    return out


def values(res: dict, pipe: ModuleType) -> list[tuple[str, float]]:
    """(metric, us) of ``measure_step``'s result."""
    lo, hi = BLOCKS
    vals = []
    for s, c in res["stages"].items():
        name = pipe.STAGE_NAMES[int(s)][0]
        vals += [(f"per step, rest, per parameter tensor, {name} ({lo} vs {hi} blocks)",
                  c["per_tensor"]),
                 (f"per step, rest, fixed, {name} ({lo} vs {hi} blocks)", c["fixed"])]
    return vals


def _method(res: dict, pipe: ModuleType) -> str:
    lo, hi = BLOCKS
    m_lo, m_hi = pipe.MICRO_BATCHES
    pts = "; ".join(f"{pipe.STAGE_NAMES[int(s)][0]}: " + ", ".join(
        f"{b} block{'s' * (b > 1)} {n} tensors {y:.1f} us" for b, (n, y) in c["points"].items())
        for s, c in res["stages"].items())
    return (f"DeepSpeed {pipe.version()} PipelineEngine.train_batch (DS_ACCELERATOR=cpu, fp32, "
            "ZeRO stage 0, client SGD, gradient clipping at DeepSpeed's default 1.0), fake pg "
            f"x{pipe.STAGES}, {pipe.STAGES} stages as in the deepspeed_pipe_engine rows; varied: "
            f"blocks per stage {lo} and {hi} on both stages (probe decoder, hidden 32, seq 8, of "
            f"{pipe.STAGES * lo} and {pipe.STAGES * hi} blocks, partition type:Block; embedding, "
            "final norm, logits unchanged); per stage and size the per-step intercept of engine "
            f"- bare stage (nn.Sequential of its layers: M x forward+backward, SGD step, "
            f"zero_grad) over M = {m_lo} and {m_hi} micro-batches (ReduceTiedGrads, ReduceGrads, "
            "OptimizerStep beyond SGD's step with clipping's per-tensor norm and mul_, loss "
            "aggregation, fill and drain steps); fitted per step = fixed + per_tensor x "
            f"parameter tensors of the stage ({pts}); all cases timed interleaved with the host "
            f"probe (fwd op {res['op']:.2f} us, CPU pressure {res['pressure']:.2f})")


def step_rows(base: dict, pipe: ModuleType) -> list[dict]:
    """The ``deepspeed_pipe_engine`` per-tensor / fixed per-step rows (``pipe``: the module
    ``calibrate.bench_deepspeed_pipe``), in the eager ops of this run's probe, tagged
    SUSPECT on a busy or slow host (``pipe._suspect``)."""
    from .bench_dp import _mechanism_rows
    res = measure_step(pipe)
    how = pipe._suspect(res, base.get("host", ""), "the per-tensor timing") + _method(res, pipe)
    return _mechanism_rows({**base, "op_fwd_us_same_run": round(res["op"], 2)}, res["op"],
                           pipe.MECHANISM, how, values(res, pipe))
