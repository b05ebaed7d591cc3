"""The analytic engine's early stop (``host_span._asynchronous``): once the device trails
the host by a lead it can never lose, the rest of the span is the device's remaining work.
Checked against the full walk on random pass sequences (hypothesis), including hosts
slower than the device, where the stop must wait for the total-remaining bound."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.host_span import _asynchronous

_PASS = st.tuples(st.floats(0.0, 5.0), st.floats(-0.1, 3.0), st.sampled_from((1.0, 0.5, 0.1)),
                  st.integers(1, 4))


def _bounds(passes):
    g = sum(p[0] for p in passes)
    h = sum(max(0.0, p[1]) for p in passes)
    safe = max(p[1] for p in passes) if all(p[0] >= p[1] for p in passes) else math.inf
    return g, h, safe


@settings(max_examples=300, deadline=None)
@given(st.lists(_PASS, min_size=1, max_size=6), st.integers(1, 30))
def test_early_stop_equals_the_full_walk(kinds, repeats):
    passes = kinds * repeats
    g, h, safe = _bounds(passes)
    walked = _asynchronous(passes, -1, g, h, math.inf)   # never stops early
    assert walked.device_s == pytest.approx(g)
    fast = _asynchronous(iter(passes), -1, g, h, safe)
    assert fast.span_s == pytest.approx(walked.span_s, rel=1e-9, abs=1e-12)
    assert fast.device_s == pytest.approx(walked.device_s, rel=1e-12)


def test_a_host_slower_than_the_device_is_never_cut_short():
    passes = [(1.0, 2.0, 1.0, 1)] * 50            # every pass issues twice as slow as it runs
    g, h, safe = _bounds(passes)
    assert safe == math.inf
    # host-bound: the last issue ends at 100 s, its pass runs 1 s after
    assert _asynchronous(passes, -1, g, h, safe).span_s == pytest.approx(101.0)


def test_the_walk_stops_within_a_few_passes_for_a_fast_host():
    seen = []

    def passes():
        for _ in range(10_000):
            seen.append(1)
            yield (1.0, 0.01, 0.1, 1)
    span = _asynchronous(passes(), -1, 10_000.0, 100.0, 0.01)
    assert span.span_s == pytest.approx(0.001 + 10_000.0)
    assert len(seen) < 5
