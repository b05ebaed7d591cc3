"""DeepSpeed's pipeline engine on the event engine: its instruction order and rendezvous p2p.

Where ``Plan.pp_rendezvous`` is set (frameworks.json: DeepSpeed's ``PipelineEngine``), a
stage's compute stream runs ``parallel.deepspeed_pipe.train_commands`` in order: the passes
(1F1B order, the same as ``schedule.pass_order``) and, between them, each activation and
gradient hand-off as two blocking calls, a send on the producer's stream and a receive on
the consumer's. NCCL documents ``ncclSend`` / ``ncclRecv`` as "blocking for the GPU": a send
completes only with its matching receive. So the pair runs as a rendezvous: both tasks
wait for the other side's stream to reach the call (each depends on the task before its
partner), then both last the transfer; the receive also lasts the all-gather that
reassembles a partitioned tensor on arrival (``pipeline_send_costs``).
"""
from __future__ import annotations

from ..network.price import CollectiveCost
from ..parallel.deepspeed_pipe import (BACKWARD, FORWARD, RECV_ACT, RECV_GRAD, SEND_ACT,
                                       SEND_GRAD, train_commands)
from ..parallel.plan import Plan, Schedule
from ..parallel.schedule import Unit
from .events import Engine

# instruction -> (activation?, sending?)
_EXCHANGES = {SEND_ACT: (True, True), RECV_ACT: (True, False),
              SEND_GRAD: (False, True), RECV_GRAD: (False, False)}


def uses_rendezvous(plan: Plan) -> bool:
    """Whether the plan's pipeline runs DeepSpeed's instruction stream: its framework's
    engine (``pp_rendezvous``), more than one stage, plain 1F1B (DeepSpeed's only training
    schedule; no virtual stages)."""
    return (plan.pp_rendezvous and plan.pp > 1 and plan.vpp == 1
            and plan.schedule == Schedule.ONE_F_ONE_B)


def transfer_times_s(costs: list[CollectiveCost]) -> tuple[float, float]:
    """(send, receive) seconds of one hand-off: the sender's stream holds for the point-to-
    point transfer, the receiver's also for the all-gather that follows on arrival."""
    send = costs[0].time_s if costs else 0.0
    return send, sum(c.time_s for c in costs)


class Rendezvous:
    """The exchanges of every stage, for wiring once all stages are built: by (stage,
    activation?, sending?, micro-batch) the task and the task before it on its stream."""

    def __init__(self) -> None:
        self.calls: dict[tuple[int, bool, bool, int], tuple[int, int]] = {}

    def add(self, eng: Engine, s: int, stream: str, kind: str, mb: int, seconds: float) -> int:
        act, sending = _EXCHANGES[kind]
        before = eng.last_on(stream)
        what = "act" if act else "grad"
        tid = eng.add(f"{'send' if sending else 'recv'} {what} mb{mb}", stream, seconds,
                      stage=s, kind="pp_send" if sending else "pp_recv")
        self.calls[(s, act, sending, mb)] = (tid, before)
        return tid

    def wire(self, eng: Engine) -> None:
        """Each send waits for its receiver's stream to reach the receive, and the other
        way round (activations go to the next stage, gradients to the previous)."""
        for (s, act, sending, mb), (tid, _) in self.calls.items():
            peer = s + 1 if act == sending else s - 1
            partner = self.calls.get((peer, act, not sending, mb))
            if partner is None:
                raise ValueError(f"stage {s}: {'send' if sending else 'recv'} of micro-batch "
                                 f"{mb} has no partner on stage {peer}")
            if partner[1] >= 0:
                eng.depend(tid, partner[1])


def stage_commands(s: int, plan: Plan, m: int) -> list[tuple[str, int]]:
    """``train_commands`` of stage ``s`` as (kind, micro-batch)."""
    return [(c.kind, c.mb) for c in train_commands(s, plan.pp, m)]


def pass_unit(kind: str, mb: int) -> Unit | None:
    """The pass a command runs (``None`` for an exchange)."""
    if kind == FORWARD:
        return Unit(True, mb, 0)
    if kind == BACKWARD:
        return Unit(False, mb, 0)
    return None
