"""Micro-batches in flight on a pipeline stage, per virtual chunk, by formula.

A stage holds a micro-batch's activations for a chunk from that chunk's forward pass to its
backward pass. The memory peak is at one of the moments right after a forward; what matters
there is the vector of live micro-batches per chunk. ``live_chunk_counts`` returns the
vectors no other such vector dominates (the candidates for the peak, whatever each chunk's
activation size).

The schedules of ``schedule.stage_order`` are a warm-up of forwards, a steady state that
alternates one forward and one backward, and a cool-down of backwards. Counting the
forwards (backwards) of chunk ``c`` among the first ``n`` in schedule order is a formula
(Megatron's interleaved order: groups of ``pp`` micro-batches per chunk, chunks in order
forward and reversed backward), and in the steady state the live vector repeats with the
period of one round over all chunks (``pp * vpp`` forwards, as many backwards). So the
candidates are the last warm-up vector and one period of the steady state: a cost of
``pp * vpp`` vectors, independent of the number of micro-batches. A schedule without a
formula here is walked (``walked_live_chunk_counts``, the reference the tests compare
against).
"""
from __future__ import annotations

from functools import lru_cache

from .plan import Schedule
from .schedule import Part, splits_backward, stage_order


def _dominant(seen: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The vectors of ``seen`` that no other dominates, largest total first."""
    kept: list[tuple[int, ...]] = []
    for v in sorted(seen, key=lambda v: (-sum(v), v)):
        if not any(all(a >= b for a, b in zip(w, v)) for w in kept):
            kept.append(v)
    return tuple(kept)


def walked_live_chunk_counts(schedule: Schedule, stage: int, pp: int, m: int,
                             vpp: int) -> tuple[tuple[int, ...], ...]:
    """The reference: play the stage's order and keep the live vector after every forward
    (and every B). When the backward is split (zero-bubble, DualPipe), B trades a
    micro-batch's activations for what W still needs, held until W: the vector then has
    ``vpp`` more entries, the micro-batches between B and W."""
    split = splits_backward(schedule)
    live = [0] * (2 * vpp if split else vpp)
    seen: set[tuple[int, ...]] = set()
    for u in stage_order(schedule, stage, pp, m, vpp):
        if u.fwd:
            live[u.chunk] += 1
            seen.add(tuple(live))
        elif u.part == Part.INPUT:
            live[u.chunk] -= 1
            live[vpp + u.chunk] += 1
            seen.add(tuple(live))
        elif u.part == Part.WEIGHT:
            live[vpp + u.chunk] -= 1
        else:
            live[u.chunk] -= 1
    return _dominant(seen)


def _count(n: int, c: int, pp: int, vpp: int) -> int:
    """Units of chunk position ``c`` among the first ``n`` of an interleaved order: rounds of
    ``pp * vpp`` units hold ``pp`` of each chunk, in blocks of ``pp`` per chunk."""
    rounds, rest = divmod(n, pp * vpp)
    return rounds * pp + min(pp, max(0, rest - c * pp))


def _rounds_vectors(stage: int, pp: int, m: int, vpp: int, warm: int
                    ) -> set[tuple[int, ...]]:
    """Live vectors of a warm-up of ``warm`` forwards then one-forward-one-backward, with
    forwards in chunk order and backwards in reversed chunk order (1F1B: ``vpp = 1``)."""
    total = m * vpp

    def live(forwards: int, backwards: int) -> tuple[int, ...]:
        return tuple(_count(forwards, c, pp, vpp) - _count(backwards, vpp - 1 - c, pp, vpp)
                     for c in range(vpp))

    seen = {live(warm, 0)} if warm > 0 else set()
    for i in range(min(total - warm, pp * vpp)):      # one period of the steady state
        seen.add(live(warm + i + 1, i))
    return seen


@lru_cache(maxsize=65536)
def live_chunk_counts(schedule: Schedule, stage: int, pp: int, m: int,
                      vpp: int) -> tuple[tuple[int, ...], ...]:
    """Micro-batches each chunk holds at the schedule's candidate worst moments: the live
    count vectors after every forward that no other such vector dominates."""
    if m <= 0:
        return walked_live_chunk_counts(schedule, stage, pp, m, vpp)
    if schedule == Schedule.GPIPE:                   # every forward of every chunk first
        return ((m,) * vpp,)
    if schedule == Schedule.INTERLEAVED and vpp > 1:
        warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, m * vpp)
        return _dominant(_rounds_vectors(stage, pp, m, vpp, warm))
    if schedule in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED):
        return ((min(pp - stage, m),) + (0,) * (vpp - 1),)
    return walked_live_chunk_counts(schedule, stage, pp, m, vpp)
