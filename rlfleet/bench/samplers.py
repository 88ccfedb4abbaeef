"""The samplers ``rlfleet bench`` times, each started once and run on demand.

Every sampler is a context manager yielding ``sample(min_steps) -> Timed``:
it takes at least ``min_steps`` env steps and says how long that took and
how much CPU each process taking part spent per step. CPU time comes from
the operating system (``time.process_time`` here, psutil for the other
processes), so it holds on a loaded machine where wall-clock rates do not.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from rlfleet._util.cpus import pin_process
from rlfleet.bench.plain_loop import LoopRun, plain_loop
from rlfleet.bench.report import BenchConfig, Measurement
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import RlfleetTimeoutError, WorkerError
from rlfleet.policies.mlp import MLPCategoricalPolicy

#: Seconds a plain-loop process may take to answer one run.
_PLAIN_RUN_TIMEOUT = 600.0


@dataclass(frozen=True)
class Timed:
    """One timed run of a sampler.

    Attributes:
        steps: Env steps taken.
        wall: Wall-clock seconds.
        cpu_us: CPU microseconds per env step, by process role.
    """

    steps: int
    wall: float
    cpu_us: dict[str, float]


SampleFn = Callable[[int], Timed]


def measurement_of(name: str, runs: list[Timed]) -> Measurement:
    """The runs of one sampler as a Measurement."""
    rates = tuple(run.steps / run.wall for run in runs)
    return Measurement(name, rates, tuple(run.cpu_us for run in runs))


def measure_interleaved(
    config: BenchConfig,
    names: dict[str, str],
    samplers: dict[str, contextlib.AbstractContextManager[SampleFn]],
    say: Callable[[str], None],
) -> dict[str, Measurement]:
    """Starts the samplers, warms each up, then times them in turn, repeat by repeat.

    Never two at once, so they do not compete for cores; every sampler is
    stopped before this returns, whatever happened. A repeat times the
    samplers in the order given, the next one in the reverse order, and so
    on: samplers next to each other in ``samplers`` (the two sides of a
    goal's ratio) are timed back to back in every repeat, each first in
    every other repeat, so a drift of the machine's speed moves both sides
    of a repeat's pair alike (:meth:`rlfleet.bench.report.Ratio.paired`).

    Args:
        config: Steps per run, request size (the warm-up) and repeats.
        names: What each sampler key is called in the report.
        samplers: Not yet entered sampler context managers, by key, in the
            order of the first repeat.
        say: Called with a short line as each phase starts.

    Returns:
        One Measurement per key, in the order of ``samplers``.
    """
    with contextlib.ExitStack() as stack:
        say("starting: " + "; ".join(names[key] for key in samplers))
        started = {key: stack.enter_context(sampler) for key, sampler in samplers.items()}
        say("warming up")
        for sample in started.values():
            sample(min(config.request_steps, config.steps))
        runs: dict[str, list[Timed]] = {key: [] for key in started}
        order = list(started)
        for repeat in range(config.repeats):
            say(f"run {repeat + 1} of {config.repeats}")
            for key in order if repeat % 2 == 0 else reversed(order):
                runs[key].append(started[key](config.steps))
    return {key: measurement_of(names[key], runs[key]) for key in started}


def _cpu_seconds(processes: Sequence[psutil.Process]) -> list[float]:
    times = [process.cpu_times() for process in processes]
    return [t.user + t.system for t in times]


def _per_step_us(seconds: float, steps: int) -> float:
    return seconds * 1e6 / max(steps, 1)


def _plain_child(
    conn: Connection,
    config: BenchConfig,
    index: int,
    vectorization: str | None,
    cpus: frozenset[int] | None,
) -> None:
    """A plain-loop process: runs the loop for each step count it receives."""
    if cpus is not None:  # before the env and policy start threads of their own
        pin_process(cpus, f"plain-loop process {index}'s CPUs")
    while True:
        steps = conn.recv()
        if steps is None:
            return
        try:
            run: LoopRun | str = plain_loop(
                config.env_id,
                config.envs_per_worker,
                steps,
                seed=config.seed + index,
                hidden_sizes=config.hidden_sizes,
                vectorization=vectorization,
            )
        except Exception:  # reported to the parent, which raises it
            run = traceback.format_exc()
        conn.send(run)


@contextlib.contextmanager
def plain_processes(config: BenchConfig, vectorization: str | None = None) -> Iterator[SampleFn]:
    """W plain-loop processes of K envs, run at the same time (the hardware's ceiling).

    ``vectorization`` makes each loop's K envs one native vector env. With
    ``config.pinned``, loop ``i`` is pinned to the CPU the fleet's worker
    ``i`` gets (:func:`~rlfleet._util.cpus.one_cpu_each`), else to none.
    """
    context = multiprocessing.get_context("spawn")  # never fork a process holding gRPC
    pipes: list[Connection] = []
    children = []
    placed = config.worker_cpus
    placement = [None] * config.workers if placed is None else [*placed]
    try:
        for index in range(config.workers):
            parent, child = context.Pipe()
            process = context.Process(
                target=_plain_child,
                args=(child, config, index, vectorization, placement[index]),
                daemon=True,
            )
            process.start()
            pipes.append(parent)
            children.append(process)

        def sample(min_steps: int) -> Timed:
            each = -(-min_steps // config.workers)
            for pipe in pipes:
                pipe.send(each)
            runs: list[LoopRun] = []
            for index, (pipe, process) in enumerate(zip(pipes, children, strict=True)):
                if not pipe.poll(_PLAIN_RUN_TIMEOUT):
                    raise RlfleetTimeoutError(
                        f"plain-loop process {index} took over {_PLAIN_RUN_TIMEOUT:g} s for "
                        f"{each} steps"
                    )
                try:
                    run = pipe.recv()
                except EOFError:
                    process.join(timeout=5)
                    raise WorkerError(
                        f"plain-loop process {index} exited (code {process.exitcode}) during a run",
                        worker=f"plain-{index}",
                    ) from None
                if isinstance(run, str):
                    raise WorkerError(
                        f"plain-loop process {index} failed on {config.env_id}",
                        worker=f"plain-{index}",
                        remote_traceback=run,
                    )
                runs.append(run)
            steps = sum(run.steps for run in runs)
            cpu = statistics.mean(_per_step_us(run.cpu, run.steps) for run in runs)
            # Started together: the slowest one is the time they took together.
            return Timed(steps, max(run.wall for run in runs), {"each plain process": cpu})

        yield sample
    finally:
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in children:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def _in_process(step: Callable[[], int]) -> SampleFn:
    """Times ``step`` (which returns env steps taken) until enough steps."""

    def sample(min_steps: int) -> Timed:
        cpu, wall = time.process_time(), time.perf_counter()
        steps = 0
        while steps < min_steps:
            steps += step()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return Timed(steps, wall, {"this process": _per_step_us(cpu, steps)})

    return sample


@contextlib.contextmanager
def vec_worker_sampler(
    config: BenchConfig, env: EnvConfig, policy: MLPCategoricalPolicy
) -> Iterator[SampleFn]:
    """One VecWorker of K envs stepped in this process: a worker's load, no network.

    The episode units (their seeds) are made before the clock starts: on a
    fleet the coordinator derives them, not the worker. Finished episodes
    are taken in the groups a remote worker sends (``flush_steps`` steps).
    """
    from rlfleet.worker._flush import flush_steps_for
    from rlfleet.worker.remote import WorkerConfig
    from rlfleet.worker.units import make_units
    from rlfleet.worker.vec import VecWorker

    n_envs = config.envs_per_worker
    worker = VecWorker(n_envs=n_envs, seed=config.seed, env=env, policy=policy)
    # A remote worker takes its finished episodes when they hold this many
    # steps (its flush), or when its 0.1 s timer runs out, whichever is first.
    flush_steps = flush_steps_for(WorkerConfig.flush_steps, native=worker.native)
    next_episode = 0

    def submit(count: int) -> None:
        nonlocal next_episode
        first, next_episode = next_episode, next_episode + count
        worker.submit(make_units(config.seed, 0, range(first, next_episode)))

    def sample(min_steps: int) -> Timed:
        # Enough units for episodes of 8 steps on average; the rest stays queued.
        wanted = min_steps // 8 + 2 * n_envs
        if worker.queued_count < wanted:
            submit(wanted - worker.queued_count)
        cpu, wall = time.process_time(), time.perf_counter()
        steps = 0
        while steps < min_steps:
            if worker.idle:  # shorter episodes than planned for
                submit(n_envs)
            worker.step()
            # Take finished episodes in groups, as the remote worker does.
            if worker.finished_steps >= flush_steps:
                batch = worker.take_finished()
                steps += 0 if batch is None else batch.total_steps
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return Timed(steps, wall, {"this process": _per_step_us(cpu, steps)})

    try:
        yield sample
    finally:
        worker.shutdown()


@contextlib.contextmanager
def sync_vector_env_sampler(
    config: BenchConfig, env: EnvConfig, policy: MLPCategoricalPolicy
) -> Iterator[SampleFn]:
    """gymnasium's SyncVectorEnv with W x K envs in this process, nothing stored."""
    vector_env = gym.vector.SyncVectorEnv(
        [env] * config.total_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    try:
        observations, _ = vector_env.reset(seed=config.seed)

        def step() -> int:
            nonlocal observations
            actions, _ = policy.get_actions(observations)
            # SAME_STEP autoreset: every step() is n_envs real transitions.
            observations, *_ = vector_env.step(actions)
            return config.total_envs

        yield _in_process(step)
    finally:
        vector_env.close()


@contextlib.contextmanager
def async_vector_env_sampler(
    config: BenchConfig, env: EnvConfig, policy: MLPCategoricalPolicy
) -> Iterator[SampleFn]:
    """gymnasium's AsyncVectorEnv with W x K env processes, actions from this process."""
    n_envs = config.total_envs
    # spawn: forking a process that holds gRPC state is unsafe, and
    # EnvConfig is a picklable env factory.
    vector_env = gym.vector.AsyncVectorEnv(
        [env] * n_envs, context="spawn", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    children = [psutil.Process(process.pid) for process in vector_env.processes]
    try:
        observations, _ = vector_env.reset(seed=config.seed)

        def sample(min_steps: int) -> Timed:
            nonlocal observations
            before, cpu, wall = _cpu_seconds(children), time.process_time(), time.perf_counter()
            steps = 0
            while steps < min_steps:
                actions, _ = policy.get_actions(observations)
                observations, *_ = vector_env.step(actions)
                steps += n_envs
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            spent = [after - b for after, b in zip(_cpu_seconds(children), before, strict=True)]
            return Timed(
                steps,
                wall,
                {
                    "parent (policy)": _per_step_us(cpu, steps),
                    "all env processes": _per_step_us(sum(spent), steps),
                },
            )

        yield sample
    finally:
        vector_env.close()


@contextlib.contextmanager
def fleet_sampler(
    config: BenchConfig, env: EnvConfig, params: dict[str, np.ndarray]
) -> Iterator[SampleFn]:
    """``obtain_samples`` through ``Fleet.local``, pushing ``params`` with every request.

    CPU per step is given for each worker process, for the learner's main
    thread (the client: requests, batch assembly) and for the learner
    process's other threads (the embedded coordinator and gRPC; with
    several coordinators, gRPC and the shards' threads, and the coordinator
    processes on their own line).
    """
    from rlfleet.client import Fleet  # gRPC is only needed here

    request_steps = min(config.request_steps, config.steps)
    options: dict[str, Any] = (
        {} if config.prefetch_factor is None else {"prefetch_factor": config.prefetch_factor}
    )
    fleet = Fleet.local(
        workers=config.workers,
        envs_per_worker=config.envs_per_worker,
        env=env,
        policy=config.policy_spec,
        seed=config.seed,
        coordinator_options=options,
        coordinators=config.coordinators,
        cpu_affinity="auto" if config.pinned else None,
    )
    with fleet as sampler:
        workers = [psutil.Process(worker.process.pid) for worker in fleet.workers]
        coordinators = [psutil.Process(c.process.pid) for c in fleet.coordinators]
        itr = 0

        def sample(min_steps: int) -> Timed:
            nonlocal itr
            before = _cpu_seconds(workers)
            coordinators_before = _cpu_seconds(coordinators)
            cpu, main, wall = time.process_time(), time.thread_time(), time.perf_counter()
            steps = 0
            while steps < min_steps:
                batch = sampler.obtain_samples(itr, request_steps, agent_update=params)
                itr += 1
                steps += batch.total_steps
            wall, main = time.perf_counter() - wall, time.thread_time() - main
            cpu = time.process_time() - cpu
            spent = [after - b for after, b in zip(_cpu_seconds(workers), before, strict=True)]
            # Every env step is taken by exactly one worker: their CPU summed
            # over all steps is a worker's CPU per step it takes.
            cpu_us = {"workers (each, per step it takes)": _per_step_us(sum(spent), steps)}
            if coordinators:
                # Likewise every step passes exactly one coordinator.
                after = _cpu_seconds(coordinators)
                used = sum(a - b for a, b in zip(after, coordinators_before, strict=True))
                cpu_us["coordinators (each, per step it passes)"] = _per_step_us(used, steps)
                cpu_us["learner (other threads)"] = _per_step_us(cpu - main, steps)
            else:
                cpu_us["coordinator (learner's other threads)"] = _per_step_us(cpu - main, steps)
            cpu_us["learner (main thread)"] = _per_step_us(main, steps)
            return Timed(steps, wall, cpu_us)

        yield sample
