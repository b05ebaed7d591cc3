"""Parameter tensors and Linear calls per layer as the model code holds them
(``simulator.cost.host.ParamLayout``), which per-tensor and per-Linear-call host costs
(DeepSpeed's ZeRO hooks, DDP's hooks, ZeRO-3's memory-efficient linear) multiply.

Checked against transformers' own decoder layers: ``len(list(layer.parameters()))`` and
the layer's ``nn.Linear`` / ``Conv1D`` modules, transformers 5.24, one-layer models built
from each family's config class (``EXACT``; the numbers are kept here so the check also
runs where transformers is not installed, and re-counted where it is). Known deviations,
each a layout the spec has no field for (``DEVIATIONS``: transformers' count, ours):
parallel attention/MLP blocks with one norm (Cohere, GPT-J, Phi, Falcon's classic
architecture, whose single biased LayerNorm and bias-free Linears happen to give the same
total as two bias-free norms), LayerNorm biases beside bias-free Linears (StableLM,
Nemotron), GPT-J's bias-free attention projections and OLMo's weightless LayerNorm.
Gemma 2/3's sandwich norms are in the op graph (``TransformerSpec.sandwich_norms``) and
transformers 5's experts, two 3-D tensors per MoE layer, are counted so
(``ParamLayout.experts_3d``): both exact since stop 36."""
from __future__ import annotations

import pytest

from simulator.cost.host import ParamLayout, linear_calls, param_tensors
from simulator.frameworks.defaults import framework_memory
from simulator.parallel.conventions import conventions_for
from simulator.workload.hf import from_hf_config
from simulator.workload.ops import LayerShape, layer_ops
from simulator.workload.presets import get_preset

# model_type: (parameter tensors, Linear modules) of one decoder layer, transformers 5.24
EXACT = {"llama": (9, 7), "mistral": (9, 7), "granite": (9, 7), "qwen2": (12, 7),
         "qwen3": (11, 7), "olmo2": (11, 7), "phi3": (6, 4), "gpt2": (12, 4),
         "gpt_bigcode": (12, 4), "gpt_neox": (12, 4), "bloom": (12, 4), "mpt": (6, 4),
         "starcoder2": (16, 6), "gemma2": (11, 7), "gemma3_text": (13, 7),
         # transformers 5: the experts as two 3-D tensors run by grouped GEMMs, no Linear
         # modules; the router a module of its own with one weight, no Linear either
         "mixtral": (9, 4), "qwen3_moe": (11, 4), "olmoe": (11, 4)}
# model_type: (transformers' tensors, ours)
DEVIATIONS = {"cohere": (8, 9), "gptj": (10, 16), "phi": (14, 16), "stablelm": (11, 9),
              "nemotron": (10, 8), "olmo": (7, 9)}
BASE = dict(hidden_size=64, num_hidden_layers=1, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=64)
MOE = dict(num_local_experts=8, num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=64)
MOE_FAMILIES = ("mixtral", "qwen3_moe", "olmoe")


def _extra(mt: str) -> dict:
    return MOE if mt in MOE_FAMILIES else {}


def _ours(cfg: dict) -> tuple[int, int]:
    spec = from_hf_config(cfg)
    ops = layer_ops(spec, LayerShape(micro_batch=1, seq_len=spec.seq_len), 0)
    lay = ParamLayout.of(spec, "hf")
    return param_tensors(ops, lay), linear_calls(ops, lay)


def _cfg(mt: str) -> dict:
    act = {"gpt2": "gelu_new", "starcoder2": "gelu_pytorch_tanh", "gpt_neox": "gelu",
           "bloom": "gelu", "mpt": "gelu", "gpt_bigcode": "gelu_pytorch_tanh",
           "gptj": "gelu_new", "phi": "gelu_new", "nemotron": "relu2"}
    return {"model_type": mt, **BASE, **_extra(mt), "hidden_act": act.get(mt, "silu")}


@pytest.mark.parametrize("mt", sorted(EXACT))
def test_layer_tensors_and_linears_match_transformers(mt):
    assert _ours(_cfg(mt)) == EXACT[mt]


@pytest.mark.parametrize("mt", sorted(DEVIATIONS))
def test_known_deviations_stay_what_they_are(mt):
    assert _ours(_cfg(mt))[0] == DEVIATIONS[mt][1]


def transformers_layer(mt: str):
    """(config dict, first decoder layer) of ``mt``'s one-layer transformers model at
    ``BASE`` sizes (GPTBigCode's KV heads follow its ``multi_query``, as in its configs,
    not the ``num_key_value_heads`` attribute set here, which its attention does not read)."""
    import torch
    import transformers
    cfg = transformers.CONFIG_MAPPING[mt]()
    for k, v in {**BASE, **_extra(mt), "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2}.items():
        if hasattr(cfg, k):
            setattr(cfg, k, v)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    out = cfg.to_dict()
    if mt == "gpt_bigcode":
        del out["num_key_value_heads"]
    return out, next(m for name, m in model.named_modules()
                     if isinstance(m, torch.nn.ModuleList)
                     and name.endswith(("layers", ".h", "blocks")))[0]


def _transformers_layer(mt: str):
    import torch
    cfg, layer = transformers_layer(mt)
    linears = sum(1 for m in layer.modules()
                  if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")
    return cfg, len(list(layer.parameters())), linears


@pytest.mark.torch
@pytest.mark.parametrize("mt", sorted(EXACT) + sorted(DEVIATIONS))
def test_the_counts_are_transformers_own(mt):
    """Re-count on transformers' modules (skipped without transformers): the numbers
    above are its layers', and ours on the config it builds are what the tables say."""
    pytest.importorskip("transformers")
    cfg, tensors, linears = _transformers_layer(mt)
    if mt in EXACT:
        assert (tensors, linears) == EXACT[mt]
        assert _ours(cfg) == EXACT[mt]
    else:
        assert tensors == DEVIATIONS[mt][0]


def test_layouts_by_framework():
    """Megatron's fused modules keep the op graph's 6 weights of a Llama layer; the
    frameworks that run transformers' code count its 9 and 7 Linear calls, torchtitan's own
    code the same; a GPT-2 layer's biases and LayerNorm biases count under any layout."""
    llama, gpt2 = get_preset("llama2-7b"), get_preset("gpt2-124m")
    sh = LayerShape(micro_batch=1, seq_len=1024)

    def counts(spec, fw):
        lay = ParamLayout.of(spec, conventions_for(framework_memory(fw), "bf16").param_layout)
        ops = layer_ops(spec, sh)
        return param_tensors(ops, lay), linear_calls(ops, lay)

    assert counts(llama, "megatron-core") == (6, 4) == counts(llama, "nemo")
    for fw in ("hf", "deepspeed", "fsdp", "fsdp2", "pytorch", "torchtitan"):
        assert counts(llama, fw) == (9, 7), fw
    for fw in ("megatron-core", "hf", "deepspeed"):
        assert counts(gpt2, fw) == (12, 4), fw
    assert param_tensors(layer_ops(llama, sh)) == 6     # the default: the op graph's weights


def test_3d_experts_count_once_whatever_the_local_experts():
    """Routed experts held as 3-D tensors count one tensor per projection (transformers 5:
    gate_up_proj, down_proj; torchtitan's GroupedExperts: w1, w3, w2) and one module, also
    when expert parallelism leaves one expert per rank (a plain GEMM, not a grouped one);
    Megatron's per-expert modules count one per expert."""
    spec = from_hf_config(_cfg("mixtral"))
    for ep, local in ((1, 8), (8, 1)):
        ops = layer_ops(spec, LayerShape(micro_batch=1, seq_len=spec.seq_len, ep=ep), 0)
        assert sum(o.batch for o in ops if o.name == "experts_fc1") == local
        hf, tt = ParamLayout.of(spec, "hf"), ParamLayout.of(spec, "split")
        assert (param_tensors(ops, hf), linear_calls(ops, hf)) == (9, 4), ep
        assert param_tensors(ops, tt) == 10, ep                 # w1, w3 apart
        assert param_tensors(ops, hf.weights_only()) == 8       # one experts module
        assert param_tensors(ops, tt.weights_only()) == 8
        fused = ParamLayout.of(spec, "fused")
        assert param_tensors(ops, fused) == 5 + 2 * local, ep   # qkv fused: a weight per expert
