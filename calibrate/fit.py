"""Robust fitters for the closed-form cost models in ``simulator.cost.kernels``.

Every fitter fits exactly the function the simulator evaluates (``gemm_time_core_s`` with
``wave_efficiency``, the memory formula of ``memory_time_s``, ``ring_steps_and_traffic`` +
``alpha_beta_time_s``), so a fitted coefficient means the same thing when it is used.

Method: ``scipy.optimize.least_squares`` on log-time residuals (relative errors, so a
32 KB all-reduce and a 16 GB one weigh alike) with a robust ``soft_l1`` loss, parameters
bounded to physical ranges. Parameter standard errors come from the Jacobian at the
optimum (``cov = s^2 (J^T J)^-1``, ``s^2`` the residual variance). Held-out error: the
model is refitted on the sweep minus every third point (sorted by size) and scored on the
left-out points (MAPE, %). The returned values are from the fit on all points.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from simulator.cost.kernels import gemm_time_core_s, tile_efficiency
from simulator.errors import InvalidInputError
from simulator.hardware.profile import (
    AttentionCurve,
    AttentionModel,
    Coefficient,
    LinkCoefficients,
)
from simulator.network.collectives import (
    Collective,
    alpha_beta_time_s,
    ring_steps_and_traffic,
)

HOLDOUT_EVERY = 3          # hold out every third point (indices 1, 4, 7, ...)
LOSS = "soft_l1"
F_SCALE = 0.05             # residuals beyond ~5 % (log space) are down-weighted


# ---- measurement rows ------------------------------------------------------------------
@dataclass(frozen=True)
class GemmPoint:
    """One timed ``(m x k) @ (k x n)`` matmul (``groups`` of them in one batched / grouped
    kernel); ``elem_bytes`` per element (2 = bf16). ``harness`` names a timing method whose
    per-call floor differs from a bare kernel's (e.g. ``"do_bench"``: Triton's benchmark
    loop, which adds a cache flush and launch per call); ``""`` is kernel time."""

    m: int
    n: int
    k: int
    time_s: float
    elem_bytes: int = 2
    groups: int = 1
    harness: str = ""

    @property
    def flops(self) -> float:
        return 2.0 * self.groups * self.m * self.n * self.k

    @property
    def bytes_moved(self) -> float:
        return float(self.groups * self.elem_bytes
                     * (self.m * self.k + self.k * self.n + self.m * self.n))

    @classmethod
    def from_tflops(cls, m: int, n: int, k: int, tflops: float, elem_bytes: int = 2,
                    groups: int = 1, harness: str = "") -> "GemmPoint":
        """A point reported as achieved TFLOP/s (10^12 FLOP/s)."""
        return cls(m, n, k, 2.0 * groups * m * n * k / (tflops * 1e12), elem_bytes, groups,
                   harness)


@dataclass(frozen=True)
class MemPoint:
    """One bandwidth-bound op moving ``bytes_moved`` bytes (read + write) in ``time_s``,
    launched as ``kernels`` kernels (``memory_time_s``'s ``kernels``)."""

    bytes_moved: float
    time_s: float
    kernels: int = 1


@dataclass(frozen=True)
class LinkPoint:
    """One timed collective of ``size_bytes`` (the full buffer) over ``n_ranks`` ranks."""

    size_bytes: float
    time_s: float
    op: Collective = Collective.ALL_REDUCE
    n_ranks: int = 2


def busbw_factor(op: Collective, n: int) -> float:
    """nccl-tests ``busbw = algbw * factor``: 2(n-1)/n all-reduce, (n-1)/n AG/RS/A2A, 1 p2p."""
    if op == Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if op == Collective.SEND_RECV:
        return 1.0
    return (n - 1) / n


def busbw_to_time_s(op: Collective, n: int, size_bytes: float, busbw_gbytes_per_s: float) -> float:
    """Time of one collective from its nccl-tests bus bandwidth (GB/s = 10^9 B/s)."""
    if busbw_gbytes_per_s <= 0:
        raise InvalidInputError("busbw_gbytes_per_s", busbw_gbytes_per_s, "a positive bandwidth")
    return size_bytes * busbw_factor(op, n) / (busbw_gbytes_per_s * 1e9)


# ---- generic robust fit ----------------------------------------------------------------
@dataclass(frozen=True)
class FitResult:
    """Fitted parameters with uncertainty and out-of-sample error.

    ``values``/``stderr`` are keyed by parameter name (fixed parameters have stderr 0, a
    parameter left on a bound NaN: no linearised error there).
    ``heldout_mape_pct`` is ``None`` when the sweep is too short to hold points out.
    """

    values: Mapping[str, float]
    stderr: Mapping[str, float]
    fixed: tuple[str, ...]
    train_mape_pct: float
    heldout_mape_pct: float | None
    n_points: int
    n_heldout: int
    dof: int = 0
    residuals_pct: tuple[float, ...] = field(default=(), repr=False)

    def err(self, name: str, scale: float = 1.0) -> float | None:
        """``name``'s standard error times ``scale``; None where there is none (fixed, on a
        bound, or zero)."""
        v = self.stderr[name]
        return v * scale if math.isfinite(v) and v else None

    def coefficient(self, name: str, unit: str, source: str, scale: float = 1.0) -> Coefficient:
        """A ``Coefficient`` for one parameter (``scale`` converts units, e.g. s -> us)."""
        fitted = name not in self.fixed
        return Coefficient(
            value=self.values[name] * scale, unit=unit, source=source,
            stderr=self.stderr[name] * scale
            if fitted and self.dof > 0 and math.isfinite(self.stderr[name]) else None,
            heldout_error_pct=self.heldout_mape_pct if fitted else None)


Model = Callable[[Mapping[str, float], object], float]


@dataclass(frozen=True)
class _Spec:
    names: tuple[str, ...]
    x0: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]


def _split_free(spec: _Spec, fixed: Mapping[str, float]) -> tuple[list[int], dict[str, float]]:
    unknown = set(fixed) - set(spec.names)
    if unknown:
        raise InvalidInputError("fixed", sorted(unknown), f"parameters among {list(spec.names)}")
    free = [i for i, n in enumerate(spec.names) if n not in fixed]
    return free, dict(fixed)


TINY = 1e-6               # lower bound of a parameter in log space (0 is not representable)


def _solve(spec: _Spec, model: Model, rows: Sequence[object], fixed: Mapping[str, float],
           starts: Sequence[Mapping[str, float]] = ()) -> tuple[dict[str, float], object]:
    """Least squares on log(pred/meas) over the free parameters, optimised in log-parameter
    space (uniform scaling, positivity); best of several starts. The returned ``sol.jac``
    is with respect to the parameters themselves (chain rule), for ``_stderr``."""
    free, params = _split_free(spec, fixed)
    meas = np.log(np.array([r.time_s for r in rows], dtype=float))

    def values(z: np.ndarray) -> dict[str, float]:
        p = dict(params)
        p.update({spec.names[i]: float(math.exp(v)) for i, v in zip(free, z)})
        return p

    def residual(z: np.ndarray) -> np.ndarray:
        p = values(z)
        pred = np.array([model(p, r) for r in rows], dtype=float)
        return np.log(np.maximum(pred, 1e-30)) - meas

    lo = np.log([max(spec.lower[i], TINY) for i in free])
    hi = np.log([spec.upper[i] for i in free])
    best = None
    for start in [dict(zip(spec.names, spec.x0)), *starts]:
        z0 = np.clip(np.log([max(start.get(spec.names[i], spec.x0[i]), TINY) for i in free]),
                     lo + 1e-9, hi - 1e-9)
        sol = least_squares(residual, z0, bounds=(lo, hi), loss=LOSS, f_scale=F_SCALE,
                            max_nfev=4000)
        if best is None or sol.cost < best.cost:
            best = sol
    out = values(best.x)
    x = np.exp(best.x)
    best.jac = np.asarray(best.jac) / x            # d r / d p = (d r / d log p) / p
    return out, best


BOUND_TOL = 1e-3          # log-space distance (0.1 % of the value) that counts as on a bound


def _near_bound(spec: _Spec, free: list[int], sol: object) -> np.ndarray:
    """1 where a free parameter ended within ``BOUND_TOL`` of a bound in log space: the
    trust-region solver keeps its iterates strictly inside the bounds, so a parameter
    pressed against one can stop a hair inside with ``active_mask`` 0 (A100's GEMM k_half
    at 1.2e-5 above its floor on one CPU, flagged on another)."""
    x = np.asarray(getattr(sol, "x", np.zeros(len(free))), dtype=float)
    lo = np.log([max(spec.lower[i], TINY) for i in free])
    hi = np.log([spec.upper[i] for i in free])
    return ((x - lo < BOUND_TOL) | (hi - x < BOUND_TOL)).astype(int)


def _stderr(spec: _Spec, fixed: Mapping[str, float], sol: object, n: int) -> dict[str, float]:
    """Linearised standard errors of the free parameters. A parameter the solver left on
    one of its bounds (``active_mask``) has none (NaN: the fit says only which side of the
    bound it would go, and a Jacobian taken there changes with the solver's last step, e.g.
    A100's GEMM k_half at 0 read 41 under one scipy and 11 under the next); the others'
    come from the Jacobian without its column."""
    free, _ = _split_free(spec, fixed)
    errs = {name: 0.0 for name in spec.names}
    dof = n - len(free)
    if dof <= 0 or not free:
        return errs
    jac = np.asarray(sol.jac, dtype=float)
    active = np.asarray(getattr(sol, "active_mask", np.zeros(len(free))), dtype=int)
    active = active | _near_bound(spec, free, sol)
    inner = [j for j in range(len(free)) if active[j] == 0]
    s2 = float(np.sum(np.asarray(sol.fun) ** 2)) / dof
    try:
        cov = np.linalg.pinv(jac[:, inner].T @ jac[:, inner]) * s2 if inner else None
    except np.linalg.LinAlgError:
        return errs
    for j, i in enumerate(free):
        if j not in inner or cov is None:
            errs[spec.names[i]] = math.nan
            continue
        k = inner.index(j)
        errs[spec.names[i]] = float(math.sqrt(max(cov[k, k], 0.0)))
    return errs


def _mape_pct(model: Model, params: Mapping[str, float], rows: Sequence[object]) -> list[float]:
    return [100.0 * (model(params, r) - r.time_s) / r.time_s for r in rows]


def robust_fit(spec: _Spec, model: Model, rows: Sequence[object], fixed: Mapping[str, float],
               size_key: Callable[[object], float],
               starts: Sequence[Mapping[str, float]] = ()) -> FitResult:
    """Fit ``model`` to ``rows`` (all points), then refit without every third point to
    measure held-out MAPE. Raises ``InvalidInputError`` with fewer points than unknowns."""
    rows = sorted(rows, key=size_key)
    n_free = len(spec.names) - len(fixed)
    if len(rows) < max(n_free, 1):
        raise InvalidInputError("rows", len(rows),
                                f"at least {n_free} measurements for {n_free} free parameters",
                                "fix some parameters with fixed={...}")
    for r in rows:
        if not (r.time_s > 0 and math.isfinite(r.time_s)):
            raise InvalidInputError("time_s", r.time_s, "a positive finite time")
    values, sol = _solve(spec, model, rows, fixed, starts)
    stderr = _stderr(spec, fixed, sol, len(rows))
    train = _mape_pct(model, values, rows)
    held_idx = list(range(1, len(rows), HOLDOUT_EVERY))
    train_rows = [r for i, r in enumerate(rows) if i not in held_idx]
    heldout = None
    if n_free > 0 and held_idx and len(train_rows) >= n_free + 1:
        v_tr, _ = _solve(spec, model, train_rows, fixed, starts)
        errs = _mape_pct(model, v_tr, [rows[i] for i in held_idx])
        heldout = float(np.mean(np.abs(errs)))
    return FitResult(values=values, stderr=stderr, fixed=tuple(sorted(fixed)),
                     train_mape_pct=float(np.mean(np.abs(train))),
                     heldout_mape_pct=heldout, n_points=len(rows),
                     n_heldout=len(held_idx) if heldout is not None else 0,
                     dof=len(rows) - n_free,
                     residuals_pct=tuple(round(e, 3) for e in train))


# ---- GEMM --------------------------------------------------------------------------------
GEMM_PARAMS = ("eff_max", "k_half", "launch_us")
MN_HALF = "mn_half"        # optional: output-panel saturation (CPU BLAS), elements


def harness_param(harness: str) -> str:
    """Name of the fitted per-call floor of a timing harness (a nuisance parameter)."""
    return f"t0_{harness}_us"


def gemm_model(peak_tflops: float, sm_count: int, mem_bw_gbytes_per_s: float,
               tile_m: int, tile_n: int, tiles: Sequence[tuple[int, int]] = (),
               persistent: bool = False) -> Model:
    """``simulator.cost.kernels.gemm_time_core_s`` (with ``tile_efficiency``) as a fit model.

    No sustained-clock ceiling: microbenchmark rows are short runs at boost clock; the
    ceiling is a separate measurement (MSMF). A point from a harness uses that harness's
    fitted floor in place of ``launch_us``.
    """
    shapes = tuple(tiles) or ((tile_m, tile_n),)

    def model(p: Mapping[str, float], r: GemmPoint) -> float:
        wave = tile_efficiency(r.m, r.n, shapes, sm_count, r.groups, persistent)
        t0 = p[harness_param(r.harness)] if r.harness else p["launch_us"]
        return gemm_time_core_s(r.groups * r.m, r.n, r.k, r.bytes_moved, peak_tflops * 1e12,
                                p["eff_max"], p["k_half"], t0 * 1e-6, wave,
                                mem_bw_gbytes_per_s * 1e9, math.inf, p.get(MN_HALF, 0.0),
                                min(r.m, r.n))
    return model


def fit_gemm(rows: Sequence[GemmPoint], gpu_peak_tflops: float, sm_count: int,
             mem_bw_gbytes_per_s: float, tile_m: int = 128, tile_n: int = 128,
             fixed: Mapping[str, float] | None = None, eff_max_upper: float = 1.0,
             tiles: Sequence[tuple[int, int]] = (), persistent: bool = False,
             fit_mn_half: bool = False) -> FitResult:
    """Fit ``eff_max`` (dimensionless), ``k_half`` (elements), ``launch_us`` (microseconds),
    plus one per-call floor ``t0_<harness>_us`` per timing harness among the rows.

    ``gpu_peak_tflops`` is the datasheet dense peak of the dtype; ``mem_bw_gbytes_per_s`` the
    achieved memory bandwidth (peak x bw_eff) used by the memory-bound branch. ``tiles`` /
    ``persistent``: the tile model (``simulator.cost.kernels.tile_efficiency``). With one
    point, fix two of the three parameters. ``eff_max_upper`` > 1 lets a device without a
    known peak (a CPU: pass peak 1.0) fit its asymptotic TFLOP/s as ``eff_max``.
    ``fit_mn_half`` also fits ``mn_half`` (elements, the output-panel saturation of a CPU
    BLAS, ``gemm_time_core_s``); it must be in ``fixed`` or fitted wherever it is used.
    """
    harnesses = sorted({r.harness for r in rows if r.harness})
    extra = (MN_HALF,) if fit_mn_half or MN_HALF in (fixed or {}) else ()
    names = GEMM_PARAMS + extra + tuple(harness_param(h) for h in harnesses)
    spec = _Spec(names, (min(0.8, eff_max_upper), 256.0, 5.0) + (16.0,) * len(extra)
                 + (5.0,) * len(harnesses),
                 (1e-4, 0.0, 0.0) + (0.0,) * len(extra) + (0.0,) * len(harnesses),
                 (eff_max_upper, 1e5, 1e5) + (1e4,) * len(extra) + (1e3,) * len(harnesses))
    model = gemm_model(gpu_peak_tflops, sm_count, mem_bw_gbytes_per_s, tile_m, tile_n, tiles,
                       persistent)
    starts = [{"k_half": 0.0, "launch_us": 1.0}, {"k_half": 2048.0, "launch_us": 20.0}]
    if extra:
        starts += [{"k_half": 16.0, "launch_us": 50.0, MN_HALF: 1.0},
                   {"k_half": 16.0, "launch_us": 50.0, MN_HALF: 256.0}]
    return robust_fit(spec, model, rows, fixed or {}, lambda r: r.flops, starts)


# ---- memory-bound kernels ------------------------------------------------------------------
MEMORY_PARAMS = ("bw_eff", "launch_us")


def memory_model(mem_bw_gbytes_per_s: float) -> Model:
    """The formula of ``simulator.cost.kernels.memory_time_s``:
    ``kernels * launch + bytes / (mem_bw * bw_eff)``."""
    def model(p: Mapping[str, float], r: MemPoint) -> float:
        return r.kernels * p["launch_us"] * 1e-6 \
            + r.bytes_moved / (mem_bw_gbytes_per_s * 1e9 * p["bw_eff"])
    return model


def fit_memory(rows: Sequence[MemPoint], mem_bw_gbytes_per_s: float,
               fixed: Mapping[str, float] | None = None, bw_eff_upper: float = 1.0) -> FitResult:
    """Fit ``bw_eff`` (fraction of the datasheet bandwidth) and ``launch_us`` (microseconds).

    For a device whose peak bandwidth is unknown pass ``mem_bw_gbytes_per_s=1.0`` and a large
    ``bw_eff_upper``: ``bw_eff`` is then the achieved GB/s.
    """
    spec = _Spec(MEMORY_PARAMS, (min(0.8, bw_eff_upper), 5.0), (1e-4, 0.0), (bw_eff_upper, 1e5))
    starts = [{"launch_us": 0.5}, {"launch_us": 50.0}]
    return robust_fit(spec, memory_model(mem_bw_gbytes_per_s), rows, fixed or {},
                      lambda r: r.bytes_moved, starts)


def composite_eff(parts: Sequence[tuple[float, float]]) -> float:
    """Efficiency of a mix of kernels that move ``bytes`` each at efficiency ``eff``:
    ``sum(bytes) / sum(bytes / eff)`` (the bandwidth the mix achieves as a whole)."""
    total = sum(b for b, _ in parts)
    return total / sum(b / e for b, e in parts)


# ---- fused attention -----------------------------------------------------------------------
@dataclass(frozen=True)
class AttnPoint:
    """One timed fused-attention call doing ``flops`` FLOPs (forward or backward)."""

    flops: float
    time_s: float


def attention_model(peak_tflops: float, launch_us: float) -> Model:
    """The formula of ``simulator.cost.kernels.attention_time_s``: ``launch + flops / (peak * eff)``."""
    def model(p: Mapping[str, float], r: AttnPoint) -> float:
        return launch_us * 1e-6 + r.flops / (peak_tflops * 1e12 * p["eff"])
    return model


def fit_attention(rows: Sequence[AttnPoint], peak_tflops: float, launch_us: float) -> FitResult:
    """Fit the achieved fraction ``eff`` of ``peak_tflops``; ``launch_us`` is the memory-model
    launch the simulator adds to every attention call."""
    spec = _Spec(("eff",), (0.5,), (1e-5,), (10.0,))
    return robust_fit(spec, attention_model(peak_tflops, launch_us), rows, {},
                      lambda r: r.flops)


@dataclass(frozen=True)
class AttnCurvePoint:
    """One fused-attention benchmark point: achieved fraction ``eff`` of the 16-bit peak at
    key length ``seq``, ``head_dim`` and masking. ``time_s`` is ``1 / eff`` (time per FLOP
    in units of the peak), so the generic fit weighs relative errors of time."""

    seq: int
    head_dim: int
    causal: bool
    eff: float

    @property
    def time_s(self) -> float:
        return 1.0 / self.eff


def _attention_curve_model(head_dims: Sequence[int], causal_block: float) -> Model:
    """``AttentionModel.curve_eff`` (the simulator's formula) as a fit model; parameters
    ``emax_<d>`` per head dim, ``s_half`` and ``causal_eff``."""
    def model(p: Mapping[str, float], r: AttnCurvePoint) -> float:
        emax = {str(d): Coefficient(p[f"emax_{d}"], "", "") for d in head_dims}
        m = AttentionModel({}, {}, {"f:fwd": AttentionCurve(emax, Coefficient(p["s_half"], "", ""))},
                           Coefficient(p["causal_eff"], "", ""),
                           Coefficient(causal_block, "", ""))
        return 1.0 / m.curve_eff("f", False, r.seq, r.head_dim, r.causal)
    return model


def fit_attention_curve(rows: Sequence[AttnCurvePoint], causal_block: float = 128.0,
                        fixed: Mapping[str, float] | None = None) -> FitResult:
    """Fit ``eff(s) = emax(head_dim) * s / (s + s_half)`` (causal: ``causal_eff * emax * s /
    (s + 2 s_half + causal_block)``) to one kernel family's benchmark points."""
    dims = sorted({r.head_dim for r in rows})
    names = tuple(f"emax_{d}" for d in dims) + ("s_half", "causal_eff")
    top = max(r.eff for r in rows)
    spec = _Spec(names, (top,) * len(dims) + (200.0, 1.0), (1e-3,) * len(dims) + (0.0, 0.3),
                 (1.0,) * len(dims) + (1e5, 1.2))
    fx = dict(fixed or {})
    if not any(r.causal for r in rows):
        fx.setdefault("causal_eff", 1.0)
    return robust_fit(spec, _attention_curve_model(dims, causal_block), rows, fx,
                      lambda r: (r.causal, r.head_dim, r.seq), [{"s_half": 20.0}, {"s_half": 1000.0}])


# ---- collectives ---------------------------------------------------------------------------
LINK_PARAMS = ("alpha_us", "small_bw_eff", "base_us", "bw_eff")


def _coefs(p: Mapping[str, float]) -> LinkCoefficients:
    def c(name: str) -> Coefficient:
        return Coefficient(p[name], "", "")
    return LinkCoefficients(alpha_us=c("alpha_us"), small_bw_eff=c("small_bw_eff"),
                            base_us=c("base_us"), bw_eff=c("bw_eff"))


def link_model(link_bw_gbytes_per_s: float, hop_latency_us: float, bw_scale: float) -> Model:
    """``ring_steps_and_traffic`` + ``alpha_beta_time_s`` as a fit model."""
    def model(p: Mapping[str, float], r: LinkPoint) -> float:
        steps, wire = ring_steps_and_traffic(r.op, r.n_ranks, r.size_bytes)
        return alpha_beta_time_s(steps, wire, link_bw_gbytes_per_s * 1e9, hop_latency_us * 1e-6,
                                 _coefs(p), bw_scale)
    return model


def fit_link(rows: Sequence[LinkPoint], link_bw_gbytes_per_s: float,
             hop_latency_us: float = 0.0, bw_scale: float = 1.0,
             fixed: Mapping[str, float] | None = None, eff_upper: float = 1.0) -> FitResult:
    """Fit ``alpha_us``, ``small_bw_eff``, ``base_us``, ``bw_eff`` of ``alpha_beta_time_s``.

    ``link_bw_gbytes_per_s``: datasheet per-direction bandwidth of the bottleneck link (the
    ``B`` the simulator will use); ``hop_latency_us``: the datasheet one-hop latency the
    simulator adds per step (the fitted ``alpha_us`` is on top of it); ``bw_scale``: the
    in-switch speedup when the sweep ran with NVLS/SHARP. Rows with ``n_ranks < 2`` (no
    communication) are rejected.
    """
    for r in rows:
        if r.op != Collective.SEND_RECV and r.n_ranks < 2:
            raise InvalidInputError("n_ranks", r.n_ranks, "at least 2 ranks for a collective")
    spec = _Spec(LINK_PARAMS, (5.0, min(0.3, eff_upper), 20.0, min(0.8, eff_upper)),
                 (0.0, 1e-4, 0.0, 1e-4), (1e5, eff_upper, 1e6, eff_upper))
    starts = _link_starts(rows, link_bw_gbytes_per_s * bw_scale, eff_upper)
    model = link_model(link_bw_gbytes_per_s, hop_latency_us, bw_scale)
    return robust_fit(spec, model, rows, fixed or {},
                      lambda r: (r.op.value, r.n_ranks, r.size_bytes), starts)


def _link_starts(rows: Sequence[LinkPoint], bw_gbytes_per_s: float,
                 eff_upper: float) -> list[dict[str, float]]:
    """Data-driven starting points: large-message efficiency from the fastest wire rate,
    alpha from the smallest message; plus a few generic ones scaled to that estimate."""
    rates, lat = [], []
    for r in rows:
        steps, wire = ring_steps_and_traffic(r.op, r.n_ranks, r.size_bytes)
        if steps and wire > 0:
            rates.append(wire / (r.time_s * bw_gbytes_per_s * 1e9))
            lat.append(r.time_s * 1e6 / steps)
    if not rates:
        return []
    eff0 = min(max(rates), eff_upper)
    a0 = max(min(lat), 1e-3)
    return [{"alpha_us": a0 * f, "small_bw_eff": eff0 * g, "base_us": a0 * h, "bw_eff": eff0}
            for f, g, h in ((0.5, 0.5, 4.0), (0.9, 0.1, 20.0), (0.2, 1.0, 1.0))]


def link_coefficients(fit: FitResult, source: str,
                      in_switch_speedup: Coefficient | None = None,
                      sources: Mapping[str, str] | None = None) -> LinkCoefficients:
    """``LinkCoefficients`` from a ``fit_link`` result; ``sources`` overrides per parameter."""
    src = dict(sources or {})
    units = {"alpha_us": "us", "small_bw_eff": "fraction", "base_us": "us", "bw_eff": "fraction"}
    c = {n: fit.coefficient(n, units[n], src.get(n, source)) for n in LINK_PARAMS}
    return LinkCoefficients(in_switch_speedup=in_switch_speedup, **c)


# ---- overlap interference ------------------------------------------------------------------
@dataclass(frozen=True)
class InterferencePoint:
    """Compute time alone (``alone_s``) and while a collective runs (``time_s``); with
    ``comm_s`` (the collective alone) the overlap lasts ``min(comm_s, alone_s)``, else the
    collective is assumed to cover the whole compute."""

    alone_s: float
    time_s: float
    comm_s: float | None = None


def fit_interference(rows: Sequence[InterferencePoint]) -> FitResult:
    """Fit ``slowdown`` (the profile's ``overlap_slowdown``, a multiplier >= ~1) in
    ``t_overlapped = t_alone + (slowdown - 1) * overlap``, the extra time
    ``simulator.cost.layer.interference_s`` charges; ``overlap = min(comm_s, t_alone)``
    (``t_alone`` without ``comm_s``, i.e. ``t_overlapped = slowdown * t_alone``)."""
    spec = _Spec(("slowdown",), (1.1,), (0.5,), (20.0,))

    def model(p: Mapping[str, float], r: InterferencePoint) -> float:
        overlap = r.alone_s if r.comm_s is None else min(r.comm_s, r.alone_s)
        return r.alone_s + (p["slowdown"] - 1.0) * overlap
    return robust_fit(spec, model, rows, {}, lambda r: r.alone_s)
