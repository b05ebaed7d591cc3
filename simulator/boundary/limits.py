"""Documented limits on input sizes and on the work one request may cause.

Sizes (``MAX_*``) are physical sanity bounds, far above any model or cluster built so far
(the largest published dense models have ~130 layers, hidden 16-25k, vocabularies of
~260k; the largest clusters ~10^5 GPUs), chosen so that a typo (an extra three zeros)
is refused in one line instead of running for minutes or exhausting memory.

Work limits bound what the discrete-event engine plays per step. Its cost grows with the
number of (micro-batch x pipeline chunk) slots: measured on the 2-core development host,
125,000 slots took 12 s and 285 MB (``complexity simulate --model llama2-7b --gpus 8
--global-batch 1000000``). ``MAX_EVENT_SLOTS`` (100,000) keeps a step under ~10 s there; a
user who wants more says so with ``--max-event-slots`` (or ``using_limits``), or uses
``--engine analytic``, whose cost does not depend on the number of micro-batches.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace
from typing import Iterator

from ..errors import InvalidInputError

MAX_GPUS = 1 << 20                  # GPUs in one cluster (and any parallel degree)
MAX_GPUS_PER_NODE = 1024            # GB200 NVL576 racks are the largest scale-up domains
MAX_NICS_PER_NODE = 64              # servers ship 8-16 scale-out NICs
MAX_NIC_GBPS = 100_000.0            # 100 Tb/s per NIC (1.6 Tb/s is the fastest shipped)
MAX_BATCH = 1 << 24                 # sequences per step / per micro-batch
MAX_SEQ_LEN = 1 << 24               # tokens per sequence
MAX_LAYERS = 10_000                 # 10k layers simulate in ~3.5 s; 100k took 20 s, 620 MB
MAX_HIDDEN = 1 << 20                # hidden, head and FFN widths
MAX_FFN = 1 << 22
MAX_HEADS = 1 << 16                 # attention heads (and KV heads)
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 16
MAX_POSITIONS = 1 << 31             # max_position_embeddings as written in a config
MAX_JSON_BYTES = 64 << 20           # a config / profile JSON larger than this is refused
MAX_JSON_DEPTH = 64                 # nesting of objects/arrays in such a JSON
MAX_CSV_BYTES = 256 << 20           # a runs CSV
MAX_CSV_ROWS = 100_000


@dataclass(frozen=True)
class WorkLimits:
    """Work one request may cause before it needs the user's consent."""

    max_event_slots: int = 100_000      # micro-batches x pipeline stages x virtual stages


_LIMITS: contextvars.ContextVar[WorkLimits] = contextvars.ContextVar("work_limits",
                                                                     default=WorkLimits())


def work_limits() -> WorkLimits:
    return _LIMITS.get()


@contextlib.contextmanager
def using_limits(**overrides: int | None) -> Iterator[WorkLimits]:
    """Raise (or lower) work limits inside the block; ``None`` keeps the current value."""
    new = replace(_LIMITS.get(), **{k: v for k, v in overrides.items() if v is not None})
    token = _LIMITS.set(new)
    try:
        yield new
    finally:
        _LIMITS.reset(token)


def check_event_slots(slots: int, what: str) -> None:
    """Refuse an event simulation of more than ``max_event_slots`` slots, naming the
    inputs that make it big."""
    limit = work_limits().max_event_slots
    if slots > limit:
        raise InvalidInputError(
            "global_batch", what,
            f"at most {limit:,} micro-batch x pipeline-chunk slots for the event engine "
            f"(this plan has {slots:,})",
            "reduce --global-batch, raise --micro-batch, use --engine analytic, or raise "
            "the limit with --max-event-slots N")
