"""Pipeline schedules as ordered per-stage lists of (pass, micro-batch, chunk).

The bubble is not a formula here: the event engine plays these orders against the
cross-stage dependencies and the idle time falls out. Where each chunk's layers sit and
which chunk feeds which (``chunk_parts``, ``upstream``) is the schedule's placement:
Megatron's interleaving, ZB-V's V, DualPipe's two mirrored copies
(``simulator.parallel.zero_bubble``).
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from .plan import Schedule
from .units import Part, Unit
from .zero_bubble import dualpipe, v_path, zb_h1, zb_v_orders

__all__ = ["SPLIT_BACKWARD", "Part", "Unit", "chunk_parts", "chunk_share", "closed_form_bubble_s",
           "iter_pass_order", "pass_order", "sends_downstream", "splits_backward",
           "stage_order", "upstream"]

SPLIT_BACKWARD = (Schedule.ZB_H1, Schedule.ZB_V, Schedule.DUALPIPE)


def splits_backward(schedule: Schedule) -> bool:
    """Whether the schedule runs some backward passes as separate B and W units."""
    return schedule in SPLIT_BACKWARD


def chunk_share(schedule: Schedule) -> float:
    """Fraction of the micro-batches that pass through each of a stage's chunks: 1, but
    1/2 for DualPipe (each direction's micro-batches use one of the two copies)."""
    return 0.5 if schedule == Schedule.DUALPIPE else 1.0


def closed_form_bubble_s(schedule: Schedule, pp: int, f_s: float, b_s: float,
                         w_s: float, pair_saving_s: float = 0.0) -> float:
    """The published bubble of a split-backward schedule for per-stage, per-micro-batch
    forward ``f_s``, input-gradient ``b_s`` and weight-gradient ``w_s`` seconds (for the
    analytic engine; the event engine plays the schedule instead):

    * ZB-H1: ``(pp-1)(F+B-W)`` (Qi et al. 2024, arXiv 2401.10241, sec. 2.1 and Table 2;
      1F1B's is ``(pp-1)(F+B+W)``);
    * ZB-V: 0 with F = B = W and enough micro-batches (same paper, sec. 6; also the
      authors' comparison table, huggingface.co/spaces/sail/zero-bubble-pipeline-parallellism);
    * DualPipe: ``(pp/2-1)(F&B + B_full - 3W)`` (DeepSeek-V3 report, arXiv 2412.19437,
      Table 2, where B is the whole backward), ``F&B = F + B_full - pair_saving_s`` (what
      overlapping the pair's communication saves, ``engine.pair_overlap``).
    """
    if schedule == Schedule.ZB_H1:
        return (pp - 1) * max(0.0, f_s + b_s - w_s)
    if schedule == Schedule.DUALPIPE:
        full = b_s + w_s
        return (pp / 2 - 1) * max(0.0, (f_s + full - pair_saving_s) + full - 3 * w_s)
    return 0.0


def stage_order(schedule: Schedule, stage: int, pp: int, m: int, vpp: int = 1) -> list[Unit]:
    """Order in which ``stage`` runs its passes."""
    plain = pass_order(schedule, stage, pp, m, vpp)
    if plain is not None:
        return [Unit(f, mb, c) for f, mb, c in plain]
    if schedule == Schedule.ZB_H1:
        return zb_h1(stage, pp, m)
    if schedule == Schedule.ZB_V:
        return list(zb_v_orders(pp, m)[stage])
    return dualpipe(stage, pp, m)


def pass_order(schedule: Schedule, stage: int, pp: int, m: int, vpp: int = 1
               ) -> list[tuple[bool, int, int]] | None:
    """``stage_order`` as plain ``(fwd, micro-batch, chunk)`` tuples (whole passes only) for
    the schedules without split backward (GPipe, 1F1B, interleaved 1F1B); ``None`` for the
    others. The engines' fast paths walk these instead of ``Unit`` objects."""
    order = iter_pass_order(schedule, stage, pp, m, vpp)
    return None if order is None else list(order)


def iter_pass_order(schedule: Schedule, stage: int, pp: int, m: int, vpp: int = 1
                    ) -> Iterator[tuple[bool, int, int]] | None:
    """``pass_order`` one pass at a time (for a walk that may stop early)."""
    if schedule == Schedule.GPIPE:
        return _gpipe(m, vpp)
    if schedule == Schedule.INTERLEAVED and vpp > 1:
        return _interleaved(stage, pp, m, vpp)
    if schedule in SPLIT_BACKWARD:
        return None
    return _one_f_one_b(stage, pp, m)


@lru_cache(maxsize=4096)
def chunk_parts(schedule: Schedule, pp: int, vpp: int) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """(number of contiguous layer parts the model is cut into, the part each chunk of each
    stage holds): part ``c*pp + s`` for Megatron's placement, ``s`` and ``2pp-1-s`` for
    ZB-V's V, ``s`` and ``pp-1-s`` for DualPipe (two copies of the ``pp`` parts, hence
    twice the parameters per rank)."""
    if schedule == Schedule.ZB_V:
        return 2 * pp, tuple((s, 2 * pp - 1 - s) for s in range(pp))
    if schedule == Schedule.DUALPIPE:
        return pp, tuple((s, pp - 1 - s) for s in range(pp))
    return pp * vpp, tuple(tuple(c * pp + s for c in range(vpp)) for s in range(pp))


@lru_cache(maxsize=4096)
def _path(schedule: Schedule, pp: int, vpp: int, chunk: int) -> tuple[tuple[tuple[int, int], ...],
                                                                     dict[tuple[int, int], int]]:
    """The (stage, chunk) positions a micro-batch of ``chunk`` passes in forward order."""
    if schedule == Schedule.ZB_V:
        path = v_path(pp)
    elif schedule == Schedule.DUALPIPE:
        path = tuple((s, chunk) for s in (range(pp) if chunk == 0 else reversed(range(pp))))
    else:
        path = tuple((s, c) for c in range(vpp) for s in range(pp))
    return path, {sc: i for i, sc in enumerate(path)}


def _gpipe(m: int, vpp: int) -> Iterator[tuple[bool, int, int]]:
    for c in range(vpp):
        for mb in range(m):
            yield True, mb, c
    for c in reversed(range(vpp)):
        for mb in range(m):
            yield False, mb, c


def _one_f_one_b(stage: int, pp: int, m: int) -> Iterator[tuple[bool, int, int]]:
    warm = min(pp - stage - 1, m)
    for mb in range(warm):
        yield True, mb, 0
    for i in range(m - warm):
        yield True, warm + i, 0
        yield False, i, 0
    for mb in range(m - warm, m):
        yield False, mb, 0


def _interleaved_unit(k: int, pp: int, vpp: int, fwd: bool) -> tuple[bool, int, int]:
    """k-th forward (or backward) pass of Megatron's interleaved schedule."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    if not fwd:
        chunk = vpp - 1 - chunk
    return fwd, group * pp + within % pp, chunk


def _interleaved(stage: int, pp: int, m: int, vpp: int) -> Iterator[tuple[bool, int, int]]:
    total = m * vpp
    warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    for k in range(warm):
        yield _interleaved_unit(k, pp, vpp, True)
    for i in range(total - warm):
        yield _interleaved_unit(warm + i, pp, vpp, True)
        yield _interleaved_unit(i, pp, vpp, False)
    for k in range(total - warm, total):
        yield _interleaved_unit(k, pp, vpp, False)


def upstream(unit: Unit, stage: int, pp: int, vpp: int,
             schedule: Schedule = Schedule.ONE_F_ONE_B) -> tuple[int, Unit] | None:
    """The (stage, unit) whose output this unit consumes, or None for the first pass. A
    backward unit names its producer as a whole backward (``Part.WHOLE``): the producer
    may run it whole or as B; W consumes its own B."""
    if unit.part == Part.WEIGHT:
        return stage, Unit(False, unit.mb, unit.chunk, Part.INPUT)
    path, pos = _path(schedule, pp, vpp, unit.chunk)
    i = pos[(stage, unit.chunk)]
    if unit.fwd:
        if i == 0:
            return None
        s, c = path[i - 1]
        return s, Unit(True, unit.mb, c)
    if i == len(path) - 1:
        return stage, Unit(True, unit.mb, unit.chunk)     # loss -> backward on the last stage
    s, c = path[i + 1]
    return s, Unit(False, unit.mb, c)


def plain_loss_pass(fwd: bool, stage: int, chunk: int, pp: int, vpp: int) -> bool:
    """``is_loss_pass`` for the placements of ``pass_order`` (GPipe, 1F1B, interleaved):
    the forward of the last stage's last chunk."""
    return fwd and stage == pp - 1 and chunk == vpp - 1


def is_loss_pass(unit: Unit, stage: int, pp: int, vpp: int,
                 schedule: Schedule = Schedule.ONE_F_ONE_B) -> bool:
    """Whether ``unit`` is a forward pass that ends in the loss (the last position of the
    model: its backward consumes this very forward)."""
    if not unit.fwd:
        return False
    back = Unit(False, unit.mb, unit.chunk)
    return upstream(back, stage, pp, vpp, schedule) == (stage, Unit(True, unit.mb, unit.chunk))


def sends_downstream(unit: Unit, stage: int, pp: int, vpp: int,
                     schedule: Schedule = Schedule.ONE_F_ONE_B) -> bool:
    """Whether this unit's output goes to another stage (a pipeline send)."""
    if pp == 1 or unit.part == Part.WEIGHT:
        return False
    path, pos = _path(schedule, pp, vpp, unit.chunk)
    i = pos[(stage, unit.chunk)]
    if unit.fwd:
        return i < len(path) - 1 and path[i + 1][0] != stage
    return i > 0 and path[i - 1][0] != stage
