"""What the event engine records of a simulated step, for the trace and the Gantt picture.

Every engine task becomes a record on its resource (``stage{s}.compute``, ``stage{s}.link``,
and any resource a task is put on later, e.g. a host-dispatch stream), with its task id and
dependencies. Derived records show what the tasks contain:

* each collective inside a forward/backward pass (TP, CP, EP, FSDP's DP gathers), placed
  at its offset in the pass (``PassCost.segments``), on ``stage{s}.comm.{group}``;
* engine tasks of a group (DP gradient buckets, pipeline sends) also on that group's track;
* every collective also on the links it crosses, ``stage{s}.link.{kind}``;
* the memory of each stage over time (``counter`` records): weights, gradients, optimizer
  state and workspace, plus each micro-batch's activations from the start of its forward
  pass to the end of its backward pass.

The timeline is built only when asked for (``simulate(keep_timeline=True)``).
"""
from __future__ import annotations

from typing import Any

from ..cost.layer import group_links
from ..hardware.specs import ClusterSpec
from ..memory.accounting import StageMemory
from ..parallel.placement import GroupPlacement, stage_boundary
from ..parallel.plan import Plan
from ..parallel.schedule import Part, Unit
from .events import Engine, Task
from .stage_work import ChunkWork

# engine task kinds that are a parallel group's communication (a task may also say
# ``group=...`` in its meta)
KIND_GROUP = {"dp_comm": "dp", "pp_send": "pp", "pp_recv": "pp"}


def build_timeline(eng: Engine, stages: list[list[ChunkWork]], memory: list[StageMemory],
                   plan: Plan, cluster: ClusterSpec,
                   groups: dict[str, GroupPlacement]) -> list[dict[str, Any]]:
    links = {g: group_links(p) for g, p in groups.items()}
    links["pp"] = group_links(stage_boundary(cluster, plan, groups["pp"].fabric)) \
        if plan.pp > 1 else ()
    out: list[dict[str, Any]] = []
    for t in eng.tasks:
        rec = task_record(t)
        out.append(rec)
        stage = int(rec.get("stage", 0))
        group = t.meta.get("group") or KIND_GROUP.get(t.meta.get("kind", ""))
        if group:
            out += _comm_records(stage, group, t.name, t.start_s, t.end_s, links.get(group, ()),
                                 {"task": t.tid})
        elif t.meta.get("kind") in ("fwd", "bwd", "bwd_input"):
            ch = stages[stage][t.meta["chunk"]]
            part = Part.INPUT if t.meta["kind"] == "bwd_input" else Part.WHOLE
            out += _pass_records(t, stage, ch.pass_cost(
                Unit(t.meta["kind"] == "fwd", t.meta["mb"], t.meta["chunk"], part)))
    for s, mem in enumerate(memory):
        out += _memory_counter(eng, s, mem, stages[s])
    return out


def task_record(t: Task) -> dict[str, Any]:
    return {"name": t.name, "resource": t.resource, "start_s": t.start_s, "end_s": t.end_s,
            "tid": t.tid, "deps": [d for d, _ in t.deps], **t.meta}


def _comm_records(stage: int, group: str, name: str, start: float, end: float,
                  links: tuple[str, ...], args: dict[str, Any]) -> list[dict[str, Any]]:
    recs = [{"name": name, "resource": f"stage{stage}.comm.{group}", "start_s": start,
             "end_s": end, "stage": stage, "kind": "collective", "group": group, **args}]
    recs += [{"name": f"{group}: {name}", "resource": f"stage{stage}.link.{kind}",
              "start_s": start, "end_s": end, "stage": stage, "kind": "link_use",
              "group": group} for kind in links]
    return recs


def _pass_records(t: Task, stage: int, pc) -> list[dict[str, Any]]:
    """The collectives inside one pass at their offsets; a collective's hidden part runs
    on past its exposed part, alongside what follows it. Half of a DualPipe pair
    (``engine.pair_overlap``): the seconds hidden beside the other pass leave each group's
    exposed time, and the pass's compute stretches by the slowdown, so the segments end
    with the task."""
    out: list[dict[str, Any]] = []
    keep, stretch = _pair_scaling(t, pc)
    cursor = t.start_s
    for seg in pc.segments:
        k = keep.get(seg.group, 1.0)
        if seg.group and seg.comm_s > 0:
            end = min(cursor + seg.comm_s, t.end_s) if k < 1.0 else cursor + seg.comm_s
            out += _comm_records(stage, seg.group, seg.name, cursor, end,
                                 seg.links, {"pass": t.name, "task": t.tid,
                                             "exposed_s": seg.exposed_s * k,
                                             "bytes": seg.comm_bytes})
        cursor += seg.exposed_s * k + seg.interference_s if seg.group else \
            seg.duration_s * stretch
    return out


def _pair_scaling(t: Task, pc) -> tuple[dict[str, float], float]:
    """(kept share of each group's exposed seconds, stretch of compute segments) of a pass
    played as half of a DualPipe pair; ({}, 1) for any other pass."""
    hidden = t.meta.get("hidden_s") or {}
    extra = t.meta.get("pair_interference_s", 0.0)
    if not hidden and not extra:
        return {}, 1.0
    keep = {g: max(0.0, 1.0 - h / pc.comm_s[g]) for g, h in hidden.items() if pc.comm_s.get(g)}
    compute = sum(seg.duration_s for seg in pc.segments if not seg.group)
    return keep, (compute + extra) / compute if compute > 0 else 1.0


def _pass_memory_delta(t: Task, kind: str, mem) -> tuple[float, float]:
    """(when, bytes) a pass changes the rank's memory: a forward takes its activations at
    its start, a whole backward frees them at its end; split, B trades them for what W
    needs (``ChunkMemory.wgrad_hold_bytes``) and W frees that."""
    if kind == "fwd":
        return t.start_s, mem.act_bytes
    if kind == "bwd_input":
        return t.end_s, mem.wgrad_hold_bytes - mem.act_bytes
    if kind == "bwd_weight":
        return t.end_s, -mem.wgrad_hold_bytes
    return t.end_s, -mem.act_bytes


def _memory_counter(eng: Engine, s: int, mem: StageMemory,
                    chunks: list[ChunkWork]) -> list[dict[str, Any]]:
    """Bytes held by one rank of stage ``s`` over the step: weights, gradients, optimizer
    state and the forward/backward workspace, plus each micro-batch's activations from its
    forward start to its backward end; during the optimizer step its own transient instead
    of the workspace (``StageMemory.total_bytes`` is the larger of the two peaks)."""
    base = mem.state_bytes + mem.workspace_bytes
    deltas: dict[float, float] = {0.0: 0.0}
    opt = None
    for t in eng.tasks:
        if t.meta.get("stage") != s:
            continue
        kind = t.meta.get("kind")
        if kind == "optimizer":
            opt = t
        elif kind in ("fwd", "bwd", "bwd_input", "bwd_weight"):
            at, delta = _pass_memory_delta(t, kind, chunks[t.meta["chunk"]].memory)
            deltas[at] = deltas.get(at, 0.0) + delta
    points, level = [], base
    for at in sorted(deltas):
        level += deltas[at]
        points.append((at, level))
    if opt is not None:
        after = [p for p in points if p[0] <= opt.start_s][-1][1]
        points = [p for p in points if p[0] < opt.start_s or p[0] > opt.end_s]
        points += [(opt.start_s, after - mem.workspace_bytes + mem.optimizer_step_bytes),
                   (opt.end_s, after)]
    return [{"counter": "memory_bytes", "stage": s, "t_s": at, "value": v}
            for at, v in sorted(points)]
