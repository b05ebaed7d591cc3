"""Every number and output path on the command line, checked once after parsing.

``FLAG_BOUNDS`` gives each numeric flag (by its argparse ``dest``, which means the same
in every command, see ``flags.COMMON_HELP``) its physical range; every ``float`` flag is
also refused when it is not finite (``inf``, ``nan``). ``OUTPUT_PATHS`` names the flags
that write a file or a directory: each is checked writable before the command starts.
``tests/simulator/cli/test_bad_input.py`` checks that every numeric flag of every command
has a bound here, including flags added later.
"""
from __future__ import annotations

import argparse
import math
from typing import Any

from ..boundary import limits as L
from ..boundary.files import check_writable
from ..errors import InvalidInputError

G = L.MAX_GPUS
_BIG = 1_000_000
# dest: (lowest, highest, lowest excluded)
FLAG_BOUNDS: dict[str, tuple[float, float, bool]] = {
    # parallel plan and batch
    "tp": (1, G, False), "pp": (1, G, False), "dp": (1, G, False), "cp": (1, G, False),
    "ep": (1, G, False), "vpp": (1, 4096, False),
    "micro_batch": (1, L.MAX_BATCH, False), "global_batch": (1, L.MAX_BATCH, False),
    "seq_len": (1, L.MAX_SEQ_LEN, False), "zero_stage": (0, 3, False), "dp_shard": (0, G, False),
    "recompute_layers": (0, L.MAX_LAYERS, False),
    "bucket_mb": (0, 1e6, False), "bucket_cap_mb": (0, 1e6, True),
    "first_bucket_mb": (0, 1e6, True), "powersgd_rank": (1, 65536, False),
    "wrap_depth": (0, 64, False),
    # cluster
    "gpus": (1, G, False), "max_gpus": (1, G, False),
    "gpus_per_node": (1, L.MAX_GPUS_PER_NODE, False),
    "nics_per_node": (1, L.MAX_NICS_PER_NODE, False), "nic_gbps": (0, L.MAX_NIC_GBPS, True),
    "oversubscription": (1, 1024, False), "core_oversubscription": (1, 1024, False),
    "planes": (1, 64, False), "group": (1, G, False), "stride": (1, G, False),
    "bandwidth_scale": (0, 1e6, True), "pue": (1, 10, False),
    # planning
    "deadline_days": (0, 1e6, True), "window_min": (0, 1e9, True),
    "startup_s": (0, 1e9, False), "checkpoint_gbps": (0, 1e6, True),
    "checkpoints": (0, _BIG, False),
    # search / output sizes
    "top": (1, _BIG, False), "event_top": (0, _BIG, False), "event_max": (0, _BIG, False),
    "workers": (1, 1024, False), "max_event_slots": (1, 10**12, False),
    # measuring on this machine
    "world": (1, 1024, False), "threads": (1, 1024, False), "nproc": (1, 1024, False),
    "steps": (1, _BIG, False), "warmup": (0, _BIG, False), "rounds": (1, _BIG, False),
    "repeat": (1, _BIG, False), "budget_s": (0, 1e7, True), "wait_quiet": (0, 1e5, False),
}
# dest: (is a directory); ``trace`` is an output only for ``simulate`` (an input elsewhere)
OUTPUT_PATHS: dict[str, bool] = {
    "out": False, "out_dir": True, "plot": False, "png": False, "results": True,
    "trace_out": False, "perfetto": False, "trace": False,
}
_DIRECTORY_OUT = {("calibrate", "out")}
_OUTPUT_ONLY_IN = {"trace": ("simulate",)}


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_number(dest: str, value: Any, kind: type) -> None:
    if value is None or isinstance(value, bool):
        return
    values = value if isinstance(value, (list, tuple)) else [value]
    lo, hi, lo_open = FLAG_BOUNDS.get(dest, (-math.inf, math.inf, False))
    kind_text = "an integer" if kind is int else "a finite number"
    left = f"> {_num(lo)}" if lo_open else f">= {_num(lo)}"
    valid = f"{kind_text} {left} and <= {_num(hi)}" if math.isfinite(hi) else kind_text
    for v in values:
        if not isinstance(v, (int, float)):
            continue
        if (isinstance(v, float) and not math.isfinite(v)) or v < lo or v > hi \
                or (lo_open and v == lo):
            raise InvalidInputError(dest, v, valid, flag_name(dest))


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Raise ``InvalidInputError`` for the first flag whose value is out of range or whose
    output path cannot be written."""
    for action in parser._actions:
        if action.type in (int, float):
            _check_number(action.dest, getattr(args, action.dest, None), action.type)
    for dest, directory in OUTPUT_PATHS.items():
        if dest in _OUTPUT_ONLY_IN and args.command not in _OUTPUT_ONLY_IN[dest]:
            continue
        if getattr(args, dest, None) is not None:
            check_writable(dest, getattr(args, dest),
                           directory or (args.command, dest) in _DIRECTORY_OUT)


def numeric_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [a.dest for a in parser._actions if a.type in (int, float)]
