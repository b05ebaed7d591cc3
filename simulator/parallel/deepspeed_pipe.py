"""DeepSpeed's pipeline engine: the instruction stream its ``TrainSchedule`` gives a stage.

DeepSpeed (``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule.steps``, unchanged from the
engine's first version to deepspeedai/DeepSpeed @ edaa7221) runs ``2 (m + pp - 1)`` steps. On
each step a stage runs one forward or one backward pass (or nothing, while the pipeline
fills or drains); even stages run forwards on even steps and backwards on odd ones, odd
stages the other way round. Before the pass it exchanges tensors with its neighbours, and
it sends a pass's output only on its *next* step:

* forward step: ``SendGrad(previous step's micro-batch)`` to the previous stage, then
  ``RecvActivation(this micro-batch)`` from it, then ``ForwardPass``;
* backward step: ``RecvGrad(this micro-batch)`` from the next stage, then
  ``SendActivation(previous step's micro-batch)`` to it, then ``BackwardPass``.

Each send and receive is its own blocking call (``deepspeed/runtime/pipe/p2p.py``:
``dist.send`` / ``dist.recv``, or a broadcast in a two-rank group on torch < 1.8), so both
sides' streams wait for the transfer, and a send cannot finish before its receiver has
reached the matching receive (``simulator.engine.ds_pipe`` plays that rendezvous).
"""
from __future__ import annotations

from dataclasses import dataclass

FORWARD, BACKWARD = "forward", "backward"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "send_act", "recv_act", "send_grad", "recv_grad"


@dataclass(frozen=True)
class Command:
    """One instruction of a stage: a pass (``FORWARD`` / ``BACKWARD``) or an exchange of a
    micro-batch's activation or gradient with a neighbour (``SEND_ACT`` ... ``RECV_GRAD``)."""

    kind: str
    mb: int


def _step_to_micro_batch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """(micro-batch, is forward) of ``step`` on ``stage``, as ``TrainSchedule`` maps them
    (the micro-batch may be out of range: an idle step)."""
    even_step, even_stage = step % 2 == 0, stage % 2 == 0
    if even_step and even_stage:
        return step // 2 - stage // 2, True
    if not even_step and not even_stage:
        return (step - 1) // 2 - stage // 2, True
    if even_step:                                      # odd stage, backward
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def train_commands(stage: int, stages: int, micro_batches: int) -> list[Command]:
    """The instructions ``TrainSchedule`` gives ``stage`` of ``stages`` for one batch of
    ``micro_batches`` (without the batch loads and the final gradient reduction and
    optimizer step, which the simulator prices elsewhere)."""
    if not 0 <= stage < stages or micro_batches < 1:
        raise ValueError(f"stage {stage} of {stages}, {micro_batches} micro-batches")

    def valid(mb: int) -> bool:
        return 0 <= mb < micro_batches
    first, last = stage == 0, stage == stages - 1
    out: list[Command] = []
    prev = -1
    for step in range(2 * (micro_batches + stages - 1)):
        mb, fwd = _step_to_micro_batch(step, stage, stages)
        if fwd and not first:
            if valid(prev):
                out.append(Command(SEND_GRAD, prev))
            if valid(mb):
                out.append(Command(RECV_ACT, mb))
        elif not fwd and not last:
            if valid(mb):
                out.append(Command(RECV_GRAD, mb))
            if valid(prev):
                out.append(Command(SEND_ACT, prev))
        if valid(mb):
            out.append(Command(FORWARD if fwd else BACKWARD, mb))
        prev = mb
    return out
