"""Predict published training runs (rows in the ``published_runs.csv`` schema).

Each row becomes (model, cluster, plan). Cells the source leaves empty are chosen and
reported in the ``chosen`` column:

* framework behaviour that the framework's own documentation fixes (attention kernel,
  gradient-reduction overlap, TP-communication overlap) and what it keeps in memory (ZeRO
  stage / distributed optimizer when the row is silent, gradient dtype, FP8 weights, loss)
  comes from ``frameworks.json`` (``simulator.parallel.framework_plan.with_framework``),
  before anything is searched;
* an empty ``vpp`` means the frameworks' default, the non-interleaved schedule;
* tunables with no framework default (micro-batch, and recompute / sequence parallelism
  where the framework does not fix them) are set to the best *feasible* value by our own
  simulation: the shortest predicted step that fits in memory. Measured step times are
  never read while choosing.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..boundary import spellings
from ..boundary.files import atomic_path
from ..engine.result import Result
from ..engine.simulate import simulate
from ..errors import ComplexityError, InfeasiblePlanError, InvalidInputError
from ..frameworks.defaults import (
    FrameworkDefaults,
    framework_defaults,
    framework_for_hardware,
)
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.framework_plan import with_framework
from ..parallel.plan import Plan
from ..uncertainty.interval import Uncertainty
from ..workload import MLP, MoESpec, TransformerSpec
from ..workload.presets import find_preset
from .runs_schema import (  # noqa: F401
    MODEL_DIMS,
    blank_not_applicable,
    check_row,
    invalid_status,
    measured_value,
    read_rows,
)

OUT_COLUMNS = ["predicted_step_time_s", "predicted_tokens_per_s_per_gpu", "error_pct",
               "chosen", "status", "predicted_step_time_p10_s", "predicted_step_time_p90_s"]


@dataclass(frozen=True)
class RowInputs:
    """What the chosen prediction was simulated from (for intervals and reports)."""

    model: TransformerSpec
    plan: Plan
    cluster: ClusterSpec
    profile: Profile
    framework: str


@dataclass
class RowOutcome:
    row: dict[str, str]
    result: Result | None
    chosen: str
    status: str
    error_pct: float | None
    inputs: RowInputs | None = None
    # spread of the step time (``simulator.validation.intervals``), when computed
    uncertainty: Uncertainty | None = None
    saved: dict[str, str] | None = None     # output columns of a row resumed from a file


# ---- row parsing ---------------------------------------------------------------------------
def _int(row: Mapping[str, str], key: str, default: int | None = None) -> int | None:
    v = (row.get(key) or "").strip()
    if v == "":
        return default
    try:
        f = float(v)
    except ValueError:
        raise InvalidInputError(key, v, "a number") from None
    if not f.is_integer():
        raise InvalidInputError(key, v, "a whole number")
    return int(f)


def _bool(row: Mapping[str, str], key: str) -> bool | None:
    v = (row.get(key) or "").strip().lower()
    if v == "":
        return None
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise InvalidInputError(key, v, "true or false")


def row_preset(row: Mapping[str, str]) -> TransformerSpec | None:
    """The preset the row's ``model`` names (any spelling ``find_preset`` reads), None when
    it names none; a name that is not a preset is refused only when the row lacks the
    dimensions to build the model from (``MODEL_DIMS``)."""
    name = (row.get("model") or "").strip()
    if not name:
        return None
    spec = find_preset(name)
    missing = [c for c in MODEL_DIMS if _int(row, c) is None]
    if spec is None and missing:
        raise InvalidInputError("model", name, "a built-in model (`complexity list models`) "
                                "or a row giving its dimensions (missing: "
                                + ", ".join(missing) + ")")
    return spec


def row_model(row: Mapping[str, str]) -> TransformerSpec:
    """Preset (if named) with explicit dimension columns overriding it."""
    base = row_preset(row)
    def pick(col: str, attr: str):
        v = _int(row, col)
        return v if v is not None else (getattr(base, attr) if base else None)
    fields = {"n_layers": pick("n_layers", "n_layers"), "hidden": pick("hidden", "hidden"),
              "ffn_hidden": pick("ffn_hidden", "ffn_hidden"), "n_heads": pick("n_heads", "n_heads"),
              "n_kv_heads": pick("n_kv_heads", "n_kv_heads"), "vocab": pick("vocab", "vocab"),
              "seq_len": pick("seq_len", "seq_len")}
    for k, v in fields.items():
        if v is None and k not in ("n_heads", "n_kv_heads"):
            raise InvalidInputError(k, "", "a value (or a model preset that provides it)")
    mlp = (row.get("mlp") or "").strip() or (base.mlp.value if base else "gelu")
    moe = _row_moe(row, base)
    heads = fields["n_heads"]
    kv = fields["n_kv_heads"] or heads
    same = base and heads == base.n_heads and base.hidden == fields["hidden"]
    # MLA's head_dim is the value-head width, not hidden / heads: it stays the preset's
    head_dim = base.head_dim if base and (same or base.mla is not None) else 0
    dims = dict(name=(row.get("model") or row.get("id") or "row").strip(),
                n_layers=fields["n_layers"], hidden=fields["hidden"],
                ffn_hidden=fields["ffn_hidden"], n_heads=heads or 0, n_kv_heads=kv or 0,
                vocab=fields["vocab"], seq_len=fields["seq_len"], mlp=mlp,
                head_dim=head_dim, moe=moe, source=row.get("source", ""))
    if base is not None:
        # the named preset's architecture (MLA, windows, RoPE, norms, biases, router) stays;
        # the row's columns override its dimensions
        return replace(base, **dims)
    return TransformerSpec(**dims)


def _row_moe(row: Mapping[str, str], base: TransformerSpec | None) -> MoESpec | None:
    experts = _int(row, "moe_experts")
    if experts is None:
        return base.moe if base else None
    pm = base.moe if base else None             # a named preset's counts fill empty cells
    counts = dict(experts=experts, top_k=_int(row, "moe_topk", pm.top_k if pm else 1),
                  expert_ffn_hidden=_int(row, "moe_ffn_hidden",
                                         pm.expert_ffn_hidden if pm else _int(row, "ffn_hidden")),
                  shared_experts=_int(row, "moe_shared_experts", pm.shared_experts if pm else 0),
                  dense_layers=_int(row, "moe_dense_layers", pm.dense_layers if pm else 0))
    # a named preset keeps its router (score function, groups, expert bias) and layer pattern
    return replace(base.moe, **counts) if base and base.moe else MoESpec(**counts)


def missing_heads(row: Mapping[str, str]) -> bool:
    return _int(row, "n_heads") is None and row_preset(row) is None


# ---- plan ----------------------------------------------------------------------------------
def base_plan(row: Mapping[str, str], fw_name: str) -> Plan:
    """The row's plan; what it leaves empty comes from framework ``fw_name``'s defaults
    (sequence parallelism and the tunables are chosen later by ``candidate_plans``)."""
    tp, pp = _int(row, "tp", 1), _int(row, "pp", 1)
    vpp = _int(row, "vpp", 1)
    plan = Plan(tp=tp, pp=pp, dp=_int(row, "dp", 1), cp=_int(row, "cp", 1), ep=_int(row, "ep", 1),
                vpp=vpp, micro_batch=_int(row, "micro_batch", 1),
                global_batch=_int(row, "global_batch"),
                sequence_parallel=bool(_bool(row, "sequence_parallel")) and tp > 1,
                recompute=(row.get("recompute") or "none").strip(),
                zero_stage=_int(row, "zero_stage", 0),
                precision=(row.get("precision") or "bf16").strip(),
                schedule="interleaved" if vpp > 1 else "1f1b")
    keep = {"sequence_parallel"} | ({"zero_stage"} if _int(row, "zero_stage") is not None else set())
    return with_framework(plan, fw_name, keep, strict=False)


def candidate_plans(row: Mapping[str, str], base: Plan,
                    fw: FrameworkDefaults) -> Iterable[tuple[Plan, str]]:
    """Plans for every combination of the empty tunable cells, with a 'chosen' note.

    An empty vpp keeps the frameworks' default, the non-interleaved schedule (Megatron's
    --num-layers-per-virtual-pipeline-stage defaults to None), so it is not searched.
    """
    mbs = [base.micro_batch] if _int(row, "micro_batch") else \
        [b for b in (1, 2, 4, 8) if (base.global_batch // base.dp) % b == 0]
    recs = [base.recompute.value] if (row.get("recompute") or "").strip() else ["none", "selective", "full"]
    sp_given = _bool(row, "sequence_parallel")
    if base.tp == 1:
        sps = [False]
    elif sp_given is not None:
        sps = [sp_given]
    else:
        sps = [fw.sp_with_tp] if fw.sp_with_tp is not None else [True, False]
    for mb in mbs:
        for rc in recs:
            for sp in sps:
                p = replace(base, micro_batch=mb, recompute=rc, sequence_parallel=sp)
                yield p, _chosen_note(row, p)


def _chosen_note(row: Mapping[str, str], p: Plan) -> str:
    notes = []
    if _int(row, "zero_stage") is None:
        notes.append(f"zero_stage={p.zero_stage} (framework default)")
    if not _int(row, "micro_batch"):
        notes.append(f"micro_batch={p.micro_batch}")
    if not _int(row, "vpp") and p.pp > 1:
        notes.append(f"vpp={p.vpp} (framework default: no interleaving)")
    if not (row.get("recompute") or "").strip():
        notes.append(f"recompute={p.recompute.value}")
    if _bool(row, "sequence_parallel") is None and p.tp > 1:
        notes.append(f"sequence_parallel={str(p.sequence_parallel).lower()}")
    return ";".join(notes)


# ---- prediction ----------------------------------------------------------------------------
ClusterFactory = Callable[[Mapping[str, str]], ClusterSpec]
ProfileFactory = Callable[[str], Profile]


def predict_row(row: Mapping[str, str], make_cluster: ClusterFactory,
                get_profile: ProfileFactory) -> RowOutcome:
    """Predict one row; never raises for a row it cannot model (status says why)."""
    row = dict(row)                             # what the outcome keeps: the cells as read
    work = dict(row)                            # what is predicted: blanks and fills applied
    try:
        blank_not_applicable(work)
        check_row(work)
        return replace(_predict(work, make_cluster, get_profile), row=row)
    except InfeasiblePlanError as exc:
        return RowOutcome(row, None, "", f"infeasible: {exc}", None)
    except InvalidInputError as exc:
        return RowOutcome(row, None, "", invalid_status(exc), None)
    except ComplexityError as exc:
        return RowOutcome(row, None, "", f"unsupported: {exc}", None)
    except Exception as exc:                    # a bug: keep the row, say so in its status
        return RowOutcome(row, None, "", f"error: internal {type(exc).__name__}: {exc}", None)


def _gpt_by_dimensions(row: Mapping[str, str], model: TransformerSpec) -> bool:
    """A row that names no preset and describes a GELU decoder: a GPT as the framework's
    GPT model builds it (``FrameworkDefaults.gpt_tied_embeddings``)."""
    return row_preset(row) is None and model.mlp == MLP.GELU and model.moe is None


def _framework_of(row: Mapping[str, str], cluster: ClusterSpec, notes: list[str]) -> str:
    """The row's framework name, or its successor where the hardware says which code ran
    (``framework_for_hardware``; the swap is noted in ``notes``)."""
    name = (row.get("framework") or "").strip().lower()
    fp8_gpu = "fp8" in cluster.gpu.peak_tflops
    precision = spellings.canonical(row.get("precision") or "", spellings.PRECISION)
    era = framework_for_hardware(name, fp8_gpu, precision)
    if era != name:
        notes.append(f"{era} defaults for a {name} run on an FP8-capable GPU or in FP8 "
                     "(frameworks.json eras)")
    return era


def _model_parallel(row: Mapping[str, str]) -> int:
    """tp x pp x cp of a row (each 1 where empty)."""
    return _int(row, "tp", 1) * _int(row, "pp", 1) * _int(row, "cp", 1)


def fill_degrees(row: dict, notes: list[str]) -> None:
    """In place: an empty ``dp`` is the GPUs left over by tp x pp x cp (Megatron's
    convention: data parallelism is what the other degrees leave), and an empty ``n_gpus``
    the product of the four degrees; each fill is noted. An empty ``dp`` the degrees do not
    divide the GPU count for is refused, naming ``dp``."""
    model_par = _model_parallel(row)
    n, dp = _int(row, "n_gpus"), _int(row, "dp")
    if n is None and dp is not None:
        row["n_gpus"] = str(model_par * dp)
        notes.append(f"n_gpus={row['n_gpus']} (tp x pp x dp x cp)")
    elif dp is None and n is not None:
        if n % model_par:
            raise InvalidInputError("dp", "", f"a value, or n_gpus={n} divisible by "
                                    f"tp x pp x cp = {model_par}")
        row["dp"] = str(n // model_par)
        notes.append(f"dp={row['dp']} (n_gpus / (tp x pp x cp))")
    elif n is None:
        raise InvalidInputError("n_gpus", "", "a GPU count (or a dp column to derive it from)")


def count_devices(row: dict, cluster: ClusterSpec, make_cluster: ClusterFactory,
                  notes: list[str]) -> bool:
    """In place, for a GPU with several devices on a card (MI250X: two GCDs, each a rank):
    a row that counts cards is rewritten to count devices. Cards are read where
    ``gpus_per_node`` x devices_per_card is the GPU's node (4 MI250X on an 8-GCD node;
    data parallelism then takes the other devices) or where tp x pp x dp x cp is
    devices_per_card x n_gpus; noted. True when the row changed."""
    k, n = cluster.gpu.devices_per_card, _int(row, "n_gpus")
    if k <= 1 or n is None:
        return False
    gpn = _int(row, "gpus_per_node")
    ranks = _model_parallel(row) * _int(row, "dp", 1)
    cards_per_node = gpn is not None and gpn * k == _own_node_devices(row, n * k, make_cluster)
    if not (cards_per_node or ranks == k * n):
        return False
    row["n_gpus"] = str(n * k)
    if cards_per_node:
        row["gpus_per_node"] = str(gpn * k)
    if ranks == n:                               # the degrees counted cards too: more DP
        row["dp"] = str(_int(row, "dp", 1) * k)
    notes.append(f"n_gpus={row['n_gpus']} devices: the row counts {n} {cluster.gpu.name} "
                 f"cards of {k} devices each")
    return True


def _own_node_devices(row: Mapping[str, str], n: int, make_cluster: ClusterFactory) -> int:
    """Devices on the GPU's own node (the row's gpus_per_node left out), 0 if none builds."""
    try:
        return make_cluster({**row, "gpus_per_node": "", "n_gpus": str(n)}).node.gpus_per_node
    except InvalidInputError:
        return 0


def _predict(row: dict, make_cluster: ClusterFactory, get_profile: ProfileFactory) -> RowOutcome:
    chosen_extra: list[str] = []
    fill_degrees(row, chosen_extra)
    check_row(row)                              # a derived n_gpus is held to the same limits
    cluster = make_cluster(row)
    if count_devices(row, cluster, make_cluster, chosen_extra):
        cluster = make_cluster(row)
    fw_name = _framework_of(row, cluster, chosen_extra)
    fw = framework_defaults(fw_name)
    if missing_heads(row):
        heads = _guess_heads(row)
        row["n_heads"] = row["n_kv_heads"] = str(heads)
        chosen_extra.append(f"n_heads={heads} (head_dim 128)")
    model = row_model(row)
    if (row.get("model") or "").strip() and row_preset(row) is None:
        chosen_extra.append(f"model {row['model'].strip()!r} is not a preset: built from the "
                            "row's dimensions")
    if _gpt_by_dimensions(row, model) and fw.gpt_tied_embeddings and not model.tied_embeddings:
        model = replace(model, tied_embeddings=True)
        chosen_extra.append("tied embeddings (the framework's GPT default)")
    prof = get_profile(cluster.gpu.key)
    base = base_plan(row, fw_name)
    best: tuple[float, Result, str, Plan] | None = None
    fallback: tuple[float, Result, str, Plan] | None = None
    why: InvalidInputError | None = None
    for plan, note in candidate_plans(row, base, fw):
        try:
            r = simulate(model, plan, cluster, prof)
        except InvalidInputError as exc:
            why = why or exc
            continue
        key = (r.step_time_s, r, note, plan)
        if r.fits_in_memory and (best is None or r.step_time_s < best[0]):
            best = key
        if fallback is None or max(r.peak_memory_bytes) < max(fallback[1].peak_memory_bytes):
            fallback = key
    if best is None and fallback is None:     # no candidate simulates: the first reason why
        raise why or InvalidInputError("plan", row.get("id", ""),
                                       "a combination this model can split")
    if best is None:
        best = fallback
        chosen_extra.append(
            f"least-memory plan: estimate {max(best[1].peak_memory_bytes) / 1e9:.1f} GB exceeds "
            f"{best[1].memory_capacity_bytes / 1e9:.0f} GB although the published run fit, "
            "so the memory model is pessimistic for this row")
    step, res, note, plan = best
    status = "ok"
    try:
        measured = measured_value(row)
    except InvalidInputError as exc:            # predicted, but no error against it
        measured, status = None, invalid_status(exc)
    err = 100.0 * (step - measured) / measured if measured else None
    chosen = ";".join(x for x in chosen_extra + [note, f"framework defaults: {fw.why}"] if x)
    return RowOutcome(row, res, chosen, status, err, RowInputs(model, plan, cluster, prof, fw_name))


def _guess_heads(row: Mapping[str, str]) -> int:
    h = _int(row, "hidden")
    return max(1, h // 128) if h and h % 128 == 0 else 1


def write_rows(path: str | Path, outcomes: list[RowOutcome]) -> None:
    """All rows plus the prediction columns, written atomically (temp file + rename)."""
    cols = [c for c in outcomes[0].row.keys() if c is not None] + \
        [c for c in OUT_COLUMNS if c not in outcomes[0].row]
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for o in outcomes:
            w.writerow({**o.row, **outcome_columns(o)})


def outcome_columns(o: RowOutcome) -> dict[str, str]:
    if o.result is None and o.saved is not None:
        return {c: o.saved.get(c, "") for c in OUT_COLUMNS}
    r = o.result
    return {"predicted_step_time_s": f"{r.step_time_s:.4g}" if r else "",
            "predicted_tokens_per_s_per_gpu": f"{r.tokens_per_s_per_gpu:.5g}" if r else "",
            "error_pct": f"{o.error_pct:+.2f}" if o.error_pct is not None else "",
            "chosen": o.chosen, "status": o.status,
            **_interval_columns(o)}


def _interval_columns(o: RowOutcome) -> dict[str, str]:
    if o.result is None or o.uncertainty is None:
        return {"predicted_step_time_p10_s": "", "predicted_step_time_p90_s": ""}
    iv = o.uncertainty.interval(o.result.step_time_s)
    return {"predicted_step_time_p10_s": f"{iv.p10:.4g}",
            "predicted_step_time_p90_s": f"{iv.p90:.4g}"}


def summary_line(outcomes: list[RowOutcome]) -> str:
    errs = [(abs(o.error_pct), o.row.get("id", "?"), o.error_pct) for o in outcomes
            if o.error_pct is not None]
    bad = sum(1 for o in outcomes if not o.status.startswith("ok"))
    if not errs:
        return f"rows={len(outcomes)} modelled=0 not_modelled={bad}"
    mape = sum(e[0] for e in errs) / len(errs)
    worst = max(errs)
    return (f"rows={len(outcomes)} modelled={len(errs)} not_modelled={bad} "
            f"MAPE={mape:.2f}% worst={worst[1]} ({worst[2]:+.1f}%)")
