"""The passes a pipeline schedule orders: one forward, or one backward (whole, or split
into its input-gradient and weight-gradient halves), of one micro-batch through one chunk."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Part(str, Enum):
    """Which part of a pass a unit is. Zero-bubble schedules (Qi et al. 2024, arXiv
    2401.10241 sec. 2) split the backward pass into B, the gradient with respect to the
    layer inputs (which the previous stage waits for), and W, the gradient with respect to
    the weights (which nothing waits for until the optimizer step)."""

    WHOLE = "whole"      # a forward pass, or a backward pass that is not split
    INPUT = "input"      # B: backward for the input (activation) gradients only
    WEIGHT = "weight"    # W: backward for the weight gradients only


@dataclass(frozen=True)
class Unit:
    """One forward (``fwd=True``) or backward pass of micro-batch ``mb`` through ``chunk``;
    ``part`` says whether a backward pass is whole or only its B or W half.
    ``paired``: the unit runs as one block with the next unit of its stage (DualPipe's
    overlapped forward&backward chunk pair): its output leaves when the pair ends, as in the
    reference implementation, which sends both outputs after the pair; not part of the
    unit's identity. ``overlapped``: a paired unit's pair also runs each pass's
    communication beside the other's compute (``engine.pair_overlap``); the reference
    leaves one pair of the middle ranks unoverlapped."""

    fwd: bool
    mb: int
    chunk: int
    part: Part = Part.WHOLE
    paired: bool = field(default=False, compare=False)
    overlapped: bool = field(default=True, compare=False)

    @property
    def releases_activations(self) -> bool:
        """Whether the micro-batch's saved activations for this chunk are freed when this
        unit ends: at a whole backward, or at W (which still reads the layer inputs and the
        output gradients that B computed; see ``simulator.memory.accounting``)."""
        return not self.fwd and self.part != Part.INPUT

    @property
    def label(self) -> str:
        """``F``, ``B`` (whole backward, or its input-gradient half) or ``W``."""
        return "F" if self.fwd else ("W" if self.part == Part.WEIGHT else "B")
