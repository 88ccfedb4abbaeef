"""What deploy/kubernetes relies on, tested on real coordinator and worker processes.

The manifests assume: a plaintext health port on both roles (gRPC probes),
a worker that reports NOT_SERVING while its coordinator is gone and rejoins
a replacement (Recreate upgrades), configuration from environment variables
(ConfigMap keys, the pod name), addresses given as DNS names (the Service),
and a fleet that takes workers joining and leaving mid-run (scaling, the
HPA, node drains) without losing or duplicating an episode.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from rlfleet.cli import build_parser
from rlfleet.cli import health as health_cli
from rlfleet.cli._health_port import LIVENESS_SERVICE, HealthPort, ProbedHealthServicer
from rlfleet.client import RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.errors import ConfigError
from tests.fleet_processes import free_port
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
LEARNER_SERVICE = "rlfleet.v1.LearnerService"

pytestmark = pytest.mark.timeout(180)


@dataclass
class Process:
    """A real rlfleet process in its own process group."""

    popen: subprocess.Popen[bytes]
    log: Path
    health: str = ""
    port: int = 0

    def output(self) -> str:
        return f"--- {self.log.name} ---\n{self.log.read_text(errors='replace')[-4000:]}"

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, as Kubernetes and `docker stop` send; returns the exit code."""
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)


@dataclass
class Fleet:
    """Starts processes for one test and kills whatever is left afterwards."""

    tmp: Path
    processes: list[Process] = field(default_factory=list)

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Process:
        # Only the variables a test sets: none leaks in from the caller.
        base = {k: v for k, v in os.environ.items() if not k.startswith("RLFLEET_")}
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "rlfleet", "--log-level=INFO", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**base, "PYTHONPATH": str(REPO), **(env or {})},
                start_new_session=True,
            )
        process = Process(popen, log)
        self.processes.append(process)
        return process

    def coordinator(self, name: str = "coordinator", port: int = 0) -> Process:
        port_file = self.tmp / f"{name}.port"
        health = f"127.0.0.1:{free_port()}"
        process = self.spawn(
            name,
            "coordinator",
            f"--listen=127.0.0.1:{port}",
            f"--port-file={port_file}",
            f"--health-listen={health}",
            "--heartbeat-timeout=5",
        )

        def written() -> bool:
            assert process.popen.poll() is None, process.output()
            return port_file.exists()

        wait_until(written, "the port file", describe=process.output)
        process.port, process.health = int(port_file.read_text()), health
        return process

    def worker(
        self, name: str, coordinator: str, *flags: str, env: dict[str, str] | None = None
    ) -> Process:
        health = f"127.0.0.1:{free_port()}"
        process = self.spawn(
            name,
            "worker",
            f"--coordinator={coordinator}",
            f"--health-listen={health}",
            "--reconnect-max-seconds=1",
            *flags,
            env={"RLFLEET_WORKER_NAME": name, "RLFLEET_ENVS_PER_WORKER": "2", **(env or {})},
        )
        process.health = health
        return process

    def logs(self) -> str:
        return "\n".join(p.output() for p in self.processes)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    started = Fleet(tmp_path)
    try:
        yield started
    finally:
        for process in started.processes:
            if process.popen.poll() is None:
                os.killpg(process.popen.pid, signal.SIGKILL)
            process.popen.wait(30)


def ready_workers(address: str) -> dict[str, int]:
    """Ready workers' names and env counts; empty while the coordinator is unreachable."""
    try:
        with RemoteSampler(address, timeout=5) as sampler:
            return {w.name: w.envs for w in sampler.status().workers if w.ready}
    except Exception:
        return {}


def health_command(*args: str) -> tuple[int, str]:
    """Runs ``rlfleet health`` as the image's HEALTHCHECK does; returns (exit code, output)."""
    parser = argparse.ArgumentParser(prog="rlfleet")
    health_cli.register(parser.add_subparsers())
    parsed = parser.parse_args(["health", *args])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = health_cli.run(parsed)
    return code, out.getvalue()


# --- health ports -------------------------------------------------------------


def test_health_ports_follow_the_fleet_through_a_coordinator_replacement(fleet: Fleet) -> None:
    coordinator = fleet.coordinator()
    address = f"127.0.0.1:{coordinator.port}"
    # The coordinator's port answers for the server and the readiness probe's service.
    assert health_cli.check(coordinator.health) == "SERVING"
    assert health_cli.check(coordinator.health, LEARNER_SERVICE) == "SERVING"
    assert health_command("--address", coordinator.health, "--service", LEARNER_SERVICE)[0] == 0

    worker = fleet.worker("w1", address)
    wait_until(
        lambda: health_cli.check(worker.health) == "SERVING", "worker SERVING", describe=fleet.logs
    )

    # The coordinator goes (a Recreate upgrade): the worker says NOT_SERVING
    # and keeps running, reconnecting.
    assert coordinator.terminate() == 0, coordinator.output()
    wait_until(
        lambda: health_cli.check(worker.health) == "NOT_SERVING",
        "worker NOT_SERVING",
        describe=fleet.logs,
    )
    code, out = health_command("--address", worker.health)
    assert (code, out.split()[-1]) == (1, "NOT_SERVING")
    assert worker.popen.poll() is None, worker.output()
    # Alive all the same: the liveness probe must not restart it.
    assert health_cli.check(worker.health, LIVENESS_SERVICE) == "SERVING"

    # Its replacement on the same address gets the worker back.
    fleet.coordinator("coordinator-2", port=coordinator.port)
    wait_until(
        lambda: health_cli.check(worker.health) == "SERVING", "worker rejoined", describe=fleet.logs
    )
    assert ready_workers(address) == {"w1": 2}
    assert health_command("--address", worker.health)[0] == 0
    assert health_cli.check(worker.health, LIVENESS_SERVICE) == "SERVING"


def test_probed_health_reports_each_service_from_its_probe() -> None:
    """The worker's health port: "" and "liveness" follow their own probes."""
    state = {"joined": True, "alive": True}

    def broken() -> bool:
        raise RuntimeError("probe bug")

    servicer = ProbedHealthServicer(
        lambda: state["joined"], {LIVENESS_SERVICE: lambda: state["alive"], "broken": broken}
    )
    port = HealthPort("127.0.0.1:0", servicer)
    address = f"127.0.0.1:{port.port}"
    try:
        assert health_cli.check(address) == "SERVING"
        assert health_cli.check(address, LIVENESS_SERVICE) == "SERVING"
        assert health_cli.check(address, "broken") == "NOT_SERVING"
        assert health_cli.check(address, "unknown") == "NOT_FOUND"
        state["joined"] = False  # seen at the next Check, not a second later
        assert health_cli.check(address) == "NOT_SERVING"
        assert health_cli.check(address, LIVENESS_SERVICE) == "SERVING"
        state["alive"] = False
        assert health_cli.check(address, LIVENESS_SERVICE) == "NOT_SERVING"
    finally:
        port.stop()


def test_health_port_refuses_a_taken_port() -> None:
    first = HealthPort("127.0.0.1:0", ProbedHealthServicer(lambda: True))
    try:
        with pytest.raises(ConfigError, match="pick another --health-listen port"):
            HealthPort(f"127.0.0.1:{first.port}", ProbedHealthServicer(lambda: True))
        with pytest.raises(ConfigError, match="HOST:PORT"):
            HealthPort("50052", ProbedHealthServicer(lambda: True))
    finally:
        first.stop()


def test_health_command_fails_when_nothing_answers() -> None:
    code, out = health_command("--address", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert code == 1
    assert "UNAVAILABLE" in out or "DEADLINE_EXCEEDED" in out


def test_health_command_reads_the_listen_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's HEALTHCHECK passes no address: RLFLEET_HEALTH_LISTEN is the default."""
    monkeypatch.setenv("RLFLEET_HEALTH_LISTEN", "0.0.0.0:50052")
    args = build_parser().parse_args(["health"])
    assert health_cli.dial_address(args.address) == "127.0.0.1:50052"
    assert health_cli.dial_address("[::]:7") == "127.0.0.1:7"
    assert health_cli.dial_address("10.1.2.3:7") == "10.1.2.3:7"
    with pytest.raises(ValueError, match="HOST:PORT"):
        health_cli.dial_address("50052")


# --- configuration from the environment ---------------------------------------


def test_worker_configured_like_a_pod_joins_through_a_dns_name(fleet: Fleet) -> None:
    """Name from the pod (RLFLEET_WORKER_NAME), settings from the ConfigMap, DNS address."""
    coordinator = fleet.coordinator()
    address = f"localhost:{coordinator.port}"
    pod = "rlfleet-worker-5f7b9c6d4-x2x4q"
    fleet.worker(
        pod,
        address,
        env={
            "RLFLEET_WORKER_NAME": pod,
            "RLFLEET_ENVS_PER_WORKER": "3",
            "RLFLEET_SEED": "5",
            "RLFLEET_DRAIN_GRACE": "45",
            "RLFLEET_HEARTBEAT_INTERVAL": "0.5",
        },
    )
    # A flag wins over its variable.
    fleet.worker("by-env", address, "--name=by-flag", "--envs=1")
    wait_until(lambda: len(ready_workers(address)) == 2, "two workers ready", describe=fleet.logs)
    assert ready_workers(address) == {pod: 3, "by-flag": 1}
    with RemoteSampler(address, timeout=60) as sampler:
        batch = sampler.obtain_episodes(5)
    np.testing.assert_array_equal(batch.episode_infos["episode_index"], np.arange(5))


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFLEET_ENVS_PER_WORKER", "four")
    parser = build_parser()
    # An explicit flag overrides a bad variable: it is never parsed.
    assert parser.parse_args(["worker", "--coordinator=c:1", "--envs=2"]).envs == 2
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "worker", "--coordinator=c:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "RLFLEET_ENVS_PER_WORKER='four'" in result.stderr
    assert "fix or unset it" in result.stderr


def test_help_names_each_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "(default: 1; env RLFLEET_ENVS_PER_WORKER)" in result.stdout
    assert "env RLFLEET_WORKER_NAME)" in result.stdout


# --- scaling ------------------------------------------------------------------


@dataclass
class Sampling:
    """Requests of a fixed size, back to back, in a thread, until stopped."""

    address: str
    seed: int
    steps: int
    batches: list[EpisodeBatch] = field(default_factory=list)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            with RemoteSampler(self.address, seed=self.seed, timeout=120) as sampler:
                while not self.stop.is_set():
                    self.batches.append(sampler.obtain_samples(len(self.batches), self.steps))
        except BaseException as exc:
            self.error = exc

    def wait_for(self, count: int, fleet: Fleet, timeout: float = 60.0) -> None:
        wait_until(
            lambda: len(self.batches) >= count or self.error is not None,
            f"{count} batches",
            timeout=timeout,
            describe=fleet.logs,
        )
        assert self.error is None, f"sampling failed: {self.error!r}\n{fleet.logs()}"


def test_scaling_workers_up_and_down_mid_run_loses_no_episode(fleet: Fleet) -> None:
    coordinator = fleet.coordinator()
    address = f"127.0.0.1:{coordinator.port}"
    first = fleet.worker("w1", address, "--drain-grace=20")
    fleet.worker("w2", address)
    wait_until(lambda: len(ready_workers(address)) == 2, "two workers", describe=fleet.logs)

    sampling = Sampling(address, seed=3, steps=1000)
    thread = threading.Thread(target=sampling.run)
    thread.start()
    try:
        sampling.wait_for(2, fleet)
        # Scale up: a third worker joins while requests run.
        fleet.worker("w3", address)
        wait_until(lambda: "w3" in ready_workers(address), "w3 ready", describe=fleet.logs)
        with RemoteSampler(address) as sampler:
            (w3_id,) = [w.worker_id for w in sampler.status().workers if w.name == "w3"]
        joined_at = len(sampling.batches)
        sampling.wait_for(joined_at + 3, fleet)
        # Scale down: SIGTERM (a pod deleted) makes w1 finish and leave.
        assert first.terminate() == 0, first.output()
        left_at = len(sampling.batches)
        sampling.wait_for(left_at + 2, fleet)
    finally:
        sampling.stop.set()
        thread.join(150)
    assert sampling.error is None, f"{sampling.error!r}\n{fleet.logs()}"
    assert sorted(ready_workers(address)) == ["w2", "w3"]
    batches = sampling.batches
    worker_ids = set()
    for batch in batches:
        indices = batch.episode_infos["episode_index"]
        np.testing.assert_array_equal(indices, np.arange(batch.n_episodes))  # none lost or twice
        assert batch.lengths.sum() >= 1000
        worker_ids.update(batch.episode_infos["worker"].tolist())
    assert w3_id in worker_ids, "the added worker sampled"

    # The same requests on the final fleet give the same batches: nothing
    # was lost, duplicated or altered by workers joining and leaving.
    with RemoteSampler(address, seed=3, timeout=120) as sampler:
        for itr, batch in enumerate(batches):
            again = sampler.obtain_samples(itr, 1000)
            np.testing.assert_array_equal(again.lengths, batch.lengths)
            np.testing.assert_array_equal(again.observations, batch.observations)
            np.testing.assert_array_equal(again.actions, batch.actions)
            np.testing.assert_array_equal(
                again.episode_infos["env_seed"], batch.episode_infos["env_seed"]
            )
