"""End to end, with real processes: a TLS + token fleet, its refusals, and the pickle gate.

The coordinator and workers are ``python -m rlfleet`` processes configured
as docs/security.md says (mutual TLS, token files); the learner is the
client library. Tests share one secured fleet; the pickle tests start a
coordinator of their own with ``--allow-pickle``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteSampler, RemoteVectorEnv
from rlfleet.envs.testing import CounterEnv, DictObservationEnv, ObjectInfoEnv
from rlfleet.errors import (
    AuthenticationError,
    ConfigError,
    PermissionDeniedError,
    UnavailableError,
)
from rlfleet.policies import RandomPolicy
from rlfleet.security import ClientTLS, Token, secure_channel
from rlfleet.security.pickle import dumps
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import updates_pb2, worker_pb2
from tests._coordinator_fakes import PROCESS_ENV, rlfleet_process, stop_process, wait_for_file
from tests.tls_fixtures import make_ca, make_cert
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

WORKER_SECRET = "3c9f0d2e8b7a41f6a5d4c3b2e1f0a9b8"
LEARNER_SECRET = "7e6d5c4b3a2918f7e6d5c4b3a2918f7e"


@dataclass(frozen=True)
class Files:
    """The PKI and token files of a deployment, as docs/security.md makes them."""

    root: Path
    ca: Path
    server_cert: Path
    server_key: Path
    worker_cert: Path
    worker_key: Path
    learner_cert: Path
    learner_key: Path
    worker_token: Path
    learner_token: Path

    def coordinator_args(self) -> list[str]:
        return [
            "--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key),
            "--tls-client-ca", str(self.ca),
            "--worker-token-file", str(self.worker_token),
            "--learner-token-file", str(self.learner_token),
        ]  # fmt: skip

    def worker_args(self, token: Path | None = None) -> list[str]:
        return [
            "--tls-ca", str(self.ca), "--tls-cert", str(self.worker_cert),
            "--tls-key", str(self.worker_key), "--token-file", str(token or self.worker_token),
        ]  # fmt: skip

    def sampler(self, address: str, token: str | None = LEARNER_SECRET) -> RemoteSampler:
        return RemoteSampler(
            address,
            tls_ca=self.ca,
            tls_cert=self.learner_cert,
            tls_key=self.learner_key,
            token=token,
            timeout=60.0,
            wait_for_workers=30.0,
        )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("deployment")
    ca = make_ca()
    (root / "ca.crt").write_bytes(ca.cert_pem)
    server = make_cert(ca, "rlfleet-coordinator").write(root, "server")
    worker = make_cert(ca, "rlfleet-worker", client=True).write(root, "worker")
    learner = make_cert(ca, "rlfleet-learner", client=True).write(root, "learner")
    (root / "worker-token").write_text(WORKER_SECRET + "\n")
    (root / "learner-token").write_text(LEARNER_SECRET + "\n")
    return Files(
        root, root / "ca.crt", *server, *worker, *learner, root / "worker-token",
        root / "learner-token",
    )  # fmt: skip


class Processes:
    """rlfleet processes started by a test, stopped at its end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[subprocess.Popen[bytes]] = []

    def coordinator(self, *args: str) -> str:
        port_file = self.root / f"port-{len(self.started)}"
        process = self.start("coordinator", "--listen", "127.0.0.1:0", "--port-file",
                             str(port_file), *args)  # fmt: skip
        return f"127.0.0.1:{wait_for_file(port_file, process).strip()}"

    def worker(self, address: str, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self.start("worker", "--coordinator", address, "--name", name, "--envs", "2",
                          "--reconnect-max-seconds", "0.5", *args)  # fmt: skip

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = self.root / f"process-{len(self.started)}.log"
        process = rlfleet_process(*args, log=log)
        self.started.append(process)
        return process

    def log(self, process: subprocess.Popen[bytes]) -> str:
        return (self.root / f"process-{self.started.index(process)}.log").read_text()

    def stop_all(self) -> None:
        for process in reversed(self.started):
            stop_process(process)


@pytest.fixture(scope="module")
def fleet(files: Files) -> Iterator[str]:
    """A coordinator with mTLS and tokens, and one worker; yields its address."""
    processes = Processes(files.root)
    try:
        address = processes.coordinator(*files.coordinator_args())
        processes.worker(address, "secure-0", *files.worker_args())
        with files.sampler(address) as sampler:
            _wait_ready(sampler, 1)
        yield address
    finally:
        processes.stop_all()


def _wait_ready(sampler: RemoteSampler, workers: int, timeout: float = 60.0) -> None:
    wait_until(
        lambda: sampler.status().ready_workers >= workers,
        f"{workers} ready workers",
        timeout=timeout,
    )


def _exit_code(process: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    return process.wait(timeout=timeout)


# --- the secured fleet works --------------------------------------------------------


def test_a_tls_and_token_fleet_samples(files: Files, fleet: str) -> None:
    with files.sampler(fleet) as sampler:
        batch = sampler.obtain_samples(0, 200)
        assert batch.total_steps >= 200
        status = sampler.status()
    assert [w.name for w in status.workers] == ["secure-0"]
    assert set(batch.episode_infos["worker"]) == {status.workers[0].worker_id}


# --- learners with the wrong credentials ----------------------------------------------


def test_no_token_is_an_authentication_error(files: Files, fleet: str) -> None:
    with files.sampler(fleet, token=None) as sampler, pytest.raises(AuthenticationError):
        sampler.status()


def test_a_wrong_token_is_an_authentication_error(files: Files, fleet: str) -> None:
    with (
        files.sampler(fleet, token="not-the-right-token-at-all-0000") as sampler,
        pytest.raises(AuthenticationError),
    ):
        sampler.obtain_samples(0, 10)


def test_the_worker_token_cannot_act_as_a_learner(files: Files, fleet: str) -> None:
    with files.sampler(fleet, token=WORKER_SECRET) as sampler:
        with pytest.raises(PermissionDeniedError, match="worker token may not call"):
            sampler.status()
        with pytest.raises(PermissionDeniedError):
            sampler.obtain_samples(0, 10)
        with pytest.raises(PermissionDeniedError):
            sampler.update_agent("mlp-categorical")
        with pytest.raises(PermissionDeniedError):
            sampler.update_env("CartPole-v1")


def test_the_learner_token_cannot_join_as_a_worker(files: Files, fleet: str) -> None:
    tls = ClientTLS.from_files(files.ca, files.worker_cert, files.worker_key)
    hello = worker_pb2.WorkerMessage(
        hello=worker_pb2.Hello(protocol_version=1, num_envs=1, name="impostor")
    ).SerializeToString()
    with secure_channel(fleet, [], tls=tls, token=Token(LEARNER_SECRET)) as channel:
        join = channel.stream_stream(_rpc.JOIN, None, None)
        with pytest.raises(grpc.RpcError) as caught:
            list(join(iter([hello]), timeout=10))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_a_client_without_a_certificate_cannot_connect(files: Files, fleet: str) -> None:
    # Issue 12.7: gRPC says UNAVAILABLE ("retry"); the learner is told TLS refused it.
    with (
        RemoteSampler(fleet, tls_ca=files.ca, token=LEARNER_SECRET, timeout=10) as sampler,
        pytest.raises(AuthenticationError) as caught,
    ):
        sampler.status()
    assert not isinstance(caught.value, UnavailableError)  # not retryable
    message = str(caught.value)
    assert f"TLS with coordinator {fleet} failed" in message, message
    assert "this client presented none" in message, message
    assert "--tls-cert and --tls-key" in message, message
    with (
        RemoteSampler(fleet, tls_ca=files.ca, token=LEARNER_SECRET, timeout=10) as sampler,
        sampler.stream() as stream,
        pytest.raises(AuthenticationError, match="this client presented none"),
    ):
        next(stream)  # subscriptions too


def test_a_client_with_a_certificate_of_another_ca_is_told_so(
    files: Files, fleet: str, tmp_path: Path
) -> None:
    stranger_cert, stranger_key = make_cert(make_ca("another CA"), "intruder", client=True).write(
        tmp_path, "stranger"
    )
    with (
        RemoteSampler(
            fleet,
            tls_ca=files.ca,
            tls_cert=stranger_cert,
            tls_key=stranger_key,
            token=LEARNER_SECRET,
            timeout=10,
        ) as sampler,
        pytest.raises(AuthenticationError, match="did not accept this client's certificate"),
    ):
        sampler.status()


def test_a_worker_without_an_accepted_certificate_exits_naming_tls(
    files: Files, fleet: str, tmp_path: Path
) -> None:
    processes = Processes(tmp_path)
    try:
        worker = processes.worker(
            fleet, "no-cert", "--tls-ca", str(files.ca), "--token-file", str(files.worker_token)
        )
        assert _exit_code(worker) == 1  # instead of retrying forever
        log = processes.log(worker)
        assert f"TLS with coordinator {fleet} failed" in log, log
        assert "this client presented none" in log, log
    finally:
        processes.stop_all()


# --- workers with the wrong credentials exit instead of retrying ---------------------


def test_a_worker_with_a_wrong_token_exits(files: Files, fleet: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0000000000000000000000000000000000")
    processes = Processes(tmp_path)
    try:
        worker = processes.worker(fleet, "intruder", *files.worker_args(token=wrong))
        assert _exit_code(worker) == 1
        assert "not authenticated" in processes.log(worker)
        assert "0000000000000000000000000000000000" not in processes.log(worker)
    finally:
        processes.stop_all()


def test_a_placeholder_token_refuses_to_start(files: Files, tmp_path: Path) -> None:
    env = {**PROCESS_ENV, "RLFLEET_WORKER_TOKEN": "CHANGE-ME", "RLFLEET_LEARNER_TOKEN": "CHANGE-ME"}
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "RLFLEET_WORKER_TOKEN is a placeholder" in result.stderr


# --- the pickle gate ---------------------------------------------------------------------


def _pickled_always_zero(sampler: RemoteSampler) -> updates_pb2.AgentUpdate:
    class AlwaysZero(RandomPolicy):
        """Defined in a function: cloudpickle ships the class by value."""

        def get_actions(self, observations, rngs=None):
            return np.zeros(len(observations), dtype=np.int64), {}

    return updates_pb2.AgentUpdate(
        pickled_policy=dumps(AlwaysZero(sampler.env_spec), "AgentUpdate.pickled_policy")
    )


def test_pickles_are_refused_by_default(files: Files, fleet: str) -> None:
    with files.sampler(fleet) as sampler:
        update = _pickled_always_zero(sampler)
        with pytest.raises(PermissionDeniedError, match="--allow-pickle"):
            sampler.update_agent(update)
        env_update = updates_pb2.EnvUpdate(pickled_env_factory=dumps(len, "factory"))
        with pytest.raises(PermissionDeniedError, match="--allow-pickle"):
            sampler.update_env(env_update)
        # Nothing changed: the fleet still samples with its random policy.
        assert sampler.obtain_samples(1, 50).total_steps >= 50


def test_allow_pickle_needs_tls_and_tokens(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", "--allow-pickle"],
        env={k: v for k, v in PROCESS_ENV.items() if not k.endswith("_TOKEN")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "--allow-pickle but without TLS and a token" in result.stderr


def test_pickles_need_both_sides_to_opt_in(files: Files, tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    try:
        address = processes.coordinator(*files.coordinator_args(), "--allow-pickle")
        plain = processes.worker(address, "no-pickle", *files.worker_args())
        with files.sampler(address) as sampler:
            _wait_ready(sampler, 1)
            update = _pickled_always_zero(sampler)
            # The coordinator allows it, but a worker did not opt in.
            with pytest.raises(PermissionDeniedError, match="'no-pickle' were not started with"):
                sampler.update_agent(update)

            opted_in = processes.worker(
                address, "pickle-ok", *files.worker_args(), "--allow-pickle"
            )
            _wait_ready(sampler, 2)
            stop_process(plain)
            wait_until(lambda: len(sampler.status().workers) == 1, "the plain worker gone")
            sampler.update_agent(update)
            batch = sampler.obtain_samples(0, 100)
            # The pickled class ran on the worker: every action it took is 0.
            assert batch.total_steps >= 100
            assert not batch.actions.any()
            (only,) = sampler.status().workers
            assert only.name == "pickle-ok"
            assert set(batch.episode_infos["worker"]) == {only.worker_id}

            # A worker without the flag cannot join a fleet running pickled code.
            late = processes.worker(address, "late-no-pickle", *files.worker_args())
            assert _exit_code(late) == 1
            assert "permission denied" in processes.log(late)
            assert opted_in.poll() is None
    finally:
        processes.stop_all()


def test_env_factories_lease_only_where_both_sides_take_code(
    files: Files, fleet: str, tmp_path: Path
) -> None:
    """RemoteVectorEnv(env_fns) over the network: refused by a fleet without
    --allow-pickle, with the --import advice; built only on the workers that
    opted in, each env from its own factory, on a fleet that allows it."""
    env_fns = [lambda n=n: CounterEnv(length=n) for n in (2, 3, 4)]
    with (
        files.sampler(fleet) as sampler,
        pytest.raises(PermissionDeniedError, match=r"--allow-pickle.*worker --import mypkg\.envs"),
    ):
        RemoteVectorEnv(env_fns, on=sampler, open_timeout=20)

    processes = Processes(tmp_path)
    try:
        address = processes.coordinator(*files.coordinator_args(), "--allow-pickle")
        processes.worker(address, "no-pickle", *files.worker_args())
        processes.worker(address, "pickle-ok", *files.worker_args(), "--allow-pickle")
        with files.sampler(address) as sampler:
            _wait_ready(sampler, 2)
            with RemoteVectorEnv(env_fns[:2], on=sampler, open_timeout=30) as venv:
                assert venv.env_workers == ["pickle-ok", "pickle-ok"]
                assert venv.get_env_attr("length") == [2, 3]
                venv.reset()
                _, _, terminated, _, _ = venv.step([0, 0])
                assert venv.step([0, 0])[2].tolist() == [True, False] and not terminated.any()
            # Such a lease carries, pickled, what arrays and JSON cannot: an
            # env in its info, Dict observations, envs of different spaces.
            mixed = [ObjectInfoEnv, DictObservationEnv]
            with RemoteVectorEnv(mixed, on=sampler, open_timeout=30) as venv:
                obs, infos = venv.reset()
                assert isinstance(infos[0]["env"], ObjectInfoEnv)
                # Rows of different kinds are kept as objects, as DummyVectorEnv keeps them.
                np.testing.assert_equal(obs[1].item(), {"count": np.zeros(1, np.float32)})
                assert isinstance(venv.observation_space[1], gym.spaces.Dict)
    finally:
        processes.stop_all()


def test_sampler_arguments_are_checked(files: Files) -> None:
    with pytest.raises(ConfigError, match="placeholder"):
        RemoteSampler("127.0.0.1:1", token="CHANGE-ME")
    with pytest.raises(ConfigError, match=r"--tls-ca .*: no such file"):
        RemoteSampler("127.0.0.1:1", tls_ca=files.root / "missing.crt")


# --- Fleet.local with tokens ---------------------------------------------------------------


def test_an_authenticated_local_fleet_keeps_other_local_users_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RLFLEET_TOKEN", raising=False)
    monkeypatch.delenv("RLFLEET_LEARNER_TOKEN", raising=False)
    fleet = Fleet.local(workers=1, authenticate=True, join_timeout=60)
    with fleet as sampler:
        assert sampler.obtain_samples(0, 50).total_steps >= 50
        assert fleet.learner_token is not None
        with (
            RemoteSampler(fleet.address, timeout=10) as stranger,
            pytest.raises(AuthenticationError),
        ):
            stranger.status()
        with RemoteSampler(fleet.address, token=fleet.learner_token, timeout=10) as friend:
            assert friend.status().ready_workers == 1
        # The worker got its token in its environment, not on its command line.
        (worker,) = fleet.workers
        command_line = Path(f"/proc/{worker.process.pid}/cmdline").read_bytes()
        assert b"token" not in command_line.lower()
