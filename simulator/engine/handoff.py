"""Pipeline hand-offs in the closed form (the analytic engine), priced as the event
engine plays them (``step.stage_units``, ``step.pipeline_sends``, ``ds_pipe``):

* blocking sends (``Plan.pp_blocking_p2p``, Megatron's synchronous p2p): every pass whose
  output goes to another stage is followed on the sender's stream by the hand-off
  (``ds_pipe.transfer_times_s``: the send and the all-gather after it), so each such pass
  adds that time to the stage's work per micro-batch;
* DeepSpeed's engine (``ds_pipe.uses_rendezvous``): the sender's stream holds for the send
  and the receiver's for the send and the all-gather, both per hand-off;
* overlapped sends: the stream is free.

Either way the hand-offs of the first forward and of the last backward lie on the
pipeline's fill and drain, ``2 (pp - 1)`` of them, one per hop (a DeepSpeed send and its
receive are one transfer); the stream's per-micro-batch hand-offs count once per
micro-batch, not again in the fill and drain.
"""
from __future__ import annotations

from ..parallel.plan import Plan
from ..parallel.schedule import Part, sends_downstream, upstream
from ..parallel.units import Unit
from .ds_pipe import uses_rendezvous


def handoffs_per_mb(plan: Plan, stage: int) -> tuple[int, int]:
    """(sends, receives) from or to another stage per micro-batch on ``stage``: forward and
    backward pass of every model chunk it holds."""
    sends = recvs = 0
    for chunk in range(plan.vpp):
        for fwd in (True, False):
            u = Unit(fwd, 0, chunk, Part.WHOLE)
            sends += sends_downstream(u, stage, plan.pp, plan.vpp, plan.schedule)
            up = upstream(u, stage, plan.pp, plan.vpp, plan.schedule)
            recvs += up is not None and up[0] != stage
    return sends, recvs


def stream_handoff_s(plan: Plan, stage: int, times: tuple[float, float]) -> float:
    """Seconds per micro-batch the stage's compute stream holds for hand-offs; ``times`` is
    (send, send + all-gather on arrival) of one hand-off."""
    if plan.pp == 1:
        return 0.0
    sends, recvs = handoffs_per_mb(plan, stage)
    if uses_rendezvous(plan):
        return sends * times[0] + recvs * times[1]
    return sends * times[1] if plan.pp_blocking_p2p else 0.0


def fill_drain_handoff_s(plan: Plan, times: tuple[float, float]) -> float:
    """Hand-off seconds on the pipeline's fill and drain: the ``pp - 1`` hops of the first
    forward and of the last backward, each a send and what follows it on arrival."""
    return 0.0 if plan.pp == 1 else 2 * (plan.pp - 1) * times[1]
