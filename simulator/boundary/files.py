"""Output files: checked before the work starts, written atomically.

``check_writable`` refuses, in one typed error, an output path that cannot be written
(empty, a directory, a missing or read-only parent) so a long command does not fail at
its end. ``atomic_write_text`` / ``atomic_write_bytes`` / ``atomic_path`` write to a
temporary file in the same directory and ``os.replace`` it over the target, so an
interrupted run leaves either the old file or the new one, never half of one. (The
calibration layer has its own copy in ``calibrate.profile_io``; the simulator core may not
import ``calibrate``, so this is the shared one for ``simulator``.)
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import InvalidInputError
from .limits import MAX_JSON_BYTES, MAX_JSON_DEPTH


def check_writable(field: str, path: str | os.PathLike | None, directory: bool = False) -> None:
    """Raise ``InvalidInputError`` unless ``path`` can be created or replaced.
    ``directory``: the path names a directory (created later if missing)."""
    if path is None:
        return
    text = str(path)
    if not text.strip():
        raise InvalidInputError(field, text, "a non-empty path")
    p = Path(text).expanduser()
    if p.exists():
        if directory and not p.is_dir():
            raise InvalidInputError(field, text, "a directory (this is a file)")
        if not directory and p.is_dir():
            raise InvalidInputError(field, text, "a file path (this is a directory)")
        target = p if directory else p.parent
        if not os.access(target, os.W_OK):
            raise InvalidInputError(field, text, "a path this user can write")
        return
    parent = p.parent if str(p.parent) else Path(".")
    existing = next((q for q in (parent, *parent.parents) if q.exists()), Path("."))
    if not directory and existing != parent:
        raise InvalidInputError(field, text, f"a path in an existing directory "
                                f"({parent} does not exist)")
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise InvalidInputError(field, text, f"a path this user can write ({existing} is not "
                                "a writable directory)")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path next to ``path``; renamed onto it when the block ends without an
    exception, removed otherwise."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=str(target.parent) if str(target.parent) else ".")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mode_for(target: Path) -> int:
    """The permissions a plain ``open(target, "w")`` would give: the existing file's, else
    0o666 less the umask (``mkstemp`` makes its file 0o600, readable by its owner only)."""
    if target.exists():
        return target.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_json(field: str, path: str | os.PathLike, what: str) -> Any:
    """A JSON file, refused in one typed error when missing, larger than
    ``MAX_JSON_BYTES``, nested deeper than ``MAX_JSON_DEPTH`` or not JSON. ``NaN`` and
    ``Infinity`` (not JSON) are refused too."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(field, str(p), f"an existing {what}")
    if p.stat().st_size > MAX_JSON_BYTES:
        raise InvalidInputError(field, str(p), f"a {what} of at most {MAX_JSON_BYTES:,} bytes")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(field, str(p), f"a readable UTF-8 {what}", str(exc)) from None
    return loads_json(field, str(p), text, what)


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_json(field: str, shown: str, text: str, what: str) -> Any:
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(field, shown, f"a {what} nested at most {MAX_JSON_DEPTH} deep",
                                f"nesting depth {depth}")
    try:
        return json.loads(text, parse_constant=_bad_constant)
    except ValueError as exc:
        raise InvalidInputError(field, shown, f"a {what} (valid JSON)", str(exc)) from None


def json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (linear, no recursion)."""
    depth = deepest = 0
    for ch in _BRACKETS.findall(_STRINGS.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
