"""Fitted coefficients outside their physical range are not shipped.

A least-squares fit can land on a value no device reaches (a bandwidth efficiency of 10^4
at the fitter's upper bound, a negative latency, NaN). ``keep_in_range`` applies the range
checks a profile read from JSON gets (``simulator.hardware.profile_schema``: by unit, an
efficiency in (0, 1], or up to ``MAX_MEASURED_FRACTION`` where the profile carries its own
measured device; latencies >= 0; every value finite) to a profile a fitter built, and
replaces each coefficient that fails with the base profile's coefficient at the same path,
its source saying so ("not informed by trace t.json: the fitted value 1.2e+04 was out of
range (...) and not used; kept from ...: <base source>"). A family efficiency
(``memory.kind_eff.<family>``) the base does not have falls back to the base's
``memory.bw_eff``, which is what the simulator uses for a family without its own. With
nothing in range to fall back on, the range error is raised.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from simulator.errors import ProfileError
from simulator.hardware.profile import Profile
from simulator.hardware.profile_schema import coefficient_error, coefficients


def _at(d: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    return d


def _fallback(base: Mapping[str, Any], keys: tuple[str, ...]) -> Mapping[str, Any] | None:
    """The base's coefficient at ``keys`` (a family efficiency: else the base's bw_eff)."""
    c = _at(base, keys)
    if c is None and keys[:2] == ("memory", "kind_eff"):
        c = _at(base, ("memory", "bw_eff"))
    return c if isinstance(c, Mapping) and "value" in c and "unit" in c else None


def _shown(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return f"{v:.4g}"
    return repr(v)


def keep_in_range(prof: Profile, base: Profile | None, lead: str, base_name: str
                  ) -> tuple[Profile, dict[str, str]]:
    """``prof`` with every out-of-range coefficient replaced by ``base``'s (see the module
    docstring), and what was replaced: coefficient path (``memory.kind_eff.norm``) -> the
    fitted value and its range. ``lead`` opens the replaced source ("not informed by trace t.json");
    ``base_name`` names the base. Raises the ``ProfileError`` of the first coefficient
    with no in-range fallback."""
    d = prof.to_dict()
    b = base.to_dict() if base is not None else {}
    own_device = bool(d.get("device"))
    rejected: dict[str, str] = {}
    for keys, c in list(coefficients(d)):
        path = "profile." + ".".join(keys)
        err = coefficient_error(path, c, own_device)
        if err is None:
            continue
        fb = _fallback(b, keys)
        if fb is None or coefficient_error(path, fb, own_device) is not None:
            raise ProfileError(err.field, err.value, err.valid,
                               f"fitted; {base_name or 'no base profile'} has no value in "
                               "range to keep instead")
        what = "value" if err.field == path else err.field.rsplit(".", 1)[-1]
        src = (f"{lead}: the fitted {what} {_shown(err.value)} was out of range "
               f"({err.valid}) and not used; kept from {base_name}: {fb['source']}")
        _at(d, keys[:-1])[keys[-1]] = {**fb, "source": src}
        rejected[".".join(keys)] = f"{what} {_shown(err.value)} (valid: {err.valid})"
    if not rejected:
        return prof, {}
    return Profile.from_dict(d).validate(), rejected
