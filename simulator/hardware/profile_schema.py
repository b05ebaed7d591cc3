"""Physical ranges of a calibration profile's numbers, checked when a profile is read.

Every ``Coefficient`` carries its unit; the unit fixes the range (``UNIT_RANGES``):
efficiencies (``fraction``) in (0, 1], latencies (``us``, ``s``) and sizes (``elements``,
``tokens``) >= 0, factors (``multiplier``, ``ratio``) > 0; every value finite. GEMM tile
sizes are integers in [0, 4096]. Two zeros are meaningful and kept: ``k_half`` 0 (no ramp
with K: the shipped A100 and V100 reference profiles) and tile 0 (no wave quantization:
CPU profiles, ``cost.kernels.wave_efficiency``); negative values are refused.

A profile that carries its own measured ``device`` (a CPU calibration, a trace fit) states
its fractions against that device's nominal peak, which caches and turbo clocks exceed
(a CPU's cache-resident optimizer step measured at 1.7x its DRAM bandwidth), so there a
fraction is only required to be > 0 and at most ``MAX_MEASURED_FRACTION``. One ``ProfileError`` names the JSON
path of the first bad number (``profile.gemm.eff_max.bf16``), its value and the range.

The same checks apply to a profile built in memory (``Profile.validate``: before it is
written or handed to the simulator); fitters that produce a value outside its range keep
their base profile's value instead (``calibrate.profile_range``), using
``coefficient_error`` and ``coefficients`` from here.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

from ..errors import ProfileError

# unit: (lowest, highest, lowest excluded)
UNIT_RANGES: dict[str, tuple[float, float, bool]] = {
    "fraction": (0.0, 1.0, True),
    "us": (0.0, math.inf, False), "s": (0.0, math.inf, False), "ms": (0.0, math.inf, False),
    "elements": (0.0, math.inf, False), "tokens": (0.0, math.inf, False),
    "multiplier": (0.0, math.inf, True), "ratio": (0.0, math.inf, True),
}
MAX_TILE = 4096
MAX_MEASURED_FRACTION = 1000.0


def _real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def coefficient_error(path: str, c: Mapping[str, Any], own_device: bool) -> ProfileError | None:
    """The error of one coefficient dict (``value``, ``unit``, optional ``stderr`` /
    ``heldout_error_pct``) outside its unit's range, else None. ``own_device``: the profile
    carries its measured device (fractions up to ``MAX_MEASURED_FRACTION``)."""
    v, unit = c.get("value"), c.get("unit")
    lo, hi, lo_open = UNIT_RANGES.get(unit, (-math.inf, math.inf, False))
    if unit == "fraction" and own_device:
        hi = MAX_MEASURED_FRACTION
    if not _real(v) or v < lo or v > hi or (lo_open and v == lo):
        left = "" if lo == -math.inf else (f"> {lo:g}" if lo_open else f">= {lo:g}")
        right = "" if hi == math.inf else f"<= {hi:g}"
        rng = " and ".join(x for x in (left, right) if x)
        return ProfileError(path, v, f"a finite number{' ' + rng if rng else ''} "
                            f"(unit {unit!r})")
    for k in ("stderr", "heldout_error_pct"):
        if c.get(k) is not None and not _real(c[k]):
            return ProfileError(f"{path}.{k}", c[k], "a finite number or null")
    return None


def _check_coefficient(path: str, c: Mapping[str, Any], own_device: bool) -> None:
    err = coefficient_error(path, c, own_device)
    if err is not None:
        raise err


def coefficients(obj: Any, keys: tuple[str, ...] = ()
                 ) -> Iterator[tuple[tuple[str, ...], Mapping[str, Any]]]:
    """(keys from the profile's top, coefficient dict) for every coefficient in a profile
    dict, in its order; the dotted path is ``"profile." + ".".join(keys)``."""
    if isinstance(obj, Mapping):
        if "value" in obj and "unit" in obj:
            yield keys, obj
            return
        for k, v in obj.items():
            yield from coefficients(v, (*keys, str(k)))


def check_numbers(obj: Any, path: str = "profile", own_device: bool | None = None) -> None:
    """Walk the profile dict; check every coefficient (a dict with ``value`` and
    ``unit``) and the GEMM tile sizes."""
    if own_device is None:
        own_device = isinstance(obj, Mapping) and bool(obj.get("device"))
    if isinstance(obj, Mapping):
        if "value" in obj and "unit" in obj:
            _check_coefficient(path, obj, own_device)
            return
        for k, v in obj.items():
            if path == "profile.gemm" and k in ("tile_m", "tile_n"):
                _check_tile(f"{path}.{k}", v)
            elif path == "profile.gemm" and k == "tiles":
                _check_tiles(f"{path}.{k}", v)
            else:
                check_numbers(v, f"{path}.{k}", own_device)


def _check_tile(path: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TILE:
        raise ProfileError(path, v, f"an integer >= 0 and <= {MAX_TILE} (0: no wave "
                           "quantization)")


def _check_tiles(path: str, v: Any) -> None:
    if not isinstance(v, list):
        raise ProfileError(path, v, "a list of [tile_m, tile_n] pairs")
    for i, pair in enumerate(v):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ProfileError(f"{path}[{i}]", pair, "a [tile_m, tile_n] pair")
        for x in pair:
            _check_tile(f"{path}[{i}]", x)
