"""Intervals on the published-run predictions, and the residual table they are learned from.

* ``attach_intervals``: every predicted row gets its ``Uncertainty`` (coefficient spread
  from extra analytic simulations, model-form spread from a learned table).
* ``residual_records``: the rows as the model-form learner sees them (source, regime,
  log residual, coefficient spread).
* ``learn_from``: the table learned from all rows (what ships) and every row's interval
  predicted with its whole source left out (the honest coverage check).
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from ..uncertainty.calibration import coverage
from ..uncertainty.coefficients import CoefficientSpread, coefficient_spread
from ..uncertainty.interval import Uncertainty
from ..uncertainty.learn import HeldOut, learn_table, loso_evaluation
from ..uncertainty.regime import regime_of
from ..uncertainty.table import ModelFormTable, ResidualRecord
from .predict import RowOutcome

_MODELLED = "ok"


def publication(row: dict) -> str:
    """The source a row is left out with: the id's leading word (``megatron_sc21_03`` and
    ``megatron_h100_2024_01`` are both tables of the Megatron-LM README; ``bloom176b_final``
    and ``bloom_topo_0228_02`` are both the BLOOM run)."""
    m = re.match(r"[A-Za-z]+", row.get("id", "") or "")
    return m.group(0).lower() if m else "?"


def _usable(o: RowOutcome) -> bool:
    return o.result is not None and o.inputs is not None and o.status.startswith(_MODELLED)


def coefficient_spreads(outcomes: Sequence[RowOutcome]) -> list[CoefficientSpread | None]:
    out = []
    for o in outcomes:
        if not _usable(o):
            out.append(None)
            continue
        i = o.inputs
        out.append(coefficient_spread(i.model, i.plan, i.cluster, i.profile))
    return out


def attach_intervals(outcomes: Sequence[RowOutcome], table: ModelFormTable,
                     spreads: Sequence[CoefficientSpread | None] | None = None) -> None:
    """Set ``uncertainty`` on every modelled row, the model-form part from ``table``."""
    spreads = spreads if spreads is not None else coefficient_spreads(outcomes)
    for o, s in zip(outcomes, spreads):
        if s is None:
            continue
        i = o.inputs
        regime = regime_of(i.model, i.plan, i.cluster, i.framework)
        o.uncertainty = Uncertainty(s, table.sigma_log(regime), regime,
                                    unvalidated=tuple(table.unseen(regime).items()))


def _measured(o: RowOutcome) -> float | None:
    try:
        v = float(o.row.get("measured_step_time_s") or "nan")
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def residual_records(outcomes: Sequence[RowOutcome],
                     spreads: Sequence[CoefficientSpread | None]) -> list[tuple[int, ResidualRecord]]:
    """(outcome index, record) for every modelled row with a measured step time."""
    out = []
    for n, (o, s) in enumerate(zip(outcomes, spreads)):
        meas = _measured(o)
        if s is None or meas is None:
            continue
        i = o.inputs
        out.append((n, ResidualRecord(o.row.get("id", f"row{n}"), publication(o.row),
                                      regime_of(i.model, i.plan, i.cluster, i.framework),
                                      math.log(o.result.step_time_s / meas), s.sigma_log)))
    return out


@dataclass(frozen=True)
class Learned:
    table: ModelFormTable              # learned from every row: the one that ships
    heldout: tuple[HeldOut, ...]       # each row predicted with its source left out
    index: tuple[int, ...]             # outcome index of each held-out row


def learn_from(outcomes: Sequence[RowOutcome], spreads: Sequence[CoefficientSpread | None],
               runs: str | Path, report: str | Path, command: str) -> Learned:
    pairs = residual_records(outcomes, spreads)
    records = [r for _, r in pairs]
    heldout = loso_evaluation(records)
    cov = coverage(heldout)
    sources: dict[str, int] = {}
    for r in records:
        sources[r.source] = sources.get(r.source, 0) + 1
    prov = {"command": command, "runs": str(runs), "runs_sha256": _sha256(runs),
            "report": str(report), "rows": len(records), "sources": sources,
            "date": datetime.now(timezone.utc).date().isoformat(),
            "leave_one_source_out": {"level": cov.level, "covered": cov.covered,
                                     "rows": cov.rows,
                                     "median_width_frac": round(cov.median_width_frac, 4)}}
    return Learned(learn_table(records, prov), tuple(heldout), tuple(n for n, _ in pairs))


def _sha256(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def attach_heldout(outcomes: Sequence[RowOutcome], spreads: Sequence[CoefficientSpread | None],
                   learned: Learned) -> None:
    """Set each row's ``uncertainty`` to its held-out version (source left out)."""
    for n, h in zip(learned.index, learned.heldout):
        s = spreads[n]
        if s is not None:
            outcomes[n].uncertainty = Uncertainty(s, h.model_form_sigma_log, h.record.regime,
                                                  unvalidated=h.unvalidated)
