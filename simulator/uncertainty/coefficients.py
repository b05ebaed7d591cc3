"""Coefficient uncertainty: how far a prediction moves when the profile's fitted
coefficients move within their own measured uncertainty.

Linearized sensitivity with central differences, on the analytic engine:

* every coefficient's relative uncertainty is ``s = max(stderr / |value|,
  heldout_error_pct / 100)`` (0 where the profile states neither: a number solved from
  one measurement or assumed carries no fitted uncertainty; its error is part of the
  model-form spread learned from validation residuals, ``simulator.uncertainty.table``);
* coefficients are grouped into the ``KNOBS`` below (e.g. every link kind's ``bw_eff``);
  a knob is perturbed only where the plan can read one of its coefficients and at least
  one of those has ``s > 0``;
* each active knob costs two analytic simulations: every member scaled by ``(1 + s)``
  and by ``1 / (1 + s)`` (symmetric in log space, positive; efficiencies capped at 1);
  its log-sensitivity is ``(ln T+ - ln T-) / 2``;
* knobs are treated as independent: ``sigma_log^2 = sum of squares``. Coefficients fitted
  jointly (e.g. a link's ``alpha_us`` and ``small_bw_eff``) are in truth correlated; the
  profiles do not store covariances, so this can over- or under-state their joint effect.

At most ``2 * len(KNOBS)`` = 24 extra analytic simulations per prediction; 10 for a
Megatron-style plan on the shipped H100 profile (GEMM ``k_half`` + four NVLink
coefficients). The result does not depend on the engine of the point prediction: it is a
relative spread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from ..engine.simulate import simulate
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec

Path = tuple[str, ...]


@dataclass(frozen=True)
class KnobEffect:
    """One knob's effect on the step time: ``sigma_log`` = (ln T+ - ln T-) / 2."""

    knob: str
    sigma_log: float


@dataclass(frozen=True)
class CoefficientSpread:
    """Log-space standard deviation of the step time from coefficient uncertainty."""

    sigma_log: float
    effects: tuple[KnobEffect, ...]
    n_simulations: int

    def to_dict(self) -> dict[str, Any]:
        return {"sigma_log": self.sigma_log, "n_simulations": self.n_simulations,
                "by_knob": {e.knob: e.sigma_log for e in self.effects}}


NO_SPREAD = CoefficientSpread(0.0, (), 0)


# ---- where each knob's coefficients live in ``Profile.to_dict()`` ------------------------
def _gemm_dtypes(plan: Plan) -> tuple[str, ...]:
    """GEMM dtypes a plan reads: its precision, the 16-bit kernels every plan runs
    (attention bmm, LM head under FP8) and the fallbacks ``Profile.gemm_eff`` takes."""
    p = plan.precision.value
    extra = ("fp32", "tf32") if p in ("fp32", "tf32") else ()
    return tuple(dict.fromkeys((p, "bf16", "fp16") + extra))


def _link_kinds(cluster: ClusterSpec) -> tuple[str, ...]:
    return tuple(dict.fromkeys((cluster.node.scale_up.kind.value, cluster.node.nic.kind.value)))


def _in(d: Mapping[str, Any], *keys: str) -> Iterator[Path]:
    """Paths of the named coefficients under ``d`` that exist."""
    for k in keys:
        if k in d:
            yield (k,)


def _eff_max(d, plan, cluster):
    yield from (("gemm", "eff_max") + p for p in _in(d["gemm"]["eff_max"], *_gemm_dtypes(plan)))


def _attention(d, plan, cluster):
    for side in ("fwd_eff", "bwd_eff"):
        yield from (("attention", side, k) for k in sorted(d["attention"][side]))


def _memory(d, plan, cluster):
    yield ("memory", "bw_eff")
    yield from (("memory", "kind_eff", k) for k in sorted(d["memory"].get("kind_eff", {})))


def _link_coef(name: str):
    def paths(d, plan, cluster):
        for kind in _link_kinds(cluster):
            lc = d["links"].get(kind)
            if lc and lc.get(name):
                yield ("links", kind, name)
    return paths


def _single(*path: str):
    return lambda d, plan, cluster: iter([path])


KNOBS: tuple[tuple[str, Callable[..., Iterator[Path]]], ...] = (
    ("gemm.eff_max", _eff_max),
    ("gemm.k_half", _single("gemm", "k_half")),
    ("gemm.launch_us", _single("gemm", "launch_us")),
    ("gemm.mn_half", lambda d, plan, cluster: iter([("gemm", "mn_half")] if d["gemm"].get("mn_half") else [])),
    ("memory.bw_eff", _memory),
    ("memory.launch_us", _single("memory", "launch_us")),
    ("attention", _attention),
    ("links.alpha_us", _link_coef("alpha_us")),
    ("links.small_bw_eff", _link_coef("small_bw_eff")),
    ("links.base_us", _link_coef("base_us")),
    ("links.bw_eff", _link_coef("bw_eff")),
    ("links.in_switch_speedup", _link_coef("in_switch_speedup")),
    ("overlap_slowdown", _single("overlap_slowdown")),
)


# ---- perturbation ---------------------------------------------------------------------------
def relative_uncertainty(coef: Mapping[str, Any]) -> float:
    """``max(stderr / |value|, heldout_error_pct / 100)``; 0 when neither is stated."""
    v = abs(float(coef.get("value") or 0.0))
    s = float(coef["stderr"]) / v if coef.get("stderr") and v > 0 else 0.0
    h = float(coef["heldout_error_pct"]) / 100.0 if coef.get("heldout_error_pct") else 0.0
    return max(s, h, 0.0)


def _get(d: Mapping[str, Any], path: Path) -> Mapping[str, Any]:
    for k in path:
        d = d[k]
    return d


def _scaled(coef: Mapping[str, Any], sign: int) -> dict[str, Any]:
    f = (1.0 + relative_uncertainty(coef)) ** sign
    v = float(coef["value"]) * f
    if coef.get("unit") == "fraction":
        v = min(v, 1.0)
    return {**coef, "value": v}


def perturbed(base: Mapping[str, Any], paths: list[Path], sign: int) -> Profile:
    """The profile with every coefficient at ``paths`` scaled by ``(1 + s) ** sign``."""
    d = _deep_copy(base)
    for path in paths:
        parent = _get(d, path[:-1])
        parent[path[-1]] = _scaled(parent[path[-1]], sign)
    return Profile.from_dict(d)


def _deep_copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_deep_copy(v) for v in obj]
    return obj


def active_knobs(profile: Profile, plan: Plan,
                 cluster: ClusterSpec) -> list[tuple[str, list[Path]]]:
    """Knobs the plan can read with at least one uncertain coefficient, in ``KNOBS`` order."""
    d = profile.to_dict()
    out = []
    for name, where in KNOBS:
        paths = [p for p in where(d, plan, cluster)
                 if relative_uncertainty(_get(d, p)) > 0]
        if paths:
            out.append((name, paths))
    return out


def coefficient_spread(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                       profile: Profile) -> CoefficientSpread:
    """Step-time log spread from the profile's coefficient uncertainty (see module doc)."""
    knobs = active_knobs(profile, plan, cluster)
    if not knobs:
        return NO_SPREAD
    base = profile.to_dict()
    effects = []
    for name, paths in knobs:
        t_hi = simulate(model, plan, cluster, perturbed(base, paths, +1), engine="analytic")
        t_lo = simulate(model, plan, cluster, perturbed(base, paths, -1), engine="analytic")
        effects.append(KnobEffect(name, abs(math.log(t_hi.step_time_s / t_lo.step_time_s)) / 2))
    total = math.sqrt(sum(e.sigma_log ** 2 for e in effects))
    return CoefficientSpread(total, tuple(effects), 2 * len(knobs))
