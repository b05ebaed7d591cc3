"""``calibrate.bench.until_quiet``: a whole timed run is repeated after backoff pauses while
it reports noise, until it is quiet or the pause budget is spent; the last run's result and
every run's noise come back."""
from __future__ import annotations

import calibrate.bench as bench


def _runs(noises):
    it = iter(noises)
    count = [0]

    def attempt():
        count[0] += 1
        return count[0], next(it)
    return attempt


def test_repeats_while_noisy_and_stops_when_quiet(monkeypatch):
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    res, attempts = bench.until_quiet(_runs(["busy", "busy", ""]), wait_s=100.0)
    assert res == 3 and attempts == ["busy", "busy", ""]
    assert slept == [bench.backoff_s(0), bench.backoff_s(1)]


def test_gives_up_once_the_pause_budget_is_spent(monkeypatch):
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    budget = bench.backoff_s(0) + bench.backoff_s(1)
    res, attempts = bench.until_quiet(_runs(["a", "b", "c", "d"]), wait_s=budget)
    assert res == 3 and attempts == ["a", "b", "c"]      # the noisy last run is returned
    assert sum(slept) == budget
    res, attempts = bench.until_quiet(_runs([""]), wait_s=0.0)
    assert res == 1 and attempts == [""]
