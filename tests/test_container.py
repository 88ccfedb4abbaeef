"""The Dockerfile, built and run for real: a fleet of containers samples for a host learner.

A private Docker engine (tests/docker_support.py) builds the image offline
from a wheelhouse on a base imported under the Dockerfile's default base
name, so the Dockerfile itself is what is tested. Containers use the host
network and talk on 127.0.0.1 only, under the restrictions the Kubernetes
manifests impose (read-only root, no capabilities, no privilege gain).

The only skip: no Docker engine can start here (the reason and dockerd's
log are in the skip message). The first run debootstraps a base (cached
under /var/cache/rlfleet-test); later runs take about two minutes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import rlfleet
from rlfleet.client import RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.errors import UnavailableError
from tests.docker_support import (
    DockerEngine,
    EngineUnavailableError,
    build_context,
    build_image,
    container_state,
    dockerfile_base_image,
    import_base_image,
    logs,
    run_container,
    running_engine,
    wait_for_state,
)
from tests.fleet_processes import free_port

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

IMAGE = f"rlfleet:{rlfleet.__version__}"


@dataclass
class Built:
    engine: DockerEngine
    image: str
    build_log: str


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    try:
        with running_engine() as engine:
            import_base_image(engine, dockerfile_base_image())
            with tempfile.TemporaryDirectory(prefix="rlfleet-context-") as tmp:
                context = build_context(Path(tmp) / "context")
                log = build_image(engine, context, IMAGE)
            yield Built(engine, IMAGE, log)
    except EngineUnavailableError as exc:
        pytest.skip(f"no Docker engine can run here: {exc}")


@pytest.fixture
def names(built: Built) -> Iterator[list[str]]:
    """Container names a test started; removed afterwards, pass or fail."""
    started: list[str] = []
    yield started
    if started:
        built.engine.docker("rm", "--force", *started, timeout=60)


def inspect(built: Built, field: str, target: str | None = None) -> str:
    result = built.engine.check("inspect", "-f", "{{json " + field + "}}", target or built.image)
    return result.strip()


def start_coordinator(built: Built, names: list[str], *flags: str) -> tuple[str, int]:
    name, port, health = f"rlf-coordinator-{len(names)}", free_port(), free_port()
    run_container(
        built.engine,
        name,
        built.image,
        "coordinator",
        f"--listen=127.0.0.1:{port}",
        *flags,
        env={"RLFLEET_HEALTH_LISTEN": f"127.0.0.1:{health}", "RLFLEET_HEARTBEAT_TIMEOUT": "5"},
    )
    names.append(name)
    return name, port


def start_worker(
    built: Built,
    names: list[str],
    port: int,
    worker_name: str,
    *flags: str,
    image: str | None = None,
) -> str:
    name = f"rlf-{worker_name}"
    run_container(
        built.engine,
        name,
        image or built.image,
        "worker",
        f"--coordinator=127.0.0.1:{port}",
        *flags,
        env={
            "RLFLEET_HEALTH_LISTEN": f"127.0.0.1:{free_port()}",
            "RLFLEET_WORKER_NAME": worker_name,
            "RLFLEET_ENVS_PER_WORKER": "2",
            "RLFLEET_DRAIN_GRACE": "20",
        },
    )
    names.append(name)
    return name


def wait_for_workers(
    sampler: RemoteSampler, expected: set[str], built: Built, names: list[str]
) -> None:
    deadline = time.monotonic() + 90
    seen: set[str] = set()
    while time.monotonic() < deadline:
        try:
            status = sampler.status()
        except UnavailableError:  # the coordinator's container is still starting
            time.sleep(0.5)
            continue
        seen = {w.name for w in status.workers if w.ready}
        if seen == expected:
            return
        time.sleep(0.5)
    raise AssertionError(
        f"workers ready: {sorted(seen)}, expected {sorted(expected)}\n{fleet_logs(built, names)}"
    )


def fleet_logs(built: Built, names: list[str]) -> str:
    return "\n".join(logs(built.engine, name) for name in names)


def assert_contiguous(batch: EpisodeBatch) -> None:
    indices = batch.episode_infos["episode_index"]
    np.testing.assert_array_equal(indices, np.arange(batch.n_episodes))


# --- the image ----------------------------------------------------------------


def test_image_is_one_entrypoint_for_both_roles(built: Built) -> None:
    assert inspect(built, ".Config.Entrypoint") == '["rlfleet"]'
    assert inspect(built, ".Config.User") == '"10001:10001"'
    healthcheck = inspect(built, ".Config.Healthcheck.Test")
    assert healthcheck.startswith('["CMD","rlfleet","health"'), healthcheck
    version = built.engine.check("run", "--rm", "--network=none", built.image, "--version")
    assert version.strip() == f"rlfleet {rlfleet.__version__}"
    for role in ("coordinator", "worker", "health"):
        text = built.engine.check("run", "--rm", "--network=none", built.image, role, "--help")
        assert f"usage: rlfleet {role}" in text


def test_final_stage_holds_the_venv_and_no_build_leftovers(built: Built) -> None:
    """Multi-stage: no source tree, wheelhouse or pip cache; the venv is not writable."""
    script = textwrap.dedent(
        """
        import os, shutil, sys
        print(os.getuid(), os.getgid())
        print(sys.prefix)
        for path in ("/src", "/wheels", "/root/.cache/pip", "/tmp/.cache/pip"):
            print(path, os.path.exists(path))
        print("venv writable", os.access("/opt/rlfleet/lib", os.W_OK))
        print("gcc", shutil.which("gcc"))
        """
    )
    out = built.engine.check(
        "run", "--rm", "--network=none", "--entrypoint=python3", built.image, "-c", script
    ).split("\n")
    assert out[0] == "10001 10001"
    assert out[1] == "/opt/rlfleet"
    assert out[2:6] == [
        "/src False",
        "/wheels False",
        "/root/.cache/pip False",
        "/tmp/.cache/pip False",
    ]
    assert out[6] == "venv writable False"
    assert out[7] == "gcc None"
    # The offline path of the Dockerfile was the one taken.
    assert "installing rlfleet" in built.build_log and "offline" in built.build_log


# --- a fleet of containers ----------------------------------------------------


def test_fleet_of_containers_survives_a_killed_worker_and_drains_on_stop(
    built: Built, names: list[str]
) -> None:
    engine = built.engine
    coordinator, port = start_coordinator(built, names)
    workers = [start_worker(built, names, port, f"container-w{i}") for i in (1, 2)]
    address = f"127.0.0.1:{port}"

    with RemoteSampler(address, timeout=180, wait_for_workers=90) as sampler:
        wait_for_workers(sampler, {"container-w1", "container-w2"}, built, names)
        warmup = sampler.obtain_episodes(40)
    assert_contiguous(warmup)
    assert len(np.unique(warmup.episode_infos["worker"])) == 2, "both containers sample"

    # The image's HEALTHCHECK (rlfleet health on RLFLEET_HEALTH_LISTEN).
    for name in (coordinator, *workers):
        status = wait_for_state(
            engine, name, ".State.Health.Status", "healthy", timeout=90, give_up_at=("unhealthy",)
        )
        assert status == "healthy", logs(engine, name)

    # Kill one worker while a request runs: the request still completes,
    # and equals the same request served by the survivor alone. The request
    # is large (seconds of sampling) so that the kill lands in its middle.
    steps = 300_000
    started = threading.Event()

    def on_progress(done: int, total: int) -> None:
        if done >= total // 20:
            started.set()

    with (
        RemoteSampler(address, seed=7, timeout=180) as sampler,
        ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(sampler.obtain_samples, 0, steps, progress=on_progress)
        deadline = time.monotonic() + 120
        while not started.wait(0.2):
            if future.done():
                future.result()  # raises what ended the request
            assert time.monotonic() < deadline, f"no progress\n{fleet_logs(built, names)}"
        engine.check("kill", workers[0])
        assert not future.done(), "the request ended before the kill: make it larger"
        during_kill = future.result(timeout=180)
    assert container_state(engine, workers[0], ".State.Status") == "exited"
    assert_contiguous(during_kill)
    assert during_kill.lengths.sum() >= steps
    with RemoteSampler(address, seed=7, timeout=180) as sampler:
        alone = sampler.obtain_samples(0, steps)
        assert [w.name for w in sampler.status().workers] == ["container-w2"]
    assert_batches_equal(during_kill, alone)

    # SIGTERM (docker stop) drains the survivor: it leaves and exits 0.
    engine.check("stop", "--time=30", workers[1], timeout=60)
    assert container_state(engine, workers[1], ".State.ExitCode") == "0", logs(engine, workers[1])
    engine.check("stop", "--time=30", coordinator, timeout=60)
    assert container_state(engine, coordinator, ".State.ExitCode") == "0", logs(engine, coordinator)


def assert_batches_equal(a: EpisodeBatch, b: EpisodeBatch) -> None:
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.observations, b.observations)
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    np.testing.assert_array_equal(a.step_types, b.step_types)
    np.testing.assert_array_equal(a.episode_infos["env_seed"], b.episode_infos["env_seed"])


# --- the documented pattern for workers with extra envs -----------------------

_CORRIDOR = '''
"""A 1-D corridor: the agent starts at 0 and the episode ends at position 4."""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(-10.0, 10.0, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        self.position += 1
        obs = np.array([self.position], dtype=np.float32)
        return obs, 1.0, self.position >= 4, False, {}


gym.register(id="Corridor-v0", entry_point="corridor_envs:Corridor")
'''


def corridor_wheel(dest: Path) -> Path:
    """Builds a wheel of a one-module package registering Corridor-v0."""
    project = dest / "corridor"
    project.mkdir()
    (project / "corridor_envs.py").write_text(_CORRIDOR)
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "corridor-envs"
            version = "1.0"
            dependencies = ["gymnasium"]

            [tool.setuptools]
            py-modules = ["corridor_envs"]
            """
        )
    )
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "-w", str(dest), str(project)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = dest.glob("corridor_envs-*.whl")
    return wheel


def test_derived_worker_image_runs_envs_from_its_own_package(
    built: Built, names: list[str]
) -> None:
    """docs/deploy.md: FROM the image, pip install a package, --import it."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-derived-") as tmp:
        context = Path(tmp)
        wheel = corridor_wheel(context)
        (context / "Dockerfile").write_text(
            textwrap.dedent(
                f"""
                FROM {built.image}
                USER root
                COPY {wheel.name} /tmp/
                RUN pip install --no-cache-dir --no-index /tmp/{wheel.name} \\
                    && rm /tmp/{wheel.name}
                USER 10001:10001
                """
            )
        )
        built.engine.check("build", "--network=none", "-t", "corridor-worker:test", context)
    _, port = start_coordinator(built, names, "--env=Corridor-v0")
    start_worker(
        built, names, port, "corridor-w1", "--import=corridor_envs", image="corridor-worker:test"
    )
    with RemoteSampler(f"127.0.0.1:{port}", timeout=120, wait_for_workers=90) as sampler:
        wait_for_workers(sampler, {"corridor-w1"}, built, names)
        batch = sampler.obtain_episodes(3)
    np.testing.assert_array_equal(batch.lengths, [4, 4, 4])
    np.testing.assert_array_equal(batch.observations[:4, 0], [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(batch.last_observations[:, 0], [4.0, 4.0, 4.0])
