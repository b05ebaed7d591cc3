"""ZeRO-3's persistent parameter tensors (``simulator.cost.persistence``): DeepSpeed keeps
whole every tensor of at most ``stage3_param_persistence_threshold`` elements
(runtime/zero/parameter_offload.py ``mark_persistent_parameters`` @ 0.19.8,
``ds_numel <= threshold``). Checked against transformers' own one-layer models (the tensors
of a decoder layer at or under the threshold, re-counted where transformers is installed),
by closed forms on presets, and as a property: never more than the layer's tensors, never
fewer at a larger threshold."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_param_layout import EXACT, transformers_layer

from simulator.cost.host import ParamLayout, param_tensors
from simulator.cost.persistence import persistent_gather_s, persistent_tensors
from simulator.workload.hf import from_hf_config
from simulator.workload.ops import LayerShape, layer_ops
from simulator.workload.presets import get_preset

MULTIPLES = (1, 2, 10, 33, 40, 100, 130)      # thresholds in hidden sizes


def _layer(spec, code: str = "hf"):
    """(one layer's ops, the layout) as the engine builds them: q, k, v and gate, up split
    where the model code splits them."""
    lay = ParamLayout.of(spec, code)
    return layer_ops(spec, LayerShape(micro_batch=1, seq_len=spec.seq_len,
                                      split_qkv=lay.split_qkv,
                                      split_gate_up=lay.split_gate_up), 0), lay


def test_gpt2_keeps_its_norms_and_biases_whole_at_hf_auto():
    """HF Trainer's "auto" threshold, 10 x 768: a GPT-2 layer's 4 biases (largest 3072) and
    its 2 LayerNorms' weights and biases (768) persist, its 4 weights (>= 589824) do not;
    nothing persists at threshold 0; every tensor at a threshold above the largest weight."""
    m = get_preset("gpt2-124m")
    ops, lay = _layer(m)
    assert persistent_tensors(ops, lay, 10 * m.hidden, m) == 8
    assert persistent_tensors(ops, lay, 0, m) == 0
    assert persistent_tensors(ops, lay, 4 * m.hidden ** 2, m) == param_tensors(ops, lay)


def test_the_threshold_is_inclusive():
    """Mixtral's router weight holds 8 x hidden elements: persistent at exactly that
    threshold (``<=``), not one element below it."""
    m = get_preset("mixtral-8x7b")
    ops, lay = _layer(m)
    at = persistent_tensors(ops, lay, 8 * m.hidden, m)
    assert at - persistent_tensors(ops, lay, 8 * m.hidden - 1, m) == 1
    many = get_preset("qwen3-30b-a3b")                 # 128 experts: its router is partitioned
    ops, lay = _layer(many)
    assert persistent_tensors(ops, lay, 10 * many.hidden, many) == \
        persistent_tensors(ops, lay, many.hidden, many)


def test_deepspeed_default_threshold_keeps_a_tiny_model_s_square_weights():
    """DeepSpeed's own default, 1e5 elements, on small-4l-256's layer (GPT-style: biased
    Linears, q, k, v split as transformers holds them, LayerNorms with biases): its four
    256 x 256 attention weights (65536) persist beside the 6 biases and the 2 LayerNorms'
    4 tensors, 14; the MLP's 256 x 1024 weights (262144) do not; HF's 10 x 256 keeps the
    biases and norms, 10."""
    m = get_preset("small-4l-256")
    ops, lay = _layer(m)
    assert (m.hidden, m.ffn_hidden, param_tensors(ops, lay)) == (256, 1024, 16)
    assert persistent_tensors(ops, lay, 1e5, m) == 14
    assert persistent_tensors(ops, lay, 10 * m.hidden, m) == 10


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpt2-124m", "llama2-7b", "mixtral-8x7b", "qwen3-30b-a3b",
                             "deepseek-v2", "small-4l-256"]),
       low=st.floats(0, 1e9), high=st.floats(0, 1e9))
def test_more_threshold_never_fewer_persistent_and_never_more_than_the_tensors(name, low, high):
    m = get_preset(name)
    ops, lay = _layer(m)
    lo, hi = sorted((low, high))
    a, b = (persistent_tensors(ops, lay, t, m) for t in (lo, hi))
    assert 0 <= a <= b <= param_tensors(ops, lay)


@pytest.mark.torch
@pytest.mark.parametrize("mt", sorted(EXACT))
def test_the_persistent_tensors_are_transformers_own(mt):
    """On each family's one-layer transformers model (hidden 64): the layer's parameters of
    at most the threshold's elements, as DeepSpeed marks them, at several thresholds."""
    pytest.importorskip("transformers")
    cfg, layer = transformers_layer(mt)
    spec = from_hf_config(cfg)
    ops, lay = _layer(spec)
    for x in MULTIPLES:
        thr = x * spec.hidden
        theirs = sum(1 for p in layer.parameters() if p.numel() <= thr)
        assert persistent_tensors(ops, lay, thr, spec) == theirs, (mt, x)


@settings(max_examples=30, deadline=None)
@given(tensors=st.integers(0, 400), gpus=st.sampled_from([2, 8, 16, 64, 256]),
       fp32=st.booleans())
def test_the_step_s_gathers_are_one_all_gather_per_tensor_and_grow_with_the_group(
        tensors, gpus, fp32):
    """``persistent_gather_s``: ``tensors`` all-gathers of ``hidden`` elements (4 B in fp32,
    else 2) in series over the shard group; never cheaper over more ranks."""
    import hardware_db
    from simulator.cost.layer import group_collective
    from simulator.engine.stage_work import place_groups
    from simulator.network.collectives import Collective
    from simulator.parallel.plan import Plan
    m = get_preset("llama2-7b")
    prof = hardware_db.load_profile("a100-sxm4-80gb")
    times = []
    for n in (gpus, 2 * gpus):
        cl = hardware_db.build_cluster("a100-sxm4-80gb", n)
        plan = Plan(dp=n, micro_batch=1, global_batch=n, zero_stage=3,
                    precision="fp32" if fp32 else "bf16")
        g = place_groups(cl, plan)["dp"]
        got = persistent_gather_s(tensors, m, plan, g, prof)
        one = group_collective(Collective.ALL_GATHER, m.hidden * (4 if fp32 else 2), g, prof)
        assert got == pytest.approx(tensors * one.time_s, rel=1e-12)
        times.append(got)
    assert times[1] >= times[0]
