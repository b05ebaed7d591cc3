"""Every long command shows progress on a terminal, and none with ``--json`` (issue 17).

Each command runs as a real process with stdout and stderr on a pseudo-terminal (``pty``)
of 100 columns, on inputs small enough to finish in seconds; the bars (``tqdm``) are
recognised by their labels and ``|`` meters. ``calibrate`` and ``validate-run`` run real
microbenchmarks and training steps: they are in the slow set.
"""
from __future__ import annotations

import csv
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pytest.importorskip("tqdm")

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RUNS = REPO / "validation" / "published_runs.csv"
SMALL = ["--model", "small-6l-512", "--gpu", "h100-sxm"]


def run_on_pty(args: list[str], timeout: float = 240) -> tuple[int, str]:
    """Run ``complexity ARGS`` with a terminal as stdout and stderr; (status, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli.main", *args], stdin=slave,
                            stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True)
    os.close(slave)
    chunks, t0 = [], time.time()
    while time.time() - t0 < timeout:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:                  # the terminal closed: the process is done
                data = b""
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None and not ready:
            break
    else:
        proc.kill()
    os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def _tiny_runs(tmp_path: Path) -> Path:
    with RUNS.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = tmp_path / "runs.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows([r for r in rows if r["id"].startswith("megatron_sc21_0")][:2])
    return out


BAR = re.compile(r"\d+%\|")        # tqdm's meter: "  40%|████      |"


def _commands(tmp: Path) -> dict[str, tuple[list[str], str]]:
    runs = str(_tiny_runs(tmp))
    return {
        "predict": (["predict", "--runs", runs, "--out", str(tmp / "p.csv")], "predict: rows"),
        "report": (["report", "--runs", runs, "--out-dir", str(tmp / "rep")], "predict: rows"),
        "search": (["search", *SMALL, "--gpus", "8", "--global-batch", "64", "--top", "2"],
                   "search: rank"),
        "plan": (["plan", *SMALL, "--gpus", "8", "--tokens", "1B", "--global-batch", "64"],
                 "search: enumerate"),
        "compare": (["compare", "--model", "small-6l-512", "--tokens", "1B", "--gpu-list",
                     "h100-sxm,a100-sxm-80gb", "--gpus-list", "8", "--global-batch", "64"],
                    "compare: hardware choices"),
        "scaling": (["scaling", *SMALL, "--gpus", "8,16", "--global-batch", "64",
                     "--kind", "strong"], "scaling (strong): GPU counts"),
    }


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pty")


@pytest.mark.parametrize("name", ["predict", "report", "search", "plan", "compare", "scaling"])
def test_progress_on_a_terminal(name, tmp_dir):
    args, label = _commands(tmp_dir)[name]
    rc, out = run_on_pty(args)
    assert rc == 0, out[-2000:]
    assert label in out and BAR.search(out), out[-2000:]


@pytest.mark.parametrize("name", ["search", "plan", "compare", "scaling"])
def test_no_progress_in_json(name, tmp_dir):
    args, label = _commands(tmp_dir)[name]
    rc, out = run_on_pty(args + ["--json"])
    assert rc == 0, out[-2000:]
    assert label not in out and not BAR.search(out) and "\r\x1b" not in out
    json.loads(out.replace("\r\n", "\n"))            # the terminal saw nothing but the JSON


def test_quiet_means_no_bars(tmp_dir):
    args, label = _commands(tmp_dir)["search"]
    rc, out = run_on_pty(args + ["--quiet"])
    assert rc == 0 and label not in out and not BAR.search(out)


@pytest.mark.slow
@pytest.mark.torch
def test_calibrate_and_validate_run_on_a_terminal(tmp_dir):
    pytest.importorskip("torch")
    cal = tmp_dir / "calib"
    rc, out = run_on_pty(["calibrate", "--quick", "--out", str(cal)], timeout=600)
    assert rc == 0, out[-2000:]
    assert "calibrate: benchmarks" in out and "calibrate: gemm" in out and BAR.search(out)
    rc, out = run_on_pty(["validate-run", "--model", "small-4l-256", "--profile",
                          str(cal / "profile.json"), "--seq-len", "64", "--steps", "3",
                          "--warmup", "1", "--wait-quiet", "0"], timeout=600)
    assert rc == 0, out[-2000:]
    assert "validate-run: warm-up and timed steps" in out and BAR.search(out)
