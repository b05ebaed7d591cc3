"""GPT-2-style model code as transformers runs it eagerly: its GELU written out
(``NewGELUActivation``, ``TransformerSpec.act_fn = "gelu_new"``; BLOOM's ``BloomGelu``,
"bloom_gelu") and its dropout after the
attention and MLP output projections (``TransformerSpec.hidden_dropout``), each priced from
the measured ``eager_elementwise`` rows (``calibrate.bench_eager``) in frameworks that run
the model's own code eagerly, and not elsewhere. The per-family config keys are counted on
transformers' modules where it is installed."""
from __future__ import annotations

import dataclasses

import pytest

from simulator.engine.recompute import early_stopped
from simulator.engine.stage_work import layer_shape
from simulator.errors import InvalidInputError
from simulator.frameworks.defaults import EAGER
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.hf import from_hf_config
from simulator.workload.hf_families import HIDDEN_DROPOUT
from simulator.workload.ops import backward_ops, layer_ops
from simulator.workload.presets import get_preset

GPT2 = get_preset("gpt2-124m")


def _ops(fw: str, model=GPT2, **plan):
    p = dataclasses.replace(with_framework(
        Plan(micro_batch=2, global_batch=8, dp=4, precision="bf16"), fw), **plan)
    sh = layer_shape(model, p)
    fwd = layer_ops(model, sh)
    return sh, fwd, {o.name: o for o in fwd + backward_ops(fwd)}


def test_gpt2_under_hf_prices_its_eager_gelu_and_dropouts():
    sh, fwd, ops = _ops("hf")
    tokens = sh.micro_batch * GPT2.seq_len
    ffn, hid = tokens * GPT2.ffn_hidden, tokens * GPT2.hidden
    g, d = EAGER["gelu_new"], EAGER["dropout"]
    act = ops["mlp_act"]
    assert act.bytes_moved == pytest.approx(g.fwd_bytes * ffn)
    assert ops["mlp_act_bwd"].bytes_moved == pytest.approx(g.bwd_bytes * ffn)
    assert (act.launches, ops["mlp_act_bwd"].launches) == (8, 11)
    assert act.saved_bytes == pytest.approx(g.saved_bytes * ffn)
    for name in ("attn_out_dropout", "mlp_out_dropout"):
        assert ops[name].bytes_moved == pytest.approx(d.fwd_bytes * hid)
        assert ops[name].saved_bytes == pytest.approx(d.saved_bytes * hid)   # the mask
    names = [o.name for o in fwd]
    # each dropout sits between its sublayer's output projection and the residual add
    assert names.index("attn_out") < names.index("attn_out_dropout") < names.index("attn_residual")
    assert names.index("mlp_fc2") < names.index("mlp_out_dropout") < names.index("mlp_residual")
    # torch's checkpoint early stop now ends at the mask, after the down projection
    assert early_stopped(fwd)[-1].name == "mlp_out_dropout"


def test_fused_frameworks_and_other_models_are_unchanged():
    """Megatron's fused GELU and its own dropout convention, and a GPT-2 without dropout or
    with a fused GELU, keep the fused pricing."""
    _, _, mc = _ops("megatron-core")
    _, _, hf = _ops("hf")
    assert "attn_out_dropout" not in mc and mc["mlp_act"].launches == 0
    assert mc["mlp_act"].bytes_moved < hf["mlp_act"].bytes_moved / 8
    plain = dataclasses.replace(GPT2, act_fn="", hidden_dropout=0.0)
    _, _, p = _ops("hf", plain)
    assert "attn_out_dropout" not in p
    assert p["mlp_act"].bytes_moved == pytest.approx(mc["mlp_act"].bytes_moved)
    # torch.compile fuses the pointwise ops: fused traffic under the compiled host mode
    _, _, comp = _ops("hf", host_mode="compiled")
    assert comp["mlp_act"].bytes_moved == pytest.approx(mc["mlp_act"].bytes_moved)


def test_bloom_code_prices_its_gelu_function():
    """BLOOM imported from its config runs BloomGelu (an autograd Function saving its input
    only) under eager model code."""
    bloom = from_hf_config({"model_type": "bloom", "hidden_size": 64, "n_layer": 2,
                            "n_head": 4, "vocab_size": 256, "seq_length": 64})
    assert bloom.act_fn == "bloom_gelu"
    sh, _, ops = _ops("hf", bloom)
    elems = sh.micro_batch * bloom.seq_len * bloom.ffn_hidden
    b = EAGER["bloom_gelu"]
    assert ops["mlp_act"].bytes_moved == pytest.approx(b.fwd_bytes * elems)
    assert ops["mlp_act_bwd"].launches == b.bwd_kernels
    assert ops["mlp_act"].saved_bytes == pytest.approx(2 * elems)


def test_dropout_in_any_dtype_and_only_in_transformers_code():
    """The dropout kernel's traffic is its I/O in the activation dtype plus a 1-byte mask:
    at 16 bits the measured row, at fp32 9 B per element each way; torchtitan's own code
    has no such dropout (nor gelu_new)."""
    sh, _, ops = _ops("hf")
    elems = sh.micro_batch * GPT2.seq_len * GPT2.hidden
    d = EAGER["dropout"]
    assert (d.fwd_bytes, d.bwd_bytes, d.saved_bytes) == (5.0, 5.0, 1.0)
    assert ops["attn_out_dropout"].bytes_moved == pytest.approx(d.fwd_bytes * elems)
    p32 = dataclasses.replace(with_framework(Plan(micro_batch=2, global_batch=8, dp=4,
                                                  precision="fp32"), "hf"))
    sh32 = layer_shape(GPT2, p32)
    f32 = {o.name: o for o in layer_ops(GPT2, sh32)}
    assert f32["mlp_out_dropout"].bytes_moved == pytest.approx(9.0 * elems)
    assert f32["mlp_out_dropout"].saved_bytes == pytest.approx(elems)
    _, _, tt = _ops("torchtitan")
    assert "attn_out_dropout" not in tt and tt["mlp_act"].launches == 0


def test_spec_checks_its_fields():
    with pytest.raises(InvalidInputError, match="act_fn"):
        dataclasses.replace(GPT2, act_fn="gelu_newer")
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(InvalidInputError, match="hidden_dropout"):
            dataclasses.replace(GPT2, hidden_dropout=bad)


BASE = dict(hidden_size=64, num_hidden_layers=1, intermediate_size=128, ffn_dim=128,
            num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
            max_position_embeddings=64)


@pytest.mark.parametrize("mt", sorted(HIDDEN_DROPOUT))
def test_the_import_reads_each_familys_key(mt):
    key, default = HIDDEN_DROPOUT[mt]
    act = "gelu_new" if mt in ("gpt2", "gptj", "phi") else "gelu"
    cfg = {"model_type": mt, **BASE, "hidden_act": act, "activation_function": act,
           "rotary_dim": 8}
    assert from_hf_config(cfg).hidden_dropout == default
    assert from_hf_config({**cfg, key: 0.25}).hidden_dropout == 0.25
    want = "bloom_gelu" if mt == "bloom" else "gelu_new" if act == "gelu_new" else ""
    assert from_hf_config(cfg).act_fn == want


def _dropout_calls(mt: str, key: str) -> tuple[int, float]:
    """Dropout kernels in one training forward of a 1-layer model of family ``mt`` whose
    ``key`` is 0.5 and every other dropout 0 (bernoulli_ on a CPU), and the config class's
    default for ``key``."""
    import torch
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode

    cfg = transformers.CONFIG_MAPPING[mt]()
    default = getattr(cfg, key)
    for k, v in {**BASE, "rotary_dim": 8, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2}.items():
        if hasattr(cfg, k):
            setattr(cfg, k, v)
    for k, v in cfg.to_dict().items():
        if ("drop" in k) and isinstance(v, float):
            setattr(cfg, k, 0.5 if k == key else 0.0)
    calls = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("bernoulli_", "native_dropout"):
                calls.append(func)
            return func(*args, **(kwargs or {}))
    model = transformers.AutoModelForCausalLM.from_config(cfg).train()
    with Count():
        model(input_ids=torch.randint(3, 200, (1, 16)))
    return len(calls), default


@pytest.mark.torch
@pytest.mark.parametrize("mt", sorted(HIDDEN_DROPOUT))
def test_the_keys_are_transformers_own(mt):
    """Where transformers is installed: the key drives two dropouts per layer (GPT-NeoX also
    applies it once to the embeddings, not priced), and the default is the config class's."""
    pytest.importorskip("transformers")
    key, default = HIDDEN_DROPOUT[mt]
    calls, class_default = _dropout_calls(mt, key)
    assert calls == (3 if mt == "gpt_neox" else 2)
    assert class_default == pytest.approx(default)
