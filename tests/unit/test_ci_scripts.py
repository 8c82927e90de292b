""".ci/run reports a missing Python 3.12 (the Megatron-LM tier's prerequisite) in its first seconds,
with what to install, before it installs or tests anything; never after the suite."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "megatron-venv.sh"


def run(*args: str, python: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, MEGATRON_BASE_PYTHON=python)
    start = time.monotonic()
    out = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    return out, time.monotonic() - start


def test_check_names_what_to_install_when_no_python_312(tmp_path):
    fake = tmp_path / "python3.12"  # a "Python" that is not one: every probe fails
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    out, seconds = run("--check", python=str(fake))
    assert out.returncode == 3, out.stderr
    assert "no Python >= 3.12" in out.stderr and "HINT: install one" in out.stderr
    assert "pyenv install 3.12" in out.stderr and "MEGATRON_BASE_PYTHON" in out.stderr
    assert seconds < 10


def test_start_fails_at_once_and_starts_no_build(tmp_path):
    venv = tmp_path / "venv"
    out, seconds = run("--start", str(venv), python="/nonexistent/python3.12")
    assert out.returncode == 3 and "no Python >= 3.12" in out.stderr
    assert seconds < 10
    assert not list(tmp_path.iterdir())  # no venv, log or pid file: nothing was started


def test_ci_run_checks_before_it_installs_anything():
    """The first command of .ci/run is the check-and-start; `set -e` stops the run there."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "step ", "export ",
                                                                          "START=", "cd "))]
    assert commands[0] == "set -euo pipefail"
    first_work = next(i for i, c in enumerate(commands) if re.search(r"\bpip\b|venv|pytest", c))
    assert commands[first_work] == "bash .ci/megatron-venv.sh --start"
