"""Activation and transient accounting against Korthikanti et al. 2022 and the framework
sources (expected values from the published decomposition, not from the code)."""
from __future__ import annotations

import dataclasses

import pytest

from simulator.frameworks import LOSS_BYTES
from simulator.memory.accounting import (
    layer_transient_bytes,
    peak_activation_bytes,
    stage_memory,
)
from simulator.memory.chunk import chunk_memory
from simulator.parallel.conventions import BucketKind, MemoryConventions
from simulator.parallel.plan import Plan, Recompute
from simulator.workload import MoESpec, TransformerSpec
from simulator.workload.ops import (
    LayerShape,
    backward_ops,
    head_ops,
    layer_ops,
    loss_transient_bytes,
)

GPT = TransformerSpec("gpt175", 96, 12288, 49152, 96, 96, 51200, 2048)
S, B, H, A = 2048, 1, 12288, 96
SBH = S * B * H


def saved(ops) -> float:
    return sum(o.saved_bytes for o in ops)


@pytest.mark.parametrize("dropout", [False, True])
def test_flash_attention_output_is_counted_once(dropout):
    """Korthikanti's per-layer sbh(34 + 5as/h) minus what a fused kernel never stores
    (the 5as^2b of scores, softmax and attention dropout) and, without dropout, the two
    1-byte hidden-dropout masks; plus the kernel's fp32 log-sum-exp (4 a s b). The output
    is the projection's saved input, stored once."""
    ops = layer_ops(GPT, LayerShape(B, S, flash=True, dropout=dropout))
    want = SBH * (34 + 5 * A * S / H) - 5 * A * S * S * B - (0 if dropout else 2 * SBH) + 4 * A * S * B
    assert saved(ops) == pytest.approx(want, rel=1e-12)


def test_dropout_is_its_own_convention_not_tied_to_materialized_attention():
    """Materialized attention without dropout: Korthikanti minus the three dropout terms
    (attention mask a s^2 b, dropout output 2 a s^2 b, two hidden masks 2 sbh)."""
    ops = layer_ops(GPT, LayerShape(B, S, flash=False, dropout=False))
    want = SBH * (34 + 5 * A * S / H) - 3 * A * S * S * B - 2 * SBH
    assert saved(ops) == pytest.approx(want, rel=1e-12)


def test_full_recompute_holds_the_recomputed_layer():
    """Under full recompute the layer being backpropagated re-creates all its activations
    (Korthikanti sec. 4: recompute re-runs the layer's forward): the transient exceeds the
    no-recompute one by exactly one layer's activations when the peak is at its first op."""
    ops = layer_ops(GPT, LayerShape(B, S, flash=False, dropout=True))
    full = layer_transient_bytes(ops, Recompute.FULL, 2)
    assert full >= SBH * (34 + 5 * A * S / H)
    assert full > layer_transient_bytes(ops, Recompute.NONE, 2)


def _plan(**kw) -> Plan:
    return Plan(**{"pp": 4, "vpp": 2, "dp": 1, "micro_batch": 1, "global_batch": 16,
                   "schedule": "interleaved", **kw})


def test_interleaved_first_stage_holds_megatron_penalty():
    """Megatron theoretical_memory_usage.py / Korthikanti: the first stage of an
    interleaved schedule holds L layers' activations times 1 + (p - 1)/(p v)."""
    p, v, L, per_layer = 4, 2, 32, 1.0
    chunk = per_layer * L / (p * v)
    got = peak_activation_bytes(_plan(), 0, [chunk] * v)
    assert got == pytest.approx(per_layer * L * (1 + (p - 1) / (p * v)))


def test_interleaved_last_chunk_holds_one_micro_batch():
    """The model's last chunk (output layer and loss) runs each micro-batch's backward
    right after its forward (Narayanan et al. 2021, interleaved 1F1B), so its activations
    count once, not by the stage's average in-flight count."""
    assert peak_activation_bytes(_plan(), 3, [0.0, 1.0]) == pytest.approx(1.0)


def test_loss_implementations_per_logit():
    """Bytes per logit saved / held on top at the loss's peak, 16-bit logits:
    eager F.cross_entropy(logits.float()) keeps the fp32 log-softmax and holds two fp32
    gradients in backward (4, 8); Megatron's vocab-parallel CE keeps one fp32 softmax and
    the 16-bit logits or gradient beside it (4, 2); TE's in-place fused CE keeps the 16-bit
    logits as the gradient (2, 0); flash-attn's fused CE (2, 2)."""
    want = {"eager": (4, 8), "megatron": (4, 2), "te-inplace": (2, 0), "fused": (2, 2)}
    for name, (s, t) in want.items():
        lb = LOSS_BYTES[name]
        assert (lb.saved(2), lb.transient(2)) == (s, t)
    sh = LayerShape(1, 2048, loss="eager")
    ce = next(o for o in head_ops(GPT, sh) if o.name == "cross_entropy")
    assert ce.saved_bytes == 4 * 2048 * 51200
    assert loss_transient_bytes(GPT, sh) == 8 * 2048 * 51200


def test_fused_swiglu_saves_its_input_only():
    """Megatron's SwiGLUFunction saves its input (2f per token); eager silu(a) * b also
    keeps silu(a) (f more)."""
    m = dataclasses.replace(GPT, mlp="swiglu", ffn_hidden=32768)
    act = lambda fused: next(o for o in layer_ops(m, LayerShape(1, S, fused_swiglu=fused))
                             if o.name == "mlp_act").saved_bytes
    assert act(True) == 2 * S * 32768 * 2
    assert act(False) == 3 * S * 32768 * 2


def test_moe_combine_keeps_the_expert_outputs():
    """An implementation that weights each expert output by its routing probability at the
    combine keeps the outputs (routed tokens x h, 16-bit) and the probabilities (fp32) for
    backward (eager MoE code; calibrate/memcheck_model.py measures it). The backward of the
    combine (a gather) and of the chunk sorts (split + cat) move their forward bytes."""
    m = TransformerSpec("moe", 2, 1024, 4096, 16, 16, 32000, 2048, mlp="swiglu",
                        moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=1408))
    fwd = layer_ops(m, LayerShape(1, 2048, ep=2))
    combine = next(o for o in fwd if o.name == "moe_combine")
    routed = 2048 * 2
    assert combine.saved_bytes == routed * 1024 * 2 + routed * 4
    bwd = {o.name: o for o in backward_ops(fwd)}
    for name in ("moe_combine", "moe_sort_chunks", "moe_unsort_chunks"):
        f = next(o for o in fwd if o.name == name)
        assert bwd[name + "_bwd"].bytes_moved == f.bytes_moved


def test_megatron_buckets_are_views_ddp_buckets_are_copies():
    """Megatron's buckets are views of the contiguous grad buffer (param_and_grad_buffer.py
    L1597): no memory; torch DDP without gradient_as_bucket_view copies every gradient."""
    m = TransformerSpec("gpt", 4, 1024, 4096, 16, 16, 32000, 1024)
    base = Plan(dp=8, global_batch=8)
    views = dataclasses.replace(base, memory=MemoryConventions(dp_buckets=BucketKind.VIEWS))
    copies = dataclasses.replace(base, memory=MemoryConventions(dp_buckets=BucketKind.COPIES))
    from simulator.engine.memory_fit import estimate_stage_memory
    v, c = estimate_stage_memory(m, views)[0], estimate_stage_memory(m, copies)[0]
    assert c.total_bytes - v.total_bytes == pytest.approx(v.grads_bytes)


def test_stage_memory_is_state_plus_the_larger_phase():
    """Peak = states + max(activations + working set, optimizer-step transient)."""
    m = TransformerSpec("gpt", 2, 1024, 4096, 16, 16, 32000, 256)
    plan = Plan(dp=1, global_batch=2)
    from simulator.engine.stage_work import layer_shape
    ch = chunk_memory(m, plan, layer_shape(m, plan), [0, 1], True, True)
    sm = stage_memory(0, [ch], plan)
    assert sm.total_bytes == pytest.approx(sm.state_bytes + max(
        sm.activations_bytes + sm.workspace_bytes, sm.optimizer_step_bytes))


def test_megatron_core_moe_combine_keeps_only_the_probabilities():
    """Megatron-Core @ d98e8a64 scales the experts' activation by the routing
    probabilities and unpermutes without them (frameworks.json memory.megatron-core
    moe_weighted_activation): its combine keeps the fp32 probabilities only, and the
    stage's activation memory is smaller by the expert outputs than under the default."""
    from simulator.engine.stage_work import layer_shape
    from simulator.parallel.framework_plan import with_framework
    m = TransformerSpec("moe", 2, 1024, 4096, 16, 16, 32000, 2048, mlp="swiglu",
                        moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=1408))
    base = Plan(dp=2, ep=2, global_batch=2)
    mc = with_framework(base, "megatron-core")
    assert mc.memory.moe_weighted_activation and not base.memory.moe_weighted_activation
    comb = lambda p: next(o for o in layer_ops(m, layer_shape(m, p))
                          if o.name == "moe_combine").saved_bytes
    routed = 2048 * 2
    assert comb(mc) == routed * 4
    assert comb(base) == routed * 1024 * 2 + routed * 4
