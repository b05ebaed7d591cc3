"""The entry point imports only what the command it runs needs (``registry.TABLE``):
heavy libraries stay out of ``import simulator``, ``complexity --help``, ``complexity list``
and ``complexity simulate`` (checked on ``sys.modules`` in a fresh process, not timed), and
the lazily built parser is the full parser for the command that runs."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli.main import build_parser, command_word
from simulator.cli.registry import CALIBRATE, COMMANDS, TABLE

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("scipy", "pyarrow", "networkx", "matplotlib", "torch", "calibrate")

_PROBE = """
import contextlib, io, sys
argv = sys.argv[1:]
if argv == ["import"]:
    import simulator, simulator.cli.main, simulator.engine, hardware_db
else:
    from simulator.cli.main import main
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    assert rc in (0, None), rc
print(" ".join(m for m in %r if m in sys.modules))
""" % (HEAVY,)


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("argv", [
    ["import"], ["--help"], ["list", "gpus"], ["list", "models"],
    ["simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "64", "--tp", "8",
     "--pp", "8", "--vpp", "3", "--global-batch", "64", "--sequence-parallel", "--json"],
])
def test_start_does_not_import_heavy_libraries(argv):
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [], f"{argv} imported {out.stdout.strip()}"


def test_table_names_every_registered_command_with_its_module_and_help():
    full = _subparsers(build_parser())
    assert list(full) == list(TABLE)
    for name, (help_text, add) in COMMANDS.items():
        assert TABLE[name] == (add.__module__, help_text), name
    # calibrate's commands are added by calibrate.cli; their help in TABLE is checked
    # through the top-level help below
    assert {n for n, (where, _) in TABLE.items() if where == CALIBRATE} == set(TABLE) - set(COMMANDS)


def test_lazy_parser_is_the_full_parser_for_the_command_that_runs():
    full = build_parser()
    top = full.format_help()
    assert build_parser("").format_help() == top
    for name in TABLE:
        lazy = build_parser(name)
        assert lazy.format_help() == top, name
        assert _subparsers(lazy)[name].format_help() == _subparsers(full)[name].format_help(), name


def test_command_word():
    assert command_word(["simulate", "--model", "x"]) == "simulate"
    assert command_word(["--help"]) == ""
    assert command_word(["no-such-command"]) == ""
    assert command_word([]) == ""
