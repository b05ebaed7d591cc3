"""``complexity`` command line. Errors print one line and exit 2; never a traceback.

Ctrl-C (SIGINT) and SIGTERM stop the command where it is: worker processes are ended,
finished work already written stays (``predict --out`` rows, ``search --results``), and
one line says so; the exit status is 130 (SIGINT) or 143 (SIGTERM), as a shell reports a
process killed by that signal.
"""
from __future__ import annotations

import argparse
import signal
import sys

from ..errors import ComplexityError
from .flags import finish_parser
from .progress import listening_for
from .registry import COMMANDS


class Terminated(BaseException):
    """SIGTERM arrived (a ``BaseException``, like ``KeyboardInterrupt``, so no library
    ``except Exception`` swallows it)."""


def build_parser() -> argparse.ArgumentParser:
    from . import (collective, commands, module, search,  # noqa: F401  (each registers
                   workflow)                                # its commands)
    parser = argparse.ArgumentParser(
        prog="complexity",
        description="Predict distributed training step time, throughput, memory and cost.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add) in COMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))
    _add_optional_commands(sub)
    for p in sub.choices.values():
        finish_parser(p)
    return parser


def _add_optional_commands(sub) -> None:
    """Commands that live in packages beyond the core (calibrate needs torch at run time)."""
    try:
        from calibrate import cli as calibrate_cli
    except ImportError:
        return
    add = getattr(calibrate_cli, "add_subcommands", None)
    if add is not None:
        add(sub)


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _run(args: argparse.Namespace) -> int:
    """Run the command with SIGTERM turned into ``Terminated`` and progress bars on."""
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:                           # not the main thread (embedded use)
        pass
    try:
        with listening_for(args):
            return int(args.func(args) or 0)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _why(exc: BaseException) -> str:
    """What the command kept, if it said (e.g. ``predict``'s finished rows)."""
    return f"; {exc.args[0]}" if exc.args and isinstance(exc.args[0], str) else ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ComplexityError as exc:
        print(f"complexity {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"complexity {args.command}: interrupted{_why(exc)}", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"complexity {args.command}: terminated{_why(exc)}", file=sys.stderr)
        return 143
    except BrokenPipeError:                      # output piped into `head` etc.
        sys.stderr.close()
        return 0
    except (OSError, ValueError) as exc:
        print(f"complexity {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
