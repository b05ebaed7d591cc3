"""``complexity`` command line. Errors print one line and exit 2; never a traceback."""
from __future__ import annotations

import argparse
import sys

from ..errors import ComplexityError
from .registry import COMMANDS


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except ComplexityError as exc:
        print(f"complexity {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"complexity {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                      # output piped into `head` etc.
        sys.stderr.close()
        return 0
    except (OSError, ValueError) as exc:
        print(f"complexity {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
