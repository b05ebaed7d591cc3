"""Launch configurations a framework accepts as they are (issue 19, item 3).

Checked against the frameworks' own interfaces, recorded in data/framework_interfaces.json
(each section names its source file and commit): Megatron-LM's parser option table,
Megatron-Core / NeMo config fields, NeMo 2 recipe and strategy names, torchtitan 0.2's
job-config schema. Where the framework itself is importable, its parser is run too."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from simulator.api.catalog import HardwareDbCatalog
from simulator.parallel.plan import Plan, validate
from simulator.planning.capacity import HardwareChoice
from simulator.planning.launch_args import launch_args, pipeline_layout
from simulator.engine.stage_work import partition_layers
from simulator.workload import resolve_model

try:
    import tomllib
except ImportError:                                   # Python 3.10
    tomllib = pytest.importorskip("tomli")

FACTS = json.loads((Path(__file__).parent / "data" / "framework_interfaces.json").read_text())
CAT = HardwareDbCatalog()

# (model, plan, GPUs): the plans the search chose for these models (ZeRO-3 / CP / EP) and
# Megatron-style 3-D plans (TP + interleaved PP; EP with TP; uneven PP over 61 layers)
CASES = {
    "llama3-70b-search": ("llama3-70b", dict(tp=1, pp=1, dp=16, cp=4, micro_batch=1, global_batch=512,
                                             zero_stage=3), 64),
    "llama3-70b-3d": ("llama3-70b", dict(tp=8, pp=4, dp=2, vpp=5, micro_batch=1, global_batch=512,
                                         sequence_parallel=True, recompute="selective", zero_stage=1,
                                         schedule="interleaved"), 64),
    "mixtral-8x7b-search": ("mixtral-8x7b", dict(dp=64, ep=8, micro_batch=1, global_batch=512,
                                                 zero_stage=3), 64),
    "mixtral-8x7b-ep-cp": ("mixtral-8x7b", dict(tp=2, dp=4, cp=4, ep=8, micro_batch=1,
                                                global_batch=512, sequence_parallel=True,
                                                zero_stage=3), 32),
    "mixtral-8x7b-ep-in-cp": ("mixtral-8x7b", dict(tp=1, dp=4, cp=4, ep=2, micro_batch=1,
                                                   global_batch=512, zero_stage=3), 16),
    "mixtral-8x7b-ep": ("mixtral-8x7b", dict(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=512,
                                             sequence_parallel=True, zero_stage=1), 64),
    "deepseek-v3-search": ("deepseek-v3", dict(dp=1024, ep=8, micro_batch=4, global_batch=4096,
                                               zero_stage=3, recompute="full"), 1024),
    "deepseek-v3-pp": ("deepseek-v3", dict(pp=16, dp=64, ep=64, micro_batch=1, global_batch=4096,
                                           zero_stage=1, recompute="full"), 1024),
}


def _case(name):
    model, kw, n = CASES[name]
    m, p = resolve_model(model), Plan(**kw)
    validate(p, m, CAT.cluster(HardwareChoice("h100-sxm", n)))
    return m, p, n, launch_args(m, p, n, 8)


def _megatron_pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    flags = FACTS["megatron_lm"]["flags"]
    out, i = [], 0
    while i < len(argv):
        f = argv[i]
        assert f in flags, f"{f} is not a Megatron-LM argument"
        if flags[f]["takes_value"]:
            out.append((f, argv[i + 1]))
            i += 2
        else:
            out.append((f, None))
            i += 1
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_arguments_parse_against_megatron_lm_option_table(name):
    m, p, n, la = _case(name)
    flags = FACTS["megatron_lm"]["flags"]
    pairs = _megatron_pairs(la.megatron_argv())
    seen = [f for f, _ in pairs]
    assert len(seen) == len(set(seen)), "an argument given twice"
    for f, v in pairs:
        choices = flags[f].get("choices")
        if choices:      # enum choices print as 'AttnBackend.flash'; argparse maps 'flash'
            assert v in choices or any(c.endswith("." + v) for c in choices), (f, v)
        if v is not None:
            assert not v.startswith("--"), (f, v)


def _args(la) -> dict[str, str | None]:
    return dict(_megatron_pairs(la.megatron_argv()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_arguments_are_complete_for_the_family(name):
    m, p, n, la = _case(name)
    a = _args(la)
    assert a["--normalization"] == "RMSNorm" and a["--position-embedding-type"] == "rope"
    assert "--disable-bias-linear" in a and "--swiglu" in a
    assert "--untie-embeddings-and-output-weights" in a
    assert int(a["--num-layers"]) == m.n_layers and int(a["--hidden-size"]) == m.hidden
    if m.mla is None:
        assert a["--num-query-groups"] == "8" and "--group-query-attention" in a
    else:
        assert "--multi-latent-attention" in a and "--num-query-groups" not in a
        assert (a["--q-lora-rank"], a["--kv-lora-rank"], a["--qk-head-dim"],
                a["--qk-pos-emb-head-dim"], a["--v-head-dim"]) == ("1536", "512", "128", "64", "128")
        assert a["--moe-router-score-function"] == "sigmoid" and "--moe-router-enable-expert-bias" in a
        assert (a["--moe-router-num-groups"], a["--moe-router-group-topk"]) == ("8", "4")
    if m.moe is not None:
        assert int(a["--num-experts"]) == m.moe.experts and int(a["--moe-router-topk"]) == m.moe.top_k
        assert a["--moe-token-dispatcher-type"] == "alltoall" and "--moe-grouped-gemm" in a
    if "--moe-layer-freq" in a:      # Megatron's moe_freq_type evaluates the list expression
        pattern = eval(a["--moe-layer-freq"], {"__builtins__": {}})  # noqa: S307
        assert pattern == [int(m.is_moe_layer(i)) for i in range(m.n_layers)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_arguments_follow_the_plan_and_validate_args_rules(name):
    m, p, n, la = _case(name)
    a = _args(la)
    assert (int(a["--tensor-model-parallel-size"]), int(a["--pipeline-model-parallel-size"])) == (p.tp, p.pp)
    assert int(a.get("--expert-model-parallel-size", 1)) == p.ep
    assert int(a.get("--context-parallel-size", 1)) == p.cp
    assert int(a["--global-batch-size"]) == p.global_batch and int(a["--micro-batch-size"]) == p.micro_batch
    # rules of megatron/training/arguments.py validate_args (same commit as the table):
    assert "--use-torch-fsdp2" not in a                     # refuses PP and EP
    if "--overlap-param-gather" in a:
        assert "--use-distributed-optimizer" in a or "--use-megatron-fsdp" in a
    if "--use-megatron-fsdp" in a:
        assert a["--ckpt-format"] == "fsdp_dtensor"
    env = dict(la.megatron_env)
    if (p.tp > 1 or p.cp > 1) and "--use-megatron-fsdp" not in a:
        assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    if "--pipeline-model-parallel-layout" in a:
        stages = a["--pipeline-model-parallel-layout"].strip("EL").split("|")
        sizes = [int(s.split("*")[1]) for s in stages]
        assert sizes == [len(c) for c in partition_layers(m.n_layers, p.pp * p.vpp)]
    elif p.vpp > 1:
        assert int(a["--num-layers-per-virtual-pipeline-stage"]) * p.pp * p.vpp == m.n_layers


def test_pipeline_layout_string():
    assert pipeline_layout(61, 16) == "Et*3|" + "t*4|" * 13 + "t*3|t*3L"


def test_megatron_arguments_with_megatron_lms_own_parser():
    """Runs where Megatron-LM's ``megatron.training`` is importable (not in this repo's
    environments: it needs the Megatron-LM checkout; checked by hand, see docs/search.md)."""
    args_mod = pytest.importorskip("megatron.training.arguments")
    import os
    import sys
    for name in sorted(CASES):
        m, p, n, la = _case(name)
        old = sys.argv
        sys.argv = ["pretrain_gpt.py"] + la.megatron_argv() + ["--mock-data", "--tokenizer-type",
                                                             "NullTokenizer", "--vocab-size", "32000"]
        os.environ["WORLD_SIZE"] = str(n)
        try:
            parsed = args_mod.parse_args(ignore_unknown_args=False)
        finally:
            sys.argv = old
        assert parsed.tensor_model_parallel_size == p.tp


def _nemo_assignments(src: str) -> dict[str, str]:
    tree = ast.parse(src)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            out[ast.unparse(node.targets[0])] = ast.unparse(node.value)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_nemo2_recipe_uses_nemos_names(name):
    m, p, n, la = _case(name)
    nemo = FACTS["nemo2"]
    src = la.nemo
    recipe = re.search(r"llm\.(\w+)\.pretrain_recipe", src).group(1)
    assert recipe in nemo["recipes"]
    fields = set(FACTS["megatron_core_config_fields"]["fields"])
    a = _nemo_assignments(src)
    for target in a:
        parts = target.split(".")
        if parts[:3] == ["recipe", "trainer", "strategy"]:
            assert parts[3] in nemo["strategy_kwargs"], target
        elif parts[:2] == ["recipe", "data"]:
            assert parts[2] in nemo["data_kwargs"], target
        elif parts[:3] == ["recipe", "model", "config"]:
            assert parts[3] in fields, target
    s = "recipe.trainer.strategy."
    assert a[s + "tensor_model_parallel_size"] == str(p.tp)
    assert a[s + "pipeline_model_parallel_size"] == str(p.pp)
    assert a[s + "expert_model_parallel_size"] == str(p.ep)
    assert a[s + "context_parallel_size"] == str(p.cp)
    assert a["recipe.data.global_batch_size"] == str(p.global_batch)
    assert f"num_nodes={n // 8}" in src and "bf16_mixed()" in src


def test_nemo2_recipe_for_a_model_without_recipe_uses_config_fields():
    m = resolve_model("qwen3-30b-a3b")
    la = launch_args(m, Plan(dp=8, ep=8, global_batch=64), 8, 8)
    fields = set(FACTS["megatron_core_config_fields"]["fields"])
    call = next(n for n in ast.walk(ast.parse(la.nemo)) if isinstance(n, ast.Call)
                and ast.unparse(n.func) == "run.Config" and ast.unparse(n.args[0]) == "llm.GPTConfig")
    names = {k.arg for k in call.keywords}
    assert names <= fields and {"num_moe_experts", "gated_linear_unit", "normalization"} <= names


@pytest.mark.parametrize("name", sorted(CASES))
def test_torchtitan_toml_matches_its_job_config_schema(name):
    m, p, n, la = _case(name)
    tt = FACTS["torchtitan"]
    cfg = tomllib.loads(la.torchtitan)
    for section, keys in cfg.items():
        assert section in tt["sections"], section
        for k, v in keys.items():
            assert k in tt["sections"][section], f"{section}.{k}"
            if f"{section}.{k}" in tt["choices"]:
                assert v in tt["choices"][f"{section}.{k}"], (section, k, v)
    if cfg["model"]["name"] in tt["flavors"]:
        assert cfg["model"]["flavor"] in tt["flavors"][cfg["model"]["name"]]
    par = cfg["parallelism"]
    # torchtitan ParallelDims: replicate * shard * cp * tp * pp == world size; ETP = TP or 1
    assert (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
            * par["context_parallel_degree"] * par["tensor_parallel_degree"]
            * par["pipeline_parallel_degree"]) == n
    assert par.get("expert_tensor_parallel_degree", 1) in (1, par["tensor_parallel_degree"])
    assert cfg["training"]["global_batch_size"] == p.global_batch


def test_torchtitan_toml_with_torchtitans_config_manager(tmp_path):
    """Runs where torchtitan 0.2 (the TOML generation) is installed."""
    manager = pytest.importorskip("torchtitan.config.manager")
    if not hasattr(manager.ConfigManager, "_maybe_load_toml"):
        pytest.skip("torchtitan >= 0.3 takes Python config functions, not TOML")
    for name in sorted(CASES):
        m, p, n, la = _case(name)
        f = tmp_path / f"{name}.toml"
        f.write_text(la.torchtitan)
        cfg = manager.ConfigManager().parse_args(["--job.config_file", str(f)])
        assert cfg.parallelism.tensor_parallel_degree == p.tp


@pytest.mark.parametrize("name", sorted(CASES))
def test_fsdp2_sketch_honours_pp_and_ep(name):
    m, p, n, la = _case(name)
    src = la.fsdp_sketch
    tree = ast.parse(src)
    mesh = next(c for c in ast.walk(tree) if isinstance(c, ast.Call)
                and ast.unparse(c.func) == "init_device_mesh")
    sizes = ast.literal_eval(mesh.args[1])
    names = ast.literal_eval(mesh.keywords[0].value)
    assert len(sizes) == len(names) and eval("*".join(map(str, sizes))) == n  # noqa: S307
    assert dict(zip(names, sizes))["pp"] == p.pp and dict(zip(names, sizes))["tp"] == p.tp
    if p.ep > 1:
        d = dict(zip(names, sizes))
        ep = d["ep"] if "ep" in d else d["ep_mod_cp"] * d["cp"]
        assert ep == p.ep and "ep_mesh" in src and "edp_mesh" in src
    assert "PipelineStage(" in src and "fully_shard(" in src
    bounds = ast.literal_eval(next(n_.value for n_ in ast.walk(tree) if isinstance(n_, ast.Assign)
                                   and ast.unparse(n_.targets[0]) == "bounds"))
    assert bounds[-1] == m.n_layers and len(bounds) == p.pp * p.vpp + 1


@pytest.mark.torch
def test_fsdp2_sketch_imports_exist_in_torch():
    pytest.importorskip("torch")
    import importlib
    m, p, n, la = _case("llama3-70b-3d")
    for node in ast.walk(ast.parse(la.fsdp_sketch)):
        if isinstance(node, ast.ImportFrom):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{node.module}.{alias.name}"


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v", "dualpipe"])
def test_split_backward_schedules_launch_what_the_frameworks_have(schedule):
    """torch.distributed.pipelining has ZB-V (``ZBVZeroBubble``, resolved by torch's own
    ``get_schedule_class`` where torch is installed); ZB-H1 and DualPipe have no torch or
    Megatron-LM flag: 1F1B is emitted and a note says so; never Megatron's interleaving."""
    m = resolve_model("llama3-8b")
    la = launch_args(m, Plan(tp=2, pp=4, dp=1, global_batch=16, schedule=schedule), 8, 8)
    assert not any("virtual" in a for a in la.megatron)
    cfg = tomllib.loads(la.torchtitan)
    name = cfg["parallelism"]["pipeline_parallel_schedule"]
    assert name == ("ZBVZeroBubble" if schedule == "zb-v" else "1F1B")
    assert cfg["parallelism"]["pipeline_parallel_layers_per_stage"] == \
        m.n_layers // (8 if schedule == "zb-v" else 4)
    if schedule != "zb-v":
        assert schedule in la.torchtitan and any(schedule in n for n in la.notes)
    else:
        assert "chunk_ids = [pp_rank, 2 * pp_size - 1 - pp_rank]" in la.fsdp_sketch
    ast.parse(la.fsdp_sketch)
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    assert torch_schedules.get_schedule_class(name).__name__ == f"Schedule{name}"
    assert f"Schedule{name}" in la.fsdp_sketch


def test_fsdp2_sketch_places_ep_like_megatron_under_cp():
    """EP groups are consecutive ranks of the DP x CP block one TP block apart (Megatron's
    expert grid, cp=1): the sketch's mesh makes the flattened EP dims exactly those ranks."""
    import numpy as np
    from simulator.planning.launch_frameworks import _mesh
    from simulator.parallel.placement import group_strides
    for kw in (dict(tp=2, dp=4, cp=4, ep=8), dict(tp=1, dp=4, cp=4, ep=2),
               dict(tp=2, dp=8, cp=1, ep=4)):
        p = Plan(**kw)
        names, sizes = _mesh(p)
        ranks = np.arange(int(np.prod(sizes))).reshape(sizes)     # row-major = rank order
        ep_dims = [i for i, n in enumerate(names) if n in ("ep", "ep_mod_cp")
                   or (n == "cp" and "ep_mod_cp" in names)]
        rest = [i for i in range(len(names)) if i not in ep_dims]
        groups = ranks.transpose(rest + ep_dims).reshape(-1, p.ep)
        size, stride = group_strides(p)["ep"]
        assert size == p.ep
        assert (groups[0] == np.arange(p.ep) * stride).all(), kw


@pytest.mark.parametrize("grad_dtype, precision, flag", [
    (None, "bf16", False), (None, "fp8", False), ("bf16", "bf16", True), ("bf16", "fp8", True),
    (None, "fp16", False)])
def test_megatron_gradient_dtype_flag_follows_the_plan(grad_dtype, precision, flag):
    """Megatron-LM's --bf16 alone reduces gradients in fp32 (arguments.py forces
    accumulate_allreduce_grads_in_fp32), which is Megatron-Core's default here; a plan with
    16-bit gradients must ask for --grad-reduce-in-bf16 or the run would not match it."""
    from simulator.parallel.framework_plan import with_framework
    m = resolve_model("llama3-8b")
    p = with_framework(Plan(tp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=1,
                            precision=precision), "megatron-core", grad_dtype=grad_dtype)
    assert p.grad_bytes == (2 if grad_dtype or precision == "fp16" else 4)
    a = _args(launch_args(m, p, 8, 8))
    assert ("--grad-reduce-in-bf16" in a) == flag


@pytest.mark.parametrize("framework, flag", [("megatron-core", False), ("nemo", True)])
def test_fp8_primary_weights_ask_for_fp8_param_gather(framework, flag):
    """Megatron-LM keeps 16-bit parameters (and TE's cached FP8 copies) unless
    --fp8-param-gather (store_true, since 2024-09); a plan priced with FP8 primary weights
    (NeMo's FP8 recipes) must ask for it."""
    from simulator.parallel.framework_plan import with_framework
    p = with_framework(Plan(tp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=1,
                            precision="fp8"), framework)
    assert p.memory.fp8_primary_weights == flag
    a = _args(launch_args(resolve_model("llama3-8b"), p, 8, 8))
    assert ("--fp8-param-gather" in a) == flag
