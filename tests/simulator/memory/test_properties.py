"""Properties of the memory accounting over many plans and frameworks."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.memory_fit import estimate_stage_memory
from simulator.frameworks import framework_names
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload import MoESpec, TransformerSpec

DENSE = TransformerSpec("p-dense", 8, 1024, 4096, 16, 4, 32000, 1024, mlp="swiglu")
MOE = TransformerSpec("p-moe", 4, 1024, 2048, 16, 16, 32000, 1024, mlp="swiglu",
                      moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=1024))


@st.composite
def cases(draw):
    model = draw(st.sampled_from([DENSE, MOE]))
    tp, pp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    dp, mb, m = draw(st.sampled_from([1, 2, 8])), draw(st.sampled_from([1, 2])), 4
    ep = draw(st.sampled_from([e for e in (1, 2, 8) if dp % e == 0])) if model.moe else 1
    plan = Plan(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=mb, global_batch=mb * dp * m,
                precision=draw(st.sampled_from(["bf16", "fp16", "fp8", "fp32"])),
                attention=draw(st.sampled_from(["flash", "materialized"])))
    return model, with_framework(plan, draw(st.sampled_from(framework_names())),
                                 keep={"attention", "sequence_parallel"})


def states(model, plan) -> float:
    return max(m.state_bytes for m in estimate_stage_memory(model, plan))


@settings(max_examples=40, deadline=None)
@given(cases())
def test_more_zero_sharding_never_holds_more_state(case):
    model, plan = case
    last = None
    for z in range(4):
        if z >= 2 and plan.pp > 1:
            break
        s = states(model, dataclasses.replace(plan, zero_stage=z))
        assert last is None or s <= last * (1 + 1e-12)
        last = s


@settings(max_examples=40, deadline=None)
@given(cases())
def test_recompute_never_keeps_more_activations(case):
    model, plan = case
    acts = [max(m.activations_bytes for m in estimate_stage_memory(
        model, dataclasses.replace(plan, recompute=rc))) for rc in ("none", "selective", "full")]
    assert acts[0] >= acts[1] >= acts[2] > 0


@settings(max_examples=40, deadline=None)
@given(cases())
def test_peak_is_at_least_each_part(case):
    model, plan = case
    for m in estimate_stage_memory(model, plan):
        assert m.total_bytes >= m.state_bytes + m.activations_bytes
        assert min(m.weights_bytes, m.grads_bytes, m.activations_bytes, m.workspace_bytes) >= 0
