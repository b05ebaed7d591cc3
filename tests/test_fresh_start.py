"""The README's two commands are what CI runs, in a fresh virtual environment."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _first_command_under(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"README section {heading!r} has no bash block"
    return block.group(1).strip()


def test_ci_runs_the_readme_install_and_test_commands_in_a_fresh_venv():
    ci = (ROOT / ".ci" / "run").read_text()
    install = _first_command_under("Install (one command)")
    test = _first_command_under("Test (one command)")
    assert install.startswith("python -m pip install") and test.startswith("python -m pytest")
    lines = [ln.strip() for ln in ci.splitlines()]
    assert test in lines, "CI must run exactly the README's test command"
    assert any(ln.replace(" --quiet", "") == install for ln in lines), \
        "CI must run the README's install command"
    venv = next(i for i, ln in enumerate(lines) if "-m venv" in ln)
    activate = next(i for i, ln in enumerate(lines) if ln.startswith("source") and "activate" in ln)
    first_install = next(i for i, ln in enumerate(lines) if ln.startswith("python -m pip install"))
    assert venv < activate < first_install < lines.index(test)
    assert "mktemp -d" in ci
