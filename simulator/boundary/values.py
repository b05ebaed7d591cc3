"""Typed checks of single values at a boundary (a flag, a JSON key, a CSV cell, an API
argument). Each returns the value in its proper type or raises ``InvalidInputError``
naming the field, the value and what would be valid; none of them coerces silently
(``"8"`` is not an integer, ``1.5`` is not a whole number, ``True`` is not a number,
``nan`` and ``inf`` are not sizes).

``parse_int`` / ``parse_float`` read text (a flag, a CSV cell) and then apply the same
range as ``check_int`` / ``check_float``; ``check_*`` take values that already have a
Python type (JSON, keyword arguments).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ..errors import InvalidInputError


def _range_text(kind: str, lo: float | None, hi: float | None, lo_open: bool = False,
                hi_open: bool = False) -> str:
    lo_s = None if lo is None else f"{lo:,g}" if isinstance(lo, float) else f"{lo:,}"
    hi_s = None if hi is None else f"{hi:,g}" if isinstance(hi, float) else f"{hi:,}"
    if lo is not None and hi is not None:
        left = f"> {lo_s}" if lo_open else f">= {lo_s}"
        right = f"< {hi_s}" if hi_open else f"<= {hi_s}"
        return f"{kind} {left} and {right}"
    if lo is not None:
        return f"{kind} {'>' if lo_open else '>='} {lo_s}"
    if hi is not None:
        return f"{kind} {'<' if hi_open else '<='} {hi_s}"
    return kind


def check_int(field: str, value: Any, lo: int | None = 1, hi: int | None = None) -> int:
    """An ``int`` (not a bool, not a float) in ``[lo, hi]``."""
    valid = _range_text("an integer", lo, hi)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(field, value, valid)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise InvalidInputError(field, value, valid)
    return value


def check_float(field: str, value: Any, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite real number (int or float, not a bool) in the range; returned as float."""
    valid = _range_text("a finite number", lo, hi, lo_open, hi_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(field, value, valid)
    v = float(value)
    if not math.isfinite(v):
        raise InvalidInputError(field, value, valid)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise InvalidInputError(field, value, valid)
    if hi is not None and (v >= hi if hi_open else v > hi):
        raise InvalidInputError(field, value, valid)
    return v


def check_fraction(field: str, value: Any) -> float:
    """An efficiency: a number in (0, 1]."""
    return check_float(field, value, 0.0, 1.0, lo_open=True)


def check_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInputError(field, value, "true or false")
    return value


def check_str(field: str, value: Any, nonempty: bool = True, max_len: int = 4096) -> str:
    if not isinstance(value, str) or (nonempty and not value.strip()) or len(value) > max_len:
        raise InvalidInputError(field, value if not isinstance(value, str) else value[:80],
                                f"a{' non-empty' if nonempty else ''} string of at most "
                                f"{max_len} characters")
    return value


def check_choice(field: str, value: Any, choices: Iterable[str]) -> str:
    opts = list(choices)
    if not isinstance(value, str) or value not in opts:
        raise InvalidInputError(field, value, "one of " + ", ".join(opts))
    return value


def check_mapping(field: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(field, type(value).__name__, "a JSON object")
    return value


# ---- text (flags, CSV cells) ----------------------------------------------------------------
def parse_int(field: str, text: Any, lo: int | None = 1, hi: int | None = None) -> int:
    """A whole number written as text: ``8``, ``1e3``, ``8.0`` (a CSV column of numbers);
    not ``1.5``, ``inf``, ``nan`` or ``abc``."""
    s = str(text).strip().replace("_", "")
    valid = _range_text("an integer", lo, hi)
    try:
        v = int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise InvalidInputError(field, text, valid) from None
        if not math.isfinite(f) or not f.is_integer() or abs(f) > 2.0 ** 62:
            raise InvalidInputError(field, text, valid) from None
        v = int(f)
    return check_int(field, v, lo, hi)


def parse_float(field: str, text: Any, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite number written as text (``inf``, ``nan`` and ``abc`` are refused)."""
    try:
        v = float(str(text).strip().replace("_", ""))
    except ValueError:
        raise InvalidInputError(field, text, _range_text("a finite number", lo, hi, lo_open,
                                                         hi_open)) from None
    return check_float(field, v, lo, hi, lo_open, hi_open)
