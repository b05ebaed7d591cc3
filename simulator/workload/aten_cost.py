"""FLOPs, GEMM shape and kind of one ATen operator, from shapes alone (no torch needed).

The tracer (``trace_torch``) hands each recorded operator here as plain Python values:
the overload name (``"aten.addmm.default"``), the shapes of its tensor arguments in
argument order, the non-tensor arguments, and the output shapes.

FLOP convention (the one ``torch.utils.flop_counter.FlopCounterMode`` uses, so the two
agree): a multiply-add is 2 FLOPs; only matmul-class operators (``mm``, ``addmm``,
``bmm``, ``baddbmm``, ``_scaled_mm``, convolutions and their backward, fused attention)
carry FLOPs; bias adds and element-wise / reduction operators count 0 and are priced by
the bytes they move.

Convolutions are described as implicit GEMMs: ``batch = groups`` independent GEMMs of
``m = N * prod(output spatial)`` rows, ``n = C_out / groups`` columns and
``k = C_in / groups * prod(kernel)`` depth (transposed convolutions swap the roles of the
input and output spatial extents).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .ops import OpKind

Shape = tuple[int, ...]

GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
CONV_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution",
                      "convolution_overrideable", "_slow_conv2d_forward",
                      "mkldnn_convolution"})
# fused attention kernels as ATen exposes them (CUDA / CPU flash, memory-efficient, cuDNN)
ATTN_FWD_OPS = frozenset({"_scaled_dot_product_flash_attention",
                          "_scaled_dot_product_efficient_attention",
                          "_scaled_dot_product_cudnn_attention",
                          "_scaled_dot_product_flash_attention_for_cpu",
                          "_flash_attention_forward", "_efficient_attention_forward"})
ATTN_BWD_OPS = frozenset({name + "_backward" for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention", "_efficient_attention")})
# operators that only allocate (no bytes moved) and operators that only alias
ALLOC_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                       "new_empty_strided", "resize_", "set_"})
ALIAS_OPS = frozenset({"_unsafe_view", "detach", "alias", "lift_fresh", "lift_fresh_copy",
                       "_reshape_alias", "view", "t", "transpose", "permute", "expand",
                       "unsqueeze", "squeeze", "select", "slice", "as_strided",
                       "_unsafe_view_copy", "unfold", "diagonal", "split", "chunk",
                       "unbind", "split_with_sizes", "narrow", "view_as", "expand_as"})


@dataclass(frozen=True)
class AtenCost:
    """What the simulator needs to price one operator."""

    kind: OpKind
    flops: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1


def packet_name(overload: str) -> str:
    """``"aten.addmm.default"`` -> ``"addmm"``."""
    parts = overload.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]


def _prod(xs: Sequence[int]) -> int:
    return int(math.prod(int(x) for x in xs))


def _gemm(m: int, n: int, k: int, batch: int = 1) -> AtenCost:
    return AtenCost(OpKind.GEMM, 2.0 * batch * m * n * k, m, n, k, batch)


def _matmul_cost(name: str, shapes: Sequence[Shape]) -> AtenCost:
    """mm(a, b), addmm(bias, a, b), bmm(a, b), baddbmm(c, a, b), _scaled_mm(a, b, ...)."""
    a, b = (shapes[1], shapes[2]) if name in ("addmm", "baddbmm") else (shapes[0], shapes[1])
    if name in ("bmm", "baddbmm"):
        return _gemm(a[1], b[2], a[2], a[0])
    return _gemm(a[0], b[1], a[1])


def conv_gemm(x: Shape, w: Shape, out: Shape, transposed: bool, groups: int) -> AtenCost:
    """Implicit-GEMM view of a forward convolution (see module doc)."""
    g = max(1, int(groups))
    kernel = _prod(w[2:])
    if not transposed:                      # w: [C_out, C_in/g, *k]
        return _gemm(x[0] * _prod(out[2:]), w[0] // g, w[1] * kernel, g)
    # transposed: w: [C_in, C_out/g, *k]; work scales with the input spatial extent
    return _gemm(x[0] * _prod(x[2:]), w[1], (w[0] // g) * kernel, g)


def _conv_cost(shapes: Sequence[Shape], args: Sequence[Any], out: Sequence[Shape]) -> AtenCost:
    transposed, groups = bool(args[6]), int(args[8])
    return conv_gemm(shapes[0], shapes[1], out[0], transposed, groups)


def _conv_backward_cost(shapes: Sequence[Shape], args: Sequence[Any]) -> AtenCost:
    """convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask): one forward-sized implicit GEMM for
    the input gradient and one for the weight gradient, as ``output_mask`` asks."""
    grad_out, x, w = shapes[0], shapes[1], shapes[2]
    transposed, groups, mask = bool(args[7]), int(args[9]), args[10]
    fwd = conv_gemm(x, w, grad_out, transposed, groups)
    n_grads = int(bool(mask[0])) + int(bool(mask[1]))
    if n_grads == 0:
        return AtenCost(OpKind.MEMORY)
    return _gemm(fwd.m, fwd.n, fwd.k, fwd.batch * n_grads)


def sdpa_flops(q: Shape, k: Shape, v: Shape, backward: bool) -> float:
    """Non-causal attention FLOPs on ``[..., seq, dim]`` tensors (heads folded into the
    leading dims, grouped KV heads broadcast to the query heads). Forward: ``QK^T`` and
    ``PV``; backward: the scores are re-formed and four more products taken
    (``dV, dP, dQ, dK``), as FlopCounterMode counts."""
    bh, s_q, d_q = _prod(q[:-2]), q[-2], q[-1]
    s_k, d_v = k[-2], v[-1]
    if backward:
        return 2.0 * bh * s_q * s_k * (3 * d_q + 2 * d_v)
    return 2.0 * bh * s_q * s_k * (d_q + d_v)


def _bshd_to_bhsd(s: Shape) -> Shape:
    """``_flash_attention_*`` / ``_efficient_attention_*`` use ``[batch, seq, heads, dim]``."""
    return (s[0], s[2], s[1], s[3]) if len(s) == 4 else s


def _attention_cost(name: str, shapes: Sequence[Shape]) -> AtenCost:
    backward = name in ATTN_BWD_OPS
    q, k, v = shapes[1:4] if backward else shapes[0:3]
    if name.startswith(("_flash_attention", "_efficient_attention")):
        q, k, v = _bshd_to_bhsd(q), _bshd_to_bhsd(k), _bshd_to_bhsd(v)
    return AtenCost(OpKind.ATTENTION, sdpa_flops(q, k, v, backward))


def aten_cost(overload: str, shapes: Sequence[Shape], args: Sequence[Any],
              out_shapes: Sequence[Shape]) -> AtenCost:
    """Kind and FLOPs of one ATen call.

    ``shapes``: shapes of the tensor arguments in argument order; ``args``: the positional
    arguments with tensors replaced by their shapes; ``out_shapes``: output shapes.
    """
    name = packet_name(overload)
    try:
        if name in GEMM_OPS:
            return _matmul_cost(name, shapes)
        if name in CONV_OPS:
            return _conv_cost(shapes, args, out_shapes)
        if name == "convolution_backward":
            return _conv_backward_cost(shapes, args)
        if name in ATTN_FWD_OPS or name in ATTN_BWD_OPS:
            return _attention_cost(name, shapes)     # backward: (grad_out, q, k, v, ...)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        return AtenCost(OpKind.MEMORY)
    return AtenCost(OpKind.MEMORY)


def is_alias(overload: str, is_view: bool) -> bool:
    """True for operators that return a view / alias of an input (no data moved)."""
    return is_view or packet_name(overload) in ALIAS_OPS


def is_alloc_only(overload: str) -> bool:
    return packet_name(overload) in ALLOC_OPS


DTYPE_NAMES = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
    "torch.float64": "fp64", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8",
    "torch.float8_e4m3fnuz": "fp8", "torch.float8_e5m2fnuz": "fp8",
    "torch.int64": "int64", "torch.int32": "int32", "torch.int16": "int16",
    "torch.int8": "int8", "torch.uint8": "uint8", "torch.bool": "bool",
    "torch.complex64": "c64", "torch.complex128": "c128",
}


def dtype_name(torch_dtype: Any) -> str:
    """``torch.float32`` -> ``"fp32"`` (the simulator's ``Dtype`` spelling)."""
    s = str(torch_dtype)
    return DTYPE_NAMES.get(s, s.replace("torch.", ""))
