"""The README's commands and example are the ones that work."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests import node_support

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    command = (
        'pip install torch==2.13.0 && pip install -e ".[test]" && '
        "(cd clients/node && npm ci --no-audit --no-fund) && python -m pytest"
    )
    assert command in README
    assert command in (ROOT / ".ci" / "run").read_text()


def test_every_group_the_default_run_leaves_out_has_a_ci_step_and_a_readme_line() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    match = re.search(r'-m "([^"]+)"', config["addopts"])
    assert match, "pyproject's addopts no longer deselects any group"
    left_out = re.findall(r"not (\w+)", match.group(1))
    assert sorted(left_out) == ["docker", "netns", "soak", "soak_long"]
    ci = (ROOT / ".ci" / "run").read_text()
    declared = {line.split(":")[0] for line in config["markers"]}
    for group in left_out:
        assert group in declared
        # Serially: each group's few tests take the machine (.ci/run says why).
        step = f"python -m pytest -m {group} -n 0"
        assert re.search(rf"^{step}$", ci, re.M), f".ci/run has no step {step!r}"
        assert step in README, f"README.md does not say how to run {group}"


def test_node_tests_fail_under_ci_true_instead_of_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_support, "NODE", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but node is not installed"):
        node_support.require_node()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match=r"\(set CI=true to make this a failure\)"):
        node_support.require_node()


def test_every_node_test_asks_the_one_helper() -> None:
    # A test finding node on its own would skip under CI=true too.
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name not in ("node_support.py", "test_readme.py"):
            assert 'which("node")' not in path.read_text(), f"{path}: use tests/node_support.py"


def test_quick_start_runs_the_demo() -> None:
    assert 'pip install -e ".[plot]" && rlfleet demo' in README


def test_python_example_runs(capsys) -> None:
    match = re.search(r"```python\n(.*?)```", README, re.S)
    assert match, "README.md has no python example"
    code = match.group(1).replace("range(30)", "range(1)")
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed[0] == "0" and float(printed[1]) > 0


def test_coming_from_garage_example_runs(capsys, tmp_path, monkeypatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    code = next(block for block in blocks if "Trainer" in block)
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace("n_epochs=20", "n_epochs=1"), "README.md", "exec"), {})
    assert float(capsys.readouterr().out.split()[-1]) > 0
    assert (tmp_path / "runs" / "vpg" / "itr_0" / "snapshot.json").exists()
