"""JSON a user's tools can read: every output the CLI prints with ``--json`` goes through
``dumps``, which writes a number that is not finite (NaN, +/-inf: e.g. an MFU of a step
that did no work) as ``null`` instead of Python's non-standard ``NaN`` / ``Infinity``
tokens, which ``jq`` and most JSON parsers reject. ``json.dumps(..., allow_nan=False)``
then guarantees none slipped through."""
from __future__ import annotations

import json
import math
from typing import Any


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float, at any depth of dicts, lists and tuples, as
    ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` in standard JSON (see module doc); ``kwargs`` as json's
    (``default=`` is applied before the non-finite check, so objects it converts are
    covered too)."""
    default = kwargs.pop("default", None)
    if default is not None:
        obj = json.loads(json.dumps(obj, default=default))
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)
