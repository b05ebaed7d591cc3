"""Schedules that split the backward pass (``Part.INPUT`` B, ``Part.WEIGHT`` W) as ordered
per-stage unit lists: ZB-H1 and ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
2024, arXiv 2401.10241, sec. 2.1 and sec. 6) and DualPipe (DeepSeek-AI, DeepSeek-V3
Technical Report, arXiv 2412.19437, sec. 3.2.1; github.com/deepseek-ai/DualPipe).

As for the other schedules, no bubble formula is used here: the event engine plays these
orders against the cross-stage dependencies and the idle time falls out. The published
closed forms they are checked against, with their sources, are in
``schedule.closed_form_bubble_s`` (used only by the analytic engine),
``tests/simulator/engine/test_zero_bubble.py`` and ``docs/schedules.md``.

Chunks and micro-batches:

* ZB-H1: one chunk per stage; 1F1B's forward/backward order with B in place of the
  backward and W passes delayed: stage ``i`` keeps at most ``i`` W passes pending, so every
  stage holds at most ``pp`` micro-batches between F and W, 1F1B's peak on stage 0.
* ZB-V: two chunks per stage placed as a V (stage ``s`` holds model parts ``s`` and
  ``2pp-1-s``); the order comes from a list scheduler with F = B = W
  (``simulator.parallel.zbv``), holding at most ``2pp`` chunk activations (1F1B's peak,
  ``pp`` micro-batches of a whole stage).
* DualPipe: two model copies, stage ``s`` holds parts ``s`` (chunk 0, micro-batches
  ``0..m/2-1`` flowing stage 0 -> pp-1) and ``pp-1-s`` (chunk 1, micro-batches
  ``m/2..m-1`` flowing pp-1 -> 0); the eight phases of ``DualPipe.step`` in the reference
  implementation, with each overlapped forward&backward pair played as its forward then
  its whole backward on the stream (``Unit.paired``: the forward's output leaves when the
  pair ends, as the reference sends both after the pair); the engine runs each pass's
  expert-parallel all-to-all beside the other pass's compute (``engine.pair_overlap``),
  except in the first pair of phase 4 on the two middle ranks, which the reference plays
  unoverlapped (``Unit.overlapped``).
"""
from __future__ import annotations

from collections import deque
from functools import lru_cache

from . import zbv as _zbv
from .units import Part, Unit


def zb_h1(stage: int, pp: int, m: int) -> list[Unit]:
    """ZB-H1 order of ``stage``."""
    warm = min(pp - stage - 1, m)
    order = [Unit(True, mb, 0) for mb in range(warm)]
    pending: deque[Unit] = deque()

    def backward(mb: int, keep: int) -> None:
        order.append(Unit(False, mb, 0, Part.INPUT))
        pending.append(Unit(False, mb, 0, Part.WEIGHT))
        if len(pending) > keep:
            order.append(pending.popleft())

    for i in range(m - warm):
        order.append(Unit(True, warm + i, 0))
        backward(i, stage)
    for mb in range(m - warm, m):
        backward(mb, 0)
    order += list(pending)
    return order


# ---- ZB-V ----------------------------------------------------------------------------------
def v_path(pp: int) -> tuple[tuple[int, int], ...]:
    """(stage, chunk) in forward order of the V placement."""
    return tuple((s, 0) for s in range(pp)) + tuple((s, 1) for s in reversed(range(pp)))


@lru_cache(maxsize=256)
def zb_v_orders(pp: int, m: int) -> tuple[tuple[Unit, ...], ...]:
    """ZB-V order of every stage (``simulator.parallel.zbv``)."""
    return _zbv.zb_v_orders(pp, m)


# ---- DualPipe ------------------------------------------------------------------------------
class _DualPipeRank:
    """Builds one rank's order from the phases of ``DualPipe.step``; ``phase`` 0 is the
    forward direction on the first half of the ranks and the reverse direction on the
    second half (the reference implementation's convention)."""

    def __init__(self, rank: int, pp: int, m: int) -> None:
        self.swap = 1 if rank >= pp // 2 else 0
        self.half = m // 2
        self.next_f = [0, 0]
        self.next_b = [0, 0]
        self.pending_w: deque[Unit] = deque()
        self.order: list[Unit] = []

    def _chunk(self, phase: int) -> int:
        return phase ^ self.swap

    def forward(self, phase: int, paired: bool = False, overlapped: bool = True) -> None:
        c = self._chunk(phase)
        self.order.append(Unit(True, c * self.half + self.next_f[c], c, paired=paired,
                               overlapped=overlapped))
        self.next_f[c] += 1

    def backward(self, phase: int, zero_bubble: bool = False) -> None:
        c = self._chunk(phase)
        mb = c * self.half + self.next_b[c]
        self.next_b[c] += 1
        if zero_bubble:
            self.order.append(Unit(False, mb, c, Part.INPUT))
            self.pending_w.append(Unit(False, mb, c, Part.WEIGHT))
        else:
            self.order.append(Unit(False, mb, c))

    def weight(self) -> None:
        self.order.append(self.pending_w.popleft())


def dualpipe(rank: int, pp: int, m: int) -> list[Unit]:
    """DualPipe order of ``rank`` (``pp`` even, ``m`` even and at least ``2 pp``)."""
    r = _DualPipeRank(rank, pp, m)
    half_pp, hr, half_m = pp // 2, min(rank, pp - 1 - rank), m // 2
    for _ in range((half_pp - hr - 1) * 2):                 # 1: nF0
        r.forward(0)
    for _ in range(hr + 1):                                  # 2: nF0F1
        r.forward(0)
        r.forward(1)
    for _ in range(half_pp - hr - 1):                        # 3: nB1W1F1
        r.backward(1, zero_bubble=True)
        r.weight()
        r.forward(1)
    for i in range(half_m - pp + hr + 1):                    # 4: nF0B1F1B0
        # the reference does not overlap the middle ranks' first pair (DualPipe.step)
        r.forward(0, paired=True, overlapped=not (i == 0 and hr == half_pp - 1))
        r.backward(1)
        r.forward(1, paired=True)
        r.backward(0)
    for _ in range(half_pp - hr - 1):                        # 5: nB1F1B0
        r.backward(1)
        r.forward(1, paired=True)
        r.backward(0)
    _dualpipe_drain(r, hr, half_pp)
    return r.order


def _dualpipe_drain(r: _DualPipeRank, hr: int, half_pp: int) -> None:
    """Phases 6-8: nB1B0 (the second half with split backward), nWB0, nW."""
    steps, zb = hr + 1, False
    for i in range(steps):
        if i == steps // 2 and hr % 2 == 1:
            zb = True
        r.backward(1, zero_bubble=zb)
        if i == steps // 2 and hr % 2 == 0:
            zb = True
        r.backward(0, zero_bubble=zb)
    for _ in range(half_pp - hr - 1):
        r.weight()
        r.backward(0, zero_bubble=True)
    for _ in range(hr + 1):
        r.weight()
