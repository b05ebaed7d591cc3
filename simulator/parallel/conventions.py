"""What a run keeps in GPU memory besides the model's arithmetic: the framework's
conventions, resolved for one plan (``MemoryConventions``), and how they come from a named
framework (``conventions_for``).

Facts and their sources live in ``simulator/frameworks/frameworks.json`` ("memory"); this
module gives them types and applies precision and ZeRO stage. An explicit choice (e.g.
``--grad-dtype``) overrides the framework's default.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import InvalidInputError
from ..frameworks import FrameworkMemory
from ..hardware.specs import Dtype


class LossImpl(str, Enum):
    """Cross-entropy implementation; what each keeps is ``frameworks.LOSS_BYTES`` (data)."""

    EAGER = "eager"              # F.cross_entropy(logits.float()): fp32 log-softmax saved
    MEGATRON = "megatron"        # vocab-parallel CE: one fp32 softmax, updated in place
    FUSED = "fused"              # flash-attn / Liger style: 16-bit logits saved, 16-bit grad
    TE_INPLACE = "te-inplace"    # Transformer Engine 2.2-2.17: grad written into the logits


class BucketKind(str, Enum):
    VIEWS = "views"              # buckets are views of the gradient buffer (Megatron)
    COPIES = "copies"            # a copy of every gradient (torch DDP default)
    IPG = "ipg"                  # one reduction buffer of ``dp_bucket_buffer_elements``


@dataclass(frozen=True)
class MemoryConventions:
    """Resolved memory conventions of one plan. Defaults: Megatron-style mixed precision
    (16-bit weights, fp32 gradients, fp32 master + Adam m, v), bucket views, Megatron's
    cross-entropy, fused SwiGLU, Transformer Engine's FP8 weight cache, no dropout.

    ``grad_dtype`` is the gradient buffer under mixed precision (fp32 plans always keep
    fp32 gradients). ``fp8_weight_copy_bytes_per_param`` counts per decoder linear
    parameter and only when the GEMMs run in FP8: an extra cached copy, or, with
    ``fp8_primary_weights``, the weight itself in place of its 16-bit bytes.
    """

    weights_fp32: bool = False
    master_weights: bool = True
    grad_dtype: Dtype = Dtype.FP32
    extra_grad_bytes_per_param: float = 0.0
    optimizer_state_bytes_per_param: float = 8.0
    optimizer_grad_copy: bool = False
    optimizer_step_temp_bytes_per_param: float = 0.0
    optimizer_step_pass_bytes_per_param: float = 0.0   # an unfused step: passes x moment bytes
    optimizer_offload: bool = False
    fp8_weight_copy_bytes_per_param: float = 2.0
    fp8_primary_weights: bool = False        # FP8 bytes replace the 16-bit linear weights
    loss: LossImpl = LossImpl.MEGATRON
    fused_swiglu: bool = True
    dropout: bool = False
    dp_buckets: BucketKind = BucketKind.VIEWS
    dp_bucket_buffer_elements: float = 0.0
    fsdp_prefetch_layers: int = 1
    fsdp_root_resharded: bool = False
    fsdp_embedding_unit: bool = False        # the embedding is its own FSDP unit (torchtitan)
    fsdp_reduce_fp32: bool = False           # FSDP's reduce-scatter in fp32 (else 16-bit)
    fsdp_pp_once_per_step: bool = False      # with PP: gather / reduce once per step
    moe_weighted_activation: bool = False    # MoE combine keeps no expert outputs
    eager_elementwise: bool = False          # norms, RoPE, SwiGLU as eager model code
    eager_code: str = ""                     # whose eager code ("" transformers; frameworks.EAGER)
    selective_recompute: str = "attention"   # Recompute.SELECTIVE: "attention" or "op" (SAC)
    param_layout: str = "fused"              # the model code's Linears (cost.host.ParamLayout)
    recompute_early_stop: bool = False       # full recompute by torch's non-reentrant checkpoint
    zero3_reuse_window_params: float = 0.0   # ZeRO-3 keeps gathers reused within this (elements)
    zero3_persistence_threshold_hidden: float = 0.0   # ZeRO-3 keeps tensors <= this x hidden whole
    zero3_prefetch_bucket_hidden2: float = 0.0        # DeepSpeed's gather bucket / h^2; 0: per unit
    zero3_reduce_bucket_hidden2: float = 0.0          # its reduce bucket / hidden^2
    zero3_linear_function: bool = False      # at ZeRO-3 every Linear is an autograd Function
    framework: str = ""

    def __post_init__(self) -> None:
        for name, enum in (("grad_dtype", Dtype), ("loss", LossImpl), ("dp_buckets", BucketKind)):
            v = getattr(self, name)
            if not isinstance(v, enum):
                try:
                    object.__setattr__(self, name, enum(v))
                except ValueError:
                    raise InvalidInputError(name, v, ", ".join(e.value for e in enum)) from None
        if self.grad_dtype not in (Dtype.FP32, Dtype.BF16, Dtype.FP16):
            raise InvalidInputError("grad_dtype", self.grad_dtype.value, "fp32, bf16 or fp16")
        for name in ("extra_grad_bytes_per_param", "optimizer_state_bytes_per_param",
                     "optimizer_step_temp_bytes_per_param", "fp8_weight_copy_bytes_per_param",
                     "dp_bucket_buffer_elements"):
            if getattr(self, name) < 0:
                raise InvalidInputError(name, getattr(self, name), "a value >= 0")
        if self.fsdp_prefetch_layers < 0:
            raise InvalidInputError("fsdp_prefetch_layers", self.fsdp_prefetch_layers, ">= 0")


def _sixteen(precision: Dtype) -> Dtype:
    """The 16-bit dtype a mixed-precision run keeps gradients in (fp8 GEMMs: bf16)."""
    return Dtype.FP16 if precision == Dtype.FP16 else Dtype.BF16


def conventions_for(fw: FrameworkMemory, precision: Dtype | str,
                    grad_dtype: Dtype | str | None = None) -> MemoryConventions:
    """``fw``'s conventions for a run in ``precision``; ``grad_dtype`` (explicit) wins over
    the framework's gradient dtype."""
    prec = Dtype(precision)
    if prec == Dtype.FP32:
        grad = Dtype.FP32
    elif grad_dtype is not None:
        grad = Dtype(grad_dtype)
    else:
        grad = Dtype.FP32 if fw.grad_dtype[prec.value] == "fp32" else _sixteen(prec)
    weights_fp32 = fw.params == "fp32"
    pure = fw.optimizer_state == "param" and prec != Dtype.FP32 and not weights_fp32
    state_bytes = 2.0 * _sixteen(prec).bytes if pure else 8.0
    extra = float(_sixteen(prec).bytes) \
        if prec.value in fw.extra_16bit_grads and grad == Dtype.FP32 else 0.0
    return MemoryConventions(
        weights_fp32=weights_fp32, master_weights=fw.master_weights and not weights_fp32,
        grad_dtype=grad, extra_grad_bytes_per_param=extra,
        optimizer_state_bytes_per_param=state_bytes, optimizer_grad_copy=fw.optimizer_grad_copy,
        optimizer_step_temp_bytes_per_param=state_bytes / 2 if fw.optimizer_foreach else 0.0,
        optimizer_step_pass_bytes_per_param=fw.optimizer_step_passes * state_bytes / 2,
        optimizer_offload=fw.optimizer_offload,
        fp8_weight_copy_bytes_per_param=fw.fp8_weight_copy_bytes_per_param,
        fp8_primary_weights=fw.fp8_primary_weights, loss=LossImpl(fw.loss),
        fused_swiglu=fw.fused_swiglu, dropout=fw.dropout, dp_buckets=BucketKind(fw.dp_buckets),
        dp_bucket_buffer_elements=fw.dp_bucket_buffer_elements,
        fsdp_prefetch_layers=fw.fsdp_prefetch_layers, fsdp_root_resharded=fw.fsdp_root_resharded,
        fsdp_embedding_unit=fw.fsdp_embedding_unit,
        fsdp_reduce_fp32=fw.fsdp_reduce_fp32, fsdp_pp_once_per_step=fw.fsdp_pp_once_per_step,
        moe_weighted_activation=fw.moe_weighted_activation,
        eager_elementwise=fw.eager_elementwise, eager_code=fw.eager_code,
        selective_recompute=fw.selective_recompute, param_layout=fw.param_layout,
        recompute_early_stop=fw.recompute_early_stop,
        zero3_reuse_window_params=fw.zero3_reuse_window_params,
        zero3_persistence_threshold_hidden=fw.zero3_persistence_threshold_hidden,
        zero3_prefetch_bucket_hidden2=fw.zero3_prefetch_bucket_hidden2,
        zero3_reduce_bucket_hidden2=fw.zero3_reduce_bucket_hidden2,
        zero3_linear_function=fw.zero3_linear_function, framework=fw.name)
