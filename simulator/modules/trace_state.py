"""Bookkeeping of a trace in progress (``trace_torch``) and its conversion to a ``TracedGraph``.

``TraceState`` is what the recording modes and hooks write into: the raw ATen calls,
which op produced each live tensor (weakly keyed, so views resolve to their producer),
which tensors are parameters, the module / custom-function / fused-attention context, the
autograd sequence-number range of every module call (backward attribution), gradient
readiness and saved activations. ``finalize`` merges fused groups and freezes the result.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ..workload.aten_cost import AtenCost, dtype_name, packet_name
from ..workload.ops import Op, OpKind
from ..workload.traced import (
    BACKWARD,
    FORWARD,
    LOSS,
    GradReady,
    ParamInfo,
    TracedGraph,
    TracedOp,
)

LOSS_MODULE = "<loss>"


@dataclass(frozen=True)
class Ctx:
    phase: str
    module: str
    custom: str = ""
    group: int = -1                     # fused-attention call id, -1 = not fused


@dataclass(frozen=True)
class RawOp:
    overload: str
    phase: str
    ctx: Ctx
    in_shapes: tuple
    out_shapes: tuple
    reads: tuple                        # ((producer raw index or None, nbytes), ...)
    written: int
    params: tuple
    cost: AtenCost
    dtype: str


class TraceState:
    def __init__(self, fuse_attention: bool = True) -> None:
        from torch.utils.weak import WeakTensorKeyDictionary
        self.fuse_attention = fuse_attention
        self.raw: list[RawOp] = []
        self._producer = WeakTensorKeyDictionary()
        self._param = WeakTensorKeyDictionary()
        self._param_storages: set[int] = set()
        self.phase = FORWARD
        self.module_stack: list[str] = []
        self._starts: list[int] = []
        self.module_ranges: list[tuple[int, int, str]] = []
        self.custom_stack: list[str] = []
        self.custom_seen: dict[str, None] = {}
        self.fused_stack: list[int] = []
        self.fused_ranges: list[tuple[int, int, int]] = []
        self.paused = 0
        self.current = ""
        self.ready: list[tuple[str, int]] = []
        self.saved: dict[int, int] = {}
        self.saved_by_op: dict[int, int] = defaultdict(int)
        self.saved_unattributed = 0
        self.input_bytes = 0
        self._probe: Any = None
        self._range_cache: dict[int, tuple[str, int]] = {}

    # ---- tensors ---------------------------------------------------------------------
    def producer_of(self, t: Any) -> int | None:
        return self._producer.get(t)

    def param_of(self, t: Any) -> str:
        return self._param.get(t, "")

    def register_param(self, t: Any, name: str, buffer: bool = False) -> None:
        if not buffer:
            self._param[t] = name
        try:
            self._param_storages.add(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError, AttributeError):
            pass

    def register_inputs(self, args: tuple, kwargs: dict) -> None:
        import torch
        from torch.utils._pytree import tree_flatten
        self.input_bytes = sum(int(t.numel()) * t.element_size()
                               for t in tree_flatten((args, kwargs))[0]
                               if isinstance(t, torch.Tensor))

    def alias(self, src: list, outs: list) -> None:
        if not src:
            return
        p, name = self._producer.get(src[0]), self._param.get(src[0])
        for o in outs:
            if p is not None:
                self._producer[o] = p
            if name:
                self._param[o] = name

    def add(self, raw: RawOp, outs: list) -> None:
        idx = len(self.raw)
        self.raw.append(raw)
        for t in outs:
            self._producer[t] = idx

    def grad_ready(self, name: str) -> None:
        self.ready.append((name, len(self.raw) - 1))

    def pack_hook(self, torch: Any):
        def pack(t):
            if self.paused:
                return t
            try:
                key = t.untyped_storage()._cdata
                nbytes = int(t.untyped_storage().nbytes())
            except (RuntimeError, NotImplementedError, AttributeError):
                return t
            if key in self._param_storages or key in self.saved:
                return t
            self.saved[key] = nbytes
            p = self._producer.get(t)
            if p is not None:
                self.saved_by_op[p] += nbytes
            else:
                self.saved_unattributed += nbytes       # inputs, tensors made outside ops
            return t
        return pack

    # ---- autograd sequence numbers and context ----------------------------------------
    def seq_now(self, torch: Any) -> int:
        """Current autograd sequence number (creates, unrecorded, one throw-away node)."""
        self.paused += 1
        try:
            if self._probe is None:
                self._probe = torch.empty(1, device="meta", requires_grad=True)
            with torch.enable_grad():
                y = self._probe.view_as(self._probe)
            return int(y.grad_fn._sequence_nr())
        finally:
            self.paused -= 1

    def begin(self, torch: Any) -> None:
        self.seq_now(torch)

    def enter_module(self, torch: Any, path: str) -> None:
        self.module_stack.append(path)
        self._starts.append(self.seq_now(torch))

    def exit_module(self, torch: Any, path: str) -> None:
        start = self._starts.pop()
        self.module_ranges.append((start, self.seq_now(torch), path))
        self.module_stack.pop()

    @contextmanager
    def fused_call(self, torch: Any, kind: str) -> Iterator[None]:
        gid = len(self.fused_ranges) + len(self.fused_stack)
        start = self.seq_now(torch)
        self.fused_stack.append(gid)
        try:
            yield
        finally:
            self.fused_stack.pop()
            self.fused_ranges.append((start, self.seq_now(torch), gid))

    def _lookup(self, seq: int) -> tuple[str, int]:
        """(innermost module path, fused group) of the forward call that created node ``seq``."""
        if seq in self._range_cache:
            return self._range_cache[seq]
        best, path = -1, ""
        for start, end, p in self.module_ranges:
            if start < seq < end and start > best:
                best, path = start, p
        group = next((g for s, e, g in self.fused_ranges if s < seq < e), -1)
        self._range_cache[seq] = (path, group)
        return path, group

    def context(self, torch: Any) -> Ctx:
        if self.phase != BACKWARD:
            module = self.module_stack[-1] if self.module_stack else ""
            custom = self.custom_stack[-1] if self.custom_stack else ""
            group = self.fused_stack[-1] if self.fused_stack else -1
            return Ctx(self.phase, module, custom, group)
        node = torch._C._current_autograd_node()
        if node is None:
            return Ctx(LOSS, LOSS_MODULE)
        path, group = self._lookup(int(node._sequence_nr()))
        fwd_cls = getattr(node, "_forward_cls", None)
        custom = fwd_cls.__name__ if fwd_cls is not None else ""
        phase = LOSS if path == LOSS_MODULE else BACKWARD
        return Ctx(phase, path, custom, group)

    def where(self) -> str:
        top = self.module_stack[-1] if self.module_stack else ""
        parts = [f"module '{top}'" if top else "the root module's forward"]
        if self.custom_stack:
            parts.append(f"inside autograd.Function {self.custom_stack[-1]}")
        if self.phase == BACKWARD:
            parts.append("during backward")
        return ", ".join(parts)


# ---- freezing ------------------------------------------------------------------------------
def _groups(raw: list[RawOp]) -> list[list[int]]:
    """Consecutive raw ops of one fused call (same phase) become one group."""
    out: list[list[int]] = []
    for i, r in enumerate(raw):
        key = (r.ctx.phase, r.ctx.group)
        if out and r.ctx.group >= 0 and (raw[out[-1][0]].ctx.phase, raw[out[-1][0]].ctx.group) == key:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _external_reads(rs: list[RawOp], idx: int, where: list[int], st: TraceState) -> list:
    """Reads from outside the group; a fused attention backward does not read what its
    forward kept internally (the score matrix: a flash kernel recomputes it)."""
    gid = rs[0].ctx.group
    out = []
    for r in rs:
        for (p, n), shape in zip(r.reads, r.in_shapes):
            if p is not None and (where[p] == idx or (gid >= 0 and st.raw[p].ctx.group == gid)):
                continue
            out.append((p, n, shape))
    return out


def _merge(idx: int, members: list[int], st: TraceState, where: list[int],
           consumers: dict[int, set[int]]) -> TracedOp:
    rs = [st.raw[i] for i in members]
    first = rs[0]
    fused = first.ctx.group >= 0
    reads = _external_reads(rs, idx, where, st)
    leaving = [i for i in members if not consumers.get(i) or any(c != idx for c in consumers[i])]
    if fused and first.ctx.phase != BACKWARD:
        leaving = [members[-1]]                   # only the attention output leaves
    written = float(sum(st.raw[i].written for i in leaving))
    flops = sum(r.cost.flops for r in rs)
    read_bytes = float(sum(n for _, n, _ in reads))
    saved = float(sum(st.saved_by_op.get(i, 0) for i in members))
    if fused:
        short = "sdpa_backward" if first.ctx.phase == BACKWARD else "sdpa"
        kind, c, aten = OpKind.ATTENTION, AtenCost(OpKind.ATTENTION, flops), f"fused.{short}"
        if first.ctx.phase != BACKWARD:           # flash keeps q, k, v, out and logsumexp
            saved = read_bytes + written + written / max(1, rs[-1].out_shapes[0][-1]) if \
                rs[-1].out_shapes and rs[-1].out_shapes[0] else read_bytes + written
        in_shapes = tuple(s for _, _, s in reads)
        out_shapes = tuple(s for i in leaving for s in st.raw[i].out_shapes)
    else:
        short, kind, c, aten = packet_name(first.overload), first.cost.kind, first.cost, first.overload
        in_shapes, out_shapes = first.in_shapes, first.out_shapes
    op = Op(f"{first.ctx.module or '<root>'}/{short}#{idx}", kind, flops=flops, model_flops=flops,
            bytes_moved=read_bytes + written, m=c.m, n=c.n, k=c.k, batch=c.batch,
            dtype=first.dtype, saved_bytes=saved)
    return TracedOp(index=idx, op=op, aten=aten, phase=first.ctx.phase, module=first.ctx.module,
                    in_shapes=in_shapes, out_shapes=out_shapes, bytes_read=read_bytes,
                    bytes_written=written,
                    deps=tuple(sorted({where[p] for p, _, _ in reads if p is not None})),
                    params=tuple(sorted({p for r in rs for p in r.params})),
                    custom=next((r.ctx.custom for r in rs if r.ctx.custom), ""),
                    fused=len(members))


def _param_infos(module: Any) -> tuple[ParamInfo, ...]:
    out = []
    for name, p in module.named_parameters():
        out.append(ParamInfo(name=name, shape=tuple(p.shape), dtype=dtype_name(p.dtype),
                             numel=int(p.numel()), nbytes=int(p.numel()) * p.element_size(),
                             module=name.rpartition(".")[0], requires_grad=bool(p.requires_grad)))
    return tuple(out)


def _custom_notes(ops: list[TracedOp], names: list[str]) -> tuple[tuple[str, ...], dict]:
    notes, info = [], {}
    for n in names:
        fwd = [o for o in ops if o.custom == n and o.phase != BACKWARD]
        bwd = [o for o in ops if o.custom == n and o.phase == BACKWARD]
        info[n] = {"forward_ops": len(fwd), "backward_ops": len(bwd),
                   "forward_flops": sum(o.flops for o in fwd),
                   "backward_flops": sum(o.flops for o in bwd)}
        notes.append(f"custom autograd.Function {n}: traced through its ATen ops "
                     f"({len(fwd)} forward ops, {info[n]['forward_flops']:.3g} FLOPs; "
                     f"{len(bwd)} backward ops, {info[n]['backward_flops']:.3g} FLOPs)")
    return tuple(notes), info


def finalize(st: TraceState, name: str, module: Any) -> TracedGraph:
    groups = _groups(st.raw)
    where = [0] * len(st.raw)
    for gi, members in enumerate(groups):
        for i in members:
            where[i] = gi
    consumers: dict[int, set[int]] = defaultdict(set)
    for i, r in enumerate(st.raw):
        for p, _ in r.reads:
            if p is not None:
                consumers[p].add(where[i])
    ops = [_merge(gi, members, st, where, consumers) for gi, members in enumerate(groups)]
    last: dict[str, int] = {}
    for pname, r in st.ready:                 # firing order; a re-fired hook counts last
        last.pop(pname, None)
        last[pname] = where[r] if r >= 0 else -1
    ready = tuple(GradReady(p, i) for p, i in last.items())
    notes, custom_info = _custom_notes(ops, list(st.custom_seen))
    buffers = sum(int(b.numel()) * b.element_size() for b in module.buffers())
    g = TracedGraph(name=name, ops=tuple(ops), params=_param_infos(module), grad_ready=ready,
                    saved_activation_bytes=float(sum(o.op.saved_bytes for o in ops)
                                                 + st.saved_unattributed),
                    buffer_bytes=float(buffers), input_bytes=float(st.input_bytes),
                    custom_functions=tuple(st.custom_seen), notes=notes)
    g.meta["custom"] = custom_info
    g.meta["fused_attention_calls"] = len(st.fused_ranges)
    unused = g.unused_params()
    if unused:
        g.meta["unused_params"] = unused
    return g
