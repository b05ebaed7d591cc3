"""A published row given by its dimensions (no preset) describes the framework's own GPT
when its MLP is GELU: Megatron-LM / Megatron-Core / NeMo / Megatron-DeepSpeed / llm-foundry
build that GPT with tied input and output embeddings unless told otherwise
(``FrameworkDefaults.gpt_tied_embeddings``, sources in frameworks.json). Other frameworks,
other MLPs and named presets keep what they had."""
from __future__ import annotations

import pytest

import hardware_db
from simulator.api.catalog import cluster_from_row
from simulator.validation.predict import predict_row

ROW = {"id": "t1", "source": "test", "model": "", "n_layers": "4", "hidden": "1024",
       "ffn_hidden": "4096", "n_heads": "16", "n_kv_heads": "16", "seq_len": "2048",
       "vocab": "51200", "mlp": "gelu", "gpu": "a100-sxm-80gb", "n_gpus": "8",
       "gpus_per_node": "8", "tp": "1", "pp": "2", "dp": "4", "micro_batch": "1",
       "global_batch": "32", "precision": "bf16", "measured_step_time_s": "1.0"}


def _outcome(**kw):
    o = predict_row({**ROW, **kw}, cluster_from_row, hardware_db.load_profile)
    assert o.status == "ok", o.status
    return o


@pytest.mark.parametrize("framework", ["megatron", "megatron-core", "nemo",
                                       "megatron-deepspeed", "llm-foundry-fsdp"])
def test_a_gelu_gpt_by_dimensions_ties_under_the_gpt_frameworks(framework):
    o = _outcome(framework=framework)
    assert o.inputs.model.tied_embeddings
    assert "tied embeddings (the framework's GPT default)" in o.chosen


@pytest.mark.parametrize("kw", [dict(framework="hf"), dict(framework="pytorch"),
                                dict(framework="megatron-core", mlp="swiglu")])
def test_other_frameworks_and_mlps_stay_untied(kw):
    o = _outcome(**kw)
    assert not o.inputs.model.tied_embeddings
    assert "tied embeddings" not in o.chosen


def test_tying_changes_the_parameter_count_and_the_pipeline_tail():
    """Tied: one V x h table fewer in the model; under PP each end stage still holds its
    copy and the two all-reduce the shared table's gradient (engine.step.tied_grad_costs),
    so the same plan is never faster tied than untied."""
    from dataclasses import replace

    from simulator.engine.simulate import simulate
    o = _outcome(framework="megatron-core")
    tied = o.inputs.model
    untied = replace(tied, tied_embeddings=False)
    assert untied.total_params() - tied.total_params() == 51200 * 1024
    a = simulate(tied, o.inputs.plan, o.inputs.cluster, o.inputs.profile)
    b = simulate(untied, o.inputs.plan, o.inputs.cluster, o.inputs.profile)
    assert a.step_time_s > b.step_time_s
