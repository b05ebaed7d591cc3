"""Learning the model-form table by leaving one *source* out at a time.

A source is a publication (all rows of one paper or README): rows of one source share
a framework, a cluster and a measuring habit, so leaving single rows out would let a
row's siblings vouch for it. The hyperparameters of ``table.Hyper`` (one similarity per
regime feature, the prior's weight and width) are chosen by coordinate descent over small
fixed grids, minimising the mean 80 % interval score (Gneiting & Raftery 2007, eq. 43:
width + (2 / alpha) x distance outside) of the rows of each left-out source, each source
weighted equally, the novelty of each left-out row's unseen values inside its interval
(so the prior does not cover again what the novelty covers). Deterministic: fixed start,
fixed order, strict improvement only.

The table keeps not one set of hyperparameters but the *ensemble* fitted to all sources
and to all sources less each one (bagging over the folds) and averages the variance over
it: a grid choice that flips on a small residual change moves the average by a fraction
of the flip.

``learn_novelty`` learns (before the hyperparameters), per feature, the extra variance of
a value no row has: each value of the feature is left out in turn (with its rows), the
table is learned from the rest (hyperparameters refitted, without novelty), and the
left-out rows' mean excess squared residual is compared
with the mean variance that table gave them; each gap is clipped at zero, then the gaps
are averaged over the values (each value once). Left-out values tell how much worse than
its fallback the table does on a GPU family, framework, context... it has never seen. The
clip comes first on purpose: the physics was developed while looking at every public row,
so a left-out value is never truly unseen, and one the table happens to over-cover (A100
rows, left out, are more accurate than the H100 rows predict) does not earn narrower
intervals for a value nobody has measured. Each gap is thus a lower bound for a new value's,
and the clip makes the average lean wide (on noise alone it is a small positive bias).

``loso_evaluation`` is the honest check of the whole procedure (nested): for each source it
learns the hyperparameters, the novelty *and* the table from the other sources only, then
predicts the left-out source's intervals (a source's framework is then often a value the
table has not seen, so the check exercises the novelty term too). The coverage and widths it
returns are what a new, unseen source should expect.

numpy is imported inside the functions (the learning runs in ``complexity report``;
predictions only read the learned table).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, Mapping, Sequence

from .regime import FEATURES, UNKNOWN
from .table import Hyper, ModelFormTable, ResidualRecord, novelty_var

Novelty = Mapping[str, "float | None"]

LEVEL = 0.8
SIMILARITY_GRID = (0.05, 0.2, 0.5, 1.0)
PRIOR_ROWS_GRID = (1.0, 3.0, 10.0)
PRIOR_SCALE_GRID = (1.0, 1.5, 2.0, 3.0)
START = Hyper({f: 1.0 for f in FEATURES}, 3.0, 1.5)
MAX_PASSES = 4


def z_of(level: float) -> float:
    """Half-width, in standard deviations, of the central ``level`` interval."""
    return NormalDist().inv_cdf(0.5 + level / 2.0)


@dataclass(frozen=True)
class HeldOut:
    """A row's interval predicted without its source: total log sigma and its parts."""

    record: ResidualRecord
    model_form_sigma_log: float
    unvalidated: tuple[tuple[str, float], ...] = ()   # its values the other sources lack

    @property
    def sigma_log(self) -> float:
        return math.hypot(self.model_form_sigma_log, self.record.coef_sigma_log)

    def covered(self, level: float = LEVEL) -> bool:
        return abs(self.record.log_residual) <= z_of(level) * self.sigma_log

    def width_frac(self, level: float = LEVEL) -> float:
        """Width of the ``level`` interval over the point prediction."""
        z = z_of(level) * self.sigma_log
        return math.exp(z) - math.exp(-z)


class _Data:
    """Records as arrays: mismatch matrices per feature, source codes, and a cache of the
    row-to-row weight matrix per similarity vector (the search revisits the same ones)."""

    def __init__(self, records: Sequence[ResidualRecord]):
        import numpy as np
        self.records = list(records)
        self.r = np.array([x.log_residual for x in records])
        self.c2 = np.array([x.coef_sigma_log ** 2 for x in records])
        self.e = self.r ** 2 - self.c2
        self.sources = np.array([x.source for x in records])
        names = sorted(set(self.sources.tolist()))
        self.source_code = np.array([names.index(x) for x in self.sources.tolist()], dtype=int)
        mismatch = []
        self.values = {f: [getattr(x.regime, f) for x in records] for f in FEATURES}
        for f in FEATURES:
            vals = self.values[f]
            known = np.array([v != UNKNOWN for v in vals])
            index = {v: n for n, v in enumerate(sorted(set(vals)))}
            codes = np.array([index[v] for v in vals])
            mismatch.append(((codes[:, None] != codes[None, :])
                             & known[:, None] & known[None, :]).astype(float))
        self.mismatch = np.stack(mismatch) if records else np.zeros((len(FEATURES), 0, 0))
        self._w: dict[tuple[float, ...], Any] = {}
        self.fits: dict[tuple[int, ...], tuple[Hyper, float]] = {}   # _fit's memo

    def weights(self, h: Hyper):
        """``w[i, j]``: weight of row ``j`` for a query in row ``i``'s regime."""
        import numpy as np
        key = tuple(h.similarity[f] for f in FEATURES)
        if key not in self._w:
            logsim = np.array([math.log(v) for v in key])
            self._w[key] = np.exp(np.tensordot(logsim, self.mismatch, axes=1))
        return self._w[key]

    def pooled(self, train) -> float:
        """``table.pooled_excess_var`` of the rows ``train``."""
        import numpy as np
        codes = self.source_code[train]
        n = np.bincount(codes, minlength=int(self.source_code.max(initial=0)) + 1)
        tot = np.bincount(codes, weights=self.e[train], minlength=len(n))
        means = tot[n > 0] / n[n > 0]
        return max(0.0, float(means.mean())) if len(means) else 0.0

    def model_var(self, train, test, h: Hyper):
        """Model-form variance of ``test`` rows from the ``train`` rows (``table.py``)."""
        import numpy as np
        w = self.weights(h)[np.ix_(test, train)]
        prior = h.prior_scale ** 2 * self.pooled(train)
        v = (w @ self.e[train] + h.prior_rows * prior) / (w.sum(axis=1) + h.prior_rows)
        return np.maximum(v, 0.0)

    def unseen_var(self, train, test, novelty: Novelty):
        """Per ``test`` row, the novelty variance of its values no ``train`` row has (as
        ``ModelFormTable.unseen`` adds it)."""
        import numpy as np
        add = np.zeros(len(test))
        for f in FEATURES:
            v = novelty_var(novelty, f)[0]
            if v > 0:
                seen = {self.values[f][int(i)] for i in train}
                add += v * np.array([x not in seen and x != UNKNOWN
                                     for x in (self.values[f][int(i)] for i in test)])
        return add

    def folds(self, idx, novelty: Novelty) -> list[tuple[Any, Any, Any]]:
        """(test, train, fixed variance) per left-out source of the rows ``idx``: what
        does not depend on the hyperparameters (coefficient spread, novelty of the left-out
        rows' unseen values), computed once per fit, not once per candidate."""
        src = self.sources[idx]
        out = []
        for s in sorted(set(src.tolist())):
            test, train = idx[src == s], idx[src != s]
            out.append((test, train, self.c2[test] + self.unseen_var(train, test, novelty)))
        return out

    def loso_score(self, folds: list[tuple[Any, Any, Any]], h: Hyper) -> float:
        """Mean over left-out sources (``folds``) of the mean interval score of their rows,
        the novelty of their unseen values included (the intervals the table would give)."""
        import numpy as np
        z, alpha = z_of(LEVEL), 1.0 - LEVEL
        scores = []
        for test, train, fixed in folds:
            sig = np.sqrt(self.model_var(train, test, h) + fixed)
            miss = np.maximum(0.0, np.abs(self.r[test]) - z * sig)
            scores.append(float(np.mean(2 * z * sig + (2.0 / alpha) * miss)))
        return sum(scores) / len(scores)


def _moves(h: Hyper):
    """Every single-parameter change of ``h`` on the grids, in a fixed order."""
    for f in FEATURES:
        for v in SIMILARITY_GRID:
            if v != h.similarity[f]:
                yield replace(h, similarity={**h.similarity, f: v})
    for v in PRIOR_ROWS_GRID:
        if v != h.prior_rows:
            yield replace(h, prior_rows=v)
    for v in PRIOR_SCALE_GRID:
        if v != h.prior_scale:
            yield replace(h, prior_scale=v)


def _fit(data: _Data, idx, novelty: Novelty) -> tuple[Hyper, float]:
    key = (tuple(int(i) for i in idx), tuple(sorted(novelty.items(), key=str)))
    if key not in data.fits:
        data.fits[key] = _descend(data, idx, novelty)
    return data.fits[key]


def _descend(data: _Data, idx, novelty: Novelty) -> tuple[Hyper, float]:
    """Coordinate descent over the grids from ``START`` (deterministic)."""
    h = START
    if len(set(data.sources[idx])) < 2:
        return h, float("nan")
    folds = data.folds(idx, novelty)
    best = data.loso_score(folds, h)
    for _ in range(MAX_PASSES):
        improved = False
        for cand in _moves(h):
            s = data.loso_score(folds, cand)
            if s < best - 1e-12:
                h, best, improved = cand, s, True
        if not improved:
            break
    return h, best


def _ensemble(data: _Data, idx, novelty: Novelty) -> tuple[Hyper, ...]:
    """The hyperparameters fitted to the rows ``idx`` and to ``idx`` less each source in
    turn (bagging over the leave-one-source-out folds): the table averages the variance
    over them, so a small change of the residuals that flips one grid choice moves the
    interval by a fraction of the flip."""
    out = [_fit(data, idx, novelty)[0]]
    for s in sorted(set(data.sources[idx])):
        rest = idx[data.sources[idx] != s]
        if len(set(data.sources[rest])) >= 2:
            out.append(_fit(data, rest, novelty)[0])
    return tuple(out)


def _bag_var(data: _Data, train, test, hypers: Sequence[Hyper]):
    """``_Data.model_var`` averaged over ``hypers`` (as ``ModelFormTable`` does)."""
    return sum(data.model_var(train, test, h) for h in hypers) / len(hypers)


def _novelty(data: _Data, idx) -> dict[str, float | None]:
    """Per feature, the novelty variance learned from the rows ``idx`` (``None`` where no
    value can be left out with two sources left to learn from). Each gap is measured
    against the table learned without the value's rows (hyperparameters refitted, without
    novelty); the final hyperparameters are then fitted with the novelty inside their
    objective, so the prior and the novelty do not both cover the same gap."""
    import numpy as np
    out: dict[str, float | None] = {}
    for f in FEATURES:
        vals = [data.values[f][int(i)] for i in idx]
        gaps = []
        for a in sorted(set(vals) - {UNKNOWN}):
            held = np.array([v == a for v in vals])
            test, train = idx[held], idx[~held]
            if len(set(data.sources[train])) < 2:
                continue
            # against the procedure run without those rows and without novelty (its own
            # hyperparameters: a value nobody measured did not shape them either)
            v = _bag_var(data, train, test, _ensemble(data, train, {}))
            gaps.append(max(0.0, float(np.mean(data.e[test]) - np.mean(v))))
        out[f] = round(sum(gaps) / len(gaps), 8) if gaps else None
    return out


def learn_novelty(records: Sequence[ResidualRecord]) -> dict[str, float | None]:
    """``ModelFormTable.novelty`` learned from ``records`` (see the module docstring)."""
    import numpy as np
    return _novelty(_Data(records), np.arange(len(records)))


def _table(data: _Data, idx, provenance: Mapping[str, Any]) -> tuple[ModelFormTable, float]:
    """The table learned from the rows ``idx``: novelty first, then the hyperparameter
    ensemble with the novelty in its objective; and the full fit's interval score."""
    novelty = _novelty(data, idx)
    hypers = _ensemble(data, idx, novelty)
    score = _fit(data, idx, novelty)[1]
    return ModelFormTable(tuple(data.records[int(i)] for i in idx), hypers[0],
                          provenance, novelty, hypers), score


def learn_table(records: Sequence[ResidualRecord],
                provenance: Mapping[str, Any] | None = None) -> ModelFormTable:
    """Novelty by leaving each feature value out, then hyperparameters by leave-one-source-
    out over ``records`` (and over ``records`` less each source: the bagged ensemble); the
    table holds them all."""
    import numpy as np
    data = _Data(records)
    table, score = _table(data, np.arange(len(records)), provenance or {})
    return replace(table, provenance={**table.provenance,
                                      "loso_interval_score": round(score, 6)})


def loso_evaluation(records: Sequence[ResidualRecord]) -> list[HeldOut]:
    """Every row's interval predicted with its whole source left out of the learning
    (hyperparameters, their ensemble and novelty included), in input order, through the
    same ``ModelFormTable.sigma_log`` that predictions use."""
    import numpy as np
    data = _Data(records)
    every = np.arange(len(records))
    out: list[HeldOut | None] = [None] * len(records)
    for s in sorted(set(data.sources)):
        table, _ = _table(data, every[data.sources != s], {})
        for i in every[data.sources == s]:
            r = data.records[int(i)]
            out[int(i)] = HeldOut(r, table.sigma_log(r.regime),
                                  tuple(table.unseen(r.regime).items()))
    return [h for h in out if h is not None]
