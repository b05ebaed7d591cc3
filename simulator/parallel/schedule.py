"""Pipeline schedules as ordered per-stage lists of (pass, micro-batch, chunk).

The bubble is not a formula here: the event engine plays these orders against the
cross-stage dependencies and the idle time falls out.
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import Schedule


@dataclass(frozen=True)
class Unit:
    """One forward (``fwd=True``) or backward pass of micro-batch ``mb`` through ``chunk``."""

    fwd: bool
    mb: int
    chunk: int


def stage_order(schedule: Schedule, stage: int, pp: int, m: int, vpp: int = 1) -> list[Unit]:
    """Order in which ``stage`` runs its passes."""
    if schedule == Schedule.GPIPE:
        return _gpipe(m, vpp)
    if schedule == Schedule.INTERLEAVED and vpp > 1:
        return _interleaved(stage, pp, m, vpp)
    return _one_f_one_b(stage, pp, m)


def _gpipe(m: int, vpp: int) -> list[Unit]:
    fwd = [Unit(True, mb, c) for c in range(vpp) for mb in range(m)]
    bwd = [Unit(False, mb, c) for c in reversed(range(vpp)) for mb in range(m)]
    return fwd + bwd


def _one_f_one_b(stage: int, pp: int, m: int) -> list[Unit]:
    warm = min(pp - stage - 1, m)
    order = [Unit(True, mb, 0) for mb in range(warm)]
    for i in range(m - warm):
        order.append(Unit(True, warm + i, 0))
        order.append(Unit(False, i, 0))
    order += [Unit(False, mb, 0) for mb in range(m - warm, m)]
    return order


def _interleaved_unit(k: int, pp: int, vpp: int, fwd: bool) -> Unit:
    """k-th forward (or backward) unit of Megatron's interleaved schedule."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    if not fwd:
        chunk = vpp - 1 - chunk
    return Unit(fwd, group * pp + within % pp, chunk)


def _interleaved(stage: int, pp: int, m: int, vpp: int) -> list[Unit]:
    total = m * vpp
    warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    order = [_interleaved_unit(k, pp, vpp, True) for k in range(warm)]
    for i in range(total - warm):
        order.append(_interleaved_unit(warm + i, pp, vpp, True))
        order.append(_interleaved_unit(i, pp, vpp, False))
    order += [_interleaved_unit(k, pp, vpp, False) for k in range(total - warm, total)]
    return order


def upstream(unit: Unit, stage: int, pp: int, vpp: int) -> tuple[int, Unit] | None:
    """The (stage, unit) whose output this unit consumes, or None for the first pass."""
    if unit.fwd:
        if stage > 0:
            return stage - 1, unit
        if unit.chunk > 0:
            return pp - 1, Unit(True, unit.mb, unit.chunk - 1)
        return None
    if stage < pp - 1:
        return stage + 1, unit
    if unit.chunk < vpp - 1:
        return 0, Unit(False, unit.mb, unit.chunk + 1)
    return stage, Unit(True, unit.mb, vpp - 1)      # loss -> backward on the last stage


def sends_downstream(unit: Unit, stage: int, pp: int, vpp: int) -> bool:
    """Whether this unit's output goes to another stage (a pipeline send)."""
    if pp == 1:
        return False
    if unit.fwd:
        return stage < pp - 1 or unit.chunk < vpp - 1
    return stage > 0 or unit.chunk > 0
