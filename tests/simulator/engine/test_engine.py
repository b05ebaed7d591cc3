"""The discrete-event core: ordering, link sharing, dependencies, determinism."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.events import Engine
from simulator.errors import ComplexityError


def test_stream_runs_in_order_and_waits_for_dependencies():
    e = Engine()
    e.stream("a")
    e.stream("b")
    x = e.add("x", "a", 2.0)
    y = e.add("y", "b", 1.0, [(x, 1.0)])
    z = e.add("z", "a", 1.0)
    assert e.run() == pytest.approx(3.0)
    t = e.tasks
    assert (t[x].start_s, t[x].end_s) == (0.0, 2.0)
    assert (t[y].start_s, t[y].end_s) == (2.0, 3.0)      # waited for x
    assert (t[z].start_s, t[z].end_s) == (2.0, 3.0)      # in-order behind x on stream a


def test_partial_dependency_releases_mid_task():
    e = Engine()
    e.stream("c")
    e.link("l")
    a = e.add("a", "c", 4.0)
    b = e.add("b", "l", 1.0, [(a, 0.25)])
    e.run()
    assert e.tasks[b].start_s == pytest.approx(1.0)


def test_two_flows_share_a_link_fairly():
    """Processor sharing: two equal flows started together both take twice as long."""
    e = Engine()
    e.link("nic")
    a = e.add("a", "nic", 1.0)
    b = e.add("b", "nic", 1.0)
    assert e.run() == pytest.approx(2.0)
    assert e.tasks[a].end_s == pytest.approx(2.0) and e.tasks[b].end_s == pytest.approx(2.0)


def test_short_flow_leaves_early_and_long_flow_speeds_up():
    # 0..2: both share (each progresses 1.0); short (1.0) done at t=2; long has 2.0 left alone
    e = Engine()
    e.link("nic")
    short = e.add("short", "nic", 1.0)
    long_ = e.add("long", "nic", 3.0)
    e.run()
    assert e.tasks[short].end_s == pytest.approx(2.0)
    assert e.tasks[long_].end_s == pytest.approx(4.0)


def test_deadlock_is_reported_not_hung():
    e = Engine()
    e.stream("s")
    a = e.add("a", "s", 1.0)
    b = e.add("b", "s", 1.0)
    e.depend(a, b)          # a waits for b, but b is queued behind a on the same stream
    with pytest.raises(ComplexityError, match="deadlock"):
        e.run()


def test_bad_inputs_raise():
    e = Engine()
    e.stream("s")
    with pytest.raises(ComplexityError):
        e.add("x", "nope", 1.0)
    with pytest.raises(ComplexityError):
        e.add("x", "s", -1.0)
    e.link("l")
    f = e.add("flow", "l", 1.0)
    g = e.add("g", "s", 1.0)
    with pytest.raises(ComplexityError, match="partial"):
        e.depend(g, f, 0.5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 5.0), min_size=1, max_size=12))
def test_link_conserves_work(works):
    """Total link busy time equals the sum of flow works (no work lost or invented)."""
    e = Engine()
    e.link("l")
    for i, w in enumerate(works):
        e.add(f"f{i}", "l", w)
    assert e.run() == pytest.approx(sum(works), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=1, max_size=10), st.integers(0, 2**16))
def test_same_inputs_same_timeline(works, seed):
    def build():
        e = Engine()
        e.stream("s")
        e.link("l")
        prev = -1
        for i, w in enumerate(works):
            deps = [(prev, 1.0)] if prev >= 0 else []
            prev = e.add(f"t{i}", "s" if (i + seed) % 2 else "l", w, deps)
        e.run()
        return [(t.start_s, t.end_s) for t in e.tasks]
    assert build() == build()
