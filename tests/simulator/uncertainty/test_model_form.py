"""Model-form table and its leave-one-source-out learning, on synthetic residuals whose
spread is known (the real residuals move with the physics; nothing here depends on them)."""
from __future__ import annotations

import dataclasses
import json
import math
import random
from statistics import NormalDist

import pytest

from simulator.api.catalog import make_cluster
from simulator.errors import InvalidInputError
from simulator.parallel.plan import Plan
from simulator.uncertainty.calibration import coverage, reliability
from simulator.uncertainty.interval import (
    Interval,
    distinguishable,
    log_interval,
    log_interval_like,
    overlap_fraction,
)
from simulator.uncertainty.learn import (
    LEVEL,
    learn_novelty,
    learn_table,
    loso_evaluation,
    z_of,
)
from simulator.uncertainty.regime import FEATURES, UNKNOWN, Regime, regime_of
from simulator.uncertainty.table import (
    SHIPPED_TABLE,
    Hyper,
    ModelFormTable,
    ResidualRecord,
    load_table,
)
from simulator.workload import get_preset

BASE = dict(gpu="a100", framework="megatron", moe="dense", context="<=2k", size="10-100B",
            kernel=">2k", scale="<=64")


def regime(**kw) -> Regime:
    return Regime(**{**BASE, **kw})


def synthetic(sigma_of, n_sources=6, rows=10, seed=7) -> list[ResidualRecord]:
    """Rows whose log residual is N(0, sigma_of(regime)^2); alternate GPU families."""
    rng = random.Random(seed)
    out = []
    for s in range(n_sources):
        for i in range(rows):
            rg = regime(gpu="h100" if i % 2 else "a100", framework=f"fw{s}")
            out.append(ResidualRecord(f"s{s}_{i}", f"src{s}", rg, rng.gauss(0, sigma_of(rg)), 0.0))
    return out


def test_z_of_80_percent_is_the_normal_quantile():
    assert z_of(0.8) == pytest.approx(NormalDist().inv_cdf(0.9))
    assert z_of(0.8) == pytest.approx(1.2815515655446004, rel=1e-12)   # Phi^-1(0.9), tables


def test_table_formula_by_hand():
    """Two rows, one matching the query, one differing in gpu: the weighted mean of the
    excess variances with the prior, as table.py's docstring writes it."""
    recs = (ResidualRecord("a", "s1", regime(), 0.10, 0.06),
            ResidualRecord("b", "s2", regime(gpu="h100"), -0.30, 0.0))
    sim = {f: 1.0 for f in FEATURES} | {"gpu": 0.2}
    t = ModelFormTable(recs, Hyper(sim, prior_rows=2.0, prior_scale=1.5))
    e_a, e_b = 0.10 ** 2 - 0.06 ** 2, 0.30 ** 2
    prior = 1.5 ** 2 * (e_a + e_b) / 2
    want = (1.0 * e_a + 0.2 * e_b + 2.0 * prior) / (1.0 + 0.2 + 2.0)
    assert t.sigma_log(regime()) == pytest.approx(math.sqrt(want), rel=1e-12)
    # an unknown feature is ignored, not a mismatch: both rows weigh 1
    want_u = (e_a + e_b + 2.0 * prior) / (2.0 + 2.0)
    assert t.sigma_log(regime(gpu=UNKNOWN)) == pytest.approx(math.sqrt(want_u), rel=1e-12)


def test_far_from_every_row_falls_back_on_the_prior():
    recs = tuple(ResidualRecord(f"r{i}", f"s{i % 3}", regime(), 0.05 * (1 + i % 2), 0.0)
                 for i in range(9))
    sim = {f: 0.01 for f in FEATURES}
    t = ModelFormTable(recs, Hyper(sim, prior_rows=3.0, prior_scale=2.0))
    far = Regime(*(f"other-{f}" for f in FEATURES))
    assert t.sigma_log(far) == pytest.approx(math.sqrt(t.prior_var), rel=1e-3)
    assert t.sigma_log(far) > t.sigma_log(regime())


def test_json_round_trip_gives_the_same_sigma(tmp_path):
    t = learn_table(synthetic(lambda r: 0.1), {"command": "test"})
    p = t.write_json(tmp_path / "t.json")
    back = ModelFormTable.read_json(p)
    for rg in (regime(), regime(gpu="h100"), regime(framework="new"), regime(scale=UNKNOWN)):
        assert back.sigma_log(rg) == t.sigma_log(rg)
    assert json.loads(p.read_text())["provenance"]["command"] == "test"


def test_wrong_schema_is_one_typed_error(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(InvalidInputError, match="uncertainty_table"):
        ModelFormTable.read_json(p)


def test_a_source_never_vouches_for_itself():
    """Leave-one-source-out: a source's held-out intervals do not depend on its own rows."""
    recs = synthetic(lambda r: 0.1)
    held = loso_evaluation(recs)
    changed = [ResidualRecord(r.row_id, r.source, r.regime, 5.0 * r.log_residual + 1.0, 0.0)
               if r.source == "src2" else r for r in recs]
    held2 = loso_evaluation(changed)
    for a, b in zip(held, held2):
        if a.record.source == "src2":
            assert a.model_form_sigma_log == b.model_form_sigma_log
    assert any(a.model_form_sigma_log != b.model_form_sigma_log
               for a, b in zip(held, held2) if a.record.source != "src2")


def test_learning_is_deterministic():
    recs = synthetic(lambda r: 0.1)
    a, b = learn_table(recs), learn_table(recs)
    assert a.to_dict() == b.to_dict()
    assert [h.model_form_sigma_log for h in loso_evaluation(recs)] == \
        [h.model_form_sigma_log for h in loso_evaluation(recs)]


def test_homoscedastic_residuals_are_covered_near_nominal():
    """Residuals N(0, 0.1^2) everywhere: the held-out 80 % intervals cover 65-95 %, and
    the reliability curve is monotone."""
    held = loso_evaluation(synthetic(lambda r: 0.1, n_sources=6, rows=12))
    cov = coverage(held)
    assert 0.65 <= cov.fraction <= 0.95
    observed = [o for _, o in reliability(held)]
    assert observed == sorted(observed)


def test_a_noisier_regime_gets_wider_intervals():
    """h100 rows 5x noisier than a100 rows: the learned table keys on the GPU family."""
    t = learn_table(synthetic(lambda r: 0.25 if r.gpu == "h100" else 0.05, rows=12))
    assert t.hyper.similarity["gpu"] < 1.0
    assert t.sigma_log(regime(gpu="h100")) > 2 * t.sigma_log(regime(gpu="a100"))


def test_the_ensemble_averages_the_variance_over_its_hyperparameters():
    recs = (ResidualRecord("a", "s1", regime(), 0.10, 0.02),
            ResidualRecord("b", "s2", regime(gpu="h100"), -0.30, 0.0),
            ResidualRecord("c", "s3", regime(context="4k"), 0.05, 0.0))
    h1 = Hyper({f: 1.0 for f in FEATURES} | {"gpu": 0.05}, 1.0, 1.0)
    h2 = Hyper({f: 0.5 for f in FEATURES}, 3.0, 2.0)
    bag = ModelFormTable(recs, h1, {}, {}, (h1, h2))
    for rg in (regime(), regime(gpu="h100"), regime(context="8k"), regime(scale=UNKNOWN)):
        want = (ModelFormTable(recs, h1).sigma_log(rg) ** 2
                + ModelFormTable(recs, h2).sigma_log(rg) ** 2) / 2
        assert bag.sigma_log(rg) ** 2 == pytest.approx(want, rel=1e-12)


def test_learned_ensemble_is_the_full_fit_plus_one_fit_per_left_out_source():
    recs = synthetic(lambda r: 0.1, n_sources=4)
    t = learn_table(recs)
    assert len(t.ensemble) == 1 + 4 and t.ensemble[0] == t.hyper
    back = ModelFormTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.ensemble == t.ensemble


# ---- novelty: a value no validation row has ---------------------------------------------
def _small_table(novelty) -> ModelFormTable:
    recs = (ResidualRecord("a", "s1", regime(), 0.10, 0.0),
            ResidualRecord("b", "s2", regime(gpu="h100"), -0.20, 0.0))
    return ModelFormTable(recs, Hyper({f: 0.5 for f in FEATURES}, 1.0, 1.0), {}, novelty)


def test_novelty_adds_to_the_variance_of_an_unseen_value_only():
    t0 = _small_table({})
    t = _small_table({"gpu": 0.01, "framework": 0.003})
    seen, new = regime(gpu="h100"), regime(gpu="b200")
    assert t.sigma_log(seen) == t0.sigma_log(seen)                # value in the rows
    assert t.unseen(seen) == {}
    assert t.sigma_log(new) ** 2 == pytest.approx(t0.sigma_log(new) ** 2 + 0.01, rel=1e-12)
    assert t.unseen(new) == {"gpu=b200": 0.01}
    both = regime(gpu="b200", framework="torchtitan")
    assert t.sigma_log(both) ** 2 == pytest.approx(t0.sigma_log(both) ** 2 + 0.013, rel=1e-12)
    # an unknown value is not a new one
    assert t.sigma_log(regime(gpu=UNKNOWN)) == t0.sigma_log(regime(gpu=UNKNOWN))


def test_a_feature_with_one_value_assumes_the_largest_learned_novelty():
    t = _small_table({"gpu": 0.01, "framework": 0.003, "moe": None})
    assert t.novelty_var("moe") == (0.01, False)
    assert t.novelty_var("framework") == (0.003, True)
    assert t.unseen(regime(moe="moe")) == {"moe=moe": 0.01}
    assert _small_table({}).novelty_var("moe") == (0.0, False)   # nothing learned: nothing added


def test_a_value_worse_than_its_fallback_earns_novelty():
    """One framework (one source) 8x noisier than the rest: leaving it out, the table
    learned from the others under-covers it, so a new framework value gets a novelty
    variance well above what homoscedastic rows give (small, from the clip on noise)."""
    homo = learn_novelty(synthetic(lambda r: 0.05))
    recs = synthetic(lambda r: 0.4 if r.framework == "fw0" else 0.05)
    hetero = learn_novelty(recs)
    assert homo["moe"] is None and hetero["moe"] is None        # one value: not learnable
    # fw0's gap over the others' ~0.05^2, averaged over 6 framework values (at least half
    # of it survives: the others' tables are not far below their own rows)
    fw0 = [r.log_residual ** 2 for r in recs if r.regime.framework == "fw0"]
    assert hetero["framework"] > 0.5 * (sum(fw0) / len(fw0) - 0.05 ** 2) / 6
    assert hetero["framework"] > 5 * homo["framework"]
    assert all(v is None or v >= 0 for v in list(homo.values()) + list(hetero.values()))


def test_novelty_widens_the_held_out_interval_of_a_source_with_a_new_value():
    """In the nested check a left-out source's framework is a value the rest never saw:
    its held-out sigma includes the learned novelty (so a noisy new framework is covered
    more often than without it)."""
    recs = synthetic(lambda r: 0.3 if r.framework == "fw0" else 0.05)
    held = [h for h in loso_evaluation(recs) if h.record.source == "src0"]
    others = [r for r in recs if r.source != "src0"]
    base = learn_table(others)
    bare = ModelFormTable(base.records, base.hyper, {}, {})
    for h in held:
        assert h.model_form_sigma_log > bare.sigma_log(h.record.regime)


def test_a_value_whose_removal_leaves_one_source_is_not_learned_from():
    """Two sources; the framework value of src0 is src0's alone: leaving it out leaves one
    source, from which no hyperparameters can be learned, so that gap is skipped (and with
    both values skipped the feature's novelty is not learned at all)."""
    recs = synthetic(lambda r: 0.1, n_sources=2)
    nov = learn_novelty(recs)
    assert nov["framework"] is None
    assert nov["gpu"] is not None                # a100/h100 rows are in both sources


@pytest.mark.parametrize("bad", [None, [], {"gpu": -1.0}, {"gpu": float("nan")},
                                 {"gpu": "x"}])
def test_malformed_novelty_is_one_typed_error(tmp_path, bad):
    d = learn_table(synthetic(lambda r: 0.1)).to_dict()
    d["novelty"] = bad
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InvalidInputError, match="uncertainty_table"):
        ModelFormTable.read_json(p)


def test_held_out_rows_name_the_values_the_other_sources_lack():
    """Each synthetic source has its own framework: held out, every row's framework is new
    to the table that predicts it, and the HeldOut says so."""
    for h in loso_evaluation(synthetic(lambda r: 0.1, n_sources=4)):
        assert [k for k, _ in h.unvalidated] == [f"framework={h.record.regime.framework}"]


def test_shipped_table_loads_and_says_where_it_came_from():
    t = load_table()
    assert SHIPPED_TABLE.is_file()
    assert len({r.source for r in t.records}) >= 2
    prov = t.provenance
    for k in ("command", "runs", "rows", "date", "report", "leave_one_source_out"):
        assert k in prov
    assert prov["rows"] == len(t.records)
    assert "complexity report" in prov["command"]
    assert all(0 < v <= 1 for v in t.hyper.similarity.values())
    assert t.sigma_log(regime()) > 0
    assert set(t.novelty) == set(FEATURES)
    assert all(v is None or v >= 0 for v in t.novelty.values())
    assert any(v for v in t.novelty.values())         # something was learned
    assert len(t.hypers) >= 2                          # the bagged ensemble ships


# ---- intervals ----------------------------------------------------------------------------
def test_log_interval_is_centred_on_the_point():
    iv = log_interval(10.0, 0.1)
    assert iv.p50 == 10.0
    assert iv.p10 * iv.p90 == pytest.approx(100.0)
    assert iv.p90 / iv.p50 == pytest.approx(math.exp(z_of(LEVEL) * 0.1))
    assert log_interval(10.0, 0.0) == Interval(10.0, 10.0, 10.0)


def test_related_quantities_share_the_relative_spread():
    step = log_interval(2.0, 0.2)
    tps = log_interval_like(step, 1000.0)
    assert tps.p10 / tps.p50 == pytest.approx(step.p10 / step.p50)
    # throughput at the P90 step time is the P10 throughput (symmetric in log space)
    assert 2.0 * 1000.0 / step.p90 == pytest.approx(tps.p10)


@pytest.mark.parametrize("a, b, overlap, same", [
    (Interval(1, 2, 3), Interval(1, 2, 3), 1.0, True),
    (Interval(1, 2, 3), Interval(4, 5, 6), 0.0, False),
    (Interval(1, 2, 3), Interval(2, 3, 4), 0.5, False),     # exactly half: distinguishable
    (Interval(1, 2, 3), Interval(1.9, 2.5, 3.5), 1.1 / 1.6, True),
    (Interval(0, 5, 10), Interval(4, 5, 6), 1.0, True),     # narrow one inside the wide one
])
def test_overlap_by_more_than_half_is_not_distinguishable(a, b, overlap, same):
    assert overlap_fraction(a, b) == pytest.approx(overlap)
    assert distinguishable(a, b) is (not same)


# ---- regime features ----------------------------------------------------------------------
@pytest.mark.parametrize("seq, bucket", [(2048, "<=2k"), (4096, "4k"), (4097, "8k"),
                                         (8192, "8k"), (8193, ">8k"), (131072, ">8k")])
def test_context_buckets_end_where_the_public_rows_end(seq, bucket):
    m = dataclasses.replace(get_preset("llama2-7b"), seq_len=seq)
    assert regime_of(m, Plan(), make_cluster("h100-sxm", 8)).context == bucket


def test_framework_aliases_are_one_regime():
    m, p, c = get_preset("llama2-7b"), Plan(), make_cluster("h100-sxm", 8)
    assert regime_of(m, p, c, "megatron") == regime_of(m, p, c, " Megatron-LM ")
    assert regime_of(m, p, c, "llm-foundry-fsdp") == regime_of(m, p, c, "llm-foundry")
    assert regime_of(m, p, c).framework == UNKNOWN
