"""torchtitan's op-level selective activation checkpointing (``simulator.workload.sac``): its
policy keeps the outputs of every other ``aten.mm``, of SDPA and of the TP reduce-scatter,
and re-runs the rest in backward. Checked against torch's own SAC machinery running that
policy on a block written in torchtitan's op order, then in the op graph, memory and step."""
from __future__ import annotations

from collections import defaultdict

import pytest

from simulator.engine.recompute import sac_op, sac_recompute_ops
from simulator.engine.stage_work import layer_shape
from simulator.frameworks.defaults import framework_memory
from simulator.memory.chunk import layer_memory
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan, Recompute
from simulator.workload import sac
from simulator.workload.ops import layer_ops
from simulator.workload.presets import get_preset


def _plan(fw: str, rc: str = "selective", tp: int = 1) -> Plan:
    return with_framework(Plan(micro_batch=1, global_batch=8, dp=8 // tp, tp=tp,
                               precision="bf16", recompute=rc), fw)


def _titan_policy():
    """torchtitan's 2024 op-SAC policy (``_get_custom_policy``, parallelize_llama.py @
    004b3148) with a fresh matmul count; the CPU SDPA kernel stands in for the CUDA ones of
    its save list."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy
    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default}
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def test_torch_sac_with_torchtitans_policy_reruns_wk_wo_w3():
    """A Llama block in torchtitan's op order (wq, wk, wv, RoPE-free attention, wo; w1, w3,
    w2) under ``create_selective_checkpoint_contexts`` with torchtitan's policy (its 2024
    ``_get_custom_policy``; the CPU SDPA kernel stands in for the CUDA ones in its save
    list): the backward re-runs exactly the 2nd, 4th and 6th matmul, whose output widths
    are what the op graph's plan re-runs."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    F, aten = torch.nn.functional, torch.ops.aten
    h, q, kv, ffn, s, heads = 64, 64, 16, 96, 8, 4
    w = {n: torch.randn(o, i, requires_grad=True) for n, (o, i) in
         dict(wq=(q, h), wk=(kv, h), wv=(kv, h), wo=(h, q), w1=(ffn, h), w3=(ffn, h),
              w2=(h, ffn)).items()}

    def block(x):
        a, b, c = F.linear(x, w["wq"]), F.linear(x, w["wk"]), F.linear(x, w["wv"])
        rep = heads // (kv // (q // heads))
        b = b.view(1, s, -1, q // heads).repeat_interleave(rep, 2).transpose(1, 2)
        c = c.view(1, s, -1, q // heads).repeat_interleave(rep, 2).transpose(1, 2)
        o = F.scaled_dot_product_attention(a.view(1, s, heads, -1).transpose(1, 2), b, c,
                                           is_causal=True)
        y = x + F.linear(o.transpose(1, 2).reshape(1, s, q), w["wo"])
        return y + F.linear(F.silu(F.linear(y, w["w1"])) * F.linear(y, w["w3"]), w["w2"])

    def context():
        return create_selective_checkpoint_contexts(_titan_policy())

    ptr = {t.data_ptr(): n for n, t in w.items()}
    rerun = []

    class Spy(TorchDispatchMode):
        """Forward matmuls run during backward: x @ W^T reads a weight transposed (a
        gradient matmul reads W as stored, or the input transposed)."""
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            b = args[1] if func == aten.mm.default else None
            if b is not None and b.data_ptr() in ptr and b.stride() == (1, b.shape[0]):
                rerun.append(ptr[b.data_ptr()])
            return func(*args, **(kwargs or {}))
    x = torch.randn(1, s, h, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False, context_fn=context)
    with Spy():
        y.sum().backward()
    assert sorted(rerun) == ["w3", "wk", "wo"]
    m = get_preset("llama3-8b")
    sh = layer_shape(m, _plan("torchtitan"))
    plan = sac.plan_for(layer_ops(m, sh), m, sh)
    assert plan["qkv"].recompute_n == m.kv_dim and plan["mlp_fc1"].recompute_n == m.ffn_hidden
    assert plan["attn_out"].recompute_fraction == 1.0 and plan["mlp_fc2"].recompute_fraction == 0


def test_the_plan_keeps_what_the_policy_saves():
    """Llama 3 8B, one micro-batch: op SAC keeps the layer input and the outputs of wq, wv,
    SDPA (with its logsumexp), w1 and w2; it re-runs every norm, RoPE and activation and
    none of the attention; it keeps less than no recompute and more than full."""
    m = get_preset("llama3-8b")
    sh = layer_shape(m, _plan("torchtitan"))
    fwd = layer_ops(m, sh)
    plan = sac.plan_for(fwd, m, sh)
    tokens, ab = m.seq_len, 2
    want = tokens * ab * (m.q_dim + m.kv_dim + m.q_dim + m.ffn_hidden + m.hidden) \
        + tokens * m.n_heads * 4
    assert sum(s.kept_bytes for s in plan.values()) == pytest.approx(want)
    assert plan["core_attn"].recompute_fraction == 0.0
    for name in ("ln1", "rope", "ln2", "mlp_act"):
        assert plan[name].recompute_fraction == 1.0, name
    kind = (False, False)
    none, _, _ = layer_memory(m, layer_shape(m, _plan("torchtitan", "none")), Recompute.NONE, kind)
    op, _, _ = layer_memory(m, sh, Recompute.SELECTIVE, kind)
    full, _, _ = layer_memory(m, layer_shape(m, _plan("torchtitan", "full")), Recompute.FULL, kind)
    assert full < op < none
    assert op == pytest.approx(want + tokens * m.hidden * ab)


def test_only_torchtitans_selective_is_op_sac():
    assert framework_memory("torchtitan").selective_recompute == "op"
    for fw in ("megatron-core", "nemo", "megatron-lm", "fsdp2", "hf"):
        assert framework_memory(fw).selective_recompute == "attention", fw
        assert not sac_op(_plan(fw))
    assert sac_op(_plan("torchtitan")) and not sac_op(_plan("torchtitan", "full"))


def test_sac_reruns_cost_between_none_and_full():
    """The re-run forward work: wk, wo and w3 of the matmul FLOPs, all of the elementwise
    ops, none of the attention; the step lands between no recompute and full."""
    import hardware_db
    from simulator.api.catalog import make_cluster
    from simulator.engine.simulate import simulate
    m = get_preset("llama3-8b")
    sh = layer_shape(m, _plan("torchtitan"))
    fwd = layer_ops(m, sh)
    again = {o.name: o for o in sac_recompute_ops(fwd, m, sh)}
    assert "core_attn_recompute" not in again
    mm = {o.name: o for o in fwd}
    assert again["qkv_recompute"].recompute_flops == pytest.approx(
        mm["qkv"].model_flops * m.kv_dim / (m.q_dim + 2 * m.kv_dim))
    assert again["mlp_fc1_recompute"].n == mm["mlp_fc1"].n // 2
    cl, prof = make_cluster("a100-sxm-80gb", 8), hardware_db.load_profile("a100-sxm-80gb")
    t = {rc: simulate(m, _plan("torchtitan", rc), cl, prof).step_time_s
         for rc in ("none", "selective", "full")}
    assert t["none"] < t["selective"] < t["full"]


def test_kept_bytes_equal_what_torch_keeps():
    """torch's own SAC storage, running torchtitan's 2024 policy on a small bf16 block in its
    op order (GQA, complex RoPE, eager RMSNorm, SwiGLU), plus the block's input, equals
    ``sac.kept_bytes`` for the same shapes, byte for byte."""
    torch = pytest.importorskip("torch")
    import dataclasses

    import torch.utils.checkpoint as ckpt

    from simulator.workload.op_types import LayerShape
    F, bf = torch.nn.functional, torch.bfloat16
    b, s, h, nh, nkv, ffn = 2, 64, 128, 4, 2, 256
    hd = h // nh
    stores = []

    def context():
        fwd, rec = ckpt.create_selective_checkpoint_contexts(_titan_policy())
        stores.append(fwd.storage)
        return fwd, rec

    def p(*shape):
        return torch.nn.Parameter(torch.randn(*shape, dtype=bf) * 0.02)
    w = dict(wq=p(nh * hd, h), wk=p(nkv * hd, h), wv=p(nkv * hd, h), wo=p(h, nh * hd),
             w1=p(ffn, h), w3=p(ffn, h), w2=p(h, ffn), n1=p(h), n2=p(h))
    freqs = torch.polar(torch.ones(s, hd // 2), torch.randn(s, hd // 2))

    def norm(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * g

    def rope(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs.view(1, s, 1, -1)).flatten(3).type_as(x)

    def block(x):
        a = norm(x, w["n1"])
        q = rope(F.linear(a, w["wq"]).view(b, s, nh, hd))
        k = rope(F.linear(a, w["wk"]).view(b, s, nkv, hd)).repeat_interleave(nh // nkv, 2)
        v = F.linear(a, w["wv"]).view(b, s, nkv, hd).repeat_interleave(nh // nkv, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        y = x + F.linear(o.transpose(1, 2).reshape(b, s, h), w["wo"])
        g = norm(y, w["n2"])
        return y + F.linear(F.silu(F.linear(g, w["w1"])) * F.linear(g, w["w3"]), w["w2"])

    x = torch.randn(b, s, h, dtype=bf, requires_grad=True)
    ckpt.checkpoint(block, x, use_reentrant=False, context_fn=context)
    seen, kept = set(), 0
    for per_op in stores[0].values():
        for val in per_op.values():
            for t in torch.utils._pytree.tree_leaves(val):
                t = getattr(t, "val", t)
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    kept += t.untyped_storage().nbytes()
    m = dataclasses.replace(get_preset("llama3-8b"), hidden=h, ffn_hidden=ffn, n_heads=nh,
                            n_kv_heads=nkv, head_dim=hd, seq_len=s)
    sh = LayerShape(micro_batch=b, seq_len=s, dropout=False, eager_elementwise=True,
                    eager_code="torchtitan", fused_swiglu=False, sac_op=True)
    inp = b * s * h * 2
    assert sac.kept_bytes(layer_ops(m, sh), m, sh, inp) == kept + inp


def test_moe_layers_keep_their_all_to_alls_and_recompute_the_router():
    """torchtitan's MoE models save the EP all-to-alls' outputs (all_to_all_single in their
    save list) and force the router gate to recompute outside the matmul count; the grouped
    experts re-run; DeepSeek's shared expert is w1, w3, w2 after wo: w3 kept."""
    m = get_preset("deepseek-v3")
    plan = with_framework(Plan(micro_batch=1, global_batch=8, dp=8, ep=8, precision="bf16",
                               recompute="selective"), "torchtitan")
    sh = layer_shape(m, plan)
    fwd = layer_ops(m, sh, m.first_layer(True))
    sac_plan = {**sac.plan_for(fwd, m, sh)}
    ops = {o.name: o for o in fwd}
    for name in ("ep_dispatch", "ep_combine"):
        assert sac_plan[name].recompute_fraction == 0.0
        assert sac_plan[name].kept_bytes == ops[name].comm_bytes
    assert sac_plan["router"].recompute_fraction == 1.0
    assert sac_plan["experts_fc1"].recompute_fraction == 1.0
    # MLA projections q_down(1) q_up(2) kv_down(3) kv_up(4) attn_out(5), shared w1(6) w3(7) w2(8)
    assert sac_plan["attn_out"].recompute_fraction == 0.0
    assert sac_plan["shared_fc1"].recompute_fraction == pytest.approx(0.5)
    assert sac_plan["shared_fc2"].recompute_fraction == 1.0


def test_context_parallel_keeps_sdpa_output_once_and_reruns_no_ring():
    m = get_preset("llama3-8b")
    plan = with_framework(Plan(micro_batch=1, global_batch=8, dp=4, cp=2, precision="bf16",
                               recompute="selective"), "torchtitan")
    sh = layer_shape(m, plan)
    fwd = layer_ops(m, sh)
    p = sac.plan_for(fwd, m, sh)
    attn = [o.name for o in fwd if o.kind.value == "attention"]
    assert len(attn) > 1 and sum(p[n].kept_bytes for n in attn) == pytest.approx(
        m.n_heads * (m.seq_len // 2) * (m.head_dim * 2 + 4))
    ring = [o.name for o in fwd if o.group == "cp" or o.name.endswith("_correction")]
    assert ring and all(p[n].recompute_fraction == 0.0 for n in ring)


def test_the_backward_working_set_counts_every_recreated_tensor():
    """The re-run forward re-creates everything the layer's backward reads (a kept matmul's
    input included), so op SAC's transient is full recompute's, not less."""
    m = get_preset("llama3-8b")
    kind = (False, False)
    _, t_op, _ = layer_memory(m, layer_shape(m, _plan("torchtitan")), Recompute.SELECTIVE, kind)
    _, t_full, _ = layer_memory(m, layer_shape(m, _plan("torchtitan", "full")), Recompute.FULL,
                                kind)
    assert t_op == pytest.approx(t_full)
