"""The command line answers --version and --help."""

from __future__ import annotations

import subprocess
import sys

import rlfleet


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    result = _run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"rlfleet {rlfleet.__version__}"


def test_help_lists_commands() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: rlfleet" in result.stdout


def test_no_command_prints_help_and_fails() -> None:
    result = _run()
    assert result.returncode == 2
    assert "usage: rlfleet" in result.stdout
