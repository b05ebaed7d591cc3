"""One interface convention for every sub-command.

* every flag has help text, and its default is shown (``HelpFormatter``);
* a flag that appears in several commands means the same thing everywhere, so its help is
  written once here (``COMMON_HELP``, keyed by the argparse ``dest``) and filled in where a
  command defines the flag without help;
* every command takes ``--quiet`` (no progress bars; commands that print per-item lines
  also drop those);
* pictures are written with ``--plot PATH`` (``.png``/``.svg``/``.pdf``).

``tests/simulator/cli/test_interface.py`` checks all of it for every registered command,
including ones added later.
"""
from __future__ import annotations

import argparse

COMMON_HELP: dict[str, str] = {
    # parallel plan
    "tp": "tensor-parallel size (Megatron TP: splits every layer's GEMMs)",
    "pp": "pipeline-parallel stages",
    "dp": "data-parallel replicas (default: the GPUs left after tp*pp*cp)",
    "cp": "context-parallel size (splits the sequence; K/V all-gathered in attention)",
    "ep": "expert-parallel size for MoE layers (divides dp)",
    "vpp": "virtual pipeline stages per rank (interleaved 1F1B when > 1)",
    "micro_batch": "sequences per micro-batch",
    "global_batch": "sequences per optimizer step",
    "seq_len": "sequence length (default: the model's)",
    "sequence_parallel": "Megatron sequence parallelism (needs tp > 1)",
    "recompute": "activation recompute: none, selective (attention core) or full (whole layer)",
    "zero_stage": "ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters (FSDP)",
    "precision": "compute precision: fp32, fp16, bf16, fp8",
    "schedule": "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipe "
                "(default: 1f1b, interleaved if vpp > 1; zb-v and dualpipe hold two chunks per rank)",
    "bucket_mb": "data-parallel gradient bucket size in MB",
    "no_dp_overlap": "reduce gradients after the backward pass instead of overlapping it",
    "dp_overlap": "overlap the gradient reduction with the backward pass even where the "
                  "framework's default does not (e.g. DeepSpeed with overlap_comm: true)",
    "tp_overlap": "overlap tensor-parallel collectives with the GEMMs they feed",
    # cluster
    "gpu": "GPU key, e.g. h100-sxm (see `complexity list gpus`)",
    "gpus": "total GPU count",
    "gpus_per_node": "GPUs per node (default: the GPU's usual server)",
    "nics_per_node": "scale-out NICs per node (default: the node preset's)",
    "nic_gbps": "NIC line rate in Gb/s, e.g. 400",
    "nic_kind": "scale-out fabric: infiniband, roce, omnipath, ethernet",
    "scale_up": "intra-node link key, e.g. nvlink4, nvlink5-nvl72",
    "pue": "power usage effectiveness (energy = TDP x GPUs x hours x PUE)",
    "max_gpus": "largest GPU count tried for a deadline",
    # search
    "objective": "what the best plan maximises",
    "micro_batches": "micro-batch sizes to try",
    "zero_stages": "ZeRO stages to try",
    "recomputes": "recompute modes to try",
    "executor": "where candidates are simulated: local processes or a Ray cluster",
    "kind": "strong (fixed global batch), weak (batch grows with GPUs) or both",
    "scaling_law": "loss law used to rank model sizes",
    # DDP / FSDP of a traced module
    "bucket_cap_mb": "DDP bucket_cap_mb in MiB (default: torch's 25)",
    "gradient_as_bucket_view": "DDP gradient_as_bucket_view=True (no gradient copy into buckets)",
    "static_graph": "DDP static_graph=True",
    "find_unused_parameters": "DDP find_unused_parameters=True (an extra graph walk per step)",
    "no_backward_prefetch": "FSDP without backward prefetch",
    "powersgd_rank": "PowerSGD low-rank approximation rank",
    "optimizer": "optimizer whose step is timed: none, sgd, sgd-momentum, adam, adamw",
    "world": "processes (gloo ranks) on this machine",
    "threads": "intra-op threads per process",
    "steps": "timed training steps (after warm-up)",
    "warmup": "untimed warm-up steps",
    # files and output
    "json": "print machine-readable JSON on stdout (no table, no progress bars)",
    "runs": "CSV in the validation/published_runs.csv schema",
    "out_dir": "directory for report.md, report.parquet (and report.html with --html)",
    "what": "what to list",
    "quiet": "no progress bars on stderr",
    "allow_profile_mismatch": "use a --profile measured on another GPU than --gpu",
    "debug": "on an error, also print the Python traceback",
    "max_event_slots": "most micro-batch x pipeline-chunk slots the event engine plays "
    "before refusing (default 100,000; see simulator/boundary/limits.py)",
    "plot": "write a picture here (.png, .svg or .pdf; needs matplotlib)",
}


class HelpFormatter(argparse.HelpFormatter):
    """Shows ``(default: X)`` after a flag's help unless the help already names its
    default or there is none to show (``None``, ``False``, suppressed)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if ("default" in text.lower() or d is None or d is False or d == argparse.SUPPRESS
                or not action.option_strings or isinstance(action, argparse._HelpAction)):
            return text
        shown = ",".join(map(str, d)) if isinstance(d, (list, tuple)) else d
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def finish_parser(p: argparse.ArgumentParser) -> None:
    """Apply the convention to one sub-command's parser (after it defined its flags)."""
    p.formatter_class = HelpFormatter
    if "--quiet" not in p._option_string_actions:
        p.add_argument("--quiet", action="store_true", help=COMMON_HELP["quiet"])
    p.add_argument("--debug", action="store_true", help=COMMON_HELP["debug"])
    if "--profile" in p._option_string_actions and "--gpu" in p._option_string_actions:
        p.add_argument("--allow-profile-mismatch", action="store_true",
                       help=COMMON_HELP["allow_profile_mismatch"])
    if "--engine" in p._option_string_actions:
        p.add_argument("--max-event-slots", type=int, default=None,
                       help=COMMON_HELP["max_event_slots"])
    for a in p._actions:
        if not a.help and a.dest in COMMON_HELP:
            a.help = COMMON_HELP[a.dest]
