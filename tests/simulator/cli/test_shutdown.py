"""Clean shutdown: SIGTERM / Ctrl-C stop search's worker processes and exit 143 / 130 with
one line; an interrupted ``predict --out`` keeps its finished rows and resumes without
recomputing them."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.cli import commands
from simulator.cli.main import main

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RUNS = REPO / "validation" / "published_runs.csv"


def _tiny_runs(tmp_path: Path, n: int = 3) -> Path:
    with RUNS.open(newline="") as f:
        rows = list(csv.DictReader(f))
    small = [r for r in rows if r["id"].startswith("megatron_sc21_0")][:n]
    out = tmp_path / "runs.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(small)
    return out


def test_interrupted_predict_resumes_without_recomputing(tmp_path, monkeypatch, capsys):
    runs = _tiny_runs(tmp_path)
    real = commands.predict_row
    calls: list[str] = []

    def interrupt_on_second(row, *a):
        if calls:
            raise KeyboardInterrupt
        calls.append(row["id"])
        return real(row, *a)

    out = tmp_path / "out.csv"
    monkeypatch.setattr(commands, "predict_row", interrupt_on_second)
    assert main(["predict", "--runs", str(runs), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "1 of 3 rows kept" in err
    partial = tmp_path / "out.csv.partial"
    assert not out.exists() and len(partial.read_text().splitlines()) == 2   # header + row

    def counting(row, *a):
        calls.append(row["id"])
        return real(row, *a)

    finished = calls[0]
    calls.clear()
    monkeypatch.setattr(commands, "predict_row", counting)
    assert main(["predict", "--runs", str(runs), "--out", str(out), "--quiet"]) == 0
    assert len(calls) == 2 and finished not in calls        # the finished row was reused
    assert out.exists() and not partial.exists()
    fresh = tmp_path / "fresh.csv"
    assert main(["predict", "--runs", str(runs), "--out", str(fresh), "--quiet"]) == 0
    assert out.read_bytes() == fresh.read_bytes()


def test_a_finished_output_is_never_reused(tmp_path, monkeypatch):
    runs = _tiny_runs(tmp_path, 2)
    out = tmp_path / "out.csv"
    assert main(["predict", "--runs", str(runs), "--out", str(out), "--quiet"]) == 0
    calls = []
    real = commands.predict_row
    monkeypatch.setattr(commands, "predict_row", lambda r, *a: calls.append(1) or real(r, *a))
    assert main(["predict", "--runs", str(runs), "--out", str(out), "--quiet"]) == 0
    assert len(calls) == 2


def _children(pid: int) -> set[int]:
    kids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.add(int(d.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig, rc, word, delay_s", [
    (signal.SIGTERM, 143, "terminated", 0.3), (signal.SIGINT, 130, "interrupted", 0.3),
    # as soon as the workers exist: a worker still in its initializer has the parent's
    # SIGTERM handler and must end without a traceback of its own
    (signal.SIGTERM, 143, "terminated", 0.0)])
def test_search_stopped_by_a_signal_leaves_no_process(sig, rc, word, delay_s):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli.main", "search", "--model", "gpt3-175b",
         "--gpu", "a100-sxm-80gb", "--gpus", "512", "--global-batch", "1536", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    kids: set[int] = set()
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        kids = _children(proc.pid)
        if len(kids) >= 2:
            break
        time.sleep(0.005)
    if proc.poll() is not None or len(kids) < 2:
        proc.kill()
        pytest.fail(f"the search never started its worker pool (children {kids})")
    time.sleep(delay_s)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)    # hangs if a worker kept stdout open
    assert proc.returncode == rc, err
    lines = err.decode().strip().splitlines()
    assert lines == [f"complexity search: {word}"], lines
    t0 = time.time()
    while any(_alive(k) for k in kids) and time.time() - t0 < 10:
        time.sleep(0.1)
    assert not [k for k in kids if _alive(k)]


def test_a_sigterm_whose_raise_was_swallowed_still_ends_the_command(tmp_path, monkeypatch,
                                                                    capsys):
    """Python runs the handler inside callbacks that only print their exceptions (os.fork's
    at-fork hooks, ``__del__``): the ``Terminated`` is lost there, and the command used to
    finish with exit code 0. The handler also records the signal; the command ends with 143
    and the one-line message all the same."""
    from simulator.cli import main as cli_main
    runs = _tiny_runs(tmp_path, 1)
    real = commands.predict_row

    def swallowed_signal(row, *a):
        try:                                  # what an "Exception ignored in ..." site does
            cli_main._raise_terminated(signal.SIGTERM, None)
        except BaseException:
            pass
        return real(row, *a)

    monkeypatch.setattr(commands, "predict_row", swallowed_signal)
    assert main(["predict", "--runs", str(runs), "--quiet"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["complexity predict: terminated"]
    # the request is cleared with the command: the next one runs normally
    monkeypatch.setattr(commands, "predict_row", real)
    assert main(["predict", "--runs", str(runs), "--quiet"]) == 0


def test_stopping_a_pool_drops_only_the_manager_threads_cancelled_future_error():
    """``stop_pool``'s guard: an ``InvalidStateError`` from the pool's manager thread (Python
    3.11 marks futures the main thread already cancelled) is not printed; any other thread
    error, and any other error of that thread, still reaches ``threading.excepthook``."""
    import threading
    from concurrent.futures import InvalidStateError

    from simulator.search.executor import _quiet_manager
    seen: list[tuple[str, type]] = []
    before = threading.excepthook
    threading.excepthook = lambda a: seen.append((a.thread.name, a.exc_type))
    try:
        def boom(exc):
            def run():
                raise exc
            return run
        manager = threading.Thread(target=boom(InvalidStateError("CANCELLED")), name="manager")
        with _quiet_manager(manager):
            manager.start()
            manager.join()
            other = threading.Thread(target=boom(InvalidStateError("x")), name="other")
            other.start()
            other.join()
            again = threading.Thread(target=boom(ValueError("y")), name="manager")
            with _quiet_manager(again):
                again.start()
                again.join()
        assert seen == [("other", InvalidStateError), ("manager", ValueError)]
    finally:
        threading.excepthook = before


def test_sigterm_is_held_while_a_pool_forks_and_delivered_after():
    """``_sigterm_held`` (around ``submit`` / ``map``, which fork the workers): a SIGTERM
    arriving inside is pending, not handled, so no handler runs inside an at-fork hook;
    it is handled the moment the block ends. The signal is sent to this thread (in the
    CLI the main thread is the only one without the block when the pool forks; here
    other tests may have left threads that would take a process-directed signal)."""
    import threading

    from simulator.search.executor import _sigterm_held
    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("no pthread_sigmask on this platform")
    seen: list[str] = []
    before = signal.signal(signal.SIGTERM, lambda *_: seen.append("handled"))
    try:
        with _sigterm_held():
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            time.sleep(0.05)
            assert signal.SIGTERM in signal.sigpending()
            seen.append("inside")
        time.sleep(0.05)
        assert seen == ["inside", "handled"]
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_that_broke_library_code_is_still_a_stop(tmp_path, monkeypatch, capsys):
    """A SIGTERM handled inside library code can break it with another error (seen once:
    ``RuntimeError: release unlocked lock`` from a ``Condition.wait``); with the stop
    recorded, the command reports it as terminated (143, one line), not as an internal
    error (exit 1)."""
    from simulator.cli import main as cli_main
    runs = _tiny_runs(tmp_path, 1)

    def broken_by_signal(row, *a):
        try:
            cli_main._raise_terminated(signal.SIGTERM, None)
        except BaseException:
            pass
        raise RuntimeError("release unlocked lock")

    monkeypatch.setattr(commands, "predict_row", broken_by_signal)
    assert main(["predict", "--runs", str(runs), "--quiet"]) == 143
    assert capsys.readouterr().err.strip().splitlines() == ["complexity predict: terminated"]


def test_stopping_a_pool_mid_result_does_not_leave_its_manager_waiting():
    """A worker killed while it sends a result leaves half a message in the result pipe;
    the manager thread must not wait for the rest (the interpreter's exit joins it):
    ``stop_pool`` closes this process's write end once the workers are reaped."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from simulator.search.executor import stop_pool
    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("fork"))
    pool.submit(_big_result, 256 << 20)
    manager = pool._executor_manager_thread
    reader = pool._result_queue._reader
    t0 = time.time()
    while not reader.poll(0) and time.time() - t0 < 30:      # the send has begun
        time.sleep(0.0005)
    stop_pool(pool)
    manager.join(timeout=10)
    assert not manager.is_alive()


def _big_result(n: int) -> bytes:
    return b"x" * n
