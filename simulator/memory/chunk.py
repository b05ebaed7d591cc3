"""Memory facts of one pipeline chunk (``ChunkMemory``) from the op graph, without pricing
any op. The simulator (``engine.stage_work``) and the search's fast estimate
(``search.space``) both build their chunks' memory here, so the two cannot disagree."""
from __future__ import annotations

from functools import lru_cache

from ..parallel.plan import Plan, Recompute
from ..workload.ops import (
    LayerShape,
    embedding_ops,
    head_ops,
    layer_ops,
    loss_transient_bytes,
    ring_forward_transient_bytes,
)
from ..workload import sac
from ..workload.spec import TransformerSpec
from .accounting import (
    zero3_kept_layers,
    ChunkMemory,
    layer_activation_bytes,
    layer_transient_bytes,
    wgrad_hold_bytes,
)


def rank_layer_params(model: TransformerSpec, plan: Plan, layer: int) -> tuple[float, float, float]:
    """(parameters on one rank, of which replicated over the whole DP group, of which
    decoder linear weights) for one layer: TP splits everything, EP the routed experts."""
    if not model.is_moe_layer(layer):
        p = model.layer_params(layer) / plan.tp
        return p, p, (model.attention_params() + model.dense_mlp_params()) / plan.tp
    moe = model.moe
    per_expert = model.dense_mlp_params(moe.expert_ffn_hidden)
    routed = moe.experts * per_expert
    dense = (model.layer_params(layer) - routed) / plan.tp
    linear = (model.attention_params() + moe.shared_experts * per_expert) / plan.tp \
        + routed / (plan.ep * plan.tp)
    return dense + routed / (plan.ep * plan.tp), dense, linear


def _tokens_per_rank(model: TransformerSpec, sh: LayerShape) -> int:
    t = sh.micro_batch * model.seq_len // sh.cp
    return t // sh.tp if sh.sequence_parallel else t


def first_of_kind(model: TransformerSpec, kind: tuple[bool, bool]) -> int:
    """Index of the first layer of ``kind`` (``TransformerSpec.layer_kind``: MoE, local
    attention); layers of one kind have the same ops and parameters."""
    return next((i for i in range(model.n_layers) if model.layer_kind(i) == kind), 0)


@lru_cache(maxsize=4096)
def layer_memory(model: TransformerSpec, sh: LayerShape, recompute: Recompute,
                 kind: tuple[bool, bool]) -> tuple[float, float, float]:
    """(activation bytes one layer of ``kind`` keeps per micro-batch, its backward working
    set, what it keeps from B to W when the backward is split)."""
    fwd = layer_ops(model, sh, first_of_kind(model, kind))
    input_bytes = _tokens_per_rank(model, sh) * model.hidden * sh.act_bytes
    kept, remade = layer_activation_bytes(fwd, recompute, input_bytes), None
    if sh.sac_op and recompute == Recompute.SELECTIVE:       # torchtitan's op-level SAC
        kept = sac.kept_bytes(fwd, model, sh, input_bytes)
        # the re-run forward re-creates everything autograd saves for the layer's backward
        # (a kept matmul's input included: its own re-run producer saves it again)
        remade = frozenset(op.name for op in fwd)
    # the working set: the layer's backward, or (context parallelism) the ring buffers its
    # forward holds, again when recompute re-runs that forward
    return (kept,
            max(layer_transient_bytes(fwd, recompute, sh.act_bytes, remade),
                ring_forward_transient_bytes(model, sh)),
            wgrad_hold_bytes(fwd, sh.act_bytes))


@lru_cache(maxsize=4096)
def edge_memory(model: TransformerSpec, sh: LayerShape, first: bool,
                last: bool) -> tuple[float, float, float]:
    """(bytes the embedding / output layer / loss keep per micro-batch, of which the
    output layer and loss, the loss's own peak)."""
    emb = sum(o.saved_bytes for o in embedding_ops(model, sh)) if first else 0.0
    head = sum(o.saved_bytes for o in head_ops(model, sh)) if last else 0.0
    return emb + head, head, (loss_transient_bytes(model, sh) if last else 0.0)


@lru_cache(maxsize=4096)
def edge_wgrad_hold_bytes(model: TransformerSpec, sh: LayerShape, last: bool) -> float:
    """The output layer's B-to-W hold (``wgrad_hold_bytes``; the embedding has no GEMM)."""
    return wgrad_hold_bytes(head_ops(model, sh), sh.act_bytes) if last else 0.0


def chunk_memory(model: TransformerSpec, plan: Plan, sh: LayerShape, layers: list[int],
                 first: bool, last: bool) -> ChunkMemory:
    """Memory facts of a chunk holding ``layers`` (``first``: it has the embedding;
    ``last``: the output layer and the loss). Cached by what it depends on, the count of
    each layer kind (not which layers): a search asks for the same chunk when it prunes,
    ranks, confirms and spreads the coefficients of one plan, and stages hold alike chunks."""
    return _chunk_memory(model, plan, sh,
                         layer_kind_counts(model, tuple(layers), plan.recompute_layers),
                         first, last)


@lru_cache(maxsize=65536)
def layer_kind_counts(model: TransformerSpec, layers: tuple[int, ...], recompute_layers: int = 0
                      ) -> tuple[tuple[tuple[tuple[bool, bool], bool], int], ...]:
    """How many of ``layers`` are of each kind (``TransformerSpec.layer_kind``) and under the
    plan's recompute or not (a partial full recompute covers the first ``recompute_layers``
    of the chunk: ``Plan.recompute_of``), sorted: all a chunk's memory depends on, besides
    the plan."""
    kinds: dict[tuple[tuple[bool, bool], bool], int] = {}
    for pos, i in enumerate(layers):
        k = (model.layer_kind(i), not recompute_layers or pos < recompute_layers)
        kinds[k] = kinds.get(k, 0) + 1
    return tuple(sorted(kinds.items()))


@lru_cache(maxsize=65536)
def _chunk_memory(model: TransformerSpec, plan: Plan, sh: LayerShape,
                  kinds: tuple[tuple[tuple[tuple[bool, bool], bool], int], ...], first: bool,
                  last: bool) -> ChunkMemory:
    emb = model.vocab * model.hidden / plan.tp
    out = (emb if not (model.tied_embeddings and first) else 0.0) + model.hidden   # + final norm
    edge = (emb if first else 0.0) + (out if last else 0.0)
    params = dense = edge
    linear = act = transient = biggest = hold = 0.0
    for (kind, under), n in kinds:
        p, d, lin = rank_layer_params(model, plan, first_of_kind(model, kind))
        a, t, w = layer_memory(model, sh, plan.recompute if under else Recompute.NONE, kind)
        params, dense, linear, act = params + n * p, dense + n * d, linear + n * lin, act + n * a
        hold += n * w
        transient, biggest = max(transient, t), max(biggest, p)
    if last and model.mtp_layers:                    # MTP modules sit after the last layer
        p, d, lin = rank_layer_params(model, plan, model.n_layers - 1)
        extra = 2 * model.hidden ** 2 / plan.tp + 2 * model.hidden     # projection, norms
        n = model.mtp_layers
        params, dense, linear = params + n * (p + extra), dense + n * (d + extra), \
            linear + n * (lin + extra)
    saved, head, loss = edge_memory(model, sh, first, last)
    n = sum(count for _, count in kinds)
    kept = zero3_kept_layers(n, (params - edge) / max(n, 1),
                             (emb + model.hidden) if last else 0.0,   # the output layer's
                             plan.memory.zero3_reuse_window_params) if plan.zero_stage >= 3 \
        else 0
    return ChunkMemory(params=params, dense_params=dense, linear_params=linear, edge_params=edge,
                       zero3_kept_layers=kept, max_layer_params=biggest, act_bytes=act + saved,
                       layer_transient_bytes=transient, loss_transient_bytes=loss,
                       head_saved_bytes=head,
                       wgrad_hold_bytes=hold + edge_wgrad_hold_bytes(model, sh, last))
