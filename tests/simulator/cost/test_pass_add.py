"""``PassCost.add_each(p, n)`` is exactly ``n`` calls of ``add(p)``: every field equal to the
bit (the simulator's outputs must not move by a rounding), including fields added later
(the test sets every number and dict field of the dataclass, whatever they are)."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.layer import PassCost, Segment

_NUM = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)


def _filled(draw, tag: str) -> PassCost:
    pc = PassCost()
    for f in dataclasses.fields(PassCost):
        if f.name.startswith("_"):
            continue
        value = getattr(pc, f.name)
        if isinstance(value, float):
            setattr(pc, f.name, draw(_NUM))
        elif isinstance(value, dict):
            setattr(pc, f.name, {k: draw(_NUM) for k in draw(st.sets(st.sampled_from("abc")))})
    for i in range(draw(st.integers(0, 3))):
        pc.append(Segment(f"{tag}{i}", draw(st.sampled_from(("", "tp"))), draw(_NUM)))
    return pc


def _state(pc: PassCost) -> dict:
    out = {f.name: getattr(pc, f.name) for f in dataclasses.fields(PassCost)
           if not f.name.startswith("_")}
    out["segments"] = list(pc.segments)
    return out


def _copy(pc: PassCost) -> PassCost:
    out = PassCost(**{f.name: (dict(v) if isinstance(v, dict) else v)
                      for f in dataclasses.fields(PassCost) if not f.name.startswith("_")
                      for v in [getattr(pc, f.name)]})
    for seg in pc.segments:
        out.append(seg)
    return out


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 7), st.integers(0, 7))
def test_add_each_is_repeated_add(data, n1, n2):
    base, a, b = (_filled(data.draw, t) for t in ("x", "a", "b"))
    slow, fast = _copy(base), _copy(base)
    for _ in range(n1):
        slow.add(a)
    for _ in range(n2):
        slow.add(b)
    fast.add_each(a, n1)
    fast.add_each(b, n2)
    assert _state(fast) == _state(slow)


def test_every_summed_field_is_covered():
    """A number field of PassCost that add() sums but add_each() skips would differ here."""
    a = PassCost()
    for f in dataclasses.fields(PassCost):
        if isinstance(getattr(a, f.name), float):
            setattr(a, f.name, 0.1)
    slow, fast = PassCost(), PassCost()
    for _ in range(3):
        slow.add(a)
    fast.add_each(a, 3)
    assert _state(fast) == _state(slow)
