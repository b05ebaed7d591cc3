"""``--json`` output is standard JSON: non-finite numbers become null, never NaN/Infinity."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.boundary.json_out import dumps, finite_or_null

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=20)


def _strict(text: str):
    def bad(token: str):
        raise AssertionError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=bad)


@given(_VALUES)
def test_any_value_dumps_as_standard_json_with_finite_numbers_kept(value):
    back = _strict(dumps(value))
    assert back == json.loads(json.dumps(finite_or_null(value)))


def test_non_finite_becomes_null_at_any_depth():
    out = _strict(dumps({"mfu": math.nan, "p": [1.0, math.inf, {"x": -math.inf}], "ok": 2.5}))
    assert out == {"mfu": None, "p": [1.0, None, {"x": None}], "ok": 2.5}


def test_default_converted_objects_are_checked_too():
    class Odd:
        pass
    out = _strict(dumps({"a": Odd(), "b": math.nan}, default=lambda o: float("nan")))
    assert out == {"a": None, "b": None}
    with pytest.raises(TypeError):
        dumps({"a": Odd()})
