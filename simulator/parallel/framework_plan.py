"""A plan under a named framework's defaults: ``with_framework(plan, name, keep)`` fills every
field the user did not state (``keep`` names those they did) from ``frameworks.json``:
the ZeRO stage (distributed optimizer / FSDP), attention kernel, overlaps, pipeline send
style, DeepSpeed's BF16_Optimizer passes, the memory conventions, and how the host issues
kernels (launch mode and host mechanisms, ``frameworks.json`` "host")."""
from __future__ import annotations

from dataclasses import replace

from ..errors import InvalidInputError
from ..frameworks import HOST, framework_defaults, framework_memory, framework_names
from ..hardware.specs import Dtype
from .conventions import conventions_for
from .plan import Plan, Schedule

BEHAVIOUR_FIELDS = ("attention", "dp_overlap", "tp_overlap", "pp_scatter_gather",
                    "pp_blocking_p2p", "pp_rendezvous", "grad_nan_check",
                    "dp_bucket_first_chunk_only", "grad_accum_bytes_per_param", "zero1_allreduce",
                    "sequence_parallel", "host_mode", "host_mechanisms")


def host_settings(name: str, bf16: bool) -> dict[str, object]:
    """Framework ``name``'s launch mode and host mechanisms (``frameworks.json`` "host");
    DeepSpeed's bf16 gradient loop runs only in bf16 runs."""
    h = HOST.framework(name)
    mech = tuple(m for m in h.mechanisms if bf16 or m != "deepspeed_bf16_grad_loop")
    return {"host_mode": h.mode, "host_mechanisms": mech}


def check_framework(name: str) -> None:
    """Raise ``InvalidInputError`` unless ``name`` is a framework we know."""
    try:
        framework_memory(name)
    except KeyError:
        raise InvalidInputError("framework", name, ", ".join(framework_names())) from None


def with_framework(plan: Plan, name: str, keep: frozenset[str] | set[str] = frozenset(),
                   grad_dtype: Dtype | str | None = None, strict: bool = True) -> Plan:
    """``plan`` with the fields not in ``keep`` set to framework ``name``'s defaults.
    ``grad_dtype`` (explicit) overrides the framework's gradient dtype. Unknown names raise
    ``InvalidInputError`` when ``strict``, else get the "default" conventions."""
    if strict:
        check_framework(name)
    try:
        mem = framework_memory(name)
    except KeyError:
        mem = framework_memory("")
    beh = framework_defaults(name)
    bf16 = plan.precision == Dtype.BF16
    values = {"attention": beh.attention, "dp_overlap": beh.dp_overlap,
              "tp_overlap": beh.tp_overlap, "pp_scatter_gather": beh.pp_scatter_gather,
              "pp_blocking_p2p": beh.pp_blocking_p2p or (beh.pp_blocking_p2p_without_vpp
                                                         and plan.vpp == 1),
              "pp_rendezvous": beh.pp_rendezvous,
              # Megatron-LM turns its NaN checks off under fp16 with dynamic loss scaling
              # (arguments.py core_r0.8.0 L289-297): NaNs are the loss scaler's signal
              "grad_nan_check": beh.grad_nan_check and plan.precision != Dtype.FP16,
              "dp_bucket_first_chunk_only": beh.dp_bucket_first_chunk_only,
              "grad_accum_bytes_per_param": beh.grad_accum_bytes_per_param if bf16 else 0.0,
              "zero1_allreduce": beh.zero1_allreduce and bf16,
              "sequence_parallel": bool(beh.sp_with_tp) and plan.tp > 1,
              "zero_stage": mem.zero_stage, **host_settings(name, bf16)}
    fields = {k: v for k, v in values.items() if k not in keep}
    if beh.dp_bucket_bytes and not plan.dp_bucket_bytes:     # an explicit size stays
        fields["dp_bucket_bytes"] = beh.dp_bucket_bytes
    zero = fields.get("zero_stage", plan.zero_stage)
    if "dp_overlap" in fields:
        fields["dp_overlap"] = beh.dp_overlap_for(zero)
    if "host_mechanisms" in fields:
        fields["host_mechanisms"] = _applicable(fields["host_mechanisms"], zero,
                                                plan.dp * plan.cp, plan.vpp, plan.pp,
                                                plan.schedule == Schedule.ONE_F_ONE_B,
                                                fields.get("dp_overlap", plan.dp_overlap))
    return replace(plan, memory=conventions_for(mem, plan.precision, grad_dtype), **fields)


def _applicable(mechanisms: tuple[str, ...], zero: int, replicas: int,
                vpp: int = 1, pp: int = 1, one_f_one_b: bool = True,
                dp_overlap: bool = True) -> tuple[str, ...]:
    """The framework's mechanisms that exist in this plan: FSDP unit hooks only under FSDP
    (ZeRO-3), DDP's per-parameter hooks only when the model is wrapped in torch DDP (no
    ZeRO: a ZeRO stage means DeepSpeed's engine, not DDP; more than one data-parallel
    replica), those marked ``only_without_vpp`` only without virtual stages (Megatron-Core
    overlaps p2p, with no batched sync, only in the interleaved schedule), those marked
    ``only_with_pp`` only where DeepSpeed's pipeline engine runs (pipeline stages, no
    virtual ones, plain 1F1B: its only training schedule), those marked
    ``only_without_pp`` only without pipeline stages, those marked ``only_with_dp_overlap``
    only where the gradient reduction overlaps the backward, and those that
    name ``zero_stages`` only at those stages (DeepSpeed's ZeRO hooks)."""
    return tuple(m for m in mechanisms
                 if not (m.startswith("fsdp") and zero < 3)
                 and not (m == "ddp_param_hooks" and (zero >= 1 or replicas <= 1))
                 and not (HOST.mechanisms[m].only_without_vpp and vpp > 1)
                 and not (HOST.mechanisms[m].only_with_pp
                          and (pp <= 1 or vpp > 1 or not one_f_one_b))
                 and not (HOST.mechanisms[m].only_without_pp and pp > 1)
                 and not (HOST.mechanisms[m].only_with_dp_overlap and not dp_overlap)
                 and not (HOST.mechanisms[m].zero_stages
                          and zero not in HOST.mechanisms[m].zero_stages))
