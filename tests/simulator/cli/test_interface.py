"""One interface convention over every sub-command (simulator.cli.flags), and the progress
plumbing (simulator.progress) without a terminal."""
from __future__ import annotations

import argparse
import io

import pytest

from simulator import progress
from simulator.cli.main import build_parser
from simulator.cli.progress import progress_wanted


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _visible(sp: argparse.ArgumentParser):
    return [a for a in sp._actions
            if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS]


def test_every_flag_of_every_command_has_help_text():
    missing = [f"{name} {a.option_strings or a.dest}" for name, sp in _subparsers().items()
               for a in _visible(sp) if not (a.help or "").strip()]
    assert not missing, missing


def test_every_command_takes_quiet():
    assert [n for n, sp in _subparsers().items() if "--quiet" not in sp._option_string_actions] == []


def test_defaults_are_shown_in_help():
    text = _subparsers()["simulate"].format_help()
    for flag, shown in (("--tp", "(default: 1)"), ("--pp", "(default: 1)"),
                        ("--micro-batch", "(default: 1)"), ("--engine", "(default: event)")):
        block = text[text.index("\n  " + flag + " "):]
        assert shown in " ".join(block.split())[:300], flag
    # a help that already names its default is not repeated; None is not shown
    assert "(default: None)" not in text


def test_pictures_use_plot_and_png_is_a_deprecated_alias():
    subs = _subparsers()
    assert not [n for n, sp in subs.items() if "--png" in sp._option_string_actions
                and "--png" in sp.format_help()]
    for name in ("analyze", "search", "plan", "compare", "scaling", "bottleneck", "simulate",
                 "report"):
        assert "--plot" in subs[name]._option_string_actions or name == "report", name
    a = subs["analyze"].parse_args(["m.py:f", "--png", "r.png"])
    assert a.png == "r.png" and a.plot is None      # run_analyze maps it onto --plot, warns


@pytest.mark.parametrize("argv, tty, expect", [
    ({}, True, True), ({}, False, False), ({"quiet": True}, True, False),
    ({"json": True}, True, False), ({"progress": True}, False, True),
    ({"progress": True, "json": True}, True, False), ({"progress": False}, True, False),
])
def test_when_bars_are_drawn(argv, tty, expect):
    class Stream(io.StringIO):
        def isatty(self):
            return tty
    assert progress_wanted(argparse.Namespace(**argv), Stream()) is expect


def test_progress_is_silent_without_a_listener_and_nests_with_one():
    with progress.task("x", 3) as bar:          # no listener: a no-op bar
        bar.update(2)
    seen = []

    class Bar:
        def __init__(self, label, total):
            self.label, self.total, self.n = label, total, 0
            seen.append(self)

        def update(self, n=1):
            self.n += n

        def note(self, text):
            self.text = text

        def close(self):
            self.closed = True

    with progress.listening(Bar):
        assert progress.active()
        for _ in progress.track(range(4), "outer", describe=str):
            with progress.task("inner", None) as b:
                b.update(1)
    assert not progress.active()
    assert seen[0].label == "outer" and seen[0].total == 4 and seen[0].n == 4
    assert [b.label for b in seen[1:]] == ["inner"] * 4 and all(b.closed for b in seen)
