"""Progress bars on stderr for the ``complexity`` command (``tqdm``).

``progress_for(args)`` decides once per command: bars when stderr is a terminal, unless
``--quiet`` or ``--json`` (or ``--no-progress``); ``--progress`` forces them on, e.g. under
a pager. Library code reports through ``simulator.progress``; this module only draws.
Bars are transient (``leave=False``): when a command finishes only its output remains.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from .. import progress as _progress


def progress_wanted(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    """Whether this command run should draw bars on ``stream`` (default: stderr)."""
    forced = getattr(args, "progress", None)
    if getattr(args, "json", False) or getattr(args, "quiet", False):
        return bool(forced) and not getattr(args, "json", False)
    if forced is not None:
        return bool(forced)
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TqdmSink:
    """``simulator.progress`` listener drawing one ``tqdm`` bar per open task (nested
    tasks stack below their parent)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        from tqdm import tqdm
        tqdm.monitor_interval = 0        # no monitor thread (search forks worker processes)
        self._tqdm = tqdm
        self.stream = stream or sys.stderr

    def __call__(self, label: str, total: int | None) -> "_TqdmBar":
        return _TqdmBar(self._tqdm(total=total, desc=label, leave=False, file=self.stream,
                                   dynamic_ncols=True, mininterval=0.1, unit="",
                                   bar_format=None if total else "{desc}: {n} {elapsed}"))


class _TqdmBar:
    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def note(self, text: str) -> None:
        self.bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        self.bar.close()


def make_sink(args: argparse.Namespace, stream: TextIO | None = None):
    """The listener for this command run, or None (no bars: not a terminal, --quiet,
    --json, or tqdm missing)."""
    if not progress_wanted(args, stream):
        return None
    try:
        return TqdmSink(stream)
    except ImportError:          # tqdm is a dependency; a broken install just loses the bars
        return None


def listening_for(args: argparse.Namespace, stream: TextIO | None = None):
    return _progress.listening(make_sink(args, stream))
