"""Full recompute through torch's non-reentrant checkpoint stops early: the re-run forward
ends once the last tensor the forward saved is saved again, and a matmul's inputs are saved
before its kernel runs, so a block ending in its down projection and residual add re-runs
neither (``engine.recompute.early_stopped``; frameworks.json ``recompute_early_stop``).
Counted here on torch's own checkpoint, then the simulator's re-run ops against it."""
from __future__ import annotations

import dataclasses

import pytest

import hardware_db
from simulator.engine.recompute import recompute_ops
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import layer_shape
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.ops import OpKind, layer_ops
from simulator.workload.presets import get_preset

MATMULS = ("mm", "addmm", "bmm")


def _rerun_matmuls(reentrant: bool | None, dropout: float = 0.0,
                   function_down: bool = False) -> int:
    """Matmuls a checkpointed Llama-style block (q, k, v, o, gate, up, down) runs in
    backward beyond the 14 of its plain backward (``reentrant`` None: not checkpointed;
    ``function_down``: the down projection is a custom autograd Function that saves its
    inputs after its matmul, as ZeRO-3's memory-efficient linear does)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        def __init__(self, h: int = 32, f: int = 64) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
            self.g, self.u = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
            self.d, self.drop = nn.Linear(f, h, bias=False), nn.Dropout(dropout)

        def forward(self, x):
            b, t, h = x.shape
            q, k, v = (p(x).view(b, t, 4, h // 4).transpose(1, 2) for p in (self.q, self.k,
                                                                               self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
            y = F.silu(self.g(x)) * self.u(x)
            return x + self.drop(Linear.apply(y, self.d.weight) if function_down
                                 else self.d(y))

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            out = x.matmul(w.t())
            ctx.save_for_backward(x, w)
            return out

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g.matmul(w), g.reshape(-1, g.shape[-1]).t().mm(x.reshape(-1, x.shape[-1]))

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.overloadpacket.__name__ in MATMULS
            return func(*args, **(kwargs or {}))

    block, x = Block().train(), torch.randn(2, 8, 32, requires_grad=True)
    out = block(x) if reentrant is None else checkpoint(block, x, use_reentrant=reentrant)
    with Count() as c:
        out.sum().backward()
    return c.n - 14


@pytest.mark.torch
def test_torchs_checkpoint_skips_the_down_projection_unless_something_saves_after_it():
    pytest.importorskip("torch")
    assert _rerun_matmuls(None) == 0
    assert _rerun_matmuls(reentrant=True) == 7          # the whole forward again
    assert _rerun_matmuls(reentrant=False) == 6         # early stop: not the down projection
    assert _rerun_matmuls(reentrant=False, dropout=0.1) == 7   # its dropout mask saves after
    assert _rerun_matmuls(reentrant=False, function_down=True) == 7   # saves after its matmul


def _rerun(fw: str, model: str = "llama2-7b", precision_fp8: bool = False, **kw) -> list[str]:
    m = get_preset(model)
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, recompute="full",
                               precision="fp8" if precision_fp8 else "bf16", **kw), fw,
                          set(kw))
    return [o.name for o in recompute_ops(layer_ops(m, layer_shape(m, plan), 1), plan, m)]


def test_frameworks_on_torchs_checkpoint_rerun_all_but_the_down_projection():
    m = get_preset("llama2-7b")
    every = [o.name + "_recompute" for o in layer_ops(m, layer_shape(
        m, with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"),
                          "hf")))]
    assert every[-2:] == ["mlp_fc2_recompute", "mlp_residual_recompute"]
    for fw in ("hf", "deepspeed", "fsdp", "fsdp2", "pytorch", "torchtitan"):
        assert _rerun(fw) == every[:-2], fw
    for fw in ("megatron-core", "megatron-lm", "nemo", "megatron-deepspeed", "llm-foundry"):
        assert _rerun(fw)[-2:] == ["mlp_fc2_recompute", "mlp_residual_recompute"], fw


def test_a_mask_saved_after_the_down_projection_keeps_it():
    m = get_preset("llama2-7b")
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16",
                               recompute="full"), "hf")
    plan = dataclasses.replace(plan, memory=dataclasses.replace(plan.memory, dropout=True))
    fwd = layer_ops(m, layer_shape(m, plan))
    assert fwd[-1].saved_bytes > 0                      # the residual's dropout mask
    assert len(recompute_ops(fwd, plan)) == len(fwd)


def test_the_step_loses_one_down_projection_per_layer():
    """Same plan with and without early stop: the hardware FLOPs differ by the down
    projection's forward in every layer, and the step is shorter."""
    m = get_preset("llama2-7b")
    cl = hardware_db.build_cluster("a100-sxm-80gb", 8)
    prof = hardware_db.load_profile("a100-sxm-80gb")
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16",
                               recompute="full"), "fsdp")
    full = dataclasses.replace(plan, memory=dataclasses.replace(
        plan.memory, recompute_early_stop=False))
    fc2 = next(o for o in layer_ops(m, layer_shape(m, plan))
               if o.kind == OpKind.GEMM and o.name == "mlp_fc2")
    a, b = simulate(m, plan, cl, prof), simulate(m, full, cl, prof)
    def per_gpu(r):
        return r.hardware_tflops_per_gpu * 1e12 * r.step_time_s
    flops = per_gpu(b) - per_gpu(a)
    assert flops == pytest.approx(m.n_layers * fc2.model_flops, rel=1e-6)
    assert a.step_time_s < b.step_time_s


def test_the_last_gemm_reruns_where_something_saves_after_it():
    """ZeRO-3's memory-efficient linear and FP8 Linears are autograd Functions (saving after
    their GEMM), and Gemma 2's post-feed-forward norm saves the down projection's output:
    each re-runs the down projection under early stop too."""
    assert _rerun("deepspeed", zero_stage=3)[-1] == "mlp_fc2_recompute"   # not the add
    assert "mlp_fc2_recompute" not in _rerun("deepspeed", zero_stage=1)
    assert "mlp_fc2_recompute" in _rerun("torchtitan", precision_fp8=True)
    assert "mlp_fc2_recompute" in _rerun("hf", model="gemma2-9b")
    # Gemma's post-feed-forward norm is in the op graph (sandwich_norms): the re-run stops
    # once it has saved its input again, before the residual add
    assert _rerun("hf", model="gemma2-9b")[-2:] == ["mlp_fc2_recompute",
                                                    "post_ffn_norm_recompute"]
    assert "mlp_fc2_recompute" not in _rerun("hf", model="llama3-8b")



def test_host_mechanisms_do_not_change_what_is_recomputed():
    """Which GEMMs re-run is the framework's code (a memory convention), not a host flag."""
    m = get_preset("llama2-7b")
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, recompute="full",
                               precision="bf16", zero_stage=3), "deepspeed", {"zero_stage"})
    bare = dataclasses.replace(plan, host_mechanisms=())
    fwd = layer_ops(m, layer_shape(m, plan))
    assert [o.name for o in recompute_ops(fwd, plan, m)] == \
        [o.name for o in recompute_ops(fwd, bare, m)]
