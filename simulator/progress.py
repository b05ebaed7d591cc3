"""Progress of long work, for whoever listens.

Library code marks its long loops with ``task(label, total)`` (or ``track(iterable,
label)``) and calls ``update`` on what it gets back; nothing is drawn unless a listener is
installed with ``listening(sink)``. The command line installs one that draws ``tqdm`` bars
on stderr when stderr is a terminal (``simulator.cli.progress``); a library caller, a test
or a ``--json`` run sees nothing. The listener lives in a ``ContextVar``, so functions keep
their signatures and nested work (a search inside a comparison) nests its bars.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

T = TypeVar("T")


class Bar(Protocol):
    """What ``task`` hands out: advance it, say what it is on, close it."""

    def update(self, n: int = 1) -> None: ...

    def note(self, text: str) -> None: ...

    def close(self) -> None: ...


Sink = Callable[[str, "int | None"], Bar]


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


SILENT = _Silent()
_SINK: ContextVar[Sink | None] = ContextVar("complexity_progress_sink", default=None)


def open_task(label: str, total: int | None = None) -> Bar:
    """Like ``task`` for code that cannot use a ``with`` block: close the bar yourself."""
    sink = _SINK.get()
    return sink(label, total) if sink is not None else SILENT


@contextmanager
def task(label: str, total: int | None = None) -> Iterator[Bar]:
    """A unit of long work with ``total`` steps (``None``: unknown, e.g. enumeration)."""
    bar = open_task(label, total)
    try:
        yield bar
    finally:
        bar.close()


def track(items: Iterable[T], label: str, total: int | None = None,
          describe: Callable[[T], str] | None = None) -> Iterator[T]:
    """Yield ``items``, advancing one step per item (``total`` defaults to ``len(items)``);
    ``describe(item)`` names the item being worked on."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with task(label, total) as bar:
        for x in items:
            if describe is not None:
                bar.note(describe(x))
            yield x
            bar.update(1)


@contextmanager
def listening(sink: Sink | None) -> Iterator[None]:
    """Send progress of the work inside the ``with`` block to ``sink`` (None: silence)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


def active() -> bool:
    return _SINK.get() is not None
