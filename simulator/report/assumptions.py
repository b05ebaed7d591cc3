"""What a simulation assumed that the user may not have typed: batch and sequence, the
framework behaviour taken as default, the calibration profile. Printed under the result
table and returned as ``assumptions`` in ``--json`` output, so every number can be traced
to its inputs."""
from __future__ import annotations

from typing import Any

from ..cost.host import code_mechanisms
from ..engine.ds_pipe import uses_rendezvous
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec


def assumptions(model: TransformerSpec, plan: Plan, cluster: ClusterSpec,
                prof: Profile) -> dict[str, Any]:
    return {
        "global_batch_sequences": plan.global_batch, "micro_batch_sequences": plan.micro_batch,
        "num_microbatches": plan.num_microbatches, "seq_len": model.seq_len,
        "tokens_per_step": plan.global_batch * model.seq_len,
        "precision": plan.precision.value, "schedule": plan.schedule.value,
        "attention_kernel": plan.attention.value,
        "dp_overlap": plan.dp_overlap, "tp_overlap": plan.tp_overlap,
        "dp_bucket_params": plan.bucket_params(),
        "dp_bucket_default": plan.dp_bucket_bytes == 0,
        "dp_bucket_first_chunk_only": plan.dp_bucket_first_chunk_only,
        "pp_blocking_p2p": plan.pp_blocking_p2p, "pp_rendezvous": uses_rendezvous(plan),
        "pp_scatter_gather": plan.pp_scatter_gather,
        "grad_accum_bytes_per_param": plan.grad_accum_bytes_per_param,
        "zero1_allreduce": plan.zero1_allreduce, "grad_nan_check": plan.grad_nan_check,
        "framework": plan.memory.framework or "none (Megatron-style conventions)",
        "grad_dtype": plan.memory.grad_dtype.value, "master_weights": plan.memory.master_weights,
        "optimizer_state_bytes_per_param": plan.memory.optimizer_state_bytes_per_param,
        "host_mode": plan.host_mode, "host_mechanisms": list(code_mechanisms(plan.host_mechanisms, model)),
        "moe_dispatcher": plan.moe_dispatcher if model.moe is not None else None,
        "profile": prof.name, "step_overhead_s": prof.step_overhead_s.value,
        "gpus_per_node": cluster.node.gpus_per_node, "nics_per_node": cluster.node.nics_per_node,
        "nic_gbits_per_s": cluster.node.nic_gbits_per_s,
    }


def _p2p(d: dict[str, Any]) -> str:
    if d.get("pp_rendezvous"):
        return "blocking send and receive (DeepSpeed's pipeline engine order)"
    return "blocking" if d["pp_blocking_p2p"] else "overlapped"


def assumption_lines(d: dict[str, Any]) -> list[str]:
    onoff = lambda b: "on" if b else "off"
    bucket = f"{d['dp_bucket_params'] / 1e6:g} M params" + \
        (" (Megatron-Core default max(40M, 1M x dp))" if d["dp_bucket_default"] else "") + \
        (", first stage's first chunk only" if d.get("dp_bucket_first_chunk_only") else "")
    return [
        f"assumed    batch {d['global_batch_sequences']} sequences x {d['seq_len']} tokens = "
        f"{d['tokens_per_step']:,} tokens/step, micro-batch {d['micro_batch_sequences']} "
        f"({d['num_microbatches']} per step)",
        f"           DP overlap {onoff(d['dp_overlap'])}, buckets {bucket}; TP overlap "
        f"{onoff(d['tp_overlap'])}; pipeline sends {_p2p(d)}"
        f", scatter/gather {onoff(d['pp_scatter_gather'])}; grad accumulation "
        f"+{d['grad_accum_bytes_per_param']:g} B/param; ZeRO-1 as all-reduce "
        f"{onoff(d['zero1_allreduce'])}"
        f"{'; gradient NaN check (a read of the gradients, priced with the optimizer)' if d.get('grad_nan_check') else ''}",
        f"           framework {d['framework']}: gradients {d['grad_dtype']}, fp32 master "
        f"weights {onoff(d['master_weights'])}, optimizer state "
        f"{d['optimizer_state_bytes_per_param']:g} B/param; host {d.get('host_mode', 'eager')}"
        f"{', ' + ', '.join(d['host_mechanisms']) if d.get('host_mechanisms') else ''}"
        f"{'; MoE dispatcher ' + d['moe_dispatcher'] if d.get('moe_dispatcher') else ''}",
        f"           profile {d['profile']} (fixed step overhead {1e3 * d['step_overhead_s']:.3g} ms)",
    ]
