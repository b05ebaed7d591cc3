"""In-flight micro-batches per chunk by formula (``parallel.in_flight``) against the walked
schedule, and against the published counts: 1F1B holds ``pp - stage`` micro-batches on a
stage (Narayanan et al. 2021 sec. 2.2), GPipe all ``m``, and Megatron's interleaved first
stage ``pp * vpp + pp - 1`` chunk-micro-batches (Korthikanti et al. 2022 sec. 4.2.3:
``1 + (p - 1) / (p v)`` times the stage's layers)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.parallel.in_flight import live_chunk_counts, walked_live_chunk_counts
from simulator.parallel.plan import Schedule

# the schedules with a formula; split-backward ones (ZB-H1, ZB-V, DualPipe) are the walk
# itself (their own counts: tests/simulator/engine/test_zero_bubble.py)
FORMULA = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)


@st.composite
def _cases(draw):
    schedule = draw(st.sampled_from(FORMULA))
    pp = draw(st.integers(1, 12))
    vpp = draw(st.integers(1, 5))
    m = draw(st.integers(1, 6)) * pp if schedule == Schedule.INTERLEAVED \
        else draw(st.integers(1, 60))
    m = m if draw(st.booleans()) else draw(st.integers(1, 60))     # also off the grid
    return schedule, draw(st.integers(0, pp - 1)), pp, m, vpp


@settings(max_examples=400, deadline=None)
@given(_cases())
def test_formula_matches_the_walked_schedule(case):
    assert live_chunk_counts.__wrapped__(*case) == walked_live_chunk_counts(*case)


def test_formula_matches_the_walk_on_large_pipelines():
    for pp, vpp, m in ((64, 1, 512), (16, 12, 96), (8, 3, 96), (64, 4, 128), (32, 2, 4096)):
        for s in sorted({0, 1, pp // 2, pp - 1}):
            for sched in FORMULA:
                args = (sched, s, pp, m, vpp)
                assert live_chunk_counts.__wrapped__(*args) == walked_live_chunk_counts(*args)


def test_published_in_flight_counts():
    assert live_chunk_counts(Schedule.ONE_F_ONE_B, 0, 8, 96, 1) == ((8,),)
    assert live_chunk_counts(Schedule.ONE_F_ONE_B, 5, 8, 96, 1) == ((3,),)
    assert live_chunk_counts(Schedule.ONE_F_ONE_B, 0, 8, 4, 1) == ((4,),)
    assert live_chunk_counts(Schedule.GPIPE, 3, 8, 96, 1) == ((96,),)
    p, v = 8, 3
    first = live_chunk_counts(Schedule.INTERLEAVED, 0, p, 96, v)
    assert max(sum(x) for x in first) == p * v + p - 1
