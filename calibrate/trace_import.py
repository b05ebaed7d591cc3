"""Read a Kineto trace (``torch.profiler`` ``export_chrome_trace``, JSON or JSON.gz) and map
what it recorded onto the simulator's op families.

Parsed with the standard ``json`` module, not HolisticTraceAnalysis: HTA 0.5.0 installs on
Python 3.11, but (1) its parser stores ``ts``/``dur`` as integer microseconds, a 20-100 %
error on the 0.5-5 us CPU operators whose host cost is fitted here; (2) its analyses
(temporal breakdown, comm/compute overlap) are built on GPU kernels and fail or return NaN
on a CPU-only trace (checked on a trace of this project's training step); (3) it brings
pandas, plotly and a Jupyter stack into a tool whose core needs numpy and scipy. The schema
read here is the one HTA and Perfetto read: complete events (``"ph": "X"``) with ``cat``
``cpu_op`` / ``user_annotation`` (host), ``cuda_runtime`` / ``cuda_driver`` (launches, with
``args.correlation``), ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` (device, with
``args.stream`` and ``args.correlation``); ``ProfilerStep#N`` annotations bound the steps;
``distributedInfo`` names rank, world size and backend; ``deviceProperties`` the GPUs.

Mapping (``calibrate/data/aten_families.json``): on every host thread the events form a
call tree (nesting by time). A *leaf* is the outermost ATen operator that does work: a
known family operator (``aten::mm`` -> gemm, ``aten::native_layer_norm`` -> norm, ...), or
an unknown ATen operator with no known operator inside it (family ``other``, e.g. the
``cat`` that is the backward of a split). Views and allocations (``aten::view``,
``aten::empty``, ...), wrappers (``aten::linear``, autograd nodes) and the gaps between
operators are host time. A *claim* (``aten::cross_entropy_loss``, ``Optimizer.step#``,
``EmbeddingBackward0``, DDP's bucket copies) gives every leaf inside it its family.
A GPU kernel belongs to the leaf whose host call launched it (``correlation``); its time is
the leaf's device time. Collectives: host calls (``c10d::allreduce_``, ``record_param_comms``)
and their execution (``gloo:all_reduce`` on gloo's thread, ``nccl*`` kernels), with sizes
from ``Input Dims`` or ``In msg nelems`` and the group from ``Group size``.
"""
from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.errors import InvalidInputError
from simulator.workload.aten_cost import ALIAS_OPS, ALLOC_OPS

DATA = Path(__file__).with_name("data") / "aten_families.json"
SIM_FAMILIES = ("gemm", "attention", "norm", "softmax", "elementwise", "copy", "optimizer")
NEST_TOL_US = 1e-3        # a child may end this much after its parent (rounding of ts/dur)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
ELEM_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "Float": 4,
              "Half": 2, "BFloat16": 2, "long int": 8, "int": 4}
COLLECTIVES = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "allgather": "all_gather",
               "all_gather": "all_gather", "_allgather_base": "all_gather",
               "allgather_into_tensor_coalesced": "all_gather",
               "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
               "reduce_scatter_tensor_coalesced": "reduce_scatter", "alltoall": "all_to_all",
               "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
               "send": "send_recv", "recv": "send_recv", "sendrecv": "send_recv",
               "broadcast": "broadcast", "allreduce_coalesced": "all_reduce"}


# ---- records ------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpRecord:
    """One leaf operator: host time (inclusive), device time of the kernels it launched."""

    name: str
    family: str            # one of SIM_FAMILIES, or "other"
    label: str             # what to call it in a table (the op, or the claim it belongs to)
    phase: str             # fwd | bwd | opt
    step: int              # index into KinetoTrace.steps, -1 outside every step
    ts_s: float
    cpu_s: float
    tid: int
    shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str = ""
    concrete: tuple[str, ...] = ()
    kernel_s: float = 0.0
    n_kernels: int = 0
    n_events: int = 1      # host events recorded inside it, itself included (profiler cost)

    @property
    def end_s(self) -> float:
        return self.ts_s + self.cpu_s


@dataclass(frozen=True)
class CommRecord:
    """One collective: where it ran (``host``: the blocking host call; ``device``: its
    execution on gloo's thread or an NCCL kernel), its size and group."""

    collective: str        # simulator.network.collectives.Collective value, or the raw name
    where: str             # host | device
    step: int
    ts_s: float
    dur_s: float
    size_bytes: float
    group_size: int
    group: str = ""
    tid: int = 0


@dataclass(frozen=True)
class KernelRecord:
    name: str
    stream: int
    family: str            # family of the op that launched it, "comm" for collectives
    step: int
    ts_s: float
    dur_s: float


@dataclass(frozen=True)
class StepWindow:
    index: int
    name: str
    start_s: float
    end_s: float
    pressure: float | None = None        # host CPU pressure (validate-run traces)

    @property
    def wall_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class KinetoTrace:
    """Everything the fit and the doctor read from one rank's trace."""

    path: str
    device: str                           # GPU name from deviceProperties, or "cpu"
    rank: int
    world_size: int
    backend: str
    main_tid: int
    steps: tuple[StepWindow, ...]
    ops: tuple[OpRecord, ...]
    comms: tuple[CommRecord, ...]
    kernels: tuple[KernelRecord, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)    # validate-run's "complexity" key
    notes: tuple[str, ...] = ()
    events_per_step: tuple[int, ...] = ()     # host operator events recorded in each step

    @property
    def has_gpu(self) -> bool:
        return bool(self.kernels)


# ---- loading ------------------------------------------------------------------------------
def _bad(path: Path, why: str) -> InvalidInputError:
    return InvalidInputError("trace", str(path), "a Kineto trace (torch.profiler "
                             "export_chrome_trace JSON or JSON.gz)", why)


def read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise _bad(p, "no such file")
    try:
        if p.name.endswith(".gz"):
            with gzip.open(p, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
        else:
            data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError) as exc:
        raise _bad(p, f"unreadable: {type(exc).__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise _bad(p, "no traceEvents list")
    return data


@lru_cache(maxsize=1)
def families() -> dict[str, Any]:
    d = json.loads(DATA.read_text())
    leaf = {name: fam for fam, names in d["leaf"].items() for name in names}
    claims = {name: fam for fam, names in d["claim"].items() for name in names}
    prefix = [(p, fam) for fam, ps in d["leaf_prefix"].items() for p in ps]
    return {"leaf": leaf, "claim": claims, "leaf_prefix": prefix,
            "wrappers": frozenset(d["wrappers"]), "host_ops": frozenset(d["host_ops"]),
            "comm_host": tuple(d["comm_host"]),
            "comm_device": tuple(d["comm_device"])}


# ---- call trees ---------------------------------------------------------------------------
@dataclass
class Node:
    ev: Mapping[str, Any]
    ts: float
    end: float
    children: list["Node"] = field(default_factory=list)
    known: bool = False            # a known leaf operator inside (or itself)

    @property
    def name(self) -> str:
        return str(self.ev.get("name", ""))


def build_trees(events: Sequence[Mapping[str, Any]]) -> list[Node]:
    """Roots of the call forest of one thread (an event is the child of the innermost event
    that contains it)."""
    nodes = sorted((Node(e, float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                    for e in events), key=lambda n: (n.ts, -n.end))
    roots: list[Node] = []
    stack: list[Node] = []
    for n in nodes:
        while stack and not (n.ts < stack[-1].end and n.end <= stack[-1].end + NEST_TOL_US):
            stack.pop()
        (stack[-1].children if stack else roots).append(n)
        stack.append(n)
    return roots


def _base(name: str) -> str:
    return name[6:] if name.startswith("aten::") else name


def leaf_family(name: str) -> str | None:
    """Family of a known leaf operator name (``aten::mm`` -> gemm), else None."""
    if not name.startswith("aten::"):
        return None
    f = families()
    base = _base(name)
    if base in f["leaf"]:
        return f["leaf"][base]
    for p, fam in f["leaf_prefix"]:
        if base.startswith(p):
            return fam
    return None


def claim_family(name: str) -> str | None:
    f = families()
    if name in f["claim"]:
        return f["claim"][name]
    for key, fam in f["claim"].items():
        if key.endswith("#") and name.startswith(key):
            return fam
    if name.startswith("autograd::engine::evaluate_function: "):
        return f["claim"].get(name.split(": ", 1)[1])
    return None


def mark_known(n: Node) -> bool:
    n.known = leaf_family(n.name) is not None
    for c in n.children:
        n.known = mark_known(c) or n.known
    return n.known


def is_host_only(name: str) -> bool:
    """Views, allocations and host-side queries: no device work of their own."""
    base = _base(name)
    return name.startswith("aten::") and (base in ALIAS_OPS or base in ALLOC_OPS
                                          or base in families()["host_ops"])


def is_leaf(n: Node) -> bool:
    """A known operator, or an ATen operator (not a wrapper) with no known operator
    inside it."""
    if not n.name.startswith("aten::") or is_host_only(n.name):
        return False
    if leaf_family(n.name) is not None:
        return True
    return not n.known and _base(n.name) not in families()["wrappers"]


# ---- shapes -------------------------------------------------------------------------------
def shapes_of(ev: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    """``Input Dims`` as tuples (a tensor-list argument contributes its first tensor)."""
    out = []
    for d in ev.get("args", {}).get("Input Dims", []) or []:
        if d and isinstance(d[0], list):
            d = d[0]
        out.append(tuple(int(x) for x in d) if isinstance(d, list) else ())
    return tuple(out)


def dtype_of(ev: Mapping[str, Any]) -> str:
    for t in ev.get("args", {}).get("Input type", []) or []:
        if t in ELEM_BYTES and t not in ("long int", "int"):
            return t
    return ""


def numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 0


def comm_size_bytes(ev: Mapping[str, Any]) -> float:
    a = ev.get("args", {})
    eb = ELEM_BYTES.get(str(a.get("dtype", "")), 0) or ELEM_BYTES.get(dtype_of(ev), 4)
    if a.get("In msg nelems") is not None:
        return float(a["In msg nelems"]) * eb
    dims = a.get("Input Dims") or []
    total = 0
    for d in dims:
        if d and isinstance(d[0], list):
            total += sum(numel(x) for x in d)
        elif isinstance(d, list):
            total += numel(d)
    return float(total * eb)


def collective_name(name: str, args: Mapping[str, Any]) -> str:
    raw = str(args.get("Collective name") or "")
    if not raw:
        raw = name.split("::")[-1].split(":")[-1].rstrip("_").lower()
        if "nccl" in name.lower() or name.startswith("ncclDevKernel"):
            raw = name.split("_")[1].lower() if "_" in name else raw
    return COLLECTIVES.get(raw.lower(), raw.lower())


# ---- walking one thread -------------------------------------------------------------------
IN_COMM = -2               # walking inside a host collective call


@dataclass
class _Walk:
    tid: int
    ops: list[dict[str, Any]] = field(default_factory=list)
    comms: list[CommRecord] = field(default_factory=list)
    launches: dict[int, int] = field(default_factory=dict)   # correlation -> op index / IN_COMM


def _leaf_record(n: Node, claim: str | None, phase: str, tid: int) -> dict[str, Any]:
    base = _base(n.name)
    if claim is not None:
        fam, label = (claim, base) if claim in SIM_FAMILIES else ("other", claim)
    else:
        fam = leaf_family(n.name) or "other"
        label = base
    a = n.ev.get("args", {})
    return {"name": n.name, "family": fam, "label": label, "phase": phase, "ts_us": n.ts,
            "cpu_us": n.end - n.ts, "tid": tid, "shapes": shapes_of(n.ev),
            "dtype": dtype_of(n.ev), "concrete": tuple(str(x) for x in a.get("Concrete Inputs", [])),
            "kernel_us": 0.0, "n_kernels": 0, "n_events": _count(n)}


def _count(n: Node) -> int:
    """Operator events in a subtree (launch records left out)."""
    own = _cat_of(n) in ("cpu_op", "operator", "user_annotation")
    return int(own) + sum(_count(c) for c in n.children)


def _cat_of(n: Node) -> str:
    return str(n.ev.get("cat", "")).lower()


def _comm_record(n: Node, where: str, tid: int) -> CommRecord:
    a = n.ev.get("args", {})
    return CommRecord(collective_name(n.name, a), where, -1, n.ts, n.end - n.ts,
                      comm_size_bytes(n.ev), int(a.get("Group size") or 0),
                      str(a.get("Process Group Name") or ""), tid)


def _phase(name: str, phase: str) -> str:
    if name.startswith("Optimizer.step#"):
        return "opt"
    if name.startswith("autograd::engine::evaluate_function") or name.endswith("Backward0"):
        return "bwd" if phase != "opt" else phase
    return phase


def walk(n: Node, w: _Walk, claim: str | None = None, phase: str = "fwd",
         inside: int = -1) -> None:
    """Classify ``n`` and its subtree into leaf ops, host collective calls and launches."""
    cat = str(n.ev.get("cat", "")).lower()
    if cat in ("cuda_runtime", "cuda_driver", "runtime"):
        corr = n.ev.get("args", {}).get("correlation")
        if corr is not None:
            w.launches[int(corr)] = inside
        return
    if inside == -1:
        f = families()
        if n.name.startswith(f["comm_device"]):
            w.comms.append(_comm_record(n, "device", w.tid))
            return
        if n.name.startswith(f["comm_host"]):
            w.comms.append(_comm_record(n, "host", w.tid))
            inside = IN_COMM
        else:
            claim = claim_family(n.name) or claim
            phase = _phase(n.name, phase)
            if is_leaf(n):
                w.ops.append(_leaf_record(n, claim, phase, w.tid))
                inside = len(w.ops) - 1
    for c in n.children:
        walk(c, w, claim, phase, inside)


# ---- the whole trace ----------------------------------------------------------------------
def _cat(e: Mapping[str, Any]) -> str:
    return str(e.get("cat", "")).lower()


def _steps(host: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], t0: float
           ) -> tuple[tuple[StepWindow, ...], int | None]:
    marks = sorted((e for e in host if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: float(e["ts"]))
    traced = list(meta.get("traced_steps") or [])
    pressure = [t.get("pressure") for t in traced] if len(traced) == len(marks) else []
    out = tuple(StepWindow(i, str(e["name"]), (float(e["ts"]) - t0) * 1e-6,
                           (float(e["ts"]) + float(e.get("dur", 0)) - t0) * 1e-6,
                           pressure[i] if pressure else None) for i, e in enumerate(marks))
    return out, (int(marks[0]["tid"]) if marks else None)


def _step_of(ts_s: float, steps: Sequence[StepWindow]) -> int:
    for s in steps:
        if s.start_s <= ts_s < s.end_s:
            return s.index
    return -1


def _device(data: Mapping[str, Any]) -> str:
    props = data.get("deviceProperties") or []
    names = [str(p.get("name", "")) for p in props if isinstance(p, Mapping)]
    return names[0] if names and names[0] else "cpu"


def load_trace(path: str | Path) -> KinetoTrace:
    """Parse one rank's trace (see the module doc)."""
    data = read_json(path)
    meta = data.get("complexity") if isinstance(data.get("complexity"), Mapping) else {}
    evs = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
           and "ts" in e and "name" in e]
    if not evs:
        raise _bad(Path(path), "no complete (ph X) events")
    t0 = min(float(e["ts"]) for e in evs)
    host = [e for e in evs if _cat(e) in HOST_CATS or _cat(e) in ("operator", "runtime")]
    device = [e for e in evs if _cat(e) in DEVICE_CATS or _cat(e) in ("memcpy", "memset")]
    steps, step_tid = _steps(host, meta, t0)
    by_tid: dict[int, list[Mapping[str, Any]]] = {}
    for e in host:
        if not str(e.get("name", "")).startswith("ProfilerStep#"):
            by_tid.setdefault(_tid(e), []).append(e)
    main = step_tid if step_tid is not None else max(by_tid, key=lambda t: len(by_tid[t]))
    walks = []
    for tid, events in sorted(by_tid.items()):
        w = _Walk(tid)
        for root in build_trees(events):
            mark_known(root)
            walk(root, w)
        walks.append(w)
    ops, comms, kernels = _assemble(walks, device, steps, t0)
    notes = () if steps else ("no ProfilerStep# annotations: the whole trace is one step",)
    if not steps:
        if not ops:
            raise _bad(Path(path), "no operators and no ProfilerStep# annotations")
        steps = (StepWindow(0, "whole trace", min(o.ts_s for o in ops),
                            max(o.end_s for o in ops)),)
        ops = tuple(_restep(o, steps) for o in ops)
        comms = tuple(_restep(c, steps) for c in comms)
        kernels = tuple(_restep(k, steps) for k in kernels)
    dist = data.get("distributedInfo") or {}
    counts = [0] * len(steps)
    for e in host:
        i = _step_of((float(e["ts"]) - t0) * 1e-6, steps)
        if i >= 0 and _cat(e) in ("cpu_op", "operator"):
            counts[i] += 1
    return KinetoTrace(str(path), _device(data), int(dist.get("rank", 0) or 0),
                       int(dist.get("world_size", 1) or 1), str(dist.get("backend", "")),
                       main, steps, ops, comms, kernels, dict(meta), notes, tuple(counts))


def _tid(e: Mapping[str, Any]) -> int:
    """Thread id; a named thread (some exporters write strings) gets a stable number."""
    try:
        return int(e.get("tid", 0))
    except (TypeError, ValueError):
        return zlib.crc32(str(e.get("tid")).encode()) & 0x7FFFFFFF


def _restep(o, steps: Sequence[StepWindow]):
    from dataclasses import replace
    return replace(o, step=_step_of(o.ts_s, steps))


def _assemble(walks: Sequence[_Walk], device: Sequence[Mapping[str, Any]],
              steps: Sequence[StepWindow], t0: float):
    """Freeze the walked records in seconds from the trace start, with each kernel's time
    added to the op that launched it."""
    index: dict[int, tuple[int, int]] = {}
    for wi, w in enumerate(walks):
        for corr, oi in w.launches.items():
            index[corr] = (wi, oi)
    kernels, comms = [], []
    for e in device:
        a = e.get("args", {})
        ts, dur = (float(e["ts"]) - t0) * 1e-6, float(e.get("dur", 0)) * 1e-6
        wi, oi = index.get(int(a.get("correlation", -1) or -1), (-1, -1))
        is_comm = "nccl" in str(e["name"]).lower() or oi == IN_COMM
        fam = "comm" if is_comm else (walks[wi].ops[oi]["family"] if oi >= 0 else "other")
        if oi >= 0 and not is_comm:
            walks[wi].ops[oi]["kernel_us"] += float(e.get("dur", 0))
            walks[wi].ops[oi]["n_kernels"] += 1
        kernels.append(KernelRecord(str(e["name"]), int(a.get("stream", 0) or 0), fam,
                                    _step_of(ts, steps), ts, dur))
        if "nccl" in str(e["name"]).lower():
            node = Node(e, float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            comms.append(_comm_record(node, "device", int(a.get("stream", 0) or 0)))
    ops = []
    for w in walks:
        for r in w.ops:
            ts = (r["ts_us"] - t0) * 1e-6
            ops.append(OpRecord(r["name"], r["family"], r["label"], r["phase"],
                                _step_of(ts, steps), ts, r["cpu_us"] * 1e-6, r["tid"],
                                r["shapes"], r["dtype"], r["concrete"], r["kernel_us"] * 1e-6,
                                r["n_kernels"], r["n_events"]))
        comms += w.comms
    secs = [_comm_seconds(c, t0, steps) for c in comms]
    return (tuple(sorted(ops, key=lambda o: o.ts_s)), tuple(sorted(secs, key=lambda c: c.ts_s)),
            tuple(sorted(kernels, key=lambda k: k.ts_s)))


def _comm_seconds(c: CommRecord, t0: float, steps: Sequence[StepWindow]) -> CommRecord:
    """A record built in trace microseconds, in seconds from the trace start."""
    from dataclasses import replace
    ts = (c.ts_s - t0) * 1e-6
    return replace(c, ts_s=ts, dur_s=c.dur_s * 1e-6, step=_step_of(ts, steps))
