"""Parallel strategy (``Plan``) and its validation against a model and a cluster."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..boundary import spellings
from ..errors import InvalidInputError
from ..frameworks import HOST
from ..hardware.specs import ClusterSpec, Dtype, GPUSpec
from ..workload.spec import TransformerSpec
from .conventions import MemoryConventions


class Schedule(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    # split backward (B, W): simulator.parallel.zero_bubble; two chunks per rank for ZB-V
    # and DualPipe (vpp is 2 for them)
    ZB_H1 = "zb-h1"
    ZB_V = "zb-v"
    DUALPIPE = "dualpipe"


TWO_CHUNK_SCHEDULES = (Schedule.ZB_V, Schedule.DUALPIPE)


class Recompute(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"   # Korthikanti et al. 2022: recompute attention core only
    FULL = "full"             # recompute each whole layer in backward


class AttentionImpl(str, Enum):
    FLASH = "flash"           # fused FlashAttention-2-class kernel, no s^2 tensor in HBM
    FLASH1 = "flash1"         # FlashAttention-1 / its pre-MLIR Triton port (llm-foundry 2023)
    FLASH3 = "flash3"         # Hopper+ kernels (FlashAttention-3 / cuDNN, as in Transformer Engine)
    MATERIALIZED = "materialized"


MOE_DISPATCHERS = ("alltoall", "flex")


def check_moe_dispatcher(value: str) -> None:
    """Raise ``InvalidInputError`` unless ``value`` names a dispatcher we price."""
    if value not in MOE_DISPATCHERS:
        raise InvalidInputError("moe_dispatcher", value, "one of " + ", ".join(MOE_DISPATCHERS))


def flex_fits(model: TransformerSpec, tp: int, ep: int) -> bool:
    """Whether an MoE model can run Megatron's flex dispatcher at this split as modelled:
    it needs TP x EP > 1, and expert tensor parallelism under it is not modelled, so
    ep > 1 and tp = 1 (dense models: always)."""
    return model.moe is None or (ep > 1 and tp == 1)


@dataclass(frozen=True)
class Plan:
    """How one training step is laid over the GPUs.

    ``micro_batch`` and ``global_batch`` count sequences. ``vpp`` is virtual stages per
    rank (interleaved 1F1B; 2 for ZB-V and DualPipe, set when left at 1). ``ep`` splits experts inside the data-parallel group
    (Megatron convention: ep divides dp*cp... here ep must divide dp).
    ``dp_bucket_bytes`` sizes gradient-reduction buckets when ``dp_overlap`` is on (0 =
    framework default, see ``bucket_params``).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    # under FULL recompute, how many layers of each model chunk are recomputed, its first
    # ones (Megatron's --recompute-method block --recompute-num-layers N); 0: every layer.
    # Only the count matters to time and memory, so torchtitan's every-k-th-layer option and
    # fms-fsdp's share of layers are the same count placed elsewhere in the chunk
    recompute_layers: int = 0
    zero_stage: int = 0
    # ZeRO-3 / FSDP shard group: 0 shards over all dp x cp ranks; HSDP (FSDP's HYBRID_SHARD,
    # torchtitan's dp_shard with dp_replicate) shards within groups of this many consecutive
    # data-parallel ranks and all-reduces the sharded gradients across the groups
    dp_shard: int = 0
    precision: Dtype = Dtype.BF16
    schedule: Schedule = Schedule.ONE_F_ONE_B
    attention: AttentionImpl = AttentionImpl.FLASH
    dp_overlap: bool = True
    tp_overlap: bool = False
    dp_bucket_bytes: int = 0              # 0: Megatron-Core's default (see bucket_bytes)
    pp_scatter_gather: bool = True        # Megatron: each TP rank sends 1/tp of a pipeline hand-off
    pp_blocking_p2p: bool = True          # pipeline sends hold the sender's stream (no p2p overlap)
    # DeepSpeed's pipeline engine: its TrainSchedule instruction order, with every send and
    # receive a blocking call that completes only with its partner (engine.ds_pipe)
    pp_rendezvous: bool = False
    # Before reducing each gradient bucket the framework reads it for NaN (a norm of the
    # bucket: Megatron-Core's check_for_nan_in_grad); one read of the gradient buffer a step
    grad_nan_check: bool = False
    # Megatron-Core's DDP splits the gradient buffer into buckets only on the first pipeline
    # stage's first model chunk; every other buffer is one bucket, reduced when the chunk's
    # last backward ends (``engine.step.grad_buffer_buckets``)
    dp_bucket_first_chunk_only: bool = False
    # Extra bytes moved per local parameter after every micro-batch's backward to accumulate
    # gradients outside the weight-gradient GEMM (DeepSpeed's BF16_Optimizer: zero the bf16
    # grads, then fp32 += bf16: 2 + 10 B). 0: the GEMM accumulates in place (Megatron's
    # gradient-accumulation fusion into fp32 main_grad, PyTorch DDP/FSDP).
    grad_accum_bytes_per_param: float = 0.0
    # ZeRO-1 as all-reduce of the gradients + update of this rank's shard + all-gather of the
    # parameters (DeepSpeed BF16_Optimizer on ZeRO stage 0), instead of reduce-scatter.
    zero1_allreduce: bool = False
    # How the host issues kernels (frameworks.json "host" -> "modes": eager, compiled,
    # cuda_graphs) and the framework's host-side mechanisms ("host" -> "mechanisms": e.g.
    # DDP's per-parameter hooks, FSDP's per-unit hooks and all-gather rate limiter).
    host_mode: str = "eager"
    host_mechanisms: tuple[str, ...] = ()
    # MoE token dispatcher (Megatron-Core --moe-token-dispatcher-type): "alltoall" (NCCL
    # all-to-all of every token-expert pair) or "flex" (DeepEP's fused dispatch/combine: one
    # copy per destination node over RDMA, forwarded over NVLink; tp must be 1)
    moe_dispatcher: str = "alltoall"
    # What the framework keeps in memory (gradient dtype, master weights, loss, buckets, ...):
    # ``simulator.parallel.conventions``; from ``--framework`` / ``frameworks.json``.
    memory: MemoryConventions = MemoryConventions()

    def __post_init__(self) -> None:
        for name, enum, other in (("recompute", Recompute, spellings.RECOMPUTE),
                                  ("precision", Dtype, spellings.PRECISION),
                                  ("schedule", Schedule, {}), ("attention", AttentionImpl, {})):
            v = getattr(self, name)
            if not isinstance(v, enum):
                try:
                    object.__setattr__(self, name, enum(spellings.canonical(v, other)))
                except ValueError:
                    valid = ", ".join(e.value for e in enum)
                    raise InvalidInputError(name, v, f"one of {valid}") from None
        rl = self.recompute_layers
        if not isinstance(rl, int) or isinstance(rl, bool) or rl < 0:
            raise InvalidInputError("recompute_layers", rl, "an integer >= 0")
        if rl and self.recompute != Recompute.FULL:
            raise InvalidInputError("recompute_layers", rl,
                                    "0 unless recompute is full (it counts full-recompute layers)")
        if self.schedule in TWO_CHUNK_SCHEDULES and self.vpp == 1:
            object.__setattr__(self, "vpp", 2)
        for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidInputError(name, v, "a positive integer")
        if self.zero_stage not in (0, 1, 2, 3):
            raise InvalidInputError("zero_stage", self.zero_stage, "0, 1, 2 or 3")
        if self.precision == Dtype.TF32:
            raise InvalidInputError("precision", "tf32", "fp32, fp16, bf16 or fp8")
        if self.grad_accum_bytes_per_param < 0:
            raise InvalidInputError("grad_accum_bytes_per_param", self.grad_accum_bytes_per_param,
                                   "bytes per parameter >= 0")
        self._check_host()
        check_moe_dispatcher(self.moe_dispatcher)
        if self.moe_dispatcher == "flex" and self.tp > 1 and self.ep > 1:
            raise InvalidInputError("moe_dispatcher", "flex", "tp=1 (the flex dispatcher's "
                                    "expert tensor parallelism is not modelled)")
        if not isinstance(self.memory, MemoryConventions):
            raise InvalidInputError("memory", self.memory, "a MemoryConventions")
        if self.dp_bucket_bytes < 0:
            raise InvalidInputError("dp_bucket_bytes", self.dp_bucket_bytes,
                                    "a positive size, or 0 for the framework default")
        self._check_dp_shard()

    def _check_dp_shard(self) -> None:
        v, ranks = self.dp_shard, self.dp * self.cp
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidInputError("dp_shard", v, "0 (shard over all dp x cp) or a group size")
        if not v:
            return
        if self.zero_stage < 3:
            raise InvalidInputError("dp_shard", v, f"0 with zero_stage={self.zero_stage} (HSDP "
                                    "shards ZeRO-3 / FSDP within groups: zero_stage=3)")
        if ranks % v:
            raise InvalidInputError("dp_shard", v, f"a divisor of dp*cp={ranks}")
        for name, k in (("cp", self.cp), ("ep", self.ep)):
            if k > 1 and v % k:            # a group never splits a CP or an EP group
                raise InvalidInputError("dp_shard", v, f"a multiple of {name}={k}")

    def recompute_of(self, position: int) -> Recompute:
        """The recompute of the layer at ``position`` (0-based) within its model chunk: the
        plan's, except that under a partial full recompute (``recompute_layers``) the layers
        past the first ``recompute_layers`` keep all their activations."""
        if self.recompute == Recompute.FULL and 0 < self.recompute_layers <= position:
            return Recompute.NONE
        return self.recompute

    @property
    def shard_ranks(self) -> int:
        """Ranks the ZeRO / FSDP state is sharded over: the HSDP group or all dp x cp."""
        return self.dp_shard or self.dp * self.cp

    @property
    def replicas(self) -> int:
        """HSDP replica groups the sharded gradients are all-reduced across (1: none)."""
        return self.dp * self.cp // self.shard_ranks

    def _check_host(self) -> None:
        if self.host_mode not in HOST.modes:
            raise InvalidInputError("host_mode", self.host_mode,
                                    "one of " + ", ".join(sorted(HOST.modes)))
        object.__setattr__(self, "host_mechanisms", tuple(self.host_mechanisms))
        for name in self.host_mechanisms:
            if name not in HOST.mechanisms:
                raise InvalidInputError("host_mechanisms", name,
                                        "one of " + ", ".join(sorted(HOST.mechanisms)))

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element as the framework keeps and reduces it: 4 in fp32
        runs, else the framework's gradient dtype (extra copies such as DeepSpeed's 16-bit
        ``.grad`` beside fp32 ones are not counted here)."""
        return 4 if self.precision == Dtype.FP32 else self.memory.grad_dtype.bytes

    def bucket_params(self) -> int:
        """Parameters per gradient bucket: the explicit size in bytes over ``grad_bytes``,
        or Megatron-Core's default ``max(40M, 1M x dp)`` parameters, which grows buckets
        with the data-parallel size so per-collective latency stays amortised."""
        if self.dp_bucket_bytes:
            return max(1, self.dp_bucket_bytes // self.grad_bytes)
        return max(40_000_000, 1_000_000 * self.dp * self.cp)

    def gradient_buckets(self, params: float, stage: int, chunk: int) -> int:
        """Buckets of one model chunk's gradient buffer (``params`` parameters, on pipeline
        ``stage``, model ``chunk``): one unless the reduction overlaps the backward; under
        ``dp_bucket_first_chunk_only`` (Megatron-Core's DDP) also one on every pipeline
        stage but the first and for every model chunk but the first
        (distributed_data_parallel.py core_r0.8.0 L66-74; training.py core_v0.15.0
        L988-1000: bucket_size None without overlap_grad_reduce, disable_bucketing for
        model_chunk_idx > 0)."""
        if not self.dp_overlap or (self.dp_bucket_first_chunk_only and (stage or chunk)):
            return 1
        return max(1, math.ceil(params / self.bucket_params()))


def validate(plan: Plan, model: TransformerSpec, cluster: ClusterSpec) -> None:
    """Raise ``InvalidInputError`` naming the first field that does not fit."""
    _check_gpus(plan, cluster)
    check_precision_supported(plan.precision.value, cluster.gpu)
    _check_model_split(plan, model)
    _check_batch(plan)
    _check_schedule(plan, model)
    if plan.pp_rendezvous and plan.pp > 1 and plan.zero_stage >= 2:
        raise InvalidInputError("zero_stage", plan.zero_stage,
                                "0 or 1 with DeepSpeed's pipeline engine (pp > 1): it asserts "
                                "'ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                                "parallelism' (deepspeed/runtime/pipe/engine.py)")


def check_precision_supported(precision: str, gpu: GPUSpec) -> None:
    """FP8 only on a GPU whose datasheet (``hardware_db/data/gpus.json`` ``peak_tflops``)
    gives an FP8 peak. (16-bit formats are not refused: a V100 has no bf16 peak, and bf16
    plans on it are priced at its fp16 rate, ``GPUSpec.peak``, as before.)"""
    if precision == "fp8" and not gpu.supports_precision(precision):
        raise InvalidInputError("precision", precision,
                                f"one {gpu.key} has tensor cores for: "
                                + ", ".join(sorted(gpu.peak_tflops)))


def check_attention_supported(attention: str, gpu: GPUSpec) -> None:
    """An attention kernel family the GPU runs (``attention_kernels`` in
    ``hardware_db/data/gpus.json``; e.g. ``flash3`` needs Hopper or Blackwell)."""
    if gpu.attention_kernels and attention not in gpu.attention_kernels:
        raise InvalidInputError("attention", attention,
                                f"one {gpu.key} runs: " + ", ".join(gpu.attention_kernels))


def _divisors(n: int) -> str:
    """The first 12 divisors of ``n`` (O(sqrt n) and at most 10^6 steps)."""
    small = [d for d in range(1, min(math.isqrt(n), 1_000_000) + 1) if n % d == 0]
    ds = sorted(set(small) | {n // d for d in small})
    return ", ".join(map(str, ds[:12])) + (" ..." if len(ds) > 12 else "")


def _check_gpus(plan: Plan, cluster: ClusterSpec) -> None:
    if plan.world_size != cluster.n_gpus:
        raise InvalidInputError(
            "dp", plan.dp,
            f"tp*pp*dp*cp must equal the GPU count {cluster.n_gpus}; "
            f"tp*pp*cp={plan.tp * plan.pp * plan.cp} so dp={cluster.n_gpus // max(1, plan.tp * plan.pp * plan.cp)}"
            if cluster.n_gpus % (plan.tp * plan.pp * plan.cp) == 0 else
            f"tp*pp*dp*cp={plan.world_size} must equal the GPU count {cluster.n_gpus}")
    if plan.tp > cluster.node.scale_up_domain_gpus:
        raise InvalidInputError("tp", plan.tp,
                                f"at most the scale-up domain size {cluster.node.scale_up_domain_gpus}")


def _check_model_split(plan: Plan, model: TransformerSpec) -> None:
    if model.n_heads % plan.tp:
        raise InvalidInputError("tp", plan.tp, f"a divisor of n_heads={model.n_heads}: {_divisors(model.n_heads)}")
    if model.n_kv_heads % plan.tp and plan.tp % model.n_kv_heads:
        raise InvalidInputError("tp", plan.tp,
                                f"a divisor or multiple of n_kv_heads={model.n_kv_heads}")
    if model.ffn_hidden % plan.tp:
        raise InvalidInputError("tp", plan.tp, f"a divisor of ffn_hidden={model.ffn_hidden}")
    if plan.pp > model.n_layers:
        raise InvalidInputError("pp", plan.pp, f"at most n_layers={model.n_layers}")
    if model.seq_len % (2 * plan.cp if plan.cp > 1 else 1):
        raise InvalidInputError("cp", plan.cp, f"2*cp must divide seq_len={model.seq_len}")
    if plan.sequence_parallel and model.seq_len % (plan.tp * plan.cp):
        raise InvalidInputError("sequence_parallel", True,
                                f"tp*cp={plan.tp * plan.cp} must divide seq_len={model.seq_len}")
    if model.moe is None:
        if plan.ep != 1:
            raise InvalidInputError("ep", plan.ep, "1 for a dense model")
        return
    if model.moe.experts % plan.ep:
        raise InvalidInputError("ep", plan.ep,
                                f"a divisor of moe_experts={model.moe.experts}: {_divisors(model.moe.experts)}")
    if (plan.dp * plan.cp) % plan.ep:
        raise InvalidInputError("ep", plan.ep, f"a divisor of dp*cp={plan.dp * plan.cp}")
    if plan.moe_dispatcher == "flex" and not flex_fits(model, plan.tp, plan.ep):
        raise InvalidInputError("moe_dispatcher", "flex", "ep > 1 and tp = 1 for an MoE model "
                                "(Megatron's flex dispatcher needs TP x EP > 1; expert tensor "
                                "parallelism under it is not modelled)")


def _check_batch(plan: Plan) -> None:
    per_step = plan.micro_batch * plan.dp
    if plan.global_batch % per_step:
        raise InvalidInputError(
            "global_batch", plan.global_batch,
            f"a multiple of micro_batch*dp={per_step}")


def _check_schedule(plan: Plan, model: TransformerSpec) -> None:
    if plan.schedule in TWO_CHUNK_SCHEDULES:
        _check_two_chunk(plan, model)
        return
    if plan.vpp > 1 and plan.schedule != Schedule.INTERLEAVED:
        raise InvalidInputError("vpp", plan.vpp, "1 unless --schedule interleaved")
    if plan.schedule == Schedule.INTERLEAVED:
        if plan.pp == 1:
            raise InvalidInputError("schedule", "interleaved", "gpipe or 1f1b when pp=1")
        if plan.num_microbatches % plan.pp:
            raise InvalidInputError("global_batch", plan.global_batch,
                                    f"interleaved 1F1B needs micro-batches ({plan.num_microbatches}) "
                                    f"divisible by pp={plan.pp}")
    chunks = plan.pp * plan.vpp
    if chunks > model.n_layers:
        raise InvalidInputError("vpp", plan.vpp, f"pp*vpp={chunks} must be at most n_layers={model.n_layers}")


def _check_two_chunk(plan: Plan, model: TransformerSpec) -> None:
    """ZB-V and DualPipe: two chunks per rank; DualPipe's reference implementation also
    asserts an even rank count and an even micro-batch count of at least twice the ranks
    (``DualPipe.step``)."""
    name = plan.schedule.value
    if plan.vpp != 2:
        raise InvalidInputError("vpp", plan.vpp, f"2 with --schedule {name} (two chunks per rank)")
    if plan.pp == 1:
        raise InvalidInputError("schedule", name, "gpipe, 1f1b or zb-h1 when pp=1")
    if plan.schedule == Schedule.ZB_V and 2 * plan.pp > model.n_layers:
        raise InvalidInputError("pp", plan.pp, f"at most n_layers/2={model.n_layers // 2} with "
                                "--schedule zb-v (two chunks per rank)")
    if plan.schedule == Schedule.DUALPIPE:
        if plan.pp % 2:
            raise InvalidInputError("pp", plan.pp, "an even number with --schedule dualpipe")
        m = plan.num_microbatches
        if m % 2 or m < 2 * plan.pp:
            raise InvalidInputError("global_batch", plan.global_batch,
                                    f"dualpipe needs an even number of micro-batches ({m}) "
                                    f"of at least 2*pp={2 * plan.pp}")
