"""Ready-to-paste launch settings for a plan: Megatron-LM arguments, NeMo (Megatron GPT
Hydra) overrides, and a torch FSDP2 + tensor-parallel sketch.

The flags are the public command-line names of Megatron-LM's ``pretrain_gpt.py``
(``megatron/training/arguments.py``) and NeMo's ``megatron_gpt_config.yaml``; settings the
plan does not decide (data, optimizer hyper-parameters, checkpoints) are left out.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware.specs import Dtype
from ..parallel.plan import AttentionImpl, Plan, Recompute
from ..workload.spec import MLP, TransformerSpec


@dataclass(frozen=True)
class LaunchArgs:
    megatron: tuple[str, ...]
    nemo: tuple[str, ...]
    fsdp_sketch: str
    notes: tuple[str, ...]

    def megatron_command(self, n_nodes: int, gpus_per_node: int) -> str:
        head = f"torchrun --nnodes {n_nodes} --nproc-per-node {gpus_per_node} pretrain_gpt.py"
        return " \\\n    ".join([head] + list(self.megatron))

    def to_dict(self) -> dict:
        return {"megatron_lm": list(self.megatron), "nemo": list(self.nemo),
                "fsdp_sketch": self.fsdp_sketch, "notes": list(self.notes)}


def _model_args(m: TransformerSpec) -> list[str]:
    a = [f"--num-layers {m.n_layers}", f"--hidden-size {m.hidden}",
         f"--ffn-hidden-size {m.ffn_hidden}", f"--num-attention-heads {m.n_heads}",
         f"--seq-length {m.seq_len}", f"--max-position-embeddings {m.seq_len}"]
    if m.n_kv_heads != m.n_heads:
        a += ["--group-query-attention", f"--num-query-groups {m.n_kv_heads}"]
    if m.head_dim != m.hidden // m.n_heads:
        a.append(f"--kv-channels {m.head_dim}")
    if m.mlp == MLP.SWIGLU:
        a.append("--swiglu")
    elif m.mlp == MLP.RELU2:
        a.append("--squared-relu")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if m.moe is not None:
        a += [f"--num-experts {m.moe.experts}", f"--moe-router-topk {m.moe.top_k}",
              f"--moe-ffn-hidden-size {m.moe.expert_ffn_hidden}"]
        if m.moe.shared_experts:
            a.append(f"--moe-shared-expert-intermediate-size "
                     f"{m.moe.shared_experts * m.moe.expert_ffn_hidden}")
    return a


def _precision_args(p: Plan) -> list[str]:
    if p.precision == Dtype.FP8:
        return ["--bf16", "--fp8-format hybrid"]
    if p.precision == Dtype.FP16:
        return ["--fp16"]
    if p.precision == Dtype.BF16:
        return ["--bf16"]
    return []


def _parallel_args(m: TransformerSpec, p: Plan) -> list[str]:
    a = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}",
         f"--micro-batch-size {p.micro_batch}", f"--global-batch-size {p.global_batch}"]
    if p.vpp > 1:
        a.append(f"--num-layers-per-virtual-pipeline-stage {m.n_layers // (p.pp * p.vpp)}")
    if p.cp > 1:
        a.append(f"--context-parallel-size {p.cp}")
    if p.ep > 1:
        a.append(f"--expert-model-parallel-size {p.ep}")
    if p.sequence_parallel:
        a.append("--sequence-parallel")
    if p.recompute == Recompute.SELECTIVE:
        a.append("--recompute-granularity selective")
    elif p.recompute == Recompute.FULL:
        a += ["--recompute-granularity full", "--recompute-method uniform",
              "--recompute-num-layers 1"]
    if p.zero_stage in (1, 2):
        a.append("--use-distributed-optimizer")
    if p.zero_stage == 3:
        a.append("--use-torch-fsdp2")
    return a


def _overlap_args(p: Plan) -> list[str]:
    a = []
    if p.attention == AttentionImpl.FLASH:
        a.append("--attention-backend flash")
    if p.dp_overlap:
        a.append("--overlap-grad-reduce")
        if p.zero_stage >= 1:
            a.append("--overlap-param-gather")
    if p.tp_overlap and p.tp > 1:
        a.append("--tp-comm-overlap")
    return a


def megatron_args(model: TransformerSpec, plan: Plan) -> list[str]:
    return _model_args(model) + _parallel_args(model, plan) + _precision_args(plan) + _overlap_args(plan)


def nemo_overrides(model: TransformerSpec, plan: Plan, n_nodes: int, gpus_per_node: int) -> list[str]:
    prec = {Dtype.BF16: "bf16-mixed", Dtype.FP16: "16-mixed", Dtype.FP8: "bf16-mixed",
            Dtype.FP32: "32"}[plan.precision]
    o = [f"trainer.num_nodes={n_nodes}", f"trainer.devices={gpus_per_node}",
         f"trainer.precision={prec}",
         f"model.num_layers={model.n_layers}", f"model.hidden_size={model.hidden}",
         f"model.ffn_hidden_size={model.ffn_hidden}",
         f"model.num_attention_heads={model.n_heads}", f"model.encoder_seq_length={model.seq_len}",
         f"model.tensor_model_parallel_size={plan.tp}",
         f"model.pipeline_model_parallel_size={plan.pp}",
         f"model.context_parallel_size={plan.cp}",
         f"model.expert_model_parallel_size={plan.ep}",
         f"model.micro_batch_size={plan.micro_batch}", f"model.global_batch_size={plan.global_batch}",
         f"model.sequence_parallel={str(plan.sequence_parallel).lower()}"]
    if model.n_kv_heads != model.n_heads:
        o.append(f"model.num_query_groups={model.n_kv_heads}")
    if plan.vpp > 1:
        o.append(f"model.virtual_pipeline_model_parallel_size={plan.vpp}")
    if plan.recompute != Recompute.NONE:
        o.append(f"model.activations_checkpoint_granularity={plan.recompute.value}")
    if plan.recompute == Recompute.FULL:
        o += ["model.activations_checkpoint_method=uniform",
              "model.activations_checkpoint_num_layers=1"]
    if plan.zero_stage in (1, 2):
        o.append("model.optim.name=distributed_fused_adam")
    elif plan.zero_stage == 3:
        o += ["model.fsdp=true", "model.fsdp_sharding_strategy=full"]
    if plan.precision == Dtype.FP8:
        o += ["model.fp8=true", "model.fp8_hybrid=true"]
    return o


_FSDP_TEMPLATE = '''\
# torch >= 2.4 sketch: FSDP2 ({zero}) over dp={dp}{tp_line}
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
{tp_import}
mesh = init_device_mesh("cuda", ({dp}, {tp}), mesh_dim_names=("dp", "tp"))
model = build_model()  # {layers} decoder blocks, hidden {hidden}
{tp_block}mp = MixedPrecisionPolicy(param_dtype=torch.{dtype}, reduce_dtype=torch.float32)
for i, block in enumerate(model.layers):
{ckpt}    fully_shard(block, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward={reshard})
fully_shard(model, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward={reshard})
# micro-batch {mb} sequences x {seq} tokens; accumulate {accum} micro-batches per step
'''


def fsdp_sketch(model: TransformerSpec, plan: Plan) -> str:
    tp = plan.tp
    tp_block = ""
    if tp > 1:
        style = "SequenceParallel()" if plan.sequence_parallel else "None"
        tp_block = ("for block in model.layers:  # Megatron-style column/row split\n"
                    "    parallelize_module(block, mesh[\"tp\"], {\n"
                    "        \"attn.qkv\": ColwiseParallel(), \"attn.out\": RowwiseParallel(),\n"
                    "        \"mlp.fc1\": ColwiseParallel(), \"mlp.fc2\": RowwiseParallel(),\n"
                    f"        \"norm\": {style}}})\n")
    ckpt = ""
    if plan.recompute != Recompute.NONE:
        ckpt = ("    model.layers[i] = block = checkpoint_wrapper(block)  # activation checkpointing "
                f"({plan.recompute.value})\n")
    accum = plan.global_batch // (plan.micro_batch * plan.dp)
    return _FSDP_TEMPLATE.format(
        zero="ZeRO-3, weights resharded after forward" if plan.zero_stage >= 3 else
        "ZeRO-2-like, weights kept after forward",
        dp=plan.dp, tp=tp, tp_line=f" x tp={tp}" if tp > 1 else "",
        tp_import="from torch.distributed.tensor.parallel import (parallelize_module, "
                  "ColwiseParallel, RowwiseParallel, SequenceParallel)" if tp > 1 else "",
        layers=model.n_layers, hidden=model.hidden, tp_block=tp_block,
        dtype="bfloat16" if plan.precision in (Dtype.BF16, Dtype.FP8) else
        ("float16" if plan.precision == Dtype.FP16 else "float32"),
        ckpt=ckpt, reshard=str(plan.zero_stage >= 3), mb=plan.micro_batch,
        seq=model.seq_len, accum=accum)


def _notes(plan: Plan) -> list[str]:
    n = []
    if plan.pp > 1:
        n.append("FSDP sketch covers dp x tp only; pipeline stages need "
                 "torch.distributed.pipelining or Megatron-LM/NeMo")
    if plan.cp > 1 or plan.ep > 1:
        n.append("context / expert parallelism: use the Megatron-LM or NeMo settings")
    if plan.zero_stage == 2:
        n.append("Megatron's distributed optimizer shards optimizer states and gradients (ZeRO-2)")
    if plan.zero_stage == 3:
        n.append("ZeRO-3 in Megatron-LM means --use-torch-fsdp2 (Megatron-Core >= 0.10)")
    return n


def launch_args(model: TransformerSpec, plan: Plan, n_gpus: int, gpus_per_node: int) -> LaunchArgs:
    gpn = min(gpus_per_node, n_gpus)
    nodes = max(1, n_gpus // gpn)
    return LaunchArgs(tuple(megatron_args(model, plan)),
                      tuple(nemo_overrides(model, plan, nodes, gpn)),
                      fsdp_sketch(model, plan), tuple(_notes(plan)))
