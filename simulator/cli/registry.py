"""The sub-command registry: each command module registers its argument builder with
``@command(name, help)``; ``simulator.cli.main`` builds the parser from ``COMMANDS``.
(Kept apart from ``main`` so command modules never import the entry point.)

``TABLE`` names, for every command, the module that defines it and its one-line help, in
the order ``complexity --help`` lists them, so the entry point imports only the module of
the command it runs (``complexity --help`` imports none): a command module pulls in the
model, the hardware database and their libraries, which take most of a second to load.
``tests/simulator/cli/test_lazy_cli.py`` checks the table against the registered commands.
"""
from __future__ import annotations

import argparse
from typing import Callable

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}

# module ``calibrate.cli`` adds its commands itself (``add_subcommands``), all at once
CALIBRATE = "calibrate.cli"

TABLE: dict[str, tuple[str, str]] = {
    "collective": ("simulator.cli.collective", "Time one collective on a cluster (nccl-tests "
                   "style; --size sweeps a curve)."),
    "simulate": ("simulator.cli.commands", "Simulate one training step of a model on a "
                 "cluster under a plan."),
    "predict": ("simulator.cli.commands", "Predict each row of a published-runs CSV and "
                "report the error."),
    "report": ("simulator.cli.commands", "Regenerate the validation report (Markdown + "
               "Parquet) from a runs CSV."),
    "list": ("simulator.cli.commands", "List built-in GPUs, nodes, links, models or profiles."),
    "analyze": ("simulator.cli.module", "Trace a torch.nn.Module (FILE.py:FACTORY) and report "
                "FLOPs and the per-op roofline."),
    "simulate-module": ("simulator.cli.module", "Simulate DDP or FSDP training of a traced "
                        "torch.nn.Module."),
    "compression-whatif": ("simulator.cli.module", "DDP gradient compression (fp16, bf16, "
                           "PowerSGD) for a traced module."),
    "precision-whatif": ("simulator.cli.module", "fp32 vs TF32 vs bf16/fp16 AMP vs fp8 for a "
                         "traced module."),
    "validate-module": ("simulator.cli.module", "Run real DDP steps of a module on this CPU "
                        "(gloo) and compare with the prediction."),
    "calibrate-loaded": ("simulator.cli.module", "Measure a CPU profile with every DDP rank "
                         "busy at once (gloo)."),
    "describe": ("simulator.cli.workflow", "A model's architecture, parameter counts and "
                 "per-token FLOPs."),
    "ledger": ("simulator.cli.workflow", "The analyzer's ledger: each attempt against the "
               "previous one."),
    "search": ("simulator.cli.search", "Search parallel plans for a model on a cluster; best "
               "first."),
    "plan": ("simulator.cli.search", "Capacity planning: time, GPUs for a deadline, cost, "
             "energy, short windows."),
    "compare": ("simulator.cli.search", "Compare GPU types / cluster shapes, each with its own "
                "best plan."),
    "scaling": ("simulator.cli.search", "Strong/weak scaling curves with efficiency classes "
                "and an Amdahl fit."),
    "whatif": ("simulator.cli.search", "One-variable sensitivity: what NIC bandwidth, "
               "micro-batch, recompute... are worth."),
    "bottleneck": ("simulator.cli.search", "Bottleneck report of a plan: roofline per op, "
                   "exposed comm, bubble."),
    "calibrate": (CALIBRATE, "measure this machine and fit a profile (`calibrate fit` refits "
                  "from stored measurements)"),
    "validate-run": (CALIBRATE, "train a real PyTorch decoder for a few steps here and compare "
                     "its step time with the prediction"),
    "validate-memory": (CALIBRATE, "compare the simulator's memory estimate with PyTorch's "
                        "MemTracker on CPU (FakeTensorMode, no allocation)"),
    "doctor": (CALIBRATE, "compare a Kineto trace of a real step with the simulator's "
               "prediction of the same step, per op family, and rank the gaps"),
}


def command(name: str, help_text: str):
    """Register ``add_arguments`` for a sub-command; the parser's ``func`` runs it."""
    def wrap(fn: Callable[[argparse.ArgumentParser], None]):
        COMMANDS[name] = (help_text, fn)
        return fn
    return wrap
