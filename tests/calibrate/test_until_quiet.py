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


def test_checked_rows_writes_only_a_fit_run(capsys):
    """calibrate.bench.checked_rows: a run's rows when ``problems`` finds none; none, with
    the problems on stderr, otherwise; none without the framework (``measure`` None)."""
    import types
    from calibrate.bench import checked_rows

    def bench(result, bad):
        return types.SimpleNamespace(
            measure=lambda: result, problems=lambda m: bad,
            print_table=lambda m: print("table", m, file=__import__("sys").stderr),
            rows_of=lambda m, base: [{**base, "value": m}])
    assert checked_rows("mech", bench(3.0, []), {"host": "h"}) == [{"host": "h", "value": 3.0}]
    assert checked_rows("mech", bench(3.0, ["noisy", "slow"]), {}) == []
    assert "mech rows not written: noisy; slow" in capsys.readouterr().err
    assert checked_rows("mech", bench(None, ["never asked"]), {}) == []
    assert "table" not in capsys.readouterr().err
