"""Strategy search: enumeration, memory pruning, ranking, executors, resume, CLI."""
from __future__ import annotations

import importlib.util
import json
import random
import time
from collections import Counter
from dataclasses import replace

import pytest

import hardware_db
from simulator.api.catalog import HardwareDbCatalog
from simulator.cli.main import main
from simulator.cli.search import parse_count, parse_int_list
from simulator.engine.simulate import simulate
from simulator.errors import InvalidInputError
from simulator.parallel.plan import AttentionImpl, Plan, Recompute, validate
from simulator.planning.capacity import HardwareChoice
from simulator.planning.launch_args import launch_args
from simulator.search.driver import (
    Bottleneck,
    Objective,
    SearchOptions,
    main_bottleneck,
    make_context,
    search,
)
from simulator.search.space import (
    Rejection,
    RejectReason,
    SearchSpace,
    enumerate_space,
    estimate_stage_memory,
)
from simulator.search.store import ResultStore, candidate_key
from simulator.workload import resolve_model

CAT = HardwareDbCatalog()
REQUIRED_KEYS = {"tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "zero_stage", "recompute",
                 "sequence_parallel", "step_time_s", "tokens_per_s_per_gpu"}


def ctx_for(model: str, gpu: str, n: int, gb: int, seq: int | None = None):
    cluster = CAT.cluster(HardwareChoice(gpu, n))
    return make_context(resolve_model(model, seq), cluster, CAT.profile(cluster.gpu.key), gb)


def fast(**kw) -> SearchOptions:
    return SearchOptions(**{"workers": 1, "event_top": 3, "top_k": 5, **kw})


# ---- enumeration and memory --------------------------------------------------------------
@pytest.mark.parametrize("model,gpu,n,gb", [("small-6l-512", "h100-sxm", 16, 64),
                                            ("tiny-moe-2l-128", "h100-sxm", 16, 64),
                                            ("llama2-7b", "a100-sxm-80gb", 32, 128)])
def test_memory_estimate_equals_simulator(model, gpu, n, gb):
    """The pruning estimate must be the simulator's own accounting, exactly."""
    ctx = ctx_for(model, gpu, n, gb)
    plans = [p for p in enumerate_space(ctx.model, ctx.cluster, gb, SearchSpace())
             if isinstance(p, Plan)]
    random.Random(0).shuffle(plans)
    for p in plans[:25]:
        r = simulate(ctx.model, p, ctx.cluster, ctx.profile, engine="analytic")
        est = [m.total_bytes for m in estimate_stage_memory(ctx.model, p)]
        assert est == pytest.approx(r.peak_memory_bytes, rel=1e-12), p


def test_enumeration_accounts_for_every_candidate():
    ctx = ctx_for("small-6l-512", "h100-sxm", 16, 64)
    plans, rej = [], Counter()
    for item in enumerate_space(ctx.model, ctx.cluster, 64, SearchSpace()):
        if isinstance(item, Rejection):
            rej[item.reason] += item.count
        else:
            plans.append(item)
    for p in plans:
        validate(p, ctx.model, ctx.cluster)             # every candidate is valid
        assert p.world_size == 16
        assert p.zero_stage < 2 or p.pp == 1
        assert p.sequence_parallel is False or p.tp > 1
    assert RejectReason.TOPOLOGY in rej                  # tp=16 > NVLink domain of 8
    assert len(plans) == len(set(plans))


def test_cp_only_for_long_sequences_and_ep_only_for_moe():
    short = ctx_for("llama2-7b", "h100-sxm", 64, 64)
    long = ctx_for("llama2-7b", "h100-sxm", 64, 64, seq=16384)
    cps = lambda c: {p.cp for p in enumerate_space(c.model, c.cluster, 64, SearchSpace())
                     if isinstance(p, Plan)}
    assert cps(short) == {1} and max(cps(long)) > 1
    moe = ctx_for("tiny-moe-2l-128", "h100-sxm", 16, 64)
    eps = {p.ep for p in enumerate_space(moe.model, moe.cluster, 64, SearchSpace()) if isinstance(p, Plan)}
    assert eps == {1, 2, 4}


# ---- search --------------------------------------------------------------------------------
def test_search_ranks_best_first_with_required_fields():
    rep = search([ctx_for("small-6l-512", "h100-sxm", 16, 64)], fast())
    d = rep.to_dict()
    assert d["plans"] and REQUIRED_KEYS <= set(d["plans"][0])
    assert d["search_wall_s"] > 0
    event = [p for p in d["plans"] if p["engine"] == "event"]
    assert [p["score"] for p in event] == sorted((p["score"] for p in event), reverse=True)
    assert all(p["memory_headroom_pct"] >= 0 for p in d["plans"])
    assert rep.generated == sum(rep.rejected.values()) + rep.simulated["analytic"]


def test_dominance_pruning_keeps_the_winner():
    ctx = ctx_for("llama2-7b", "a100-sxm-80gb", 32, 128)
    a = search([ctx], fast(event_top=0, top_k=1))
    b = search([ctx], fast(event_top=0, top_k=1,
                           space=SearchSpace(prune_dominated=False)))
    assert a.winner.plan == b.winner.plan
    assert a.simulated["analytic"] < b.simulated["analytic"]
    assert a.rejected.get("dominated", 0) > 0


def test_process_pool_matches_inline():
    ctx = ctx_for("small-6l-512", "h100-sxm", 16, 64)
    a = search([ctx], fast(workers=1))
    b = search([ctx], fast(workers=2))
    assert [r.to_dict() for r in a.ranked] == [r.to_dict() for r in b.ranked]


def test_ranges_of_gpus_and_batches_rank_together():
    ctxs = [ctx_for("small-6l-512", "h100-sxm", n, gb) for n in (8, 16) for gb in (32, 64)]
    rep = search(ctxs, fast(top_k=20, event_top=2))
    assert len(rep.targets) == 4
    assert {p.n_gpus for p in rep.ranked} == {8, 16}
    assert max(p.tokens_per_s for p in rep.ranked) == rep.winner.tokens_per_s


def test_objectives():
    ctxs = [ctx_for("small-6l-512", "h100-sxm", n, 64) for n in (8, 16)]
    cost = search(ctxs, fast(objective=Objective.COST, event_top=0, top_k=50))
    usd = [p.to_dict()["usd_per_million_tokens"] for p in cost.ranked]
    assert usd == sorted(usd)
    watt = search(ctxs, fast(objective="throughput-per-watt", event_top=0, top_k=50))
    per_w = [p.tokens_per_s / (p.n_gpus * p.tdp_w) for p in watt.ranked]
    assert per_w == sorted(per_w, reverse=True)
    no_price = ctx_for("small-6l-512", "v100-sxm-32gb", 8, 64)   # hardware_db has no price
    with pytest.raises(InvalidInputError, match="price"):
        search([no_price], fast(objective="cost"))
    ok = search([no_price], fast(objective="cost", price_usd_per_gpu_hour=2.0))
    assert ok.winner.usd_per_gpu_hour == 2.0


def test_main_bottleneck():
    bd = dict(compute_s=1.0, tp_comm_s=0.0, cp_comm_s=0.0, ep_comm_s=0.0, dp_comm_s=0.05,
              pp_comm_s=0.0, bubble_s=0.0, optimizer_s=0.0, overhead_s=0.0)
    assert main_bottleneck(bd) == Bottleneck.COMPUTE
    assert main_bottleneck({**bd, "bubble_s": 0.5}) == Bottleneck.BUBBLE


# ---- resume --------------------------------------------------------------------------------
def test_interrupted_sweep_resumes_without_redoing(tmp_path):
    ctx = ctx_for("small-6l-512", "h100-sxm", 16, 64)
    out = tmp_path / "sweep"
    first = search([ctx], fast(results_dir=str(out)))
    parts = sorted(out.glob("part-*.parquet"))
    assert parts and (out / "inputs.json").is_file()
    total = first.simulated["analytic"] + first.simulated["event"]
    assert len(ResultStore(out).load()) == total
    again = search([ctx], fast(results_dir=str(out)))
    assert again.resumed == total
    assert [r.to_dict() for r in again.ranked] == [r.to_dict() for r in first.ranked]
    # an interruption loses at most the unflushed tail: drop all but the first part file
    store = ResultStore(out, flush_every=50)
    for p in sorted(out.glob("part-*.parquet")):
        p.unlink()
    store.add(list(first.records[:40]))
    store.flush()
    third = search([ctx], fast(results_dir=str(out)))
    assert third.resumed == 40
    assert [r.to_dict() for r in third.ranked] == [r.to_dict() for r in first.ranked]


def test_candidate_keys_are_deterministic():
    ctx = ctx_for("small-6l-512", "h100-sxm", 16, 64)
    p = Plan(dp=16, global_batch=64)
    assert candidate_key(ctx.fingerprint, p, "analytic") == candidate_key(ctx.fingerprint, p, "analytic")
    assert candidate_key(ctx.fingerprint, p, "analytic") != candidate_key(ctx.fingerprint, p, "event")
    other = ctx_for("small-6l-512", "h100-sxm", 16, 128)
    assert other.fingerprint == ctx.fingerprint          # batch lives in the plan, not the inputs


# ---- the published GPT-3 175B configuration -----------------------------------------------
def test_search_beats_published_megatron_gpt3_175b():
    """Megatron-LM's GPT-3 175B recipe (examples/gpt3/train_gpt3_175b_distributed.sh: tp 8,
    pp 16, micro-batch 1, global batch 1536, fp16; SC21 setup: full recompute, no
    flash attention, no overlap) on 1,024 A100-80GB. Under the same software stack the
    search winner must predict at least the published plan's throughput."""
    ctx = ctx_for("gpt3-175b", "a100-sxm-80gb", 1024, 1536)
    space = SearchSpace(precisions=("fp16",), attention=AttentionImpl.MATERIALIZED,
                        dp_overlap=False, tp_overlap=False)
    published = Plan(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1536, recompute=Recompute.FULL,
                     precision="fp16", attention="materialized", dp_overlap=False)
    pub = simulate(ctx.model, published, ctx.cluster, ctx.profile, engine="event")
    rep = search([ctx], SearchOptions(space=space, top_k=3, event_top=5))
    assert pub.fits_in_memory
    assert rep.winner.engine == "event"
    assert rep.winner.tokens_per_s >= pub.tokens_per_s


@pytest.mark.slow
def test_search_targets_wall_time():
    t0 = time.perf_counter()
    rep = search([ctx_for("gpt3-175b", "a100-sxm-80gb", 1024, 1536)], SearchOptions())
    assert rep.winner is not None and time.perf_counter() - t0 < 60
    t0 = time.perf_counter()
    rep = search([ctx_for("llama3-405b", "h100-sxm", 16384, 2048)], SearchOptions())
    assert rep.winner is not None and time.perf_counter() - t0 < 300


# ---- ray -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed")
def test_ray_executor_matches_local(tmp_path):
    import ray
    ctx = ctx_for("small-6l-512", "h100-sxm", 16, 64)
    local = search([ctx], fast())
    try:
        remote = search([ctx], fast(executor="ray", workers=2, results_dir=str(tmp_path / "r")))
    finally:
        ray.shutdown()
    assert [r.to_dict() for r in remote.ranked] == [r.to_dict() for r in local.ranked]
    assert len(ResultStore(tmp_path / "r").load()) == remote.simulated["analytic"] + remote.simulated["event"]


# ---- launch arguments ----------------------------------------------------------------------
def test_launch_args_follow_the_plan():
    m = resolve_model("mixtral-8x7b")
    p = Plan(tp=2, pp=4, dp=4, ep=2, vpp=2, micro_batch=1, global_batch=64, sequence_parallel=True,
             recompute="selective", zero_stage=1, schedule="interleaved")
    la = launch_args(m, p, 32, 8)
    args = " ".join(la.megatron)
    for flag in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 4",
                 "--num-layers-per-virtual-pipeline-stage 4", "--expert-model-parallel-size 2",
                 "--sequence-parallel", "--recompute-granularity selective",
                 "--use-distributed-optimizer", "--num-experts 8", "--num-query-groups 8", "--swiglu"):
        assert flag in args
    assert "num_nodes=4" in la.nemo and "virtual_pipeline_model_parallel_size = 2" in la.nemo
    compile(la.fsdp_sketch, "sketch", "exec")
    assert la.megatron_command(4, 8).startswith(
        "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 4 --nproc-per-node 8")   # TP without FSDP


# ---- CLI -----------------------------------------------------------------------------------
def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_search_json(capsys, tmp_path):
    pytest.importorskip("matplotlib")          # the PNG needs the optional plot extra
    png = tmp_path / "space.png"
    rc, out, _ = _run(capsys, "search", "--model", "small-6l-512", "--gpu", "h100-sxm",
                      "--gpus", "8,16", "--global-batch", "64", "--top", "4", "--workers", "1",
                      "--event-top", "2", "--json", "--plot", str(png))
    assert rc == 0
    d = json.loads(out)
    assert REQUIRED_KEYS <= set(d["plans"][0]) and "search_wall_s" in d
    assert d["rejected"] and "megatron_lm" in d["launch"]
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("argv,needle", [
    (["--gpus", "0", "--global-batch", "8"], "gpus"),
    (["--gpus", "8", "--global-batch", "8", "--gpu", "nope"], "gpu"),
    (["--gpus", "1024", "--global-batch", "3"], "global_batch"),
    (["--gpus", "12", "--global-batch", "12"], "gpus_per_node"),
])
def test_cli_bad_input_is_one_line(capsys, argv, needle):
    base = ["search", "--model", "small-4l-256", "--gpu", "h100-sxm", "--workers", "1"]
    rc, out, err = _run(capsys, *(base + argv))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_cli_no_feasible_plan_says_why(capsys):
    rc, _, err = _run(capsys, "search", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb",
                      "--gpus", "8", "--global-batch", "8", "--workers", "1")
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert "no_feasible_plan" in last and "memory=" in last


def test_parsers():
    assert parse_int_list("256..1024", "gpus") == [256, 512, 1024]
    assert parse_int_list("8,16", "gpus") == [8, 16]
    assert parse_count("300B", "tokens") == 300e9 and parse_count("1.5T", "tokens") == 1.5e12
    with pytest.raises(InvalidInputError):
        parse_count("lots", "tokens")
    with pytest.raises(InvalidInputError):
        parse_int_list("8,x", "gpus")
    assert replace(SearchSpace(), recomputes=("full",)).recomputes == (Recompute.FULL,)
    assert hardware_db.load_gpu("h100-sxm").price_usd_per_hour > 0


def test_peak_memory_shortcut_equals_full_estimate():
    from simulator.search.space import peak_memory_bytes
    for model, gpu, n, gb in [("llama2-7b", "a100-sxm-80gb", 32, 128), ("tiny-moe-2l-128", "h100-sxm", 16, 64)]:
        ctx = ctx_for(model, gpu, n, gb)
        for p in enumerate_space(ctx.model, ctx.cluster, gb, SearchSpace()):
            if isinstance(p, Plan):
                full = max(m.total_bytes for m in estimate_stage_memory(ctx.model, p))
                assert peak_memory_bytes(ctx.model, p) == full


def test_event_confirmation_rounds_stop_when_analytic_cannot_win():
    ctx = ctx_for("llama2-7b", "h100-sxm", 64, 256)
    rep = search([ctx], fast(event_top=2, event_max=8, top_k=3))
    n_event = rep.simulated["event"]
    assert 2 <= n_event <= 8
    analytic = sorted((r["tokens_per_s"] for r in rep.records if r["status"] == "ok"), reverse=True)
    best_event = max(p.tokens_per_s for p in rep.ranked if p.engine == "event")
    if n_event < 8 and n_event < len(analytic):
        assert analytic[n_event] <= best_event * 1.01
