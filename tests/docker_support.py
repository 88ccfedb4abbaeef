"""A real Docker engine for the container tests, with no registry.

Follows the shared testing notes ("Containers: a real Docker engine, no
registry"): Debian's docker.io and debootstrap (installed with apt-get when
missing and running as root), a private ``dockerd --storage-driver=vfs`` on
its own socket with no bridge and no iptables rules (containers use
``--network host`` and loopback only), a base image made with debootstrap
and imported under the name the Dockerfile's ``FROM`` defaults to, and a
wheelhouse so the build runs with ``--network none``.

The debootstrap root filesystem (as a tar) and downloaded wheels are cached
under ``RLFLEET_TEST_CACHE`` (default /var/cache/rlfleet-test), so only the
first run pays for them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("RLFLEET_TEST_CACHE", "/var/cache/rlfleet-test"))
ROOTFS_TAR = CACHE / "bookworm-python3-minbase.tar"
WHEEL_CACHE = CACHE / "wheels"

#: Repository items never copied into the build context (.dockerignore would
#: drop them anyway; skipping them keeps the copy quick).
_NOT_CONTEXT = (
    ".git",
    "__pycache__",
    "node_modules",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    "wheels",
)


class EngineUnavailableError(RuntimeError):
    """No Docker engine can run here; the message says why."""


def dockerfile_base_image(dockerfile: Path = REPO / "Dockerfile") -> str:
    """The default of the Dockerfile's ``ARG BASE_IMAGE``."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{dockerfile} has no 'ARG BASE_IMAGE=...' line")
    return match.group(1)


def _run(
    args: Sequence[str | Path], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _checked(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise RuntimeError(
            f"{what} failed with exit code {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


def ensure_tools() -> None:
    """Installs docker.io and debootstrap with apt-get when they are missing.

    Raises:
        EngineUnavailableError: They are missing and cannot be installed here.
    """
    if shutil.which("dockerd") and shutil.which("debootstrap"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EngineUnavailableError(
            "dockerd or debootstrap is missing and this is not root with apt-get: "
            "install docker.io and debootstrap"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "docker.io", "debootstrap"],
    ):
        result = _run(args, timeout=600, env=env)
        if result.returncode != 0:
            raise EngineUnavailableError(f"{' '.join(args)} failed:\n{result.stderr[-2000:]}")


class DockerEngine:
    """A private dockerd on its own socket, data root and pid file.

    Args:
        root: An empty directory for the engine's state; removed by the caller.
        storage_driver: vfs works everywhere (no overlay mounts needed) but
            copies the whole image at every build step.
    """

    def __init__(self, root: Path, storage_driver: str = "vfs") -> None:
        self.root = root
        self.storage_driver = storage_driver
        self.socket = root / "docker.sock"
        self.pidfile = root / "dockerd.pid"
        self.log = root / "dockerd.log"
        self._process: subprocess.Popen[bytes] | None = None
        # Debian's client matches Debian's daemon; any other client on PATH
        # (a newer static one) still negotiates down, so it is a fallback.
        self._client = shutil.which("docker", path="/usr/bin") or shutil.which("docker") or ""
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "0"}

    def start(self, timeout: float = 60.0) -> None:
        """Starts dockerd and waits until ``docker info`` answers.

        Raises:
            EngineUnavailableError: The engine did not come up; the message holds
                the reason and the end of dockerd's log.
        """
        if not self._client:
            raise EngineUnavailableError(
                "no docker client on PATH (Debian's docker.io provides one)"
            )
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    "dockerd",
                    f"--storage-driver={self.storage_driver}",
                    f"--data-root={self.root / 'data'}",
                    f"--exec-root={self.root / 'exec'}",
                    f"--pidfile={self.pidfile}",
                    f"--host=unix://{self.socket}",
                    # No docker0 bridge and no firewall rules: containers run
                    # with --network host and talk on loopback only.
                    "--bridge=none",
                    "--iptables=false",
                    "--ip6tables=false",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EngineUnavailableError(
                    f"dockerd exited with code {self._process.returncode}:\n{self.log_tail()}"
                )
            if self.docker("info", timeout=10).returncode == 0:
                return
            time.sleep(0.5)
        raise EngineUnavailableError(
            f"dockerd did not answer within {timeout:g} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of dockerd's log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no dockerd log)"
        return "\n".join(text.splitlines()[-lines:])

    def docker(self, *args: str | Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Runs the docker client against this engine (never raises on exit codes)."""
        return _run([self._client, *args], timeout=timeout, env=self.env)

    def check(self, *args: str | Path, timeout: float = 120.0) -> str:
        """Runs the docker client; returns stdout or raises with its output."""
        return _checked(self.docker(*args, timeout=timeout), f"docker {' '.join(map(str, args))}")

    def stop(self) -> None:
        """Removes every container, then stops dockerd by its pid."""
        if self._process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            ids = self.docker("ps", "-aq", timeout=30).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, timeout=60)
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # dockerd leads its own session: its containerd and shims go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)
        self._process = None


def storage_drivers() -> tuple[str, ...]:
    """Storage drivers to try, fastest first.

    overlay2 builds about five times faster than vfs here (27 s against
    142 s for the image), but needs overlay mounts; vfs works anywhere.
    ``RLFLEET_TEST_DOCKER_STORAGE`` forces one.
    """
    forced = os.environ.get("RLFLEET_TEST_DOCKER_STORAGE", "").strip()
    return (forced,) if forced else ("overlay2", "vfs")


@contextlib.contextmanager
def running_engine() -> Iterator[DockerEngine]:
    """A started private engine, stopped and removed afterwards.

    Raises:
        EngineUnavailableError: Tools are missing or dockerd cannot start with
            any storage driver; the message holds each driver's log tail.
    """
    ensure_tools()
    root = Path(tempfile.mkdtemp(prefix="rlfleet-dockerd-"))
    failures: list[str] = []
    try:
        for driver in storage_drivers():
            engine = DockerEngine(root / driver, storage_driver=driver)
            engine.root.mkdir()
            try:
                engine.start()
            except EngineUnavailableError as exc:
                failures.append(f"--storage-driver={driver}: {exc}")
                engine.stop()
                continue
            try:
                yield engine
            finally:
                engine.stop()
            return
        raise EngineUnavailableError("\n".join(failures))
    finally:
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Unmounts what dockerd left mounted under ``root`` (its netns/default bind mount)."""
    prefix = f"{root}/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):  # deepest first
        _run(["umount", "--lazy", point], timeout=30)


def rootfs_tar() -> Path:
    """A tar of a minimal Debian bookworm with python3 and venv (cached)."""
    if ROOTFS_TAR.exists():
        return ROOTFS_TAR
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _checked(
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    "--include=python3,python3-venv,ca-certificates",
                    "bookworm",
                    rootfs,
                ],
                timeout=900,
            ),
            "debootstrap",
        )
        # The downloaded .debs are half the size and no image needs them.
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        partial = Path(tmp) / "rootfs.tar"
        _checked(_run(["tar", "-C", rootfs, "-cf", partial, "."], timeout=600), "tar")
        partial.replace(ROOTFS_TAR)
    return ROOTFS_TAR


def import_base_image(engine: DockerEngine, name: str) -> None:
    """Imports the cached root filesystem as image ``name`` (the Dockerfile's base)."""
    with rootfs_tar().open("rb") as tar:
        result = subprocess.run(
            [engine._client, "import", "-", name],
            stdin=tar,
            capture_output=True,
            text=True,
            env=engine.env,
            timeout=600,
            check=False,
        )
    _checked(result, f"docker import {name}")


def wheelhouse(source: Path, dest: Path) -> None:
    """Fills ``dest`` with rlfleet's wheel (built from ``source``) and its dependencies'."""
    dest.mkdir(parents=True, exist_ok=True)
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _checked(
        _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", dest, source], timeout=300),
        "pip wheel rlfleet",
    )
    (own,) = dest.glob("rlfleet-*.whl")
    # Dependencies come from the wheel's own metadata; the cache keeps
    # reruns from downloading them again.
    _checked(
        _run(
            [*pip, "download", "--only-binary=:all:", "-d", WHEEL_CACHE, own],
            timeout=600,
        ),
        "pip download rlfleet's dependencies",
    )
    for wheel in WHEEL_CACHE.glob("*.whl"):
        if not wheel.name.startswith("rlfleet-"):
            shutil.copy2(wheel, dest / wheel.name)


def build_context(dest: Path) -> Path:
    """A copy of the repository as build context, with a filled ``wheels/``."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(*_NOT_CONTEXT))
    # Built from the copy, so setuptools' build/ and egg-info stay out of the
    # working tree (and .dockerignore keeps them out of the image).
    wheelhouse(dest, dest / "wheels")
    return dest


def build_image(engine: DockerEngine, context: Path, tag: str) -> str:
    """Builds the Dockerfile in ``context`` offline with the classic builder; returns the log."""
    return engine.check("build", "--network", "none", "-t", tag, context, timeout=900)


def container_state(engine: DockerEngine, name: str, field: str) -> str:
    """One ``docker inspect`` field of a container (Go template, e.g. ``.State.Status``)."""
    result = engine.docker("inspect", "-f", "{{" + field + "}}", name, timeout=30)
    return result.stdout.strip() if result.returncode == 0 else ""


def wait_for_state(
    engine: DockerEngine,
    name: str,
    field: str,
    wanted: str,
    *,
    timeout: float,
    give_up_at: tuple[str, ...] = (),
) -> str:
    """Polls a container's inspect field until it equals ``wanted``; returns the last value.

    Stops early at a value in ``give_up_at`` (e.g. "unhealthy").
    """
    deadline = time.monotonic() + timeout
    value = container_state(engine, name, field)
    while value != wanted and value not in give_up_at and time.monotonic() < deadline:
        time.sleep(0.5)
        value = container_state(engine, name, field)
    return value


#: How the tests run rlfleet containers: host network on loopback (never the
#: bridge), and the restrictions the Kubernetes manifests impose.
RUN_FLAGS = (
    "--network=host",
    "--read-only",
    "--tmpfs=/tmp",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
)


def run_container(
    engine: DockerEngine,
    name: str,
    image: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> None:
    """Starts a detached container with :data:`RUN_FLAGS`."""
    env_flags = [f"--env={key}={value}" for key, value in (env or {}).items()]
    engine.check("run", "--detach", f"--name={name}", *RUN_FLAGS, *env_flags, image, *args)


def logs(engine: DockerEngine, name: str, lines: int = 40) -> str:
    """The last lines a container printed (for failure messages)."""
    result = engine.docker("logs", "--tail", str(lines), name, timeout=30)
    return f"--- docker logs {name} ---\n{result.stdout}{result.stderr}"
