"""One learner over 1 and 2 coordinators, each fed by its own synthetic workers.

Run: ``python -m benchmarks.shards`` (about a minute; ``--netns`` puts each
coordinator and its workers on hosts of their own, as root; ``--help``).

What it answers: does a second coordinator add a coordinator's worth of
capacity? Each coordinator is a real ``rlfleet coordinator`` process served
by :class:`benchmarks.capacity_workers.SyntheticWorker` processes that answer tasks
with pre-encoded results, so the coordinators, not worker CPU, are the
bound. Results travel as a default fleet's do (``--carrier data``: on the
workers' and the learner's data connections) or all on gRPC (``--carrier
join``). Each coordinator's CPU seconds are read from its nanosecond
process clock.

Both layouts run on the same processes, started once: coordinators A and
B with their workers, one :class:`~rlfleet.client.RemoteSampler` over A
alone and one over A and B. The layouts take turns (1, 2, 1, 2, ...) of
``--requests`` requests each, ``--turns`` turns of each layout per round
and ``--rounds`` rounds, so a slow spell of a shared machine falls on
both; a round sums each layout's turns, every round's ratio is reported,
and the goal is judged on each, not on their median. Many short turns
pair the layouts more closely than one long one: the machine's slow
spells last seconds, as long as a turn of 48 requests.

``--pin`` puts coordinator ``i`` and its workers on the ``i``-th CPU, in
both layouts alike (they are the same processes); the learner and the
neighbour stay unpinned.

On a machine with fewer cores than coordinators + learner, wall-clock
throughput cannot grow with the coordinators: they share the cores. So the
report gives, per layout and round:

* ``steps_per_second``: delivered steps per wall second (shared cores);
* ``coordinator_us_per_step``: the coordinators' CPU per delivered step,
  summed (flat if sharding costs nothing);
* ``capacity_steps_per_second``: what the layout delivers when each
  coordinator has a core of its own: N times the slowest coordinator's
  own steps per CPU second (the split is even, so the slowest gates);
* ``learner_us_per_step``: this process's CPU per delivered step.

``capacity_ratio`` (2 coordinators over 1, per round) is the figure the
capacity model (docs/performance.md) predicts to be about 2 while the
learner is not the bound; ``wall_ratio`` is what this machine's shared
cores gave.

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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.capacity import _cpu_clock, _settled, _stopping, _wait_for_port
from rlfleet._util.cpus import can_pin, cpu_list_text, one_cpu_each
from rlfleet.client import RemoteSampler
from rlfleet.errors import ConfigError

#: Longest wait for processes to start and workers to join.
_START_SECONDS = 120.0
#: Where the synthetic workers' results travel (as benchmarks.capacity's).
CARRIERS = ("data", "join")
#: The goal: 2 coordinators give at least this times one's capacity.
GOAL_RATIO = 1.8


@dataclasses.dataclass(frozen=True)
class Setup:
    """One run's knobs.

    Attributes:
        workers: Synthetic workers per coordinator.
        num_envs: ``Hello.num_envs`` of each.
        episode_steps: Steps of every episode.
        result_episodes: Episodes per result message.
        request_episodes: Episodes per request.
        requests: Timed requests per layout in each turn.
        rounds: Rounds; each measures layout 1, then layout 2, ``turns``
            times, and sums each layout's turns into the round's report.
        turns: Turns of each layout per round (1, 2, 1, 2, ...): a slow
            spell of a shared machine longer than a turn falls on both.
        carrier: ``data``: results on the workers' and the learner's data
            connections (a default fleet); ``join``: all on gRPC.
        neighbour: While layout 1 runs on coordinator A, a second learner
            process keeps coordinator B and its workers as busy as layout
            2 does, so both layouts share the machine with the same
            processes at work (see the module's docstring).
        netns: Each coordinator and its workers on hosts of their own.
        pin: Coordinator ``i`` and its workers pinned to the ``i``-th CPU
            this process may use (round-robin), as the capacity model
            counts them: a core each. The learner and the neighbour stay
            unpinned; both layouts run on the same pinned processes.
    """

    workers: int = 2
    num_envs: int = 64
    episode_steps: int = 100
    result_episodes: int = 80
    request_episodes: int = 6400
    requests: int = 6
    rounds: int = 5
    turns: int = 1
    carrier: str = "data"
    neighbour: bool = True
    netns: bool = False
    pin: bool = False


@dataclasses.dataclass
class _Shard:
    address: str
    coordinator: subprocess.Popen[bytes]
    counts: list[Path]
    workers: list[subprocess.Popen[bytes]]


def run(setup: Setup) -> dict[str, Any]:
    """Measures the layouts in turn, ``setup.rounds`` times, on one set of processes.

    Returns:
        ``cpus``: per coordinator, the CPUs it and each of its workers may
        run on (every thread's, as CPU lists); ``rounds``: per round, both
        layouts' reports (see :func:`measure`) and the round's
        ``capacity_ratio`` and ``wall_ratio``; ``capacity_ratios`` and
        ``wall_ratios``: every round's; ``met``: rounds whose capacity ratio
        reaches :data:`GOAL_RATIO`.
    """
    if setup.carrier not in CARRIERS:
        raise ConfigError(f"carrier must be one of {CARRIERS}, got {setup.carrier!r}")
    if setup.turns < 1:
        raise ConfigError(f"turns must be at least 1, got {setup.turns}")
    if setup.pin and not can_pin():
        raise ConfigError(f"pin needs Linux (sched_setaffinity, taskset); this is {sys.platform}")
    with (
        tempfile.TemporaryDirectory(prefix="rlfleet-shards-") as name,
        contextlib.ExitStack() as stack,
    ):
        directory = Path(name)
        processes: list[subprocess.Popen[bytes]] = []
        # Namespaces outlive the processes in them: entered first, left last.
        networks = stack.enter_context(contextlib.ExitStack())
        stack.enter_context(_stopping(processes))
        cpus = one_cpu_each(2) if setup.pin else [None, None]
        shards = [
            _start_shard(directory / f"shard-{i}", setup, processes, networks, cpus[i])
            for i in range(2)
        ]
        layouts = {
            n: stack.enter_context(
                RemoteSampler([s.address for s in shards[:n]], seed=0, timeout=600)
            )
            for n in (1, 2)
        }
        _wait_for_workers(layouts[2], 2 * setup.workers)
        cpus_run_on = [_cpus_of([s.coordinator, *s.workers]) for s in shards]
        print(
            "CPUs of each coordinator, then its workers: "
            + "; ".join(", ".join(shard) for shard in cpus_run_on)
        )
        for sampler in layouts.values():
            sampler.obtain_episodes(setup.request_episodes)  # warm-up
        neighbour = (
            _Neighbour(directory / "neighbour", shards[1].address, setup, processes)
            if setup.neighbour
            else None
        )
        rounds = []
        for number in range(1, setup.rounds + 1):
            turns = []
            for _ in range(setup.turns):
                turn = []
                for n in (1, 2):
                    with neighbour.busy() if neighbour and n == 1 else contextlib.nullcontext():
                        turn.append(measure(layouts[n], shards[:n], setup))
                turns.append(turn)
            reports = [merged([turn[i] for turn in turns]) for i in (0, 1)]
            one, two = reports
            result = {
                "turns": turns,
                "reports": reports,
                "capacity_ratio": two["capacity_steps_per_second"]
                / one["capacity_steps_per_second"],
                "wall_ratio": two["steps_per_second"] / one["steps_per_second"],
            }
            _print_round(number, result)
            rounds.append(result)
    capacity = [r["capacity_ratio"] for r in rounds]
    met = sum(ratio >= GOAL_RATIO for ratio in capacity)
    print(
        f"capacity ratio, every round: {', '.join(f'{r:.2f}' for r in capacity)}; "
        f">= {GOAL_RATIO}x in {met} of {len(rounds)}"
    )
    return {
        "cpus": cpus_run_on,
        "rounds": rounds,
        "capacity_ratios": capacity,
        "wall_ratios": [r["wall_ratio"] for r in rounds],
        "met": met,
    }


def measure(sampler: RemoteSampler, shards: Sequence[_Shard], setup: Setup) -> dict[str, Any]:
    """Runs ``setup.requests`` requests through ``sampler`` over ``shards``; returns the report."""
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
    return _report(steps, wall, cpu, learner)


def merged(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One layout's report over its turns: their steps, seconds and each coordinator's CPU summed.

    The capacity is then N times the slowest coordinator's rate over the
    whole round, as in a round of one turn.
    """
    cpu = [sum(c) for c in zip(*(r["coordinator_cpu_seconds"] for r in reports), strict=True)]
    return _report(
        sum(r["steps"] for r in reports),
        sum(r["wall_seconds"] for r in reports),
        cpu,
        sum(r["learner_cpu_seconds"] for r in reports),
    )


def _report(steps: int, wall: float, cpu: list[float], learner: float) -> dict[str, Any]:
    coordinators = len(cpu)
    per_shard_rate = [steps / coordinators / c for c in cpu]
    return {
        "coordinators": coordinators,
        "steps": steps,
        "wall_seconds": wall,
        "steps_per_second": steps / wall,
        "coordinator_cpu_seconds": cpu,
        "coordinator_us_per_step": sum(cpu) / steps * 1e6,
        "capacity_steps_per_second": coordinators * min(per_shard_rate),
        "learner_cpu_seconds": learner,
        "learner_us_per_step": learner / steps * 1e6,
    }


def _start_shard(
    directory: Path,
    setup: Setup,
    processes: list[subprocess.Popen[bytes]],
    stack: contextlib.ExitStack,
    cpus: frozenset[int] | None = None,
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
    if cpus is not None:
        # Pinned before exec: every thread the process starts inherits the set.
        pin = ["taskset", "-c", cpu_list_text(cpus)]
        coordinator_prefix, worker_prefix = pin + coordinator_prefix, pin + worker_prefix
    # Without a data channel every result travels on gRPC, both ways.
    data = [] if setup.carrier == "data" else ["--lease-data-listen", "off"]
    coordinator = subprocess.Popen(
        [*coordinator_prefix, sys.executable, "-m", "rlfleet", "--log-level", "ERROR",
         "coordinator", "--listen", f"{listen}:0", "--port-file", str(port_file),
         "--env", "CartPole-v1", *data],
        env=env,
    )  # fmt: skip
    processes.insert(0, coordinator)  # stopped first: its workers then exit
    port = _wait_for_port(port_file, coordinator)
    counts = [directory / f"counts-{i}" for i in range(setup.workers)]
    workers = []
    for count_file in counts:
        workers.append(
            subprocess.Popen(
                [
                    *worker_prefix,
                    *(sys.executable, "-m", "benchmarks.capacity"),
                    *("--serve-worker", f"{worker_host}:{port}", "--carrier", setup.carrier),
                    *("--envs", str(setup.num_envs), "--episode-steps", str(setup.episode_steps)),
                    *("--control", str(control), "--counts", str(count_file)),
                ],
                env=env,
            )
        )
        processes.append(workers[-1])
    return _Shard(f"{dial_host}:{port}", coordinator, counts, workers)


class _Neighbour:
    """A second learner process that keeps coordinator B busy while layout 1 runs on A.

    On a shared machine a coordinator's CPU per step grows with what runs
    beside it (caches, the core's other hyperthread): layout 2 runs both
    coordinators and all workers at once, so measured alone, layout 1 would
    have the machine to itself and the ratio would count the machine's
    contention as a cost of sharding. The process is told ``busy`` or
    ``idle`` through a file and acknowledges in another once its requests
    have started or its last one has ended.
    """

    def __init__(
        self,
        directory: Path,
        address: str,
        setup: Setup,
        processes: list[subprocess.Popen[bytes]],
    ) -> None:
        directory.mkdir()
        self._control, self._ack = directory / "control", directory / "ack"
        self._control.write_text("idle")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.shards", "--serve-neighbour", address,
             "--request-episodes", str(setup.request_episodes),
             "--control", str(self._control), "--ack", str(self._ack)],
            env=env,
        )  # fmt: skip
        processes.append(self._process)
        self._await("idle")

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Keeps coordinator B sampling while the block runs."""
        self._control.write_text("busy")
        self._await("busy")
        try:
            yield
        finally:
            self._control.write_text("idle")
            self._await("idle")

    def _await(self, state: str) -> None:
        deadline = time.monotonic() + _START_SECONDS
        while not (self._ack.exists() and self._ack.read_text() == state):
            if self._process.poll() is not None:
                raise RuntimeError(f"the neighbour learner exited with {self._process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the neighbour learner was not {state} within {_START_SECONDS} s"
                )
            time.sleep(0.02)


def serve_neighbour(address: str, request_episodes: int, control: Path, ack: Path) -> int:
    """The neighbour learner's process: samples from ``address`` while ``control`` says
    busy, until the benchmark stops it."""
    with RemoteSampler(address, seed=1, timeout=600) as sampler:
        while True:
            state = control.read_text()
            if state == "busy":
                sampler.obtain_episodes(request_episodes)
            else:
                time.sleep(0.01)
            # Written after a whole request: "idle" means none is in flight.
            if not ack.exists() or ack.read_text() != state:
                ack.write_text(state)


def _cpus_of(processes: Sequence[subprocess.Popen[bytes]]) -> list[str]:
    """Each process's CPUs, every thread's together, as a CPU list (``0``, ``0-1``).

    ``unknown`` where the platform cannot tell (no ``sched_getaffinity``).
    """
    if not can_pin():
        return ["unknown"] * len(processes)
    lists = []
    for process in processes:
        cpus: set[int] = set()
        for thread in os.listdir(f"/proc/{process.pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that has ended
                cpus |= os.sched_getaffinity(int(thread))
        lists.append(cpu_list_text(cpus))
    return lists


def _wait_for_workers(sampler: RemoteSampler, count: int) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while len(sampler.status().workers) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} synthetic workers did not join within {_START_SECONDS} s")
        time.sleep(0.1)


def _print_round(number: int, result: dict[str, Any]) -> None:
    turns = len(result["turns"])
    over = f" over {turns} turns" if turns > 1 else ""
    for report in result["reports"]:
        cpu = ", ".join(f"{c:.2f}" for c in report["coordinator_cpu_seconds"])
        print(
            f"round {number}, {report['coordinators']} coordinator(s){over}: "
            f"{report['steps']:,} steps "
            f"in {report['wall_seconds']:.2f} s = {report['steps_per_second']:,.0f} steps/s; "
            f"coordinator CPU {cpu} s = {report['coordinator_us_per_step']:.3f} us/step; "
            f"capacity {report['capacity_steps_per_second']:,.0f} steps/s with a core each; "
            f"learner {report['learner_us_per_step']:.3f} us/step"
        )
    print(
        f"round {number}, 2 over 1 coordinator(s): capacity {result['capacity_ratio']:.2f}x, "
        f"wall-clock on this machine {result['wall_ratio']:.2f}x"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__)
    defaults = Setup()
    for field in dataclasses.fields(Setup):
        if field.name not in ("netns", "carrier", "neighbour", "pin"):
            flag = "--" + field.name.replace("_", "-")
            parser.add_argument(flag, type=int, default=getattr(defaults, field.name))
    parser.add_argument(
        "--carrier",
        choices=CARRIERS,
        default=defaults.carrier,
        help="where results travel: data connections (a default fleet) or gRPC only",
    )
    parser.add_argument(
        "--no-neighbour",
        dest="neighbour",
        action="store_false",
        help="measure layout 1 with coordinator B idle (the machine's contention then counts "
        "against layout 2)",
    )
    parser.add_argument("--netns", action="store_true", help="hosts in network namespaces (root)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="coordinator i and its workers on the i-th CPU (a core each, as the capacity "
        "model counts them); the learner and the neighbour unpinned",
    )
    # The neighbour learner's own process (started by the benchmark).
    parser.add_argument("--serve-neighbour", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--control", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ack", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark."""
    args = _parser().parse_args(argv)
    if args.serve_neighbour:
        return serve_neighbour(args.serve_neighbour, args.request_episodes, args.control, args.ack)
    del args.serve_neighbour, args.control, args.ack
    setup = Setup(**vars(args))
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.1f} on {os.cpu_count()} cores")
    run(setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
