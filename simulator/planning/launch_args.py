"""Launch configurations for a chosen plan that a framework accepts as they are:
Megatron-LM arguments (here), a NeMo 2 recipe, a torchtitan TOML and a torch FSDP2 sketch
(``launch_frameworks``).

The Megatron-LM flags are the command-line names of ``pretrain_gpt.py``
(``megatron/training/arguments.py``) and say everything the model family needs: norm,
position embedding, biases, activation, GQA, MLA, MoE router and token dispatcher, local
attention. Settings the plan does not decide (data, tokenizer, optimizer
hyper-parameters, checkpoints, RoPE base) are left out. The tests parse these lists with
the flag table extracted from Megatron-LM's own parser.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.stage_work import partition_layers
from ..hardware.specs import Dtype
from ..parallel.plan import AttentionImpl, Plan, Recompute, Schedule
from ..parallel.schedule import SPLIT_BACKWARD
from ..workload.spec import MLP, Norm, Position, TransformerSpec
from .launch_frameworks import fsdp_sketch, nemo_recipe, torchtitan_toml

# DeepSeek-V3 report (arXiv:2412.19437) Sec. 4.2: the complementary sequence-wise balance
# loss of the auxiliary-loss-free router uses alpha = 0.0001.
SEQ_AUX_LOSS_DEEPSEEK_V3 = 1e-4


@dataclass(frozen=True)
class LaunchArgs:
    megatron: tuple[str, ...]
    nemo: str
    torchtitan: str
    fsdp_sketch: str
    notes: tuple[str, ...]
    megatron_env: tuple[tuple[str, str], ...] = ()

    def megatron_command(self, n_nodes: int, gpus_per_node: int) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.megatron_env)
        head = f"torchrun --nnodes {n_nodes} --nproc-per-node {gpus_per_node} pretrain_gpt.py"
        return " \\\n    ".join([f"{env} {head}" if env else head] + list(self.megatron))

    def megatron_argv(self) -> list[str]:
        """The arguments as ``sys.argv`` would hold them."""
        return [tok for arg in self.megatron for tok in arg.split(" ", 1)]

    def to_dict(self) -> dict:
        return {"megatron_lm": list(self.megatron), "megatron_env": dict(self.megatron_env),
                "nemo2_recipe": self.nemo,
                "torchtitan_toml": self.torchtitan, "fsdp_sketch": self.fsdp_sketch,
                "notes": list(self.notes)}


def _layer_pattern(flags: list[bool]) -> str:
    """``[True]*3 + [False]*2`` -> ``"[1]*3+[0]*2"`` (Megatron's list-expression form)."""
    runs: list[list] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "+".join(f"[{int(f)}]*{n}" for f, n in runs)


def _family_args(m: TransformerSpec) -> list[str]:
    a = [f"--normalization {'RMSNorm' if m.norm == Norm.RMSNORM else 'LayerNorm'}",
         "--position-embedding-type " + {Position.ROPE: "rope", Position.LEARNED: "learned_absolute",
                                         Position.ALIBI: "none"}[m.position]]
    if not m.linear_bias:
        a.append("--disable-bias-linear")
    if m.qkv_bias and not m.linear_bias:
        a.append("--add-qkv-bias")
    if m.mlp == MLP.SWIGLU:
        a.append("--swiglu")
    elif m.mlp == MLP.RELU2:
        a.append("--squared-relu")
    if m.qk_norm:
        a.append("--qk-layernorm")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    return a


def _attention_args(m: TransformerSpec) -> list[str]:
    a: list[str] = []
    if m.mla is not None:
        x = m.mla
        a += ["--multi-latent-attention", f"--kv-lora-rank {x.kv_lora_rank}",
              f"--qk-head-dim {x.qk_nope_head_dim}", f"--qk-pos-emb-head-dim {x.qk_rope_head_dim}",
              f"--v-head-dim {x.v_head_dim}"]
        if x.q_lora_rank:
            a.append(f"--q-lora-rank {x.q_lora_rank}")
        return a
    if m.n_kv_heads != m.n_heads:
        a += ["--group-query-attention", f"--num-query-groups {m.n_kv_heads}"]
    if m.head_dim != m.hidden // m.n_heads:
        a.append(f"--kv-channels {m.head_dim}")
    if any(map(m.is_local_layer, range(m.n_layers))):
        # flash-attention window (left, right): the last `window` positions including itself
        a.append(f"--window-size ({m.window - 1},0)")
        if m.global_every:
            a.append(f"--window-attn-skip-freq {m.global_every}")
    return a


def _dispatcher_args(plan: Plan) -> list[str]:
    """Megatron-Core's dispatcher flags (megatron/core/transformer/moe/README.md @ d98e8a64:
    flex with the DeepEP backend, which takes fp32 router probabilities)."""
    if plan.moe_dispatcher == "flex":
        return ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
    return ["--moe-token-dispatcher-type alltoall"]


def _moe_args(m: TransformerSpec, plan: Plan) -> list[str]:
    e = m.moe
    if e is None:
        return []
    a = [f"--num-experts {e.experts}", f"--moe-router-topk {e.top_k}",
         f"--moe-ffn-hidden-size {e.expert_ffn_hidden}",
         f"--moe-router-score-function {e.router_score}",
         *_dispatcher_args(plan), "--moe-grouped-gemm"]
    if e.shared_experts:
        a.append(f"--moe-shared-expert-intermediate-size {e.shared_experts * e.expert_ffn_hidden}")
    flags = [m.is_moe_layer(i) for i in range(m.n_layers)]
    if not all(flags):
        a.append(f"--moe-layer-freq {_layer_pattern(flags)}")
    if e.router_expert_bias:
        coeff = e.aux_loss_coeff or SEQ_AUX_LOSS_DEEPSEEK_V3
        a += ["--moe-router-enable-expert-bias", "--moe-router-load-balancing-type seq_aux_loss",
              f"--moe-aux-loss-coeff {coeff:g}", "--moe-router-dtype fp32"]
    elif e.aux_loss_coeff > 0:
        a += ["--moe-router-load-balancing-type aux_loss", f"--moe-aux-loss-coeff {e.aux_loss_coeff:g}"]
    if e.router_topk_scale != 1.0:
        a.append(f"--moe-router-topk-scaling-factor {e.router_topk_scale:g}")
    if e.router_groups:
        a += [f"--moe-router-num-groups {e.router_groups}",
              f"--moe-router-group-topk {e.router_group_topk}"]
    return a


def _model_args(m: TransformerSpec, plan: Plan) -> list[str]:
    a = [f"--num-layers {m.n_layers}", f"--hidden-size {m.hidden}",
         f"--ffn-hidden-size {m.ffn_hidden}", f"--num-attention-heads {m.n_heads}",
         f"--seq-length {m.seq_len}", f"--max-position-embeddings {m.seq_len}"]
    a += _family_args(m) + _attention_args(m) + _moe_args(m, plan)
    if plan.attention != AttentionImpl.MATERIALIZED:
        # the plan was priced without dropout kernels (fused attention, no dropout)
        a += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    return a


def pipeline_layout(n_layers: int, chunks: int) -> str:
    """Megatron's layout string for the simulator's uneven split (``partition_layers``):
    ``E`` embedding, ``t`` a decoder layer, ``L`` the loss, stages split by ``|``."""
    parts = [f"t*{len(c)}" for c in partition_layers(n_layers, chunks)]
    return "E" + "|".join(parts) + "L"


def _precision_args(p: Plan) -> list[str]:
    """``--bf16`` alone reduces gradients in fp32 (Megatron-LM forces
    accumulate_allreduce_grads_in_fp32); a plan with 16-bit gradients asks for
    ``--grad-reduce-in-bf16`` (Megatron-LM since 2025-02), one with FP8 primary weights for
    ``--fp8-param-gather`` (since 2024-09)."""
    bf16_grads = ["--grad-reduce-in-bf16"] if p.grad_bytes == 2 else []
    if p.precision == Dtype.FP8:
        fp8_params = ["--fp8-param-gather"] if p.memory.fp8_primary_weights else []
        return ["--bf16", "--fp8-format hybrid"] + fp8_params + bf16_grads
    if p.precision == Dtype.FP16:
        return ["--fp16"]
    if p.precision == Dtype.BF16:
        return ["--bf16"] + bf16_grads
    return []


def _parallel_args(m: TransformerSpec, p: Plan) -> list[str]:
    a = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}",
         f"--micro-batch-size {p.micro_batch}", f"--global-batch-size {p.global_batch}"]
    vpp = p.vpp if p.schedule == Schedule.INTERLEAVED else 1    # Megatron: no ZB-V / DualPipe
    chunks = p.pp * vpp
    if m.n_layers % chunks:
        a.append(f"--pipeline-model-parallel-layout {pipeline_layout(m.n_layers, chunks)}")
        if vpp > 1:
            a.append(f"--num-virtual-stages-per-pipeline-rank {vpp}")
    elif vpp > 1:
        a.append(f"--num-layers-per-virtual-pipeline-stage {m.n_layers // chunks}")
    if p.cp > 1:
        a.append(f"--context-parallel-size {p.cp}")
    if p.ep > 1:
        a.append(f"--expert-model-parallel-size {p.ep}")
    if p.sequence_parallel:
        a.append("--sequence-parallel")
    if p.recompute == Recompute.SELECTIVE:
        a.append("--recompute-granularity selective")
    elif p.recompute == Recompute.FULL and p.recompute_layers:
        a += ["--recompute-granularity full", "--recompute-method block",
              f"--recompute-num-layers {p.recompute_layers}"]
    elif p.recompute == Recompute.FULL:
        a += ["--recompute-granularity full", "--recompute-method uniform",
              "--recompute-num-layers 1"]
    if p.zero_stage in (1, 2):
        a.append("--use-distributed-optimizer")
    if p.zero_stage == 3:
        # Megatron-FSDP (torch FSDP2 in Megatron refuses PP and EP: arguments.py validate_args)
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
              "--use-distributed-optimizer", "--ckpt-format fsdp_dtensor"]
    return a


def _overlap_args(p: Plan) -> list[str]:
    a = []
    if p.attention in (AttentionImpl.FLASH, AttentionImpl.FLASH3):
        a.append("--attention-backend flash")
    if p.dp_overlap:
        a.append("--overlap-grad-reduce")
        if p.zero_stage >= 1:            # distributed optimizer or Megatron-FSDP
            a.append("--overlap-param-gather")
    if p.tp_overlap and p.tp > 1:
        a.append("--tp-comm-overlap")
    return a


def megatron_args(model: TransformerSpec, plan: Plan) -> list[str]:
    return (_model_args(model, plan) + _parallel_args(model, plan) + _precision_args(plan)
            + _overlap_args(plan))


def megatron_env(plan: Plan) -> tuple[tuple[str, str], ...]:
    """Megatron-LM (before Blackwell) asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP,
    unless FSDP is on, which wants it unset (validate_args)."""
    if (plan.tp > 1 or plan.cp > 1) and plan.zero_stage < 3:
        return (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)
    return ()


def _notes(model: TransformerSpec, plan: Plan) -> list[str]:
    n = ["not decided by the plan, add them: data (--data-path or --mock-data), tokenizer, "
         "optimizer and LR schedule, checkpoints, RoPE base (--rotary-base)"]
    if plan.zero_stage == 2:
        n.append("Megatron's distributed optimizer shards optimizer states and gradients (ZeRO-2)")
    if plan.zero_stage == 3:
        n.append("ZeRO-3 in Megatron-LM: Megatron-FSDP (--use-megatron-fsdp, optim_grads_params)")
    if plan.schedule in SPLIT_BACKWARD:
        n.append(f"the plan was simulated with --schedule {plan.schedule.value}; Megatron-LM has "
                 "no flag for it (ZB-H1/ZB-V: the Sea AI Lab fork, github.com/sail-sg/"
                 "zero-bubble-pipeline-parallelism; DualPipe: github.com/deepseek-ai/DualPipe): "
                 "these arguments run 1F1B")
    if plan.attention == AttentionImpl.FLASH1:
        n.append("the plan was priced with FlashAttention-1-class attention (llm-foundry 2023); "
                 "Megatron-LM has no such backend: its default backend runs a faster kernel")
    if model.position == Position.ALIBI:
        n.append("ALiBi is not in Megatron-Core: the arguments say no position embedding")
    if model.attn_logit_softcap or model.final_logit_softcap:
        n.append("logit soft-capping has no Megatron-LM flag; NeMo's Gemma 2 model applies it")
    if model.moe is not None and model.moe.router_expert_bias and not model.moe.aux_loss_coeff:
        n.append(f"sequence-wise balance loss {SEQ_AUX_LOSS_DEEPSEEK_V3:g} from the DeepSeek-V3 "
                 "report (the config.json has no coefficient)")
    return n


def launch_args(model: TransformerSpec, plan: Plan, n_gpus: int, gpus_per_node: int) -> LaunchArgs:
    gpn = min(gpus_per_node, n_gpus)
    nodes = max(1, n_gpus // gpn)
    return LaunchArgs(tuple(megatron_args(model, plan)), nemo_recipe(model, plan, nodes, gpn),
                      torchtitan_toml(model, plan), fsdp_sketch(model, plan),
                      tuple(_notes(model, plan)), megatron_env(plan))
