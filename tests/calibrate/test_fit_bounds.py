"""A least-squares parameter pressed against its bound has no linearised standard error,
whether the solver flags it (``active_mask``) or stops a hair inside (``calibrate.fit.
_near_bound``: within 0.1 % of the bound); a parameter well inside keeps its error."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from calibrate.fit import BOUND_TOL, TINY, _near_bound, _Spec, _stderr

SPEC = _Spec(names=("a", "b"), x0=(1.0, 1.0), lower=(0.0, 0.0), upper=(10.0, math.inf))


def _sol(x, active=(0, 0)):
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(12, 2))
    return SimpleNamespace(x=np.asarray(x, dtype=float), jac=jac,
                           fun=rng.normal(size=12) * 0.01, active_mask=np.asarray(active))


def test_a_parameter_a_hair_above_its_floor_has_no_stderr():
    floor = math.log(TINY)
    inside = _sol([floor + 1.2e-5, math.log(3.0)])            # not flagged by the solver
    err = _stderr(SPEC, {}, inside, 12)
    assert math.isnan(err["a"]) and math.isfinite(err["b"]) and err["b"] > 0
    assert list(_near_bound(SPEC, [0, 1], inside)) == [1, 0]


def test_flagged_or_at_the_ceiling_counts_and_well_inside_does_not():
    flagged = _sol([math.log(2.0), math.log(3.0)], active=(-1, 0))
    assert math.isnan(_stderr(SPEC, {}, flagged, 12)["a"])
    ceiling = _sol([math.log(10.0) - BOUND_TOL / 2, math.log(3.0)])
    assert list(_near_bound(SPEC, [0, 1], ceiling)) == [1, 0]
    clear = _sol([math.log(TINY) + 10 * BOUND_TOL, math.log(3.0)])
    assert list(_near_bound(SPEC, [0, 1], clear)) == [0, 0]
    assert all(math.isfinite(v) and v > 0 for v in _stderr(SPEC, {}, clear, 12).values())
