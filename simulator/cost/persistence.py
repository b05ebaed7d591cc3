"""ZeRO-3's parameter tensors by size. Which ones DeepSpeed keeps whole on every rank: each
tensor of at most ``stage3_param_persistence_threshold`` elements is persistent
(runtime/zero/parameter_offload.py ``mark_persistent_parameters`` @ 0.19.8: ``ds_numel <=
threshold``), never partitioned for the forward; its optimizer step still releases it with
every other tensor and all-gathers it again afterwards (``persistent_gather_s``: device
time; the step's host work is not priced). The threshold is
``FrameworkMemory.zero3_persistence_threshold_hidden`` times the hidden size (HF Trainer's
"auto": 10). How many collectives DeepSpeed issues for a pass over them (``gather_calls``,
``reduce_calls``: its prefetch and reduce buckets).

Sizes per tensor as the model code holds it (``ParamLayout``; ``tensor_sizes``): a Linear's
weight is its share of the op graph GEMM's ``k x n`` (each split part's own shape,
``Op.split``, as the engine's layer shape makes them; split evenly where an op carries none),
its bias that share's ``n``; a norm's weight and bias are ``hidden`` wide, the query and key
norms ``head_dim`` each where shared by the heads (Qwen3, Gemma 3) or the whole projections'
(OLMo 2: ``TransformerSpec.extra_norm_params``), MLA's latent norms their ranks; an
embedding table ``vocab x hidden`` (a tied output layer counted again where the op graph uses
it)."""
from __future__ import annotations

from ..hardware.profile import Profile
from ..network.collectives import Collective
from ..parallel.placement import GroupPlacement
from ..parallel.plan import Plan
from ..workload.op_types import Op, OpKind
from ..workload.spec import TransformerSpec
from .host import NORMS_PER_OP, WEIGHTLESS_GEMMS, ParamLayout, routed_experts
from .layer import group_collective


def _linear_parts(o: Op, layout: ParamLayout) -> list[tuple[float, float]]:
    """(weight elements, bias elements) of each Linear module one weight GEMM of the op graph
    stands for, per group (all groups at once where routed experts are 3-D tensors)."""
    parts = layout.linears(o)
    if o.split and len(o.split) == parts:
        shapes = [(k * n, n) for _, n, k in o.split]
    else:
        shapes = [(o.k * o.n / parts, o.n / parts)] * parts
    if routed_experts(o) and layout.experts_3d:
        return [(w * o.batch, b * o.batch) for w, b in shapes]
    return shapes


def _norm_widths(o: Op, spec: TransformerSpec) -> list[int]:
    """Elements of each weight one norm op of the op graph stands for (a LayerNorm's bias
    the same again)."""
    if o.name == "qk_norm":             # extra_norm_params holds them (and Gemma's sandwich)
        hd, qk = spec.head_dim, spec.extra_norm_params - 2 * spec.hidden * spec.sandwich_norms
        return [hd, hd] if qk == 2 * hd else [spec.q_dim, spec.kv_dim]
    if spec.mla is not None and o.name in ("q_norm", "kv_norm"):
        return [spec.mla.q_lora_rank if o.name == "q_norm" else spec.mla.kv_lora_rank]
    return [spec.hidden] * NORMS_PER_OP.get(o.name, 1)


def tensor_sizes(ops: list[Op], layout: ParamLayout, spec: TransformerSpec,
                 experts: bool | None = None) -> list[float]:
    """Elements of each parameter tensor of ``cost.host.param_tensors(ops, layout)`` in the
    order the ops use them (a Linear's weight, then its bias; a norm's weight, then its bias;
    an embedding table as ``vocab x hidden``): all of them, or with ``experts`` True / False
    only the routed experts' / all others (per rank: the op graph's shapes are TP and EP
    shards; the table is whole)."""
    out: list[float] = []
    for o in ops:
        if experts is not None and routed_experts(o) != experts:
            continue
        if o.kind == OpKind.GEMM and o.name not in WEIGHTLESS_GEMMS:
            groups = 1 if routed_experts(o) and layout.experts_3d else o.batch
            biased = layout.biases(o) > 0
            for _ in range(groups):
                for weight, bias in _linear_parts(o, layout):
                    out += [weight, bias] if biased else [weight]
        elif o.kind == OpKind.MEMORY and o.mem_kind == "norm":
            for w in _norm_widths(o, spec):
                out += [w, w] if layout.norm_bias else [w]
        elif o.kind == OpKind.MEMORY and o.name == "embedding":
            out.append(float(spec.vocab * spec.hidden))
    return out


def persistent_tensors(ops: list[Op], layout: ParamLayout, threshold_elements: float,
                       spec: TransformerSpec) -> int:
    """Of ``cost.host.param_tensors(ops, layout)``, the tensors of at most
    ``threshold_elements`` elements (0: none), as ZeRO-3 counts them persistent."""
    if threshold_elements <= 0:
        return 0
    return persistent_count(tensor_sizes(ops, layout, spec), threshold_elements)


def persistent_count(sizes: list[float], threshold_elements: float) -> int:
    """Of tensors of ``sizes`` elements, those ZeRO-3 keeps whole (``ds_numel <=``
    ``threshold_elements``; 0: none)."""
    return sum(1 for x in sizes if x <= threshold_elements) if threshold_elements > 0 else 0


def gather_calls(sizes: list[float], threshold_elements: float, bucket_elements: float) -> int:
    """All-gathers DeepSpeed ZeRO-3 issues for one pass over tensors of ``sizes`` elements
    in the order given: its prefetch takes the next partitioned tensors (above the persistence
    threshold) into one coalesced all-gather until it holds ``bucket_elements``
    (stage3_prefetch_bucket_size; partitioned_param_coordinator.py ``fetch_sub_module``
    l.450-484 and ``__all_gather_params_`` -> ``all_gather_coalesced`` @ 0.19.8)."""
    calls, held = 0, 0.0
    for x in sizes:
        if x > threshold_elements:
            held += x
            if held >= bucket_elements:
                calls, held = calls + 1, 0.0
    return calls + (held > 0)


def reduce_calls(sizes: list[float], bucket_elements: float) -> int:
    """Reduce-scatters DeepSpeed ZeRO-3 issues for one backward over gradients of ``sizes``
    elements in the order they are ready: its ipg bucket is reduced before a gradient that
    would overflow ``bucket_elements`` joins it (reduce_bucket_size; stage3.py
    ``reduce_independent_p_g_buckets_and_remove_grads`` l.1583-1585, one
    ``reduce_scatter_coalesced`` per bucket), and once more at the end."""
    calls, held = 0, 0.0
    for x in sizes:
        if held > 0 and held + x > bucket_elements:
            calls, held = calls + 1, 0.0
        held += x
    return calls + (held > 0)


def persistent_gather_s(tensors: int, spec: TransformerSpec, plan: Plan, shard: GroupPlacement,
                        prof: Profile) -> float:
    """DeepSpeed ZeRO-3's step ends by all-gathering its ``tensors`` persistent parameters
    again (its ``_partition_all_parameters`` released them with the rest), each with an
    all-gather of its own over the shard group ``shard``, launched back to back on one
    stream (stage3.py ``_post_step`` -> partition_parameters.py
    ``_allgather_params_coalesced``: one ``all_gather_into_tensor`` per parameter @ 0.19.8):
    in series, each taken as ``hidden`` elements in the parameters' dtype (norms are; biases
    up to a few times that: latency-bound either way)."""
    if tensors <= 0:
        return 0.0
    size = spec.hidden * (4 if plan.precision.value == "fp32" else 2)
    return tensors * group_collective(Collective.ALL_GATHER, size, shard, prof).time_s
