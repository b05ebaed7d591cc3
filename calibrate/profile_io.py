"""Writing profiles reproducibly: digits a fit justifies, nothing more.

Least-squares results depend on the BLAS/LAPACK build and the CPU's kernels in their last
digits, so a profile written with every digit a float has is not reproducible across
machines. ``write_profile`` rounds each number to what its own precision justifies:

- a standard error or held-out error to ``ERROR_SIG`` significant digits (an uncertainty
  estimated from n points is itself uncertain by about 1/sqrt(2(n-1)), tens of percent for
  the fits here);
- a fitted value with a standard error to ``DIGITS_BELOW_STDERR`` decimal places below the
  leading digit of that error (838.4 +/- 276 -> 838), and never to more than ``VALUE_SIG``
  significant digits;
- any other float (datasheet facts, ratios) to ``VALUE_SIG`` significant digits.

Output is deterministic on one machine (sorted keys, same rounding). Across machines two
builds agree within each coefficient's standard error, which is what
``profile_differences`` checks (the shipped-profile test uses it).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

from simulator.hardware.profile import Profile
from simulator.hardware.profile_schema import check_numbers

VALUE_SIG = 6
ERROR_SIG = 2
DIGITS_BELOW_STDERR = 2
# Two builds of one coefficient may differ by this fraction of its standard error: machine
# differences in a least-squares solve are orders of magnitude below a standard error.
STDERR_FRACTION_TOLERANCE = 0.05
# Rounding to ERROR_SIG digits can land on either side of a boundary: 1.05 -> 1.0 or 1.1.
ERROR_REL_TOLERANCE = 0.11
FLOAT_REL_TOLERANCE = 1e-5


def sig(x: float, digits: int) -> float:
    """``x`` rounded to ``digits`` significant digits (non-finite values unchanged)."""
    if not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{digits}g}")


def _is_coefficient(d: dict) -> bool:
    return {"value", "unit", "source"} <= d.keys()


def round_value(value: float, stderr: float | None) -> float:
    """A fitted value to ``DIGITS_BELOW_STDERR`` places below its error's leading digit."""
    if isinstance(stderr, (int, float)) and math.isfinite(stderr) and stderr > 0 \
            and math.isfinite(value):
        place = math.floor(math.log10(stderr)) - DIGITS_BELOW_STDERR
        value = round(value, -place)
    return sig(float(value), VALUE_SIG)


def _round_coefficient(d: dict) -> dict:
    out = {k: round_numbers(v) for k, v in d.items()}
    for key in ("stderr", "heldout_error_pct"):
        if isinstance(d.get(key), float):
            out[key] = sig(d[key], ERROR_SIG)
    if isinstance(d["value"], (int, float)) and not isinstance(d["value"], bool):
        out["value"] = round_value(float(d["value"]), d.get("stderr"))
        if out["value"] == 0 and d["value"] > 0 and d.get("unit") == "fraction":
            # an efficiency whose error bar exceeds it (a noisy fit on a busy host) keeps
            # one significant digit: 0 is not an efficiency, and a profile reader refuses it
            out["value"] = sig(float(d["value"]), 1)
    return out


def round_numbers(obj: Any) -> Any:
    """Every float in a profile dict rounded as the module docstring says."""
    if isinstance(obj, float):
        return sig(obj, VALUE_SIG)
    if isinstance(obj, dict):
        if _is_coefficient(obj):
            return _round_coefficient(obj)
        return {k: round_numbers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [round_numbers(v) for v in obj]
    return obj


def profile_json(prof: Profile) -> str:
    """The deterministic text of a profile (sorted keys, rounded numbers), after the range
    checks ``Profile.read_json`` applies (``ProfileError`` naming the first bad number's
    path): text that a reader would refuse is never produced."""
    data = round_numbers(prof.to_dict())
    check_numbers(data)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_profile(prof: Profile, path: Path) -> None:
    """Write atomically (temporary file, then rename): an interrupted write leaves the old
    file or none, never half a profile; a profile out of range (``profile_json``) leaves
    no file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(profile_json(prof))
    tmp.replace(path)


# ---- comparing two builds ---------------------------------------------------------------------
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _last_place(token: str) -> float:
    """One unit in the last printed place of a number as written (``0.125`` -> 0.001)."""
    mant, _, exp = token.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 10.0 ** (-decimals + (int(exp) if exp else 0))


def _text_differences(path: str, a: str, b: str) -> Iterator[str]:
    """Provenance strings print fitted numbers: same words, numbers within one unit of
    their last printed digit (or 0.1%)."""
    if _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
        yield f"{path}: text differs: {a!r} != {b!r}"
        return
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b)):
        fx, fy = float(x), float(y)
        if abs(fx - fy) > max(_last_place(x), _last_place(y)) * 1.0001 + 1e-3 * abs(fy):
            yield f"{path}: number {x} != {y} in text"


def _close(a: float, b: float, rel: float, abs_tol: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_tol)


def _coefficient_differences(path: str, a: dict, b: dict) -> Iterator[str]:
    se = b.get("stderr") if isinstance(b.get("stderr"), (int, float)) else None
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        where = f"{path}.{key}"
        if key == "value" and se and isinstance(x, (int, float)) and isinstance(y, (int, float)):
            tol = STDERR_FRACTION_TOLERANCE * se + FLOAT_REL_TOLERANCE * abs(y)
            if abs(x - y) > tol:
                yield f"{where}: {x} != {y} (more than {STDERR_FRACTION_TOLERANCE} x stderr {se})"
        elif key in ("stderr", "heldout_error_pct") and isinstance(x, float) \
                and isinstance(y, float):
            if not _close(x, y, ERROR_REL_TOLERANCE, 1e-12):
                yield f"{where}: {x} != {y} (more than {ERROR_REL_TOLERANCE:.0%})"
        else:
            yield from profile_differences(x, y, where)


def profile_differences(a: Any, b: Any, path: str = "profile") -> Iterator[str]:
    """What differs between two profile dicts beyond what a rebuild on another machine may
    change (see the module docstring); nothing when they agree."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            yield f"{path}: keys differ: {sorted(set(a) ^ set(b))}"
            return
        if _is_coefficient(a):
            yield from _coefficient_differences(path, a, b)
            return
        for k in sorted(a):
            yield from profile_differences(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: lengths differ ({len(a)} != {len(b)})"
            return
        for i, (x, y) in enumerate(zip(a, b)):
            yield from profile_differences(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and _close(float(a), float(b), FLOAT_REL_TOLERANCE)):
            yield f"{path}: {a} != {b}"
    elif isinstance(a, str) and isinstance(b, str):
        yield from _text_differences(path, a, b)
    elif a != b:
        yield f"{path}: {a!r} != {b!r}"
