"""Model code that runs q, k and v (and a SwiGLU's gate and up) as separate Linears issues
one GEMM per projection, forward and backward, where the op graph fuses them (``Op.split``;
frameworks whose ``param_layout`` is "hf" or "split"). Checked against the matmuls
transformers' own LlamaDecoderLayer issues (a TorchDispatchMode over forward and backward),
then priced as the sum of its parts."""
from __future__ import annotations

from collections import Counter

import pytest

import hardware_db
from simulator.cost.layer import compute_time_s
from simulator.engine.stage_work import layer_shape
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.ops import OpKind, backward_ops, layer_ops
from simulator.workload.spec import MLP, Norm, Position, TransformerSpec

SPEC = TransformerSpec("tiny-llama", n_layers=1, hidden=64, ffn_hidden=128, n_heads=4,
                       n_kv_heads=2, vocab=256, seq_len=16, mlp=MLP.SWIGLU,
                       norm=Norm.RMSNORM, position=Position.ROPE, linear_bias=False)


def _layer(fw: str):
    plan = with_framework(Plan(dp=1, micro_batch=1, global_batch=1, precision="bf16"), fw)
    fwd = layer_ops(SPEC, layer_shape(SPEC, plan))
    return fwd, backward_ops(fwd)


def _kernels(ops) -> Counter:
    """GEMM kernels as (sorted (M, N), K): a weight gradient may be computed transposed."""
    out = Counter()
    for o in ops:
        if o.kind == OpKind.GEMM:
            for m, n, k in o.split or ((o.m, o.n, o.k),):
                out[(tuple(sorted((m, n))), k)] += o.batch
    return out


def _transformers_kernels() -> Counter:
    import torch
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=256,
                                   attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg)
    seen = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("mm", "addmm"):
                a, b = args[-2], args[-1]
                seen[(tuple(sorted((a.shape[0], b.shape[1]))), a.shape[1])] += 1
            return func(*args, **(kwargs or {}))

    x = torch.randn(1, 16, 64, requires_grad=True)
    pos = torch.arange(16)[None]
    with Count():
        out = model.model.layers[0](x, position_ids=pos,
                                    position_embeddings=model.model.rotary_emb(x, pos))
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    return seen


@pytest.mark.torch
def test_the_kernels_are_transformers_own():
    pytest.importorskip("transformers")
    fwd, bwd = _layer("hf")
    assert _kernels(fwd + bwd) == _transformers_kernels()
    assert sum(_kernels(fwd).values()) == 7 and sum(_kernels(bwd).values()) == 14


def test_fused_and_split_layouts():
    """Megatron-Core keeps the fused GEMMs; the split ones run the same FLOPs in more
    kernels, each priced on its own shape, and their input gradients are summed."""
    fused, split = _layer("megatron-core"), _layer("hf")
    assert sum(_kernels(fused[0]).values()) == 4
    by = {o.name: o for o in split[0] + split[1]}
    assert by["qkv"].split == ((16, 64, 64), (16, 32, 64), (16, 32, 64))
    assert by["qkv_dgrad"].split == ((16, 64, 64), (16, 64, 32), (16, 64, 32))
    assert by["qkv_wgrad"].split == ((64, 64, 16), (64, 32, 16), (64, 32, 16))
    assert by["mlp_fc1"].split == ((16, 128, 64), (16, 128, 64))
    assert by["qkv_dgrad_sum"].launches == 2 and by["mlp_fc1_dgrad_sum"].launches == 1
    gpu, prof = hardware_db.load_gpu("h100-sxm"), hardware_db.load_profile("h100-sxm")
    from simulator.cost.kernels import gemm_time_s
    assert compute_time_s(by["qkv"], gpu, prof) == pytest.approx(
        sum(gemm_time_s(m, n, k, "bf16", gpu, prof) for m, n, k in by["qkv"].split))
    for name in ("qkv", "mlp_fc1"):
        assert by[name].flops == pytest.approx(
            sum(2.0 * m * n * k for m, n, k in by[name].split))
        fused_op = next(o for o in fused[0] if o.name == name)
        assert compute_time_s(by[name], gpu, prof) >= compute_time_s(fused_op, gpu, prof)


def test_routed_experts_stay_fused_and_fp8_casts_follow_the_parts():
    """transformers 5 fuses routed experts' gate and up (gate_up_proj); shared experts and
    dense MLPs split. Under FP8 each part's Linear casts its input."""
    from simulator.workload.presets import get_preset
    m = get_preset("qwen3-30b-a3b")
    for ep in (1, 128):
        plan = with_framework(Plan(dp=128, ep=ep, micro_batch=1, global_batch=128,
                                   precision="bf16"), "hf")
        ops = layer_ops(m, layer_shape(m, plan), 1)
        assert all(not o.split for o in ops if o.name.startswith("experts")), ep
    plan = with_framework(Plan(dp=1, micro_batch=1, global_batch=1, precision="fp8"), "hf")
    by = {o.name: o for o in layer_ops(SPEC, layer_shape(SPEC, plan))}
    assert by["qkv_fp8cast"].bytes_moved == pytest.approx(3 * 4.0 * 16 * 64)
    assert by["mlp_fc1_fp8cast"].bytes_moved == pytest.approx(2 * 4.0 * 16 * 64)


def test_the_trace_comparison_counts_every_part_launched():
    """``calibrate.sim_ops`` launches per GEMM kernel, as the cost model prices them."""
    from calibrate.sim_ops import step_ops
    from simulator.workload.presets import get_preset
    m = get_preset("llama2-7b")
    launches = {}
    for fw in ("megatron-core", "hf"):
        plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"), fw)
        launches[fw] = sum(s.launches for s in step_ops(m, plan) if s.family == "gemm")
    # per layer: q, k, v and gate, up add 2 + 1 kernels forward, 4 + 2 backward
    assert launches["hf"] - launches["megatron-core"] == 9 * m.n_layers
