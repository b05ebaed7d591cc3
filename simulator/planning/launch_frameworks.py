"""A chosen plan as a NeMo 2 recipe, a torchtitan job TOML and a torch FSDP2 sketch.

* NeMo 2 (``nemo.collections.llm`` + ``nemo_run``): the model's own recipe module when
  NeMo ships one (``llm.<recipe>.pretrain_recipe``), its ``trainer.strategy``
  (``MegatronStrategy``) parallel sizes, ``data`` batch sizes and ``model.config``
  recompute settings; other models get a ``llm.GPTConfig`` with the family's
  ``TransformerConfig`` fields.
* torchtitan: the TOML job config of torchtitan 0.2 (``--job.config_file``; sections
  ``job``, ``model``, ``training``, ``parallelism``, ``activation_checkpoint``). torchtitan
  0.3 replaced TOML files by Python config functions; the same keys are its
  ``--<section>.<key>`` command-line overrides.
* FSDP2 sketch: a device mesh ``pp x dp x tp`` (``dp`` split ``dp_mod_ep x ep`` for MoE),
  ``torch.distributed.pipelining`` stages and schedule, tensor parallelism, experts sharded
  over ``ep`` and FSDP over the rest -- torchtitan's layout.
"""
from __future__ import annotations

from ..engine.stage_work import partition_layers
from ..hardware.specs import Dtype
from ..parallel.plan import Plan, Recompute, Schedule
from ..parallel.schedule import chunk_parts
from ..workload.presets import PRESETS
from ..workload.spec import MLP, Norm, Position, TransformerSpec

# preset -> NeMo 2 recipe module (nemo/collections/llm/recipes/<name>.py)
NEMO_RECIPES = {"llama2-7b": "llama2_7b", "llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b",
                "llama3-405b": "llama31_405b", "mixtral-8x7b": "mixtral_8x7b",
                "deepseek-v2": "deepseek_v2", "deepseek-v3": "deepseek_v3",
                "gemma2-9b": "gemma2_9b", "gpt3-175b": "gpt3_175b",
                "nemotron4-340b": "nemotron4_340b"}
# preset -> torchtitan 0.2 (model.name, model.flavor)
TORCHTITAN_MODELS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
                     "llama3-405b": ("llama3", "405B"), "deepseek-v2": ("deepseek_v3", "236B"),
                     "deepseek-v3": ("deepseek_v3", "671B")}


def _preset_key(m: TransformerSpec) -> str | None:
    """The preset this spec is (name and parameter count agree), if any."""
    ref = PRESETS.get(m.name)
    return m.name if ref is not None and ref.total_params() == m.total_params() else None


def _dtype_name(p: Plan) -> str:
    return {Dtype.FP16: "float16", Dtype.FP32: "float32"}.get(p.precision, "bfloat16")


# ---- NeMo 2 -------------------------------------------------------------------------------
def _gpt_config_fields(m: TransformerSpec, p: Plan) -> list[str]:
    f = [f"num_layers={m.n_layers}", f"hidden_size={m.hidden}", f"ffn_hidden_size={m.ffn_hidden}",
         f"num_attention_heads={m.n_heads}", f"num_query_groups={m.n_kv_heads}",
         f"kv_channels={m.head_dim}", f"seq_length={m.seq_len}",
         f"normalization={'RMSNorm' if m.norm == Norm.RMSNORM else 'LayerNorm'!r}",
         "position_embedding_type=" + repr("rope" if m.position == Position.ROPE else "learned_absolute"),
         f"add_bias_linear={m.linear_bias}", f"add_qkv_bias={m.qkv_bias}",
         f"gated_linear_unit={m.mlp == MLP.SWIGLU}",
         f"share_embeddings_and_output_weights={m.tied_embeddings}"]
    if m.mlp == MLP.SWIGLU:
        f.append("activation_func=F.silu")
    if m.moe is not None:
        f += [f"num_moe_experts={m.moe.experts}", f"moe_router_topk={m.moe.top_k}",
              f"moe_ffn_hidden_size={m.moe.expert_ffn_hidden}", "moe_grouped_gemm=True",
              f"moe_token_dispatcher_type={p.moe_dispatcher!r}"]
        if p.moe_dispatcher == "flex":            # Megatron-Core TransformerConfig field
            f.append("moe_flex_dispatcher_backend='deepep'")
    return f


def nemo_recipe(m: TransformerSpec, p: Plan, nodes: int, gpus_per_node: int) -> str:
    key = _preset_key(m)
    recipe = NEMO_RECIPES.get(key or "")
    base = recipe or "llama3_8b"
    lines = ["# NeMo 2 recipe (nemo.collections.llm + nemo_run) for the chosen plan",
             "import nemo_run as run",
             "import torch.nn.functional as F  # activation functions for GPTConfig",
             "from nemo.collections import llm",
             "from nemo.collections.llm.recipes.precision.mixed_precision import "
             + ("bf16_with_fp8_mixed" if p.precision == Dtype.FP8 else "bf16_mixed"),
             "",
             f'recipe = llm.{base}.pretrain_recipe(name="complexity_plan", num_nodes={nodes}, '
             f"num_gpus_per_node={gpus_per_node})"]
    if recipe is None:
        fields = ",\n    ".join(_gpt_config_fields(m, p))
        lines.append(f"# no NeMo recipe for {m.name}: a GPT model with its architecture\n"
                     f"recipe.model = run.Config(llm.GPTModel, config=run.Config(\n"
                     f"    llm.GPTConfig,\n    {fields}))")
    s = "recipe.trainer.strategy."
    lines += [f"{s}tensor_model_parallel_size = {p.tp}", f"{s}pipeline_model_parallel_size = {p.pp}",
              f"{s}virtual_pipeline_model_parallel_size = {p.vpp if p.vpp > 1 else None}",
              f"{s}context_parallel_size = {p.cp}", f"{s}expert_model_parallel_size = {p.ep}",
              f"{s}sequence_parallel = {p.sequence_parallel}",
              f"recipe.data.seq_length = {m.seq_len}", f"recipe.model.config.seq_length = {m.seq_len}",
              f"recipe.data.micro_batch_size = {p.micro_batch}",
              f"recipe.data.global_batch_size = {p.global_batch}"]
    if m.moe is not None and recipe is not None:   # a preset recipe: set the dispatcher too
        lines.append(f"recipe.model.config.moe_token_dispatcher_type = {p.moe_dispatcher!r}")
        if p.moe_dispatcher == "flex":
            lines.append("recipe.model.config.moe_flex_dispatcher_backend = 'deepep'")
    if p.recompute != Recompute.NONE:
        lines.append(f"recipe.model.config.recompute_granularity = {p.recompute.value!r}")
    if p.recompute == Recompute.FULL:
        method, n = ("block", p.recompute_layers) if p.recompute_layers else ("uniform", 1)
        lines += [f"recipe.model.config.recompute_method = {method!r}",
                  f"recipe.model.config.recompute_num_layers = {n}"]
    lines += ["recipe.trainer.plugins = " + ("bf16_with_fp8_mixed()" if p.precision == Dtype.FP8
                                             else "bf16_mixed()"),
              f'run.run(recipe, executor=run.LocalExecutor(ntasks_per_node={gpus_per_node}, '
              'launcher="torchrun"))']
    return "\n".join(lines) + "\n"


# ---- torchtitan ---------------------------------------------------------------------------
def _dp_degrees(p: Plan) -> tuple[int, int, str]:
    """(replicate, shard, fsdp_reshard_after_forward): DDP for ZeRO-0, FSDP2 otherwise
    (ZeRO-1/2 have no torchtitan mode: FSDP that keeps weights after forward is closest)."""
    if p.zero_stage == 0:
        return p.dp, 1, "default"
    if p.dp_shard:               # HSDP: torchtitan shards over dp_shard x cp, replicates across
        return p.replicas, p.dp_shard // p.cp, "default"
    return 1, p.dp, "default" if p.zero_stage >= 3 else "never"


def torch_pipeline(p: Plan) -> tuple[str, int, str, str]:
    """(``torch.distributed.pipelining`` schedule name, as ``get_schedule_class`` takes it,
    chunks the model is cut into, this rank's chunk ids (a Python expression in ``pp_rank``,
    ``pp_size``), a note). torch has ZB-V (``ZBVZeroBubble``, V placement); it has no ZB-H1
    and no DualPipe (its ``DualPipeV`` is the cut-in-half V variant on pp/2 ranks), for
    which 1F1B is emitted and the note says so."""
    if p.schedule == Schedule.ZB_V:
        return "ZBVZeroBubble", 2 * p.pp, "[pp_rank, 2 * pp_size - 1 - pp_rank]", ""
    if p.schedule in (Schedule.ZB_H1, Schedule.DUALPIPE):
        return ("1F1B", p.pp, "list(range(pp_rank, {c}, pp_size))",
                f"# the plan was simulated with {p.schedule.value}, which torch.distributed."
                "pipelining does not provide: 1F1B here")
    return ("Interleaved1F1B" if p.vpp > 1 else "1F1B", p.pp * p.vpp,
            "list(range(pp_rank, {c}, pp_size))", "")


def torchtitan_toml(m: TransformerSpec, p: Plan) -> str:
    key = _preset_key(m)
    name, flavor = TORCHTITAN_MODELS.get(key or "", (m.name, "custom"))
    rep, shard, reshard = _dp_degrees(p)
    local = p.global_batch // p.dp
    lines = ["# torchtitan job config (0.2 TOML schema): torchrun ... -m torchtitan.train "
             "--job.config_file plan.toml"]
    if (key or "") not in TORCHTITAN_MODELS:
        lines.append(f"# torchtitan ships no {m.name} model: register it (experimental.custom_import) "
                     "under this name and flavor")
    lines += ["[job]", 'dump_folder = "./outputs"', f'description = "complexity plan: {m.name}"', "",
              "[model]", f'name = "{name}"', f'flavor = "{flavor}"']
    if p.precision == Dtype.FP8:
        lines.append('converters = ["quantize.linear.float8"]')
    lines += ["", "[training]", f"local_batch_size = {local}", f"global_batch_size = {p.global_batch}",
              f"seq_len = {m.seq_len}",
              'mixed_precision_param = "' + ("float32" if p.precision == Dtype.FP32 else "bfloat16")
              + '"' + ("   # torchtitan has no fp16 training" if p.precision == Dtype.FP16 else ""),
              'mixed_precision_reduce = "float32"', "",
              "[parallelism]", f"data_parallel_replicate_degree = {rep}",
              f"data_parallel_shard_degree = {shard}", f'fsdp_reshard_after_forward = "{reshard}"',
              f"tensor_parallel_degree = {p.tp}", f"pipeline_parallel_degree = {p.pp}",
              f"context_parallel_degree = {p.cp}", f"expert_parallel_degree = {p.ep}"]
    if p.ep > 1 and p.tp > 1:            # experts sliced over TP too, as simulated (ETP = TP)
        lines.append(f"expert_tensor_parallel_degree = {p.tp}")
    if p.pp > 1:
        sched, chunks, _, note = torch_pipeline(p)
        lines += ([note] if note else []) + [f'pipeline_parallel_schedule = "{sched}"',
                                             f"pipeline_parallel_microbatch_size = {p.micro_batch}"]
        if m.n_layers % chunks == 0:
            lines.append(f"pipeline_parallel_layers_per_stage = {m.n_layers // chunks}")
    return "\n".join(lines + _torchtitan_ac(m, p)) + "\n"


def _torchtitan_ac(m: TransformerSpec, p: Plan) -> list[str]:
    """The [activation_checkpoint] section: a partial full recompute of N layers per chunk
    is torchtitan's every-k-th-layer option where k = layers per chunk / N is whole (the
    same count of layers, every k-th instead of the first N), else said in a comment."""
    mode = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[p.recompute]
    if p.recompute == Recompute.SELECTIVE:
        return ["", "[activation_checkpoint]", f'mode = "{mode}"', 'selective_ac_option = "op"']
    per_chunk = m.n_layers // chunk_parts(p.schedule, p.pp, p.vpp)[0]
    if p.recompute_layers and per_chunk % p.recompute_layers == 0:
        k = per_chunk // p.recompute_layers
        return ["", "[activation_checkpoint]", 'mode = "selective"',
                f'selective_ac_option = "{k}"   # one layer in {k}: {p.recompute_layers} '
                f"of {per_chunk} per chunk"]
    note = ([f"# {p.recompute_layers} of {per_chunk} layers per chunk is not an every-k-th "
             "layer count: all layers checkpointed here"] if p.recompute_layers else [])
    return ["", "[activation_checkpoint]"] + note + [f'mode = "{mode}"']


# ---- FSDP2 sketch -------------------------------------------------------------------------
def _mesh(p: Plan) -> tuple[list[str], list[int]]:
    """Mesh dims, slowest first. EP groups take consecutive ranks of the DP x CP block, one
    TP block apart, as Megatron's expert grid does (cp folded into expert DP): with CP, the
    dim that holds them is split and flattened back in the sketch (``_ep_mesh_lines``)."""
    names, sizes = ["pp"], [p.pp]
    if p.ep > 1 and p.cp > 1 and p.ep % p.cp == 0:      # EP spans CP and part of DP
        names += ["dp_mod_ep", "ep_mod_cp", "cp"]
        sizes += [p.dp * p.cp // p.ep, p.ep // p.cp, p.cp]
    elif p.ep > 1 and p.cp > 1:                          # EP inside CP (ep divides cp)
        names += ["dp", "cp_mod_ep", "ep"]
        sizes += [p.dp, p.cp // p.ep, p.ep]
    elif p.ep > 1:
        names += ["dp_mod_ep", "ep"]
        sizes += [p.dp // p.ep, p.ep]
    else:
        names.append("dp")
        sizes.append(p.dp)
        if p.cp > 1:
            names.append("cp")
            sizes.append(p.cp)
    return names + ["tp"], sizes + [p.tp]


def _ep_mesh_lines(p: Plan, names: list[str]) -> list[str]:
    """``dp_mesh`` (dense parameters), and with EP ``ep_mesh`` / ``edp_mesh`` (experts)."""
    if "ep_mod_cp" in names:
        return ['ep_mesh = mesh["ep_mod_cp", "cp"]._flatten("ep")   # experts: EP over CP x part of DP',
                'edp_mesh = mesh["dp_mod_ep"]',
                'dp_mesh = mesh["dp_mod_ep", "ep_mod_cp"]._flatten("dp")   # dense params: FSDP over DP']
    if "cp_mod_ep" in names:
        return ['ep_mesh = mesh["ep"]   # experts: EP inside CP',
                'edp_mesh = mesh["dp", "cp_mod_ep"]._flatten("edp")',
                'dp_mesh = mesh["dp"]   # dense params: FSDP over DP']
    if p.ep > 1:
        return ['ep_mesh = mesh["ep"]', 'edp_mesh = mesh["dp_mod_ep"]',
                'dp_mesh = mesh["dp_mod_ep", "ep"]._flatten("dp")   # dense params: FSDP over all DP ranks']
    return ['dp_mesh = mesh["dp"]']


def fsdp_sketch(m: TransformerSpec, p: Plan) -> str:
    names, sizes = _mesh(p)
    name, chunks, ids, note = torch_pipeline(p)
    sched = f"Schedule{name}"
    reshard = p.zero_stage >= 3
    L = [f"# torch >= 2.6 sketch of the plan: {' x '.join(f'{n}={s}' for n, s in zip(names, sizes))}"
         f" ({m.n_layers} blocks, {chunks} pipeline chunk(s))",
         "import torch",
         "from torch.distributed.device_mesh import init_device_mesh",
         "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard",
         f"from torch.distributed.pipelining import PipelineStage, {sched}",
         "from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,",
         "                                               SequenceParallel, parallelize_module)",
         "",
         f"mesh = init_device_mesh(\"cuda\", {tuple(sizes)}, mesh_dim_names={tuple(names)})"]
    L += _ep_mesh_lines(p, names)
    L += ['pp_rank, pp_size = mesh["pp"].get_local_rank(), mesh["pp"].size()',
          f"mp = MixedPrecisionPolicy(param_dtype=torch.{_dtype_name(p)}, reduce_dtype=torch.float32)",
          "model = build_model()       # your module: .layers (blocks), .embed, .head",
          f"# pipeline: {chunks} chunks of layers (the simulated split); this rank holds "
          + (f"chunks pp_rank, pp_rank + {p.pp}, ..." if p.schedule != Schedule.ZB_V
             else "chunks pp_rank and 2 pp_size - 1 - pp_rank (a V)"),
          f"bounds = {_bounds(m.n_layers, chunks)}",
          f"chunk_ids = {ids.format(c=chunks)}",
          "stages = []",
          "for c in chunk_ids:",
          "    part = build_chunk(model, range(bounds[c], bounds[c + 1]),",
          f"                       first=c == 0, last=c == {chunks - 1})",
          "    for i, block in enumerate(part.layers):"]
    L += _tp_lines(p) + _ep_lines(m, p) + _ckpt_lines(p)
    L += [f"        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward={reshard})",
          f"    fully_shard(part, mesh=dp_mesh, mp_policy=mp, reshard_after_forward={reshard})",
          f"    stages.append(PipelineStage(part, c, {chunks}, torch.device('cuda')))",
          f"n_micro = {p.global_batch // (p.micro_batch * p.dp)}   # micro-batches of {p.micro_batch} x "
          f"{m.seq_len} tokens per step",
          f"schedule = {sched}({'stages' if chunks > p.pp else 'stages[0]'}, n_microbatches=n_micro, "
          "loss_fn=loss_fn)" + (f"   {note}" if note else ""),
          "# each step: schedule.step(inputs) on the first stage, schedule.step(target=labels) on the last"]
    return "\n".join(L) + "\n"


def _bounds(n_layers: int, chunks: int) -> list[int]:
    parts = partition_layers(n_layers, chunks)
    return [c[0] for c in parts] + [n_layers]


def _tp_lines(p: Plan) -> list[str]:
    if p.tp == 1:
        return []
    norm = "SequenceParallel()" if p.sequence_parallel else "None"
    return ['        parallelize_module(block, mesh["tp"], {   # Megatron-style column/row split',
            '            "attn.qkv": ColwiseParallel(), "attn.out": RowwiseParallel(),',
            '            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(),',
            f'            "norm": {norm}}})']


def _ep_lines(m: TransformerSpec, p: Plan) -> list[str]:
    if m.moe is None:
        return []
    if p.ep == 1:
        return [f"        # MoE: all {m.moe.experts} experts on every rank (ep=1)"]
    return [f"        # MoE: {m.moe.experts // p.ep} of {m.moe.experts} experts per rank; tokens "
            'all-to-all over ep_mesh',
            "        if hasattr(block, \"moe\"):",
            "            shard_experts(block.moe.experts, ep_mesh)   # keep experts "
            "[ep_rank * E/ep, (ep_rank+1) * E/ep)",
            "            fully_shard(block.moe.experts, mesh=edp_mesh, mp_policy=mp)"]


def _ckpt_lines(p: Plan) -> list[str]:
    if p.recompute == Recompute.NONE:
        return []
    wrap = f"part.layers[i] = block = checkpoint_wrapper(block)   # recompute ({p.recompute.value})"
    return ["        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import "
            "checkpoint_wrapper"] + (
        [f"        if i < {p.recompute_layers}:   # the chunk's first layers only",
         "            " + wrap] if p.recompute_layers else ["        " + wrap])
