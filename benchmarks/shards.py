"""One learner over 1 and 2 coordinators, each fed by its own synthetic workers.

Run: ``python -m benchmarks.shards`` (about a minute; ``--netns`` puts each
coordinator and its workers on hosts of their own, as root; ``--help``).

What it answers: does a second coordinator add a coordinator's worth of
capacity? Each coordinator is a real ``rlfleet coordinator`` process served
by :class:`benchmarks.capacity.SyntheticWorker` processes that answer tasks
with pre-encoded results, so the coordinators, not worker CPU, are the
bound. The learner (this process) asks one
:class:`~rlfleet.client.RemoteSampler` over all of them for episodes, and
each coordinator's CPU seconds are read from its nanosecond process clock.

On a machine with fewer cores than coordinators + learner, wall-clock
throughput cannot grow with the coordinators: they share the cores. So the
report gives, per layout:

* ``steps_per_second``: delivered steps per wall second (shared cores);
* ``coordinator_us_per_step``: the coordinators' CPU per delivered step,
  summed (flat if sharding costs nothing);
* ``capacity_steps_per_second``: what the layout delivers when each
  coordinator has a core of its own: N times the slowest coordinator's
  own steps per CPU second (the split is even, so the slowest gates);
* ``learner_us_per_step``: this process's CPU per delivered step.

``capacity_ratio`` (2 coordinators over 1) is the figure the capacity model
(docs/performance.md) predicts to be about 2 while the learner is not the
bound; ``wall_ratio`` is what this machine's shared cores gave.

With ``--netns`` each coordinator runs in a namespace of its own and its
workers in another (``tests/netns_support.py``, from the repository), the
learner dialling each coordinator over its own veth link.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.capacity import _cpu_clock, _settled, _stopping, _wait_for_port
from rlfleet.client import RemoteSampler

#: Longest wait for processes to start and workers to join.
_START_SECONDS = 120.0


@dataclasses.dataclass(frozen=True)
class Setup:
    """One run's knobs.

    Attributes:
        workers: Synthetic workers per coordinator.
        num_envs: ``Hello.num_envs`` of each.
        episode_steps: Steps of every episode.
        result_episodes: Episodes per result message.
        request_episodes: Episodes per request.
        requests: Timed requests per layout (after one warm-up).
        netns: Each coordinator and its workers on hosts of their own.
    """

    workers: int = 2
    num_envs: int = 64
    episode_steps: int = 100
    result_episodes: int = 80
    request_episodes: int = 1600
    requests: int = 4
    netns: bool = False


@dataclasses.dataclass
class _Shard:
    address: str
    coordinator: subprocess.Popen[bytes]
    counts: list[Path]


def measure(coordinators: int, setup: Setup) -> dict[str, Any]:
    """Runs ``setup``'s requests over ``coordinators`` fresh coordinators; returns the report."""
    with (
        tempfile.TemporaryDirectory(prefix="rlfleet-shards-") as name,
        contextlib.ExitStack() as stack,
    ):
        directory = Path(name)
        processes: list[subprocess.Popen[bytes]] = []
        # Namespaces outlive the processes in them: entered first, left last.
        networks = stack.enter_context(contextlib.ExitStack())
        stack.enter_context(_stopping(processes))
        shards = [
            _start_shard(directory / f"shard-{i}", setup, processes, networks)
            for i in range(coordinators)
        ]
        sampler = stack.enter_context(
            RemoteSampler([s.address for s in shards], seed=0, timeout=600)
        )
        _wait_for_workers(sampler, coordinators * setup.workers)
        sampler.obtain_episodes(setup.request_episodes)  # warm-up
        clocks = [_cpu_clock(s.coordinator.pid) for s in shards]
        counts = [f for s in shards for f in s.counts]
        _settled(counts)
        cpu_before = [clock() for clock in clocks]
        learner_before, wall_before = time.process_time(), time.perf_counter()
        steps = 0
        for _ in range(setup.requests):
            steps += sampler.obtain_episodes(setup.request_episodes).total_steps
        wall = time.perf_counter() - wall_before
        learner = time.process_time() - learner_before
        _settled(counts)
        cpu = [clock() - before for clock, before in zip(clocks, cpu_before, strict=True)]
    per_shard_rate = [steps / coordinators / c for c in cpu]
    return {
        "coordinators": coordinators,
        "steps": steps,
        "wall_seconds": wall,
        "steps_per_second": steps / wall,
        "coordinator_cpu_seconds": cpu,
        "coordinator_us_per_step": sum(cpu) / steps * 1e6,
        "capacity_steps_per_second": coordinators * min(per_shard_rate),
        "learner_us_per_step": learner / steps * 1e6,
    }


def _start_shard(
    directory: Path,
    setup: Setup,
    processes: list[subprocess.Popen[bytes]],
    stack: contextlib.ExitStack,
) -> _Shard:
    directory.mkdir()
    port_file, control = directory / "port", directory / "result-episodes"
    control.write_text(str(setup.result_episodes))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    coordinator_prefix: list[str] = []
    worker_prefix: list[str] = []
    listen, dial_host, worker_host = "127.0.0.1", "127.0.0.1", "127.0.0.1"
    if setup.netns:
        from tests.netns_support import Network  # the repository's, standard library only

        network = stack.enter_context(Network(tag="bsh"))
        host = network.add_host("workers")
        coordinator_prefix, worker_prefix = network.hub_prefix, host.prefix
        listen, dial_host, worker_host = "0.0.0.0", network.hub_root_address, host.hub_address
    coordinator = subprocess.Popen(
        [*coordinator_prefix, sys.executable, "-m", "rlfleet", "--log-level", "ERROR",
         "coordinator", "--listen", f"{listen}:0", "--port-file", str(port_file),
         "--env", "CartPole-v1", "--lease-data-listen", "off"],
        env=env,
    )  # fmt: skip
    processes.insert(0, coordinator)  # stopped first: its workers then exit
    port = _wait_for_port(port_file, coordinator)
    counts = [directory / f"counts-{i}" for i in range(setup.workers)]
    for count_file in counts:
        processes.append(
            subprocess.Popen(
                [
                    *worker_prefix,
                    *(sys.executable, "-m", "benchmarks.capacity"),
                    *("--serve-worker", f"{worker_host}:{port}"),
                    *("--envs", str(setup.num_envs), "--episode-steps", str(setup.episode_steps)),
                    *("--control", str(control), "--counts", str(count_file)),
                ],
                env=env,
            )
        )
    return _Shard(f"{dial_host}:{port}", coordinator, counts)


def _wait_for_workers(sampler: RemoteSampler, count: int) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while len(sampler.status().workers) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} synthetic workers did not join within {_START_SECONDS} s")
        time.sleep(0.1)


def run(setup: Setup, layouts: Sequence[int] = (1, 2)) -> dict[str, Any]:
    """Measures each layout in turn; returns the reports and the 2-over-1 ratios."""
    reports = [measure(n, setup) for n in layouts]
    for report in reports:
        _print(report)
    first, last = reports[0], reports[-1]
    ratios = {
        "capacity_ratio": last["capacity_steps_per_second"] / first["capacity_steps_per_second"],
        "wall_ratio": last["steps_per_second"] / first["steps_per_second"],
    }
    print(
        f"{last['coordinators']} over {first['coordinators']} coordinator(s): capacity "
        f"{ratios['capacity_ratio']:.2f}x, wall-clock on this machine {ratios['wall_ratio']:.2f}x"
    )
    return {"reports": reports, **ratios}


def _print(report: dict[str, Any]) -> None:
    cpu = ", ".join(f"{c:.2f}" for c in report["coordinator_cpu_seconds"])
    print(
        f"{report['coordinators']} coordinator(s): {report['steps']:,} steps in "
        f"{report['wall_seconds']:.2f} s = {report['steps_per_second']:,.0f} steps/s; "
        f"coordinator CPU {cpu} s = {report['coordinator_us_per_step']:.3f} us/step; "
        f"capacity {report['capacity_steps_per_second']:,.0f} steps/s with a core each; "
        f"learner {report['learner_us_per_step']:.3f} us/step"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__)
    defaults = Setup()
    for field in dataclasses.fields(Setup):
        if field.name != "netns":
            flag = "--" + field.name.replace("_", "-")
            parser.add_argument(flag, type=int, default=getattr(defaults, field.name))
    parser.add_argument("--netns", action="store_true", help="hosts in network namespaces (root)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark."""
    args = _parser().parse_args(argv)
    setup = Setup(**vars(args))
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.1f} on {os.cpu_count()} cores")
    run(setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
