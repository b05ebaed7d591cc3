"""Model-form error: how wrong the model is in a regime, from validation residuals.

The table is the validation rows themselves (regime, log residual ``ln(predicted /
measured)``, the row's own coefficient spread) plus a few learned numbers
(``Hyper``). The model-form variance of a new prediction in regime ``x`` is a
similarity-weighted mean of the rows' excess squared residuals, shrunk towards a prior:

    w_i    = prod over features f of similarity[f] where row i differs from x in f (else 1)
    e_i    = r_i^2 - c_i^2      (the part of the squared residual coefficient uncertainty
                                 does not already explain)
    v(x)   = max(0, (sum_i w_i e_i + prior_rows * prior_var) / (sum_i w_i + prior_rows))
    prior_var = prior_scale^2 * (mean over sources of the source's mean e_i)

averaged over an *ensemble* of ``Hyper`` sets (the fit to every source and to every source
less one, ``learn.py``), which keeps the grid's discrete choices from flipping the interval.

A regime far from every validated row (small ``sum w``) falls back on the prior, which
``prior_scale`` (learned by leaving whole sources out) makes as wide as the error on a
source never seen.

A feature *value* that no row has (a GPU family, framework or MoE never validated, a
context beyond the longest validated one) adds a *novelty* variance on top:

    v(x)  += sum over features f where x's value is in no row of novelty[f]

``novelty[f]`` is learned by leaving each value of ``f`` out in turn (``learn.py``): how
much larger the left-out rows' excess squared residuals were than the variance the table
learned without them gave them. A feature with a single value in the rows (every public row
is dense, so ``moe``) cannot be learned that way; it is *assumed* as novel as the most novel
learned feature (``novelty_var``), and says so. The squared residual counts a row's bias as
spread: the interval is centred on the point prediction, which is never shifted.

The learning itself (``simulator.uncertainty.learn``) needs numpy; reading the shipped
table and evaluating ``v(x)`` here is plain Python.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError
from .regime import FEATURES, UNKNOWN, Regime

SCHEMA_VERSION = 2
SHIPPED_TABLE = Path(__file__).resolve().parent / "data" / "model_form.json"


def _r6(v: float) -> float:
    return float(f"{v:.6g}")


@dataclass(frozen=True)
class ResidualRecord:
    """One validation row: ``log_residual`` = ln(predicted / measured step time)."""

    row_id: str
    source: str
    regime: Regime
    log_residual: float
    coef_sigma_log: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_residual", _r6(self.log_residual))
        object.__setattr__(self, "coef_sigma_log", _r6(self.coef_sigma_log))

    @property
    def excess_var(self) -> float:
        return self.log_residual ** 2 - self.coef_sigma_log ** 2

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.row_id, "source": self.source, "regime": self.regime.as_dict(),
                "log_residual": self.log_residual, "coef_sigma_log": self.coef_sigma_log}


@dataclass(frozen=True)
class Hyper:
    """``similarity[f]`` in (0, 1]: weight of a row that differs in feature ``f`` (1 = the
    feature does not matter); ``prior_rows``: pseudo-rows of prior; ``prior_scale``: prior
    standard deviation over the source-balanced pooled one."""

    similarity: Mapping[str, float]
    prior_rows: float
    prior_scale: float

    def to_dict(self) -> dict[str, Any]:
        return {"similarity": {f: self.similarity[f] for f in FEATURES},
                "prior_rows": self.prior_rows, "prior_scale": self.prior_scale}


def pooled_excess_var(records: Sequence[ResidualRecord]) -> float:
    """Mean over sources of each source's mean excess variance (each source counts once)."""
    by: dict[str, list[float]] = {}
    for r in records:
        by.setdefault(r.source, []).append(r.excess_var)
    if not by:
        return 0.0
    return max(0.0, sum(sum(v) / len(v) for v in by.values()) / len(by))


def novelty_var(novelty: Mapping[str, float | None], feature: str) -> tuple[float, bool]:
    """(variance, learned) for a value of ``feature`` no record has; an unlearned feature
    is assumed as novel as the most novel learned one (0 if none is learned)."""
    v = novelty.get(feature)
    if v is not None:
        return v, True
    learned = [x for x in novelty.values() if x is not None]
    return (max(learned) if learned else 0.0), False


def similarity_weight(a: Regime, b: Regime, similarity: Mapping[str, float]) -> float:
    w = 1.0
    for f in FEATURES:
        x, y = getattr(a, f), getattr(b, f)
        if x != y and UNKNOWN not in (x, y):
            w *= similarity[f]
    return w


@dataclass(frozen=True)
class ModelFormTable:
    """``novelty[f]``: extra variance of ln(step time) for a value of feature ``f`` that no
    record has (``None`` where the rows give ``f`` a single value, so it was not learned)."""

    records: tuple[ResidualRecord, ...]
    hyper: Hyper
    provenance: Mapping[str, Any] = field(default_factory=dict)
    novelty: Mapping[str, float | None] = field(default_factory=dict)
    ensemble: tuple[Hyper, ...] = ()

    @property
    def hypers(self) -> tuple[Hyper, ...]:
        """The hyperparameter sets the variance is averaged over (``hyper`` alone when the
        table has no ensemble)."""
        return self.ensemble or (self.hyper,)

    @property
    def prior_var(self) -> float:
        """The prior variance of the full fit's hyperparameters (``hyper``)."""
        return self.hyper.prior_scale ** 2 * pooled_excess_var(self.records)

    def novelty_var(self, feature: str) -> tuple[float, bool]:
        """(variance, learned) for a value of ``feature`` no record has."""
        return novelty_var(self.novelty, feature)

    def unseen(self, regime: Regime) -> dict[str, float]:
        """``{"feature=value": novelty variance}`` for each known value of ``regime`` that no
        record has (empty inside the validated range)."""
        out = {}
        for f in FEATURES:
            x = getattr(regime, f)
            if x != UNKNOWN and all(getattr(r.regime, f) != x for r in self.records):
                out[f"{f}={x}"] = self.novelty_var(f)[0]
        return out

    def _var(self, regime: Regime, h: Hyper, pooled: float) -> float:
        k = h.prior_rows
        num, den = k * h.prior_scale ** 2 * pooled, k
        for r in self.records:
            w = similarity_weight(regime, r.regime, h.similarity)
            num += w * r.excess_var
            den += w
        return max(0.0, num / den) if den > 0 else 0.0

    def sigma_log(self, regime: Regime) -> float:
        """Model-form standard deviation of ln(step time) in ``regime``: the variance
        averaged over the ensemble, plus the novelty of values no record has."""
        pooled = pooled_excess_var(self.records)      # shared by every hyperparameter set
        v = sum(self._var(regime, h, pooled) for h in self.hypers) / len(self.hypers)
        return math.sqrt(v + sum(self.unseen(regime).values()))

    # ---- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION,
                "what": "model-form error of the step-time prediction by regime; read by "
                        "simulator.uncertainty (see simulator/uncertainty/table.py)",
                "provenance": dict(self.provenance), "hyper": self.hyper.to_dict(),
                "novelty": {f: self.novelty.get(f) for f in FEATURES},
                "ensemble": [h.to_dict() for h in self.ensemble],
                "records": [r.to_dict() for r in self.records]}

    def write_json(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")
        return p

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelFormTable":
        if d.get("schema_version") != SCHEMA_VERSION:
            raise InvalidInputError("uncertainty_table.schema_version", d.get("schema_version"),
                                    f"schema version {SCHEMA_VERSION} (regenerate with "
                                    "`complexity report --ship-uncertainty`)")
        hyper = _hyper(d["hyper"])
        ensemble = tuple(_hyper(h) for h in d["ensemble"])
        recs = tuple(ResidualRecord(r["id"], r["source"], Regime.from_dict(r["regime"]),
                                    float(r["log_residual"]), float(r["coef_sigma_log"]))
                     for r in d["records"])
        novelty = _novelty_of(d["novelty"])
        return cls(recs, hyper, dict(d.get("provenance", {})), novelty, ensemble)

    @classmethod
    def read_json(cls, path: str | Path) -> "ModelFormTable":
        p = Path(path)
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInputError("uncertainty_table", str(p),
                                    "a table written by `complexity report`", str(exc)) from None


def _novelty_of(nov: Any) -> dict[str, float | None]:
    """The table's ``novelty`` map, each value None or a finite variance >= 0."""
    if not isinstance(nov, dict):
        raise TypeError(f"novelty must be a mapping of feature to variance, not {nov!r}")
    out: dict[str, float | None] = {}
    for f in FEATURES:
        v = nov.get(f)
        if v is not None:
            v = float(v)
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"novelty[{f!r}] = {v!r}: a finite variance >= 0 or null")
        out[f] = v
    return out


def _hyper(h: Mapping[str, Any]) -> Hyper:
    return Hyper({f: float(h["similarity"][f]) for f in FEATURES},
                 float(h["prior_rows"]), float(h["prior_scale"]))


_CACHE: dict[str, ModelFormTable] = {}


def load_table(path: str | Path | None = None) -> ModelFormTable:
    """The shipped table (``simulator/uncertainty/data/model_form.json``) or ``path``."""
    p = str(Path(path) if path else SHIPPED_TABLE)
    if p not in _CACHE:
        _CACHE[p] = ModelFormTable.read_json(p)
    return _CACHE[p]
