"""ZB-V's order (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241 v2+,
sec. 6): two chunks per stage in a V (stage ``s`` holds model parts ``s`` and
``2pp-1-s``), peak activations no more than 1F1B's (``2 pp`` chunk activations, ``pp``
micro-batches of a whole stage), built by a list scheduler that times every pass with
F = B = W (the condition the schedule is designed for; no communication).

The policy follows the reference generator's (sail-sg/zero-bubble-pipeline-parallelism,
``zerobubble/scheduler/zbv.py``; re-written, not copied): a warm-up that fills each stage
with chunk-0 forwards while the first chunk-1 forward travels back up; then rounds of one
B and one F per stage, B passes placed in dependency order (the chunk-0 backward chain,
stage ``pp-1`` to 0, and the chunk-1 chain, stage 0 to ``pp-1``); before a pass that would
wait, pending W passes fill the wait; a W is also placed when the wait would exceed the
largest bubble any stage already has (the reference's "approved bubble", iterated while it
shrinks). In this model a micro-batch's activations stay until its W (``units.Unit``).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .units import Part, Unit

F_, B_, W_ = 0, 1, 2          # pass kinds; every pass lasts one time unit


@dataclass
class _Stage:
    time: float = 0.0
    live: int = 0                                  # chunk activations held
    bubble: float = 0.0
    count: dict[tuple[int, int], int] = field(default_factory=dict)   # (kind, chunk) -> done
    pending_w: deque = field(default_factory=deque)
    order: list[Unit] = field(default_factory=list)

    def n(self, kind: int, chunk: int) -> int:
        return self.count.get((kind, chunk), 0)


class _VBuilder:
    def __init__(self, pp: int, m: int, fill_b: bool, fill_f: bool, approved: list[float]):
        self.pp, self.m, self.fill_b, self.fill_f = pp, m, fill_b, fill_f
        self.cap = 2 * pp
        self.st = [_Stage() for _ in range(pp)]
        self.end: dict[tuple[int, int, int, int], float] = {}    # (kind, chunk, stage, mb)
        self.approved = approved

    # ---- timing ----------------------------------------------------------------------------
    def dep_end(self, kind: int, chunk: int, s: int, mb: int) -> float:
        """End of the pass on another stage this one waits for (-1: none)."""
        if kind == W_:
            return -1.0
        if kind == F_:
            nb = s - 1 if chunk == 0 else s + 1
            edge = (chunk == 0 and s == 0) or (chunk == 1 and s == self.pp - 1)
        else:                                       # backward runs the V in reverse
            nb = s + 1 if chunk == 0 else s - 1
            edge = (chunk == 0 and s == self.pp - 1) or (chunk == 1 and s == 0)
        return -1.0 if edge else self.end[(kind, chunk, nb, mb)]

    def put(self, kind: int, chunk: int, s: int) -> None:
        st = self.st[s]
        if kind == W_:
            mb, chunk = st.pending_w.popleft()
        else:
            mb = st.n(kind, chunk)
        start = max(st.time, self.dep_end(kind, chunk, s, mb))
        if st.n(F_, 0) > 0:
            st.bubble += start - st.time
        st.time = start + 1.0
        self.end[(kind, chunk, s, mb)] = st.time
        st.count[(kind, chunk)] = st.n(kind, chunk) + 1
        part = {F_: Part.WHOLE, B_: Part.INPUT, W_: Part.WEIGHT}[kind]
        st.order.append(Unit(kind == F_, mb, chunk, part))
        if kind == F_:
            st.live += 1
        elif kind == B_:
            st.pending_w.append((mb, chunk))
        else:
            st.live -= 1

    def max_bubble(self, s: int = -1) -> float:
        worst = max(x.bubble for x in self.st)
        if s >= 0 and self.approved:
            worst = max(worst, max(self.approved) - self.approved[s])
        return worst

    def fill_w(self, s: int, wait_until: float, fill: bool) -> None:
        """W passes into the wait before a pass that starts at ``wait_until``."""
        st = self.st[s]
        while st.pending_w and wait_until >= st.time + 1.0:
            self.put(W_, 0, s)
        if st.pending_w and fill and wait_until - st.time > self.max_bubble(s) - st.bubble:
            self.put(W_, 0, s)

    # ---- phases ----------------------------------------------------------------------------
    def warm_up(self) -> None:
        pp, m, st = self.pp, self.m, self.st
        for i in range(pp):
            self.put(F_, 0, i)
        for i in reversed(range(pp)):
            if i < pp - 1:
                back = self.end[(F_, 1, i + 1, 0)]
                while (st[i].live + 2 + 2 * i <= self.cap and st[i].time + 1.0 <= back
                       and st[i].n(F_, 0) < m):
                    for j in range(i + 1):
                        self.put(F_, 0, j)
            self.put(F_, 1, i)
        chunk = 0
        for i in range(1, pp):
            while (st[i].n(F_, 0) + st[i].n(F_, 1) < st[i - 1].n(F_, 0) + st[i - 1].n(F_, 1)
                   or st[i].n(F_, 1) <= st[i - 1].n(F_, 1) < m):
                for j in range(pp - 1, i - 1, -1):
                    if st[j].n(F_, chunk) < m:
                        self.put(F_, chunk, j)
                chunk = 1 - chunk

    def b_chunk(self, i: int) -> int:
        st = self.st[i]
        if st.n(B_, 0) >= st.n(B_, 1):
            return 1
        if i == self.pp - 1 or st.n(B_, 1) >= self.m:
            return 0
        return 0 if (B_, 0, i + 1, st.n(B_, 0)) in self.end else 1

    def f_chunk(self, i: int) -> int | None:
        st = self.st[i]
        if st.n(F_, 1) >= st.n(F_, 0):
            return 0
        if i == self.pp - 1 or (F_, 1, i + 1, st.n(F_, 1)) in self.end:
            return 1
        if st.n(F_, 0) < self.m and (i == 0 or (F_, 0, i - 1, st.n(F_, 0)) in self.end):
            return 0
        return None

    def round(self) -> None:
        """One B, then one F, per stage."""
        pp = self.pp
        picks = [(i, self.b_chunk(i)) for i in range(pp)]
        ordered = [p for p in reversed(picks) if p[1] == 0] + [p for p in picks if p[1] == 1]
        for i, c in ordered:
            mb = self.st[i].n(B_, c)
            self.fill_w(i, self.dep_end(B_, c, i, mb), fill=(c == 0 or self.fill_b))
            self.put(B_, c, i)
        for i in range(pp):
            st = self.st[i]
            c = self.f_chunk(i) if st.n(F_, 1) < self.m else None
            if c is None:
                continue
            while st.live + 1 > self.cap:
                self.put(W_, 0, i)
            self.fill_w(i, self.dep_end(F_, c, i, st.n(F_, c)), fill=self.fill_f)
            self.put(F_, c, i)

    def build(self) -> "_VBuilder":
        self.warm_up()
        for _ in range(2 * self.m):
            self.round()
        for i in range(self.pp):
            while self.st[i].pending_w:
                self.put(W_, 0, i)
        return self


def _best(pp: int, m: int, fill_b: bool, fill_f: bool) -> _VBuilder:
    """Build, then rebuild with the bubbles found as the approved ones while that helps."""
    best = _VBuilder(pp, m, fill_b, fill_f, []).build()
    while True:
        again = _VBuilder(pp, m, fill_b, fill_f, [s.bubble for s in best.st]).build()
        if again.max_bubble() >= best.max_bubble():
            return best
        best = again


def zb_v_orders(pp: int, m: int) -> tuple[tuple[Unit, ...], ...]:
    """ZB-V order of every stage."""
    tries = [_best(pp, m, fb, ff) for fb in (True, False) for ff in (True, False)]
    pick = min(tries, key=lambda b: b.max_bubble())      # first of equals: deterministic
    return tuple(tuple(s.order) for s in pick.st)
