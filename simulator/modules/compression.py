"""DDP gradient-compression hooks as the simulator prices them: PowerSGD, fp16, bf16.

Each hook turns one gradient bucket into a sequence of ``Step``s: compute on the compute
stream (at the moment the bucket becomes ready, as the hook runs inside the autograd
hook), all-reduce messages, and compute in the hook's future callbacks. The messages follow
``torch.distributed.algorithms.ddp_comm_hooks`` exactly:

* default (no hook): the bucket is divided by the world size and all-reduced;
* ``fp16_compress_hook`` / ``bf16_compress_hook``: cast to 16 bits and divide
  (``buffer.to(dtype).div_(world)``), all-reduce half the bytes, copy back into the bucket;
* ``powerSGD_hook`` (rank ``r``, after ``start_powerSGD_iter``): every gradient is viewed as
  a matrix ``n x m`` (``tensor.view(shape[0], -1)``) and compressed when
  ``(n + m) * r * min_compression_rate < n * m`` with ``r = min(n, m, rank)``; the others
  (biases, norms: 1-D tensors, small matrices) are concatenated and all-reduced as they are.
  Three all-reduces per bucket, in sequence: the uncompressed tensors, all ``P`` (``sum n*r``
  elements), all ``Q`` (``sum m*r``). Extra compute: error feedback (add the previous
  error, keep a copy, subtract after decompression), orthogonalisation of ``Q`` (warm
  start) and ``P`` (Gram-Schmidt for ``r <= 2``, QR otherwise), and three matmuls per
  matrix (``P = MQ``, ``Q = M^T P``, ``M = P Q^T``: ``6 n m r`` FLOPs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..cost.kernels import gemm_time_s, memory_time_s
from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec

HOOKS = ("none", "fp16", "bf16", "powersgd")


@dataclass(frozen=True)
class CompressionSpec:
    """A DDP communication hook and its settings (PowerSGD defaults as in torch)."""

    hook: str = "none"
    rank: int = 1                         # PowerSGD matrix_approximation_rank
    min_compression_rate: float = 2.0
    warm_start: bool = True
    error_feedback: bool = True

    def __post_init__(self) -> None:
        if self.hook not in HOOKS:
            raise InvalidInputError("compression", self.hook, f"one of {', '.join(HOOKS)}")
        if self.rank < 1:
            raise InvalidInputError("powersgd_rank", self.rank, "a rank >= 1")

    @property
    def label(self) -> str:
        return f"powersgd-r{self.rank}" if self.hook == "powersgd" else self.hook


@dataclass(frozen=True)
class Step:
    """``kind`` "compute" (``seconds`` on ``where``: "compute" or "hook") or "comm" (``nbytes``)."""

    kind: str
    label: str
    seconds: float = 0.0
    nbytes: float = 0.0
    where: str = "compute"


@dataclass(frozen=True)
class PowerSGDSplit:
    """How PowerSGD treats one bucket: element counts of its three messages."""

    uncompressed_numel: int
    p_numel: int
    q_numel: int
    matrices: tuple[tuple[int, int, int], ...]     # (n, m, r) per compressed gradient

    def message_numels(self) -> tuple[int, int, int]:
        return self.uncompressed_numel, self.p_numel, self.q_numel


def powersgd_split(shapes: Sequence[tuple[int, ...]], rank: int,
                   min_compression_rate: float = 2.0) -> PowerSGDSplit:
    """Which gradients of a bucket PowerSGD compresses, and its message sizes."""
    unc = p = q = 0
    mats = []
    for shape in shapes:
        numel = math.prod(shape) if shape else 1
        n = shape[0] if shape else 1
        m = numel // n if n else 0
        r = min(n, m, rank)
        if n and m and (n + m) * r * min_compression_rate < n * m:
            p, q = p + n * r, q + m * r
            mats.append((n, m, r))
        else:
            unc += numel
    return PowerSGDSplit(unc, p, q, tuple(mats))


def _orthogonalize_s(rows: int, r: int, dtype: str, gpu: GPUSpec, prof: Profile) -> float:
    """Orthogonalise a ``rows x r`` matrix: Gram-Schmidt (``r <= 2``: ~5 small kernels per
    column) or a QR (about ``4 rows r^2`` FLOPs, a handful of kernels)."""
    eb = 2 if dtype in ("fp16", "bf16") else 4
    if r <= 2:
        return memory_time_s(rows * r * eb * 4.0 * r, gpu, prof, kernels=5 * r)
    return gemm_time_s(rows, r, r, dtype, gpu, prof) * 2 + memory_time_s(
        rows * r * eb * 2.0, gpu, prof, kernels=4)


def _powersgd_steps(shapes, numel: int, eb: int, dtype: str, spec: CompressionSpec,
                    gpu: GPUSpec, prof: Profile) -> list[Step]:
    sp = powersgd_split(shapes, spec.rank, spec.min_compression_rate)
    pre = memory_time_s(5.0 * numel * eb, gpu, prof, kernels=2) if spec.error_feedback else 0.0
    pre += memory_time_s(2.0 * sp.uncompressed_numel * eb, gpu, prof)
    mid = post = 0.0
    for n, m, r in sp.matrices:
        pre += _orthogonalize_s(m, r, dtype, gpu, prof) if spec.warm_start else 0.0
        pre += gemm_time_s(n, r, m, dtype, gpu, prof)                 # P = M Q
        mid += _orthogonalize_s(n, r, dtype, gpu, prof) + gemm_time_s(m, r, n, dtype, gpu, prof)
        post += gemm_time_s(n, m, r, dtype, gpu, prof)                # M = P Q^T
    post += memory_time_s(sp.q_numel * eb * 2.0, gpu, prof)            # Q /= world
    if spec.error_feedback:
        post += memory_time_s(3.0 * numel * eb, gpu, prof)             # error = copy - M
    unpack = memory_time_s(4.0 * sp.uncompressed_numel * eb, gpu, prof, kernels=2)
    return [Step("compute", "powersgd: error feedback + P = MQ", seconds=pre),
            Step("comm", "all-reduce uncompressed", nbytes=sp.uncompressed_numel * eb),
            Step("compute", "unpack uncompressed", seconds=unpack, where="hook"),
            Step("comm", "all-reduce P", nbytes=sp.p_numel * eb),
            Step("compute", "orthogonalize P, Q = M^T P", seconds=mid, where="hook"),
            Step("comm", "all-reduce Q", nbytes=sp.q_numel * eb),
            Step("compute", "decompress M = P Q^T", seconds=post, where="hook")]


def bucket_steps(shapes: Sequence[tuple[int, ...]], elem_bytes: int, dtype: str,
                 spec: CompressionSpec, gpu: GPUSpec, prof: Profile) -> list[Step]:
    """The steps that reduce one bucket holding gradients of ``shapes``."""
    numel = sum(math.prod(s) if s else 1 for s in shapes)
    nbytes = numel * elem_bytes
    if spec.hook == "none":
        return [Step("compute", "divide by world size", seconds=memory_time_s(2.0 * nbytes, gpu, prof)),
                Step("comm", "all-reduce bucket", nbytes=nbytes)]
    if spec.hook in ("fp16", "bf16"):
        half = numel * 2
        cast = memory_time_s(nbytes + half + 2.0 * half, gpu, prof, kernels=2)
        back = memory_time_s(half + nbytes, gpu, prof)
        return [Step("compute", f"cast to {spec.hook} and divide", seconds=cast),
                Step("comm", f"all-reduce {spec.hook} bucket", nbytes=half),
                Step("compute", "copy back to fp32", seconds=back, where="hook")]
    return _powersgd_steps(shapes, numel, elem_bytes, dtype, spec, gpu, prof)


def message_bytes(steps: Sequence[Step]) -> list[float]:
    return [s.nbytes for s in steps if s.kind == "comm"]


# ---- what-if -----------------------------------------------------------------------------------


DEFAULT_OPTIONS = (CompressionSpec("none"), CompressionSpec("fp16"), CompressionSpec("bf16"),
                   CompressionSpec("powersgd", rank=1), CompressionSpec("powersgd", rank=4),
                   CompressionSpec("powersgd", rank=16))


