"""The operator graph of a traced ``torch.nn.Module`` (plain data; no torch needed).

``trace_torch.trace_module`` fills these; the roofline report, the DDP / FSDP simulation
and the what-ifs read them. Each ``TracedOp`` wraps the simulator's ``Op`` (kind, FLOPs,
bytes moved, GEMM shape, dtype) and adds what only a trace knows: the ATen overload, the
phase, the owning module path, tensor shapes, bytes read and written, the parameters it
touches, its data dependencies and, for operators run inside a custom
``torch.autograd.Function``, that function's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ops import Op, OpKind

FORWARD, LOSS, BACKWARD = "forward", "loss", "backward"


@dataclass(frozen=True)
class TracedOp:
    """One ATen operator (or a fused group, e.g. ``fused.sdpa``) as it ran in the trace."""

    index: int
    op: Op
    aten: str                                   # "aten.addmm.default", "fused.sdpa", ...
    phase: str                                  # FORWARD, LOSS or BACKWARD
    module: str                                 # owning module path ("" = the root)
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    bytes_read: float
    bytes_written: float
    deps: tuple[int, ...] = ()                  # indices of the ops producing its inputs
    params: tuple[str, ...] = ()                # parameters it reads (forward) / grads of
    custom: str = ""                            # autograd.Function class, if inside one
    fused: int = 1                              # ATen calls merged into this op

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def kind(self) -> OpKind:
        return self.op.kind

    @property
    def flops(self) -> float:
        return self.op.flops

    @property
    def bytes_moved(self) -> float:
        return self.op.bytes_moved

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (0 for pure data movement)."""
        return self.op.flops / self.op.bytes_moved if self.op.bytes_moved > 0 else 0.0


@dataclass(frozen=True)
class ParamInfo:
    """One parameter (deduplicated: tied weights appear once, under their first name)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    nbytes: int
    module: str
    requires_grad: bool = True


@dataclass(frozen=True)
class GradReady:
    """A parameter's gradient is complete once op ``after_op`` has run (DDP's hook point)."""

    param: str
    after_op: int


@dataclass(frozen=True)
class TracedGraph:
    """Forward, loss and backward ops of one training step on one (unsharded) rank."""

    name: str
    ops: tuple[TracedOp, ...]
    params: tuple[ParamInfo, ...]               # in ``module.parameters()`` order
    grad_ready: tuple[GradReady, ...]           # in the order gradients became ready
    saved_activation_bytes: float               # tensors autograd kept for backward
    buffer_bytes: float
    input_bytes: float
    custom_functions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    # ---- totals ----------------------------------------------------------------------
    def phase_ops(self, *phases: str) -> list[TracedOp]:
        return [o for o in self.ops if o.phase in phases]

    @property
    def forward_flops(self) -> float:
        """FLOPs of the model's forward (the loss is reported separately)."""
        return sum(o.flops for o in self.ops if o.phase == FORWARD)

    @property
    def loss_flops(self) -> float:
        return sum(o.flops for o in self.ops if o.phase == LOSS)

    @property
    def backward_flops(self) -> float:
        return sum(o.flops for o in self.ops if o.phase == BACKWARD)

    @property
    def total_flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def param_count(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def trainable_param_count(self) -> int:
        return sum(p.numel for p in self.params if p.requires_grad)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def param(self, name: str) -> ParamInfo:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def unused_params(self) -> list[str]:
        ready = {g.param for g in self.grad_ready}
        return [p.name for p in self.params if p.requires_grad and p.name not in ready]

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "forward_flops": self.forward_flops,
            "backward_flops": self.backward_flops,
            "loss_flops": self.loss_flops,
            "params": self.param_count,
            "trainable_params": self.trainable_param_count,
            "param_bytes": self.param_bytes,
            "saved_activation_bytes": self.saved_activation_bytes,
            "buffer_bytes": self.buffer_bytes,
            "input_bytes": self.input_bytes,
            "n_ops": len(self.ops),
            "custom_functions": list(self.custom_functions),
            "unused_params": self.unused_params(),
            "notes": list(self.notes),
        }
