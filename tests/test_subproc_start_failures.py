"""A SubprocVectorEnv child that dies while starting says why.

Each case runs a real script in a real interpreter: ``spawn`` re-imports the
script's main module in every child, which is where these failures happen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import rlfleet

ROOT = str(Path(rlfleet.__file__).resolve().parent.parent)


def run_script(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    environment = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        cwd=tmp_path,
        check=False,
    )


def test_a_script_without_main_guard_is_told_to_add_it(tmp_path: Path) -> None:
    result = run_script(
        tmp_path,
        """
        import gymnasium as gym
        from rlfleet.envs import SubprocVectorEnv

        venv = SubprocVectorEnv([lambda: gym.make("CartPole-v1")])
        venv.close()
        """,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rlfleet.errors.VectorEnvError: env 0: its process died while starting")
    assert "the script has no main guard" in last
    assert 'if __name__ == "__main__":' in last and "train.py" in last


def test_a_main_module_that_raises_in_the_child_sends_its_exception_back(
    tmp_path: Path,
) -> None:
    result = run_script(
        tmp_path,
        """
        import gymnasium as gym
        from rlfleet.envs import SubprocVectorEnv

        if __name__ != "__main__":
            raise KeyError("settings.yaml is missing in the child")

        if __name__ == "__main__":
            try:
                SubprocVectorEnv([lambda: gym.make("CartPole-v1")])
            except Exception as exc:
                print("PARENT:", exc)
        """,
    )
    assert "PARENT: env 0: its process died while starting" in result.stdout
    assert "raised KeyError: 'settings.yaml is missing in the child'" in result.stdout
    assert "--- traceback in the child ---" in result.stdout
