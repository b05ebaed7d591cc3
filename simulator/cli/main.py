"""``complexity`` command line. Errors print one line and exit 2; never a traceback.

Every flag is checked after parsing (``checks``: integer degrees >= 1 with physical upper
bounds, finite floats, writable output paths) before the command starts. A mistake in the
input (``ComplexityError``, a bad file) prints ``complexity CMD: error: ...`` and exits 2;
anything else is a bug in this program: one line saying so and where to report it, exit
status 1; ``--debug`` adds the Python traceback to either.

Ctrl-C (SIGINT) and SIGTERM stop the command where it is: worker processes are ended,
finished work already written stays (``predict --out`` rows, ``search --results``), and
one line says so; the exit status is 130 (SIGINT) or 143 (SIGTERM), as a shell reports a
process killed by that signal.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import traceback

from ..boundary.limits import using_limits
from ..errors import (ComplexityError, Terminated, clear_stop_signal, note_stop_signal,
                      raise_if_stopped, stop_requested)
from .checks import check_args
from .flags import finish_parser
from .progress import listening_for
from .registry import CALIBRATE, COMMANDS, TABLE


REPORT_AT = "the Complexity Framework issue tracker (with the command line)"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``PROG: error: MESSAGE (see PROG --help)``, exit 2
    (argparse's own prints the usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (``only``: a command name, or ``""`` for none) one whose other
    commands are names with their help (``registry.TABLE``), so only the module of the
    command that runs is imported (``complexity --help``: none)."""
    parser = Parser(
        prog="complexity",
        description="Predict distributed training step time, throughput, memory and cost.")
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = None if only is None else TABLE.get(only, ("", ""))[0]
    if only is None:
        from . import (collective, commands, module, search,  # noqa: F401  (each registers
                       workflow)                                # its commands)
    elif wanted and wanted != CALIBRATE:
        importlib.import_module(wanted)
    for name, (where, help_text) in TABLE.items():
        if where == CALIBRATE:
            continue
        if only is None or where == wanted:
            help_text, add = COMMANDS[name]
            add(sub.add_parser(name, help=help_text, description=help_text))
        else:
            sub.add_parser(name, help=help_text, description=help_text)
    _add_optional_commands(sub, load=only is None or wanted == CALIBRATE)
    for p in sub.choices.values():
        finish_parser(p)
    return parser


def command_word(argv: list[str]) -> str:
    """The sub-command ``argv`` names (its first word that is not an option), or ``""``."""
    word = next((a for a in argv if not a.startswith("-")), "")
    return word if word in TABLE else ""


def _add_optional_commands(sub, load: bool) -> None:
    """Commands that live in packages beyond the core (calibrate needs torch at run time);
    without ``load`` only their names and help, when the package is there."""
    if not load:
        if importlib.util.find_spec("calibrate") is not None:
            for name, (where, help_text) in TABLE.items():
                if where == CALIBRATE:
                    sub.add_parser(name, help=help_text, description=help_text)
        return
    try:
        from calibrate import cli as calibrate_cli
    except ImportError:
        return
    add = getattr(calibrate_cli, "add_subcommands", None)
    if add is not None:
        add(sub)


_handler_pid = 0          # the process that installed ``_raise_terminated``


def _raise_terminated(signum, frame) -> None:
    """SIGTERM in the command's process: ``Terminated``. A forked pool worker inherits the
    handler and may get the signal before its initializer resets it (a search stopped while
    its pool starts): it ends quietly with the shell's code, leaving the message to the
    parent (no traceback from a worker)."""
    if os.getpid() != _handler_pid:
        os._exit(128 + signum)
    note_stop_signal(signum)
    raise Terminated()


def _run(args: argparse.Namespace) -> int:
    """Run the command with SIGTERM turned into ``Terminated`` and progress bars on."""
    global _handler_pid
    previous = None
    _handler_pid = os.getpid()
    clear_stop_signal()
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:                           # not the main thread (embedded use)
        pass
    try:
        with listening_for(args), \
                using_limits(max_event_slots=getattr(args, "max_event_slots", None)):
            rc = int(args.func(args) or 0)
            raise_if_stopped()               # the signal's own raise was swallowed
            return rc
    except Terminated:
        raise
    except BaseException as exc:             # the signal landed inside library code (a
        if stop_requested():                 # lock's wait, say) and broke it: still a stop
            raise Terminated() from exc
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        clear_stop_signal()


def _why(exc: BaseException) -> str:
    """What the command kept, if it said (e.g. ``predict``'s finished rows)."""
    return f"; {exc.args[0]}" if exc.args and isinstance(exc.args[0], str) else ""


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_word(argv))
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    try:
        check_args(args, _subparser(parser, args.command))
        return _run(args)
    except KeyboardInterrupt as exc:
        print(f"complexity {args.command}: interrupted{_why(exc)}", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"complexity {args.command}: terminated{_why(exc)}", file=sys.stderr)
        return 143
    except BrokenPipeError:                      # output piped into `head` etc.
        sys.stderr.close()
        return 0
    except (ComplexityError, OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        # bad input: our own errors, unreadable files, files that are not JSON / text
        if debug:
            traceback.print_exc()
        text = one_line(exc) or type(exc).__name__
        print(f"complexity {args.command}: error: {text}", file=sys.stderr)
        return 2
    except Exception as exc:                     # a bug: say so in one line
        if debug:
            traceback.print_exc()
        print(f"complexity {args.command}: internal error: {type(exc).__name__}: "
              f"{one_line(exc)[:300]}; please report it to {REPORT_AT}; rerun with --debug "
              "for the traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
