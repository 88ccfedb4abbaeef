"""``rlfleet sample`` and ``rlfleet status`` against a local fleet of worker processes."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet import load_batch
from rlfleet.cli import main
from rlfleet.client import Fleet, RemoteSampler
from rlfleet.core.batch_file import FILE_FORMAT
from rlfleet.envs import EnvConfig
from rlfleet.errors import EnvError, PolicyError
from rlfleet.sampling.local import LocalSampler
from tests.test_fleet_equivalence import assert_same_batch
from tests.waiting import PATIENCE, wait_until

pytestmark = pytest.mark.timeout(120)

CARTPOLE = EnvConfig("CartPole-v1")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(2, 2, CARTPOLE)
    try:
        yield fleet
    finally:
        fleet.close()


def test_sample_writes_the_batch_local_sampler_would_give(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "batch.npz"
    command = [sys.executable, "-m", "rlfleet", "--log-level", "WARNING", "sample"]
    command += ["--coordinator", fleet.address, "--steps", "300", "--seed", "6", "--out", str(out)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    # stderr is a pipe, not a terminal: progress comes as plain lines, no bar.
    assert re.search(r"^sample: [\d,]+/300 steps \(\d+%\), ", done.stderr, re.M), done.stderr
    assert "\r" not in done.stderr
    batch = load_batch(out)
    assert done.stdout.strip() == (
        f"wrote {batch.n_episodes} episodes ({batch.total_steps} steps) to {out}"
    )
    with LocalSampler(CARTPOLE, n_workers=2, envs_per_worker=2, seed=6) as local:
        assert_same_batch(
            local.obtain_samples(0, 300),
            batch,
            {w.worker_id for w in fleet.sampler.status().workers},
        )


def test_the_file_layout_is_flat_numpy_arrays(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "episodes.npz"
    code = main(
        ["sample", "--coordinator", fleet.address, "--mode", "episodes", "--episodes", "4",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    with np.load(out, allow_pickle=False) as data:
        assert str(data["format"]) == FILE_FORMAT
        assert data["lengths"].shape == (4,)
        assert data["episode_infos.episode_index"].tolist() == [0, 1, 2, 3]
        assert data["observations"].shape == (int(data["lengths"].sum()), 4)
        spec = json.loads(str(data["env_spec"]))
        dtypes = {key: data[key].dtype.name for key in data.files}
    # Readable JSON: gymnasium's names, numbers as numbers, infinities as text.
    assert spec["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
    box = spec["observation_space"]
    assert (box["type"], box["shape"], box["dtype"]) == ("Box", [4], "float32")
    assert box["high"][0] == pytest.approx(4.8) and box["high"][1] == "inf"
    assert spec["max_episode_length"] == 500
    assert load_batch(out).env_spec == CARTPOLE.env_spec()
    # docs/operations.md's table of dtypes is what the file holds.
    documented = documented_dtypes()
    spaces = {"observation space": "float32", "action space": "int64"}  # CartPole's
    for key, dtype in dtypes.items():
        group = key.split(".")[0]
        if key in ("env_spec", "format") or group == "env_infos":
            continue  # text; env_infos are as the env gives them
        assert spaces.get(documented[group], documented[group]) == dtype, key


def documented_dtypes() -> dict[str, str]:
    """The ``| key | dtype |`` rows of docs/operations.md's batch file table."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Batch files", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return {key.strip().strip("`"): dtype.strip().strip("`") for key, dtype in rows}


def test_agent_infos_of_the_policy_are_in_the_file(tmp_path: Path) -> None:
    from rlfleet.policies import MLPCategoricalPolicy

    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(4,), seed=0)
    own = Fleet.local(1, 1, CARTPOLE)
    with own as sampler:
        sampler.update_agent(policy)
        out = tmp_path / "mlp.npz"
        assert main(["sample", "--coordinator", own.address, "--mode", "episodes",
                     "--episodes", "2", "--out", str(out)]) == 0  # fmt: skip
    with np.load(out, allow_pickle=False) as data:
        assert data["agent_infos.log_prob"].shape == data["rewards"].shape
        assert data["agent_infos.logits"].shape == (len(data["rewards"]), 2)
    assert set(load_batch(out).agent_infos) == {"log_prob", "logits"}


def test_sample_fragments(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "fragments.npz"
    code = main(
        ["sample", "--coordinator", fleet.address, "--mode", "fragments", "--steps", "40",
         "--fragment-length", "5", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    batch = load_batch(out)
    assert batch.total_steps == 40  # 2 rounds of 4 streams x 5 steps
    assert batch.lengths.max() <= 5
    assert set(batch.episode_infos["stream"].tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "episodes"], "--mode episodes needs --episodes N"),
        (["--mode", "fragments", "--steps", "10"], "--mode fragments needs --fragment-length T"),
        ([], "--mode steps needs --steps N"),
    ],
)
def test_sample_says_which_flag_is_missing(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = str(tmp_path / "x.npz")
    assert main(["sample", "--coordinator", fleet.address, "--out", out, *args]) == 2
    assert message in capsys.readouterr().err
    assert not Path(out).exists()


def run_sample(address: str, out: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rlfleet", "--log-level", "WARNING", "sample"]
    command += ["--coordinator", address, "--steps", "50", "--seed", "2", "--out", out]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def test_sample_creates_the_missing_folders_of_its_out_file(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "deeper" / "b.npz"
    done = run_sample(fleet.address, str(out), tmp_path)
    assert done.returncode == 0, done.stderr
    assert load_batch(out).total_steps >= 50


def test_an_out_that_cannot_be_a_file_is_refused_before_sampling(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sample", "--coordinator", fleet.address, "--steps", "10", "--out", "."]) == 2
    assert "--out .: is a folder" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = str(blocker / "b.npz")
    assert main(["sample", "--coordinator", fleet.address, "--steps", "10", "--out", out]) == 2
    assert f"--out {out}: cannot create its folder {blocker}" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a full disk)")
def test_a_write_failing_after_sampling_saves_the_batch_to_a_fallback_file(
    fleet: Fleet, tmp_path: Path
) -> None:
    # /dev/full passes every check (it exists and may be written) and then
    # fails the write as a full disk does: the collected batch must survive.
    done = run_sample(fleet.address, "/dev/full", tmp_path)
    assert done.returncode == 1, done.stderr
    saved = list(tmp_path.glob("rlfleet-sample-*.npz"))
    assert len(saved) == 1, (done.stdout, done.stderr)
    assert "writing /dev/full failed after sampling" in done.stderr, done.stderr
    assert f"the batch was saved to {saved[0]} instead" in done.stderr, done.stderr
    batch = load_batch(saved[0])
    assert batch.total_steps >= 50
    assert str(saved[0]) in done.stdout


def test_an_unknown_env_id_is_one_line_and_leaves_no_error_after_the_rollback(
    tmp_path: Path,
) -> None:
    with Fleet.local(2, 1, CARTPOLE) as sampler:
        unknown_env_checks(sampler, tmp_path)


def unknown_env_checks(sampler: RemoteSampler, tmp_path: Path) -> None:
    out = str(tmp_path / "b.npz")
    sample = ["sample", "--coordinator", sampler.address, "--env", "Nope-v9", "--steps", "10"]
    sample += ["--out", out]
    done = subprocess.run(
        [sys.executable, "-m", "rlfleet", *sample],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if not line.startswith("sample: ")]
    assert len(errors) == 1, done.stderr  # no remote traceback after the message
    assert errors[0].startswith("rlfleet: error: no gymnasium env is registered under id 'Nope-v9'")
    assert "--log-level DEBUG" in errors[0]
    # The fleet rolled back to CartPole: nothing is wrong with any worker now.
    status = sampler.status()
    assert status.env is not None and status.env.id == "CartPole-v1"
    assert [w.last_error for w in status.workers] == [None, None]
    # Likewise after a refused agent update.
    with pytest.raises(PolicyError):
        sampler.update_agent({"no_such_layer": np.zeros(3, np.float32)})
    assert [w.last_error for w in sampler.status().workers] == [None, None]
    # With --log-level DEBUG the remote traceback is there.
    debug = subprocess.run(
        [sys.executable, "-m", "rlfleet", "--log-level", "DEBUG", *sample],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "--- remote traceback ---" in debug.stderr, debug.stderr


def test_status_prints_a_row_per_worker_and_totals(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--coordinator", fleet.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "HOST",
        "PID",
        "ENVS",
        "STATE",
        "STEPS/S",
        "AGENT",
        "HEARTBEAT",
    ]
    rows = sorted(line.split() for line in lines[1:3])
    pids = sorted(str(w.process.pid) for w in fleet.workers)
    assert [row[0] for row in rows] == ["local-0", "local-1"]
    assert sorted(row[2] for row in rows) == pids
    assert all(row[1] == socket.gethostname() and row[3] == "2" for row in rows)
    assert lines[3].startswith("fleet: 2 workers (2 ready), 4 envs, ")
    assert lines[3].endswith("env CartPole-v1 (generation 1)")


def test_status_of_an_absent_coordinator_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["status", "--coordinator", f"127.0.0.1:{port}", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"rlfleet: error: no coordinator answers at 127.0.0.1:{port} (")
    assert "UNAVAILABLE" in err and "--coordinator (or RLFLEET_COORDINATOR)" in err
    assert "obtain_" not in err  # advice for the command line, not the Python API


def test_status_json_has_every_worker_and_the_totals(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--coordinator", fleet.address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(w["name"] for w in data["workers"]) == ["local-0", "local-1"]
    assert all(w["agent_lag"] == 0 and w["envs"] == 2 for w in data["workers"])
    assert data["total_envs"] == 4 and data["ready_workers"] == 2
    assert data["env"]["id"] == "CartPole-v1"
    assert data["env_spec"]["action_space"] == {"type": "Discrete", "n": 2, "start": 0}


def test_status_watch_keeps_every_column_readable_at_80_columns_with_an_error() -> None:
    from rich.console import Console

    from rlfleet.cli.status import _view

    off_space = EnvConfig("rlfleet/OffSpace-v0", imports=("rlfleet.envs.testing",))
    with Fleet.local(1, 1, off_space, timeout=60) as sampler:
        with pytest.raises(EnvError):  # leaves the worker with a long last error
            sampler.obtain_episodes(1)
        views = {}
        for width in (80, 160):
            out = io.StringIO()
            Console(file=out, width=width).print(_view(sampler, "here", width))
            views[width] = out.getvalue().splitlines()
    headers = ["NAME", "STATE", "ENVS", "STEPS/S", "STEPS", "UNITS", "LAG", "HEARTBEAT"]
    for width, lines in views.items():
        assert all(len(line) <= width for line in lines), "\n".join(lines)
        header = next(line for line in lines if "NAME" in line)
        assert header.replace("┃", " ").split()[:8] == headers, "\n".join(lines)
        row = next(line for line in lines if "local-0 " in line)
        assert row.replace("│", " ").split()[:3] == ["local-0", "idle", "1"], "\n".join(lines)
    # 80 columns: the error goes under the table, cut to the width.
    note = views[80][-1]
    assert note.startswith("local-0: env 'rlfleet/OffSpace-v0' left its observation space")
    assert note.endswith("…") and len(note) == 80
    # 160 columns: the error has a column of its own, cut with an ellipsis.
    assert "LAST ERROR" in next(line for line in views[160] if "NAME" in line)
    row = next(line for line in views[160] if "local-0 " in line)
    assert "│ env 'rlfleet/OffSpace-v0' left" in row


@pytest.mark.parametrize("as_json", [True, False])
def test_status_watch_refreshes_until_interrupted(
    fleet: Fleet, as_json: bool, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "rlfleet", "status", "--coordinator", fleet.address,
               "--watch", "0.2", *(["--json"] if as_json else [])]  # fmt: skip
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    title = f"rlfleet {fleet.address}"  # one per table

    def refreshed() -> bool:
        text = out.read_text()
        if as_json:
            return text.count("\n") >= 3
        return text.count(title) >= 2 and text.endswith("\n")

    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            command, stdout=stdout, stderr=stderr, cwd=ROOT, start_new_session=True
        )
    try:
        wait_until(refreshed, "two refreshes", describe=lambda: out.read_text() + err.read_text())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=PATIENCE) == 0, err.read_text()
    finally:
        # A failed wait must not leave the watcher running.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=PATIENCE)
    text = out.read_text()
    if as_json:
        # Whole lines only: SIGINT may have cut the last one.
        polls = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
        assert all(len(p["workers"]) == 2 for p in polls)
        assert polls[0]["time"] < polls[-1]["time"]
    else:
        assert "UNITS" in text and "LAG" in text and "local-0" in text
        assert text.count(title) >= 2  # refreshed, one table each


def test_sample_with_env_switches_the_fleet(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "pendulum.npz"
    try:
        code = main(
            ["sample", "--coordinator", fleet.address, "--env", "Pendulum-v1", "--steps", "10",
             "--out", str(out)]
        )  # fmt: skip
        assert code == 0
        batch = load_batch(out)
        assert isinstance(batch.env_spec.action_space, gym.spaces.Box)
        assert batch.lengths.tolist() == [200]  # Pendulum's registered limit
    finally:
        with RemoteSampler(fleet.address) as sampler:
            sampler.update_env("CartPole-v1")


def test_sample_with_the_env_the_fleet_runs_rebuilds_nothing(fleet: Fleet, tmp_path: Path) -> None:
    before = fleet.sampler.status().env_generation
    out = tmp_path / "same.npz"
    code = main(
        ["sample", "--coordinator", fleet.address, "--env", "CartPole-v1", "--steps", "10",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    assert fleet.sampler.status().env_generation == before
    with RemoteSampler(fleet.address) as sampler:
        # Same kwargs written differently: still the same env.
        assert sampler.update_env(EnvConfig("CartPole-v1", {})) == before
        # Different kwargs: a new generation, and back.
        changed = sampler.update_env(EnvConfig("CartPole-v1", {"sutton_barto_reward": True}))
        assert changed == before + 1
        assert sampler.update_env("CartPole-v1") == before + 2


def test_progress_off_a_terminal_is_a_line_every_interval() -> None:
    from rlfleet.cli._progress import LINE_SECONDS, Progress

    now = [0.0]
    out = io.StringIO()  # not a TTY
    with Progress("sample", 1000, "steps", stream=out, clock=lambda: now[0]) as progress:
        progress.update(100)  # too soon for a line
        now[0] = LINE_SECONDS
        progress.update(400)
        now[0] = LINE_SECONDS + 1
        progress.update(600)  # too soon again
        now[0] = 2 * LINE_SECONDS
        progress.update(1000)
    assert out.getvalue().splitlines() == [
        "sample: 400/1,000 steps (40%), 40 steps/s, 10.0 s",
        "sample: 1,000/1,000 steps (100%), 50 steps/s, 20.0 s",  # not repeated at the end
    ]
