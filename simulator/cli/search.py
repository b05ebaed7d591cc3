"""Sub-commands: search, plan, compare, scaling, whatif, bottleneck.

The hardware_db-backed ``HardwareDbCatalog`` lives here (CLI modules may load hardware_db;
the library modules take a catalog as an argument).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import replace
from typing import Any

from ..api.catalog import HardwareDbCatalog
from ..boundary import json_out
from ..boundary.limits import MAX_BATCH, MAX_GPUS
from ..errors import InfeasiblePlanError, InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan, check_attention_supported
from ..planning.capacity import (
    DEFAULT_PUE,
    HardwareChoice,
    compare,
    gpus_for_deadline,
    time_on,
    window_plan,
)
from ..planning.launch_args import launch_args
from ..planning.scaling import ScalingKind, scaling_curve
from ..planning.whatif import bottleneck_report, rank_knobs, sensitivity
from ..search.driver import Objective, SearchOptions, make_context, search
from ..search.executor import ExecutorKind
from ..search.space import SearchSpace
from ..workload import resolve_model
from ..workload.spec import TransformerSpec
from .commands import add_moe_args, add_recompute_args, plan_from_args
from .fabric_choices import (
    add_fabric_alternatives,
    fabric_choices,
    fabric_rows,
    format_fabric_rows,
)
from .format import (
    format_bottleneck,
    format_compare,
    format_plan_answer,
    format_scaling,
    format_search,
    format_sensitivity,
)
from .registry import command
from .workflow import add_window_args, run_window_sweep

# ---- argument parsing helpers ------------------------------------------------------------
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str, field: str) -> float:
    """``300e9``, ``300B``, ``1.5T``, ``2M`` -> float."""
    s = str(text).strip().lower().replace("_", "")
    mult = _SUFFIX.get(s[-1:], 1.0) if s else 1.0
    try:
        v = float(s[:-1] if mult != 1.0 else s) * mult
    except ValueError:
        raise InvalidInputError(field, text, "a number such as 300e9, 300B or 1.5T") from None
    if not math.isfinite(v) or v <= 0:
        raise InvalidInputError(field, text, "a positive number")
    return v


_LIST_MAX = {"gpus": MAX_GPUS, "gpus_list": MAX_GPUS, "global_batch": MAX_BATCH,
             "micro_batches": MAX_BATCH, "zero_stages": 3}
MAX_LIST = 1000


def parse_int_list(text: str, field: str, minimum: int = 1) -> list[int]:
    """``256,512,1024`` or a doubling range ``256..4096``; every value at most the field's
    physical bound (``boundary.limits``) and at most ``MAX_LIST`` values."""
    if len(str(text)) > 20 * MAX_LIST:
        raise InvalidInputError(field, str(text)[:40] + "...", f"at most {MAX_LIST} values")
    maximum = _LIST_MAX.get(field, MAX_GPUS)
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\.\.(\d+)", part)
        try:
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                if lo < max(1, minimum) or hi < lo:
                    raise ValueError
                hi = min(hi, 2 * maximum)            # beyond it the check below refuses
                while lo <= hi:
                    out.append(lo)
                    lo *= 2
            else:
                out.append(int(part))
        except ValueError:
            raise InvalidInputError(field, text, "positive integers like 256,512 or 256..4096") from None
    if not out or any(v < minimum for v in out) or any(v > maximum for v in out) \
            or len(out) > MAX_LIST:
        raise InvalidInputError(field, text, f"one to {MAX_LIST} integers >= {minimum} and "
                                f"<= {maximum:,}")
    return out


def parse_str_list(text: str) -> list[str]:
    return [s.strip() for s in str(text).split(",") if s.strip()]


def parse_prices(text: str | None) -> tuple[float | None, dict[str, float]]:
    """``2.5`` (every GPU) or ``h100-sxm=2.5,b200=5``."""
    if text is None:
        return None, {}
    if "=" not in text:
        v = parse_count(text, "price") if text.strip() not in ("0", "0.0") else 0.0
        return v, {}
    prices = {}
    for item in parse_str_list(text):
        k, _, v = item.partition("=")
        prices[k.strip()] = parse_count(v, "price")
    return None, prices


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset key or HuggingFace config.json")
    p.add_argument("--seq-len", type=int, help="override the model's sequence length")


def _add_cluster_args(p: argparse.ArgumentParser, alternatives: bool = False) -> None:
    """``alternatives``: fabric flags take comma lists (``fabric_choices``)."""
    p.add_argument("--gpus-per-node", type=int)
    if alternatives:
        add_fabric_alternatives(p, nic_gbps=True)
    else:
        p.add_argument("--nics-per-node", type=int)
    p.add_argument("--profile", help="calibration profile JSON (default: shipped reference)")


def _add_search_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search")
    g.add_argument("--objective", default="throughput", choices=[o.value for o in Objective])
    g.add_argument("--top", type=int, default=10, help="plans to list")
    g.add_argument("--event-top", type=int, default=10,
                   help="best analytic candidates re-simulated on the event engine (per round)")
    g.add_argument("--event-max", type=int, default=40,
                   help="cap on event simulations while analytic bounds could still win")
    g.add_argument("--micro-batches", default="1,2,4,8")
    g.add_argument("--zero-stages", default="0,1,3")
    g.add_argument("--dp-shards", default="",
                   help="HSDP shard group sizes to try beside full sharding for ZeRO-3 plans, "
                   "e.g. 8 (one node); default none")
    g.add_argument("--recomputes", default="none,selective,full")
    g.add_argument("--partial-recompute", action="store_true",
                   help="where full recompute is the cheapest mode that fits, also try "
                   "recomputing only the fewest layers per model chunk that fit (shown as "
                   "full:N; Megatron --recompute-method block --recompute-num-layers N)")
    g.add_argument("--precisions", default="bf16", help="e.g. bf16,fp8")
    g.add_argument("--attention", default="flash",
                   help="flash (FA2-class), flash1 (FA1 class), flash3 (FA3/cuDNN, Hopper+) or "
                   "materialized; one the GPU runs")
    g.add_argument("--no-dp-overlap", action="store_true")
    g.add_argument("--tp-overlap", action="store_true")
    add_moe_args(g)
    g.add_argument("--keep-dominated", action="store_true",
                   help="also simulate dearer recompute modes of plans that fit without them")
    g.add_argument("--workers", type=int, help="local processes (default: all cores)")
    g.add_argument("--executor", default="local", choices=[e.value for e in ExecutorKind])
    g.add_argument("--address", help="Ray cluster address (with --executor ray)")
    g.add_argument("--results", help="Parquet dataset directory; a rerun resumes from it")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


def search_options(a: argparse.Namespace, price: float | None = None,
                   tokens: float | None = None) -> SearchOptions:
    space = SearchSpace(
        micro_batches=tuple(parse_int_list(a.micro_batches, "micro_batches")),
        zero_stages=tuple(parse_int_list(a.zero_stages, "zero_stages", minimum=0)),
        recomputes=tuple(parse_str_list(a.recomputes)),
        precisions=tuple(parse_str_list(a.precisions)), attention=a.attention,
        dp_overlap=not a.no_dp_overlap, tp_overlap=a.tp_overlap,
        prune_dominated=not a.keep_dominated, moe_dispatcher=a.moe_dispatcher,
        partial_recompute=bool(getattr(a, "partial_recompute", False)),
        dp_shards=tuple(parse_int_list(a.dp_shards, "dp_shards")) if a.dp_shards else ())
    progress = sys.stderr.isatty() if a.progress is None else a.progress
    return SearchOptions(space=space, objective=a.objective, top_k=a.top, event_top=a.event_top,
                         event_max=max(a.event_top, a.event_max),
                         workers=a.workers, executor=a.executor, address=a.address,
                         results_dir=a.results, progress=progress,
                         price_usd_per_gpu_hour=price, tokens=tokens)


def _catalog(a: argparse.Namespace, nic_gbps: float | None = None) -> HardwareDbCatalog:
    nics = a.nics_per_node if isinstance(a.nics_per_node, int) else None
    return HardwareDbCatalog(a.profile, a.gpus_per_node, nics, nic_gbps,
                             getattr(a, "allow_profile_mismatch", False))


def _emit_json(obj: Any) -> None:
    print(json_out.dumps(obj, indent=2, sort_keys=True, default=_json_default))


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return getattr(o, "value", str(o))


def _maybe_plot(path: str | None, fn, *args, **kw) -> None:
    if path:
        out = fn(*args, path=path, **kw)
        sys.stdout.flush()
        print(f"plot written to {out}", file=sys.stderr)


# ---- search -------------------------------------------------------------------------------
@command("search", "Search parallel plans for a model on a cluster; best first.")
def _search_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    p.add_argument("--gpu", required=True, help="GPU key (see `complexity list gpus`)")
    p.add_argument("--gpus", required=True, help="GPU count, or a list/range: 256,512 or 256..4096")
    p.add_argument("--global-batch", required=True, help="sequences per step, or a list: 1024,2048")
    p.add_argument("--price", help="USD per GPU-hour (default: hardware_db's)")
    p.add_argument("--tokens", help="token budget, for time-to-train (e.g. 300B)")
    _add_cluster_args(p, alternatives=True)
    _add_search_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="search-space scatter (throughput vs memory), PNG/SVG")
    p.set_defaults(func=run_search)


def run_search(a: argparse.Namespace) -> int:
    model = resolve_model(a.model, a.seq_len)
    counts = parse_int_list(a.gpus, "gpus", minimum=0)
    if any(n < 1 for n in counts):
        raise InvalidInputError("gpus", a.gpus, "positive GPU counts")
    batches = parse_int_list(a.global_batch, "global_batch", minimum=0)
    if any(b < 1 for b in batches):
        raise InvalidInputError("global_batch", a.global_batch, "positive batch sizes")
    price, _ = parse_prices(a.price)
    tokens = parse_count(a.tokens, "tokens") if a.tokens else None
    cat = _catalog(a)
    alternatives = [fabric_choices(a, a.gpu, n) for n in counts]
    check_attention_supported(a.attention, cat.cluster(alternatives[0][0]).gpu)
    if len(alternatives[0]) > 1:
        return _search_fabrics(a, model, cat, alternatives, batches, search_options(a, price, tokens))
    choice_of = {ch.n_gpus: ch for (ch,) in alternatives}
    ctxs = []
    for n in counts:
        cluster = cat.cluster(choice_of[n])
        ctxs += [make_context(model, cluster, cat.profile(cluster.gpu.key), b) for b in batches]
    report = search(ctxs, search_options(a, price, tokens))
    out = report.to_dict()
    w = report.winner
    if w is not None:
        la = launch_args(model, w.plan, w.n_gpus, cat.cluster(choice_of[w.n_gpus]).node.gpus_per_node)
        out["launch"] = la.to_dict()
    if a.json:
        _emit_json(out)
    else:
        print(format_search(report, model, out.get("launch")))
    if a.plot:
        from ..report.plots import plot_search
        _maybe_plot(a.plot, plot_search, report.records, winner=w.to_dict() if w else None)
    if w is None:
        if a.json:
            return 1
        raise InfeasiblePlanError("no_feasible_plan", "no plan fits; rejected plans by reason: "
                                  + report.rejection_summary(), report.rejected)
    return 0


def _search_fabrics(a, model, cat, alternatives, batches, opts) -> int:
    """One search per fabric alternative (every GPU count and batch in each)."""
    results = []
    for i in range(len(alternatives[0])):
        ctxs = []
        for per_count in alternatives:
            cluster = cat.cluster(per_count[i])
            ctxs += [make_context(model, cluster, cat.profile(cluster.gpu.key), b) for b in batches]
        results.append((alternatives[0][i], search(ctxs, opts)))
    rows = fabric_rows(results)
    if a.json:
        _emit_json({"model": model.name, "gpu": a.gpu, "fabrics": rows})
    else:
        print(f"search  {model.name} on {a.gpu}, fabric alternatives"
              + format_fabric_rows(rows))
    return 0 if any("step_time_s" in r for r in rows) else 1


# ---- plan ---------------------------------------------------------------------------------
@command("plan", "Capacity planning: time, GPUs for a deadline, cost, energy, short windows.")
def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="preset key or HuggingFace config.json (omit with --window-min: "
                   "a ladder of model sizes is compared)")
    p.add_argument("--seq-len", type=int, help="override the model's sequence length")
    p.add_argument("--gpu", required=True)
    p.add_argument("--tokens", help="token budget (e.g. 300B, 1.5T)")
    p.add_argument("--gpus", type=int, help="how long on this many GPUs")
    p.add_argument("--deadline-days", type=float, help="how many GPUs to finish within this")
    p.add_argument("--window-min", type=float, help="most tokens in this many minutes on --gpus")
    p.add_argument("--global-batch", default=None,
                   help="sequences per step (a list for --window-min; default 1024 / a ladder)")
    p.add_argument("--nic-gbps", type=float)
    p.add_argument("--price", help="USD per GPU-hour (default: hardware_db's)")
    p.add_argument("--pue", type=float, default=DEFAULT_PUE,
                   help=f"power usage effectiveness (default {DEFAULT_PUE}; energy = TDP x GPUs x hours x PUE)")
    p.add_argument("--max-gpus", type=int, default=65536)
    add_window_args(p)
    _add_cluster_args(p)
    _add_search_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="PNG/SVG: step breakdown (+ days vs GPUs / tokens vs batch)")
    p.set_defaults(func=run_plan, event_top=3, top=3)


def run_plan(a: argparse.Namespace) -> int:
    if a.window_min is not None and (a.model is None or a.models):
        return run_window_sweep(a, _catalog(a, a.nic_gbps), search_options(a),
                                parse_str_list(a.models) if a.models else None,
                                parse_int_list(a.global_batch, "global_batch") if a.global_batch else None)
    if a.model is None:
        raise InvalidInputError("model", None, "a preset or config.json (or use --window-min "
                                "to compare model sizes)")
    model = resolve_model(a.model, a.seq_len)
    if a.gpus is None and a.deadline_days is None:
        raise InvalidInputError("gpus/deadline-days", None, "--gpus N, --deadline-days D, or both")
    if a.window_min is not None and a.gpus is None:
        raise InvalidInputError("window-min", a.window_min, "used together with --gpus N")
    if a.tokens is None and (a.deadline_days is not None or a.window_min is None):
        raise InvalidInputError("tokens", None, "a token budget such as 300B")
    price, _ = parse_prices(a.price)
    tokens = parse_count(a.tokens, "tokens") if a.tokens else None
    opts = search_options(a, price, tokens)
    cat = _catalog(a, a.nic_gbps)
    answer = _plan_answers(a, model, tokens, price, opts, cat)
    if a.json:
        _emit_json({k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in answer.items()})
    else:
        print(format_plan_answer(answer, model))
    if a.plot:
        from ..report.plots import plot_plan
        _maybe_plot(a.plot, plot_plan, *_plan_plot_args(answer))
    return 0


def _plan_answers(a, model, tokens, price, opts, cat) -> dict[str, Any]:
    answer: dict[str, Any] = {"model": model.name, "gpu": a.gpu, "pue": a.pue}
    batches = parse_int_list(a.global_batch, "global_batch") if a.global_batch else None
    gb = batches[0] if batches else DEFAULT_PLAN_BATCH
    gpu_key = cat.cluster(HardwareChoice(a.gpu, 1)).gpu.key
    answer["assumptions"] = plan_assumptions(model, gb, batches is not None,
                                             cat.profile(gpu_key).name)
    if a.gpus is not None and tokens is not None:
        est, _ = time_on(model, tokens, HardwareChoice(a.gpu, a.gpus), gb, cat, opts, price, a.pue)
        answer["time_on_gpus"] = est
    if a.deadline_days is not None:
        answer["deadline"] = gpus_for_deadline(
            model, tokens, a.deadline_days * 86400.0, a.gpu, gb, cat, opts,
            cat.gpus_per_node(a.gpu), a.max_gpus, price, a.pue)
    if a.window_min is not None:
        ladder = batches or [b for b in (2 ** k for k in range(20))
                             if max(1, a.gpus // 8) <= b <= 8 * a.gpus]
        answer["window"] = window_plan(model, a.window_min * 60.0, HardwareChoice(a.gpu, a.gpus),
                                       ladder, cat, opts)
        answer["assumptions"]["window_global_batches"] = ladder
        if "time_on_gpus" not in answer and "deadline" not in answer:
            answer["assumptions"].update(global_batch_sequences=None, tokens_per_step=None,
                                         global_batch_source="the window's ladder")
    return answer


DEFAULT_PLAN_BATCH = 1024


def plan_assumptions(model: TransformerSpec, gb: int, given: bool, profile: str) -> dict[str, Any]:
    """What ``plan`` assumed (printed and in ``--json``)."""
    return {"global_batch_sequences": gb,
            "global_batch_source": "--global-batch" if given else "default; set --global-batch",
            "window_global_batches": None,
            "seq_len": model.seq_len, "tokens_per_step": gb * model.seq_len, "profile": profile}


def _plan_plot_args(answer: dict[str, Any]) -> tuple:
    est = answer.get("time_on_gpus")
    dl = answer.get("deadline")
    win = answer.get("window")
    best = (est.plan if est else None) or (dl.estimate.plan if dl and dl.estimate else None) \
        or (win.best if win else None)
    bd = dict(best.breakdown) if best else {}
    title = f"{answer['model']}: step on {best.n_gpus} GPUs" if best else answer["model"]
    if dl is not None:
        curve = [(n, d) for n, d in dl.tried if d is not None]
        return bd, title, curve, ("GPUs", "days", "time to train vs GPUs (dashed: deadline)"), \
            dl.deadline_s / 86400, True
    if win is not None:
        return bd, title, list(win.by_batch), ("global batch", "tokens in window", "short window"), None
    return bd, title


# ---- compare ------------------------------------------------------------------------------
@command("compare", "Compare GPU types / cluster shapes, each with its own best plan.")
def _compare_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    p.add_argument("--tokens", required=True, help="token budget (e.g. 300B)")
    p.add_argument("--gpu-list", required=True, help="GPU keys, e.g. h100-sxm,h200-sxm,b200,mi300x")
    p.add_argument("--gpus-list", required=True, help="GPU counts, e.g. 1024 or 512,1024")
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--price", help="USD/GPU-hour for all, or per GPU: h100-sxm=2.5,b200=5")
    p.add_argument("--pue", type=float, default=DEFAULT_PUE)
    _add_cluster_args(p, alternatives=True)
    _add_search_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="comparison bar chart, PNG/SVG")
    p.set_defaults(func=run_compare, event_top=3, top=3)


def run_compare(a: argparse.Namespace) -> int:
    model = resolve_model(a.model, a.seq_len)
    tokens = parse_count(a.tokens, "tokens")
    gpus = parse_str_list(a.gpu_list)
    counts = parse_int_list(a.gpus_list, "gpus_list")
    if not gpus:
        raise InvalidInputError("gpu_list", a.gpu_list, "one or more GPU keys")
    one_price, prices = parse_prices(a.price)
    if one_price is not None:
        prices = {g: one_price for g in gpus}
    choices = [ch for g in gpus for n in counts for ch in fabric_choices(a, g, n)]
    cat = _catalog(a)
    for ch in choices:
        cat.cluster(ch)                      # bad GPU keys / counts fail here, in one line
    rows = compare(model, tokens, choices, a.global_batch, cat, search_options(a, None, tokens),
                   prices, a.pue)
    if a.json:
        _emit_json({"model": model.name, "tokens": tokens, "pue": a.pue,
                    "assumptions": {"global_batch_sequences": a.global_batch,
                                    "seq_len": model.seq_len},
                    "rows": [r.to_dict() for r in rows]})
    else:
        print(format_compare(rows, model, tokens, a.pue, a.global_batch))
    if a.plot:
        from ..report.plots import plot_comparison
        _maybe_plot(a.plot, plot_comparison, rows)
    return 0


# ---- scaling ------------------------------------------------------------------------------
@command("scaling", "Strong/weak scaling curves with efficiency classes and an Amdahl fit.")
def _scaling_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    p.add_argument("--gpu", required=True)
    p.add_argument("--gpus", required=True, help="GPU counts: 64,128,256 or 64..1024")
    p.add_argument("--global-batch", type=int, required=True,
                   help="batch at the smallest count (weak scaling grows it with the count)")
    p.add_argument("--kind", default="both", choices=["strong", "weak", "both"])
    p.add_argument("--nic-gbps", type=float)
    _add_cluster_args(p)
    _add_search_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="scaling curves, PNG/SVG")
    p.set_defaults(func=run_scaling, event_top=2, top=1)


def run_scaling(a: argparse.Namespace) -> int:
    model = resolve_model(a.model, a.seq_len)
    counts = parse_int_list(a.gpus, "gpus")
    kinds = [ScalingKind.STRONG, ScalingKind.WEAK] if a.kind == "both" else [ScalingKind(a.kind)]
    cat = _catalog(a, a.nic_gbps)
    cat.cluster(HardwareChoice(a.gpu, counts[0]))
    opts = replace(search_options(a), intervals=False)     # curves show point values only
    curves = [scaling_curve(model, a.gpu, counts, a.global_batch, k, cat, opts) for k in kinds]
    if a.json:
        _emit_json({"model": model.name, "curves": [c.to_dict() for c in curves],
                    "assumptions": {"global_batch_sequences_at_smallest_count": a.global_batch,
                                    "seq_len": model.seq_len}})
    else:
        print(format_scaling(curves, model))
    if a.plot:
        from ..report.plots import plot_scaling
        _maybe_plot(a.plot, plot_scaling, curves)
    return 0


# ---- whatif / bottleneck ------------------------------------------------------------------
def _add_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan (omit tp/pp/dp/cp/ep to search for the best plan first)")
    for k in ("tp", "pp", "dp", "cp", "ep"):
        g.add_argument(f"--{k}", type=int, default=None)
    g.add_argument("--vpp", type=int, default=1)
    g.add_argument("--micro-batch", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    add_recompute_args(g)
    g.add_argument("--zero-stage", type=int, default=0)
    g.add_argument("--precision", default="bf16")
    g.add_argument("--schedule", default=None)
    g.add_argument("--bucket-mb", type=float, default=40.0)


def _one_plan_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    p.add_argument("--gpu", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--nic-gbps", type=float)
    p.add_argument("--engine", default="analytic", help="analytic or event")
    _add_cluster_args(p)
    _add_plan_args(p)
    _add_search_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="PNG/SVG (bottleneck: roofline with the model's ops)")


def _resolve_plan(a, model: TransformerSpec, cluster: ClusterSpec, prof: Profile) -> Plan:
    if all(getattr(a, k) is None for k in ("tp", "pp", "dp", "cp", "ep")):
        opts = replace(search_options(a), top_k=1, event_top=0 if a.engine == "analytic" else 1,
                       intervals=False)
        rep = search([make_context(model, cluster, prof, a.global_batch)], opts)
        if rep.winner is None:
            raise InfeasiblePlanError("no_feasible_plan", "no plan fits; rejected: "
                                      + rep.rejection_summary(), rep.rejected)
        return rep.winner.plan
    for k in ("tp", "pp", "cp", "ep"):
        if getattr(a, k) is None:
            setattr(a, k, 1)
    a.no_dp_overlap = getattr(a, "no_dp_overlap", False)
    return plan_from_args(a, cluster.n_gpus, cluster.gpu)


@command("whatif", "One-variable sensitivity: what NIC bandwidth, micro-batch, recompute... are worth.")
def _whatif_args(p: argparse.ArgumentParser) -> None:
    _one_plan_args(p)
    p.set_defaults(func=run_whatif)


def _one_plan_context(a: argparse.Namespace):
    """(model, catalog, cluster, profile, plan) of a single-plan command."""
    model = resolve_model(a.model, a.seq_len)
    cat = _catalog(a, a.nic_gbps)
    cluster = cat.cluster(HardwareChoice(a.gpu, a.gpus))
    prof = cat.profile(cluster.gpu.key)
    return model, cat, cluster, prof, _resolve_plan(a, model, cluster, prof)


def run_whatif(a: argparse.Namespace) -> int:
    model, cat, cluster, prof, plan = _one_plan_context(a)

    def rebuild(gbps, nics):
        return cat.cluster(HardwareChoice(a.gpu, a.gpus, gbps or a.nic_gbps, nics or a.nics_per_node))
    rows = sensitivity(model, plan, cluster, prof, rebuild, a.engine)
    if a.json:
        _emit_json({"model": model.name, "plan": plan.__dict__, "rows": [r.to_dict() for r in rows],
                    "ranked": [r.knob + ": " + r.change for r in rank_knobs(rows)]})
    else:
        print(format_sensitivity(rows, plan, model, cluster))
    return 0


@command("bottleneck", "Bottleneck report of a plan: roofline per op, exposed comm, bubble.")
def _bottleneck_args(p: argparse.ArgumentParser) -> None:
    _one_plan_args(p)
    p.set_defaults(func=run_bottleneck)


def run_bottleneck(a: argparse.Namespace) -> int:
    model, _, cluster, prof, plan = _one_plan_context(a)
    from ..engine.simulate import simulate
    rep = bottleneck_report(model, plan, cluster, prof, simulate(model, plan, cluster, prof, engine=a.engine))
    if a.json:
        _emit_json({"model": model.name, "plan": plan.__dict__, **rep.to_dict()})
    else:
        print(format_bottleneck(rep, plan, model, cluster))
    if a.plot:
        from ..report.plots import plot_roofline
        _maybe_plot(a.plot, plot_roofline, rep.ops, cluster.gpu.peak(plan.precision),
                    cluster.gpu.mem_bw_gbytes_per_s, title=f"{model.name} on {cluster.gpu.key}")
    return 0
