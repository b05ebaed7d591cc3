"""The Perfetto trace of a simulated step: tracks per resource, per parallel group and per
link; flows; memory counters; the Trace Event Format (and Perfetto's trace processor
when it can run here)."""
from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from dataclasses import replace

import pytest

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.parallel.plan import Plan
from simulator.report.trace import chrome_trace, validate_trace_events, write_chrome_trace
from simulator.workload import get_preset

GROUPS = ("tp", "cp", "ep", "dp", "pp")


@pytest.fixture(scope="module")
def every_group():
    """A MoE model with every parallel group > 1: tp, cp, ep, dp and pp all 2."""
    m = get_preset("tiny-moe-2l-128")
    cluster = make_cluster("h100-sxm", 16, 8, None, None, None, None, None, 1.0)
    prof = hardware_db.load_profile("h100-sxm")
    plan = Plan(tp=2, pp=2, dp=2, cp=2, ep=2, global_batch=16, sequence_parallel=True)
    return m, plan, cluster, prof, simulate(m, plan, cluster, prof, keep_timeline=True)


def _threads(trace) -> dict[int, list[str]]:
    out = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            out[e["pid"]].append(e["args"]["name"])
    return out


def test_one_track_per_resource_group_and_link(every_group):
    """Each stage has a track for every group its work uses (stage 0 holds the dense
    layer, so no EP there; stage 1 the MoE layer), and every group is used somewhere."""
    m, plan, cluster, prof, res = every_group
    chunks = build_chunks(m, plan, cluster, prof, place_groups(cluster, plan))
    t = chrome_trace(res)
    assert validate_trace_events(t) == []
    threads = _threads(t)
    assert sorted(threads) == [0, 1]
    used_anywhere = set()
    for pid, names in threads.items():
        used = {"dp", "pp"} | {seg.group for ch in chunks[pid] for pc in (ch.fwd, ch.bwd)
                               for seg in pc.segments if seg.group}
        used_anywhere |= used
        assert names[0] == "compute"
        assert {n.split()[1] for n in names if n.startswith("comm ")} == used, (pid, names)
        assert any(n.startswith("link nvlink") for n in names)
    assert used_anywhere == set(GROUPS)
    assert "ep" in {seg.group for ch in chunks[1] for seg in ch.fwd.segments}
    assert "link infiniband" in threads[0]          # 16 ranks over 2 nodes: dp crosses nodes


def test_flows_connect_pipeline_hand_offs_and_dependencies(every_group):
    *_, res = every_group
    evs = chrome_trace(res)["traceEvents"]
    starts = [e for e in evs if e["ph"] == "s"]
    names = {e["name"] for e in starts}
    assert names == {"pipeline", "dependency"}
    pipe = [e for e in starts if e["name"] == "pipeline"]
    # every forward of stage 1 waits on a send from stage 0 and every backward of stage 0
    # on one from stage 1: 8 micro-batches each way, each hand-off drawn as send -> pass
    assert len(pipe) >= 2 * 8
    assert {e["pid"] for e in pipe} == {0, 1}


def test_collectives_sit_inside_their_pass_with_its_exposed_time(every_group):
    """Each pass's collectives start inside the pass, and their exposed times add up to
    the pass's exposed communication per group (``PassCost.comm_s``)."""
    m, plan, cluster, prof, res = every_group
    chunks = build_chunks(m, plan, cluster, prof, place_groups(cluster, plan))
    tasks = {r["tid"]: r for r in res.timeline if "tid" in r}
    exposed = defaultdict(float)
    for r in res.timeline:
        if r.get("kind") == "collective" and "pass" in r:
            p = tasks[r["task"]]
            assert p["start_s"] - 1e-12 <= r["start_s"] <= p["end_s"] + 1e-12
            exposed[(r["task"], r["group"])] += r["exposed_s"]
    checked = 0
    for tid, p in tasks.items():
        if p.get("kind") not in ("fwd", "bwd"):
            continue
        ch = chunks[p["stage"]][p["chunk"]]
        pc = ch.fwd if p["kind"] == "fwd" else ch.bwd
        for g, v in pc.comm_s.items():
            assert exposed[(tid, g)] == pytest.approx(v, rel=1e-9, abs=1e-15)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("schedule, vpp, zero", [("1f1b", 1, 0), ("gpipe", 1, 0),
                                                ("interleaved", 2, 0), ("1f1b", 1, 3)])
def test_memory_counter_peaks_at_the_stage_estimate(schedule, vpp, zero):
    """Activations held from a micro-batch's forward start to its backward end, on top of
    the state and workspace (the optimizer step's transient in its place during the step):
    the counter, played on the event engine's timeline, peaks exactly at the memory
    model's per-stage peak, which counts live micro-batches per schedule in closed form."""
    m = get_preset("llama2-7b")
    cluster = make_cluster("h100-sxm", 32, 8, None, None, None, None, None, 1.0)
    plan = Plan(tp=2, pp=4, dp=4, vpp=vpp, schedule=schedule, global_batch=64, zero_stage=zero)
    res = simulate(m, plan, cluster, hardware_db.load_profile("h100-sxm"), keep_timeline=True)
    peak = defaultdict(float)
    for r in res.timeline:
        if r.get("counter") == "memory_bytes":
            peak[r["stage"]] = max(peak[r["stage"]], r["value"])
    assert sorted(peak) == list(range(4))
    for s in res.stages:
        assert peak[s.stage] == pytest.approx(s.peak_memory_bytes, rel=1e-12)


def test_a_new_resource_gets_its_own_track(every_group):
    """Track creation is generic: a task on a resource the trace has never seen (e.g. a
    host-dispatch stream) gets its own named thread, right after compute."""
    *_, res = every_group
    host = [{"name": "launch F mb0", "resource": "stage0.host", "start_s": 0.0, "end_s": 1e-5,
             "stage": 0, "kind": "dispatch", "tid": 10**6, "deps": []},
            {"name": "launch F mb1", "resource": "stage0.host", "start_s": 5e-6, "end_s": 2e-5,
             "stage": 0, "kind": "dispatch", "tid": 10**6 + 1, "deps": [10**6]}]
    t = chrome_trace(replace(res, timeline=res.timeline + host))
    assert validate_trace_events(t) == []
    assert _threads(t)[0][:3] == ["compute", "host", "host #2"]      # overlapping: two lanes


def test_the_format_check_finds_problems():
    ok = {"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 1, "ts": 0, "dur": 10}]}
    assert validate_trace_events(ok) == []
    partial = {"traceEvents": ok["traceEvents"] + [
        {"ph": "X", "name": "b", "pid": 0, "tid": 1, "ts": 5, "dur": 10}]}
    assert validate_trace_events(partial)
    flow = {"traceEvents": ok["traceEvents"] + [
        {"ph": "s", "id": 1, "name": "f", "pid": 0, "tid": 1, "ts": 5},
        {"ph": "f", "id": 1, "name": "f", "pid": 0, "tid": 2, "ts": 5, "bp": "e"}]}
    assert any("not inside a slice" in p for p in validate_trace_events(flow))
    assert validate_trace_events({"traceEvents": [{"ph": "X", "name": "a"}]})


def test_gzip_trace_and_same_bytes_twice(tmp_path, every_group):
    *_, res = every_group
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    write_chrome_trace(a, res)
    write_chrome_trace(b, res)
    assert a.read_bytes() == b.read_bytes()
    assert validate_trace_events(json.loads(gzip.decompress(a.read_bytes()))) == []


def test_perfetto_trace_processor_loads_it(tmp_path, every_group):
    """Perfetto's own importer, when it can run: the ``perfetto`` package downloads its
    ``trace_processor_shell`` on first use, or takes one from $PERFETTO_TRACE_PROCESSOR."""
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    *_, res = every_group
    path = tmp_path / "step.json"
    write_chrome_trace(path, res)
    cfg = tp_mod.TraceProcessorConfig(bin_path=os.environ.get("PERFETTO_TRACE_PROCESSOR"))
    try:
        tp = tp_mod.TraceProcessor(trace=str(path), config=cfg)
    except Exception as exc:           # no binary and no network here
        pytest.skip(f"trace processor unavailable: {str(exc).splitlines()[0][:120]}")
    try:
        n_x = sum(1 for e in chrome_trace(res)["traceEvents"] if e["ph"] == "X")
        n_flow = sum(1 for e in chrome_trace(res)["traceEvents"] if e["ph"] == "s")
        assert next(iter(tp.query("select count(*) as n from slice"))).n == n_x
        assert next(iter(tp.query("select count(*) as n from flow"))).n == n_flow
        names = {r.name for r in tp.query("select name from thread")}
        assert {f"comm {g}" for g in GROUPS} <= names
    finally:
        tp.close()
