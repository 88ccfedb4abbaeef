"""Vector-env benchmark: ``python -m benchmarks.vector_env [--seconds 5] [--quick]``.

Measures env steps per second of a learner that steps a vector env itself
(central inference), in one run:

(a) CartPole, 16 envs, a batched numpy MLP (4-64-64-2) choosing actions on
    the learner: RemoteVectorEnv (a local fleet of 2 workers x 8 leased envs)
    against SubprocVectorEnv(16) and gymnasium's AsyncVectorEnv(16), in sync
    mode and (tianshou's async mode) with ``wait_num=8``. Goal: Remote at
    least as fast as both.
(b) An I/O-bound env that waits 1 ms per step (rlfleet/Slow-v0), 2 workers
    x 16 envs: goal >= 0.8 x the 32,000 steps/s that 32 such envs allow.
    Reference: the same 32 envs stepped by a thread pool in this process
    (what the machine allows without any transport).
    Floors: the real duration of ``time.sleep(0.001)`` here; 32 bare child
    processes that each sleep 1 ms per "step" and answer through a pipe,
    driven in lock-step (sync) and free-running (each released again as
    soon as it answered: the bound of a learner doing central inference,
    which cannot act on an env before it saw that env's last observation,
    so each env's cycle is at least its sleep plus one round trip); the
    latency bound 32 / (sleep + pipe round trip), and per layout the same
    with the relay's measured round trip (r); and the CPU per step that
    these cores allow at the goal, against what Remote spends.
(r) The relay's cost: the median round trip of one env step through the
    coordinator, against one echo over a direct gRPC stream (what a learner
    dialling a worker itself would pay at least).
(c) The same with a step time drawn uniformly from 0.5-5 ms: sync stepping
    against ``wait_num=16``; reports the speedup.

The Remote figures are taken in two layouts, named in each line:

* ``local``: ``Fleet.local``, the coordinator embedded in the learner's
  process, the workers its child processes;
* ``procs``: as deployed, ``rlfleet coordinator`` and two ``rlfleet worker``
  processes, the learner dialling the coordinator's address.

(a) runs in rounds (``--rounds``; 3 in ``--quick``, 5 otherwise): each
round runs every sampler once, in the same order, each after its own
warm-up, so that a noisy moment of a shared machine does not decide a
comparison. It reports each sampler's median steps/s and, for sync and
``wait_num=8``, Remote's ratio to the strongest plain alternative of each
round and how many rounds Remote won. ``--only-a`` leaves out (b), (c) and
(r).

Each figure is env steps (not learner calls) per wall-clock second after a
warm-up. The Remote figures also give CPU microseconds per env step of the
learner's process (with the coordinator in ``local``), of the coordinator's
(``procs``) and of each worker process, read with psutil: less noisy than
wall clock on a shared machine. Timing on a shared machine varies from run
to run: compare figures of one run. Needs rlfleet importable (``PYTHONPATH=.``
from the repository root).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
import gymnasium as gym
import numpy as np
import psutil

import rlfleet.envs.testing  # noqa: F401  (registers rlfleet/Slow-v0 here too)
from benchmarks.coordinator import _wait_for_port
from rlfleet.client import Fleet, RemoteSampler, RemoteVectorEnv
from rlfleet.envs import BaseVectorEnv, EnvConfig, SubprocVectorEnv

CARTPOLE = EnvConfig("CartPole-v1")
IO_BOUND = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 0.001, "length": 1000})
VARIABLE = EnvConfig(
    "rlfleet/Slow-v0", {"step_seconds": 0.0005, "max_seconds": 0.005, "length": 1000}
)


class BatchedMLP:
    """A 4-64-64-2 tanh MLP picking argmax actions for a batch of observations."""

    def __init__(self, obs_dim: int, actions: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        sizes = [obs_dim, 64, 64, actions]
        self.layers = [
            (rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32), np.zeros(b, np.float32))
            for a, b in itertools.pairwise(sizes)
        ]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32)
        for k, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if k < len(self.layers) - 1:
                x = np.tanh(x)
        return np.argmax(x, axis=1)


def cpu_seconds(processes: list[psutil.Process]) -> np.ndarray:
    """User + system CPU seconds of each process so far."""
    return np.array([sum(p.cpu_times()[:2]) for p in processes])


def run_tianshou(
    venv: BaseVectorEnv,
    policy: Callable[[np.ndarray], np.ndarray],
    seconds: float,
    warmup: float,
    processes: list[psutil.Process] | None = None,
) -> tuple[float, np.ndarray]:
    """Steps a tianshou-style vector env (sync or async) for ``seconds``.

    Returns:
        Steps per second, and CPU microseconds per step of each of ``processes``.
    """
    n = len(venv)
    obs, _ = venv.reset(seed=list(range(n)))
    latest = np.asarray(obs).copy()
    ready = list(range(n))

    def run_for(duration: float) -> tuple[int, float]:
        nonlocal ready
        steps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < duration:
            obs, _, terminated, truncated, infos = venv.step(policy(latest[ready]), id=ready)
            ready = [int(info["env_id"]) for info in infos]
            latest[ready] = obs
            steps += len(ready)
            done = [i for i, end in zip(ready, terminated | truncated, strict=True) if end]
            if done:
                latest[done] = venv.reset(done)[0]
        return steps, time.perf_counter() - start

    run_for(warmup)
    cpu_before = cpu_seconds(processes or [])
    steps, elapsed = run_for(seconds)
    cpu_per_step = 1e6 * (cpu_seconds(processes or []) - cpu_before) / max(steps, 1)
    in_flight = n - len(ready)
    while in_flight:  # collect what is still in flight before closing
        in_flight -= len(venv.step([], id=[])[4])
    return steps / elapsed, cpu_per_step


def run_gymnasium(
    envs: gym.vector.VectorEnv,
    policy: Callable[[np.ndarray], np.ndarray],
    seconds: float,
    warmup: float,
) -> float:
    """Steps a gymnasium vector env (its own autoreset) for ``seconds``; steps/s."""
    obs, _ = envs.reset(seed=0)
    end_warmup = time.perf_counter() + warmup
    while time.perf_counter() < end_warmup:
        obs, *_ = envs.step(policy(obs))
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        obs, *_ = envs.step(policy(obs))
        steps += envs.num_envs
    return steps / (time.perf_counter() - start)


def thread_pool_steps_per_s(config: EnvConfig, count: int, seconds: float, warmup: float) -> float:
    """Steps/s of ``count`` envs stepped together by a thread pool in this process.

    (b)'s reference: the strongest local alternative for envs that wait
    (one thread per env, every env stepped each round), so the closing
    note can say what the machine allows without any transport.
    """
    envs = [gym.make(config.id, **config.kwargs) for _ in range(count)]
    for k, env in enumerate(envs):
        env.reset(seed=k)

    def step(env: gym.Env) -> None:
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()

    with ThreadPoolExecutor(count) as pool:
        end_warmup = time.perf_counter() + warmup
        while time.perf_counter() < end_warmup:
            list(pool.map(step, envs))
        steps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            list(pool.map(step, envs))
            steps += count
        rate = steps / (time.perf_counter() - start)
    for env in envs:
        env.close()
    return rate


#: A floor child: sleeps 1 ms per byte it reads, then answers with that byte
#: (a byte "0": answers at once, for the pipe's round trip).
_SLEEPER = (
    "import os, time\n"
    "while (b := os.read(0, 1)):\n"
    "    if b != b'0':\n"
    "        time.sleep(0.001)\n"
    "    os.write(1, b)\n"
)
#: Goal (b): this share of 32 envs x 1,000 steps/s.
B_GOAL, B_IDEAL = 0.8, 32_000


@dataclass(frozen=True)
class SleepFloor:
    """What this machine allows 32 envs that sleep 1 ms, with no rlfleet at all.

    Attributes:
        sleep_ms: Median real duration of ``time.sleep(0.001)`` here.
        round_trip_ms: Median round trip through a pipe to a bare child
            process and back (the least transport a learner can have).
        sync: Steps/s of the bare children driven in lock-step.
        free_running: Steps/s with each child released again as soon as it
            answered: the bound of a central-inference learner, which
            cannot act on an env before it saw its last observation.
        free_running_cpu_us: CPU microseconds per step of the free-running
            run (parent and children): the machine's cost of the sleeps,
            wake-ups and pipes alone.
    """

    sleep_ms: float
    round_trip_ms: float
    sync: float
    free_running: float
    free_running_cpu_us: float


def latency_bound(count: int, sleep_ms: float, round_trip_ms: float) -> float:
    """Steps/s of ``count`` envs when each env's cycle is its sleep plus one round trip.

    A learner doing central inference sends an env's action only after it
    has that env's last observation, so no env steps more often than once
    per (actual sleep + round trip learner -> env -> learner).
    """
    return count * 1000.0 / (sleep_ms + round_trip_ms)


def cpu_budget_us(cores: int, steps_per_s: float) -> float:
    """CPU microseconds per step that ``cores`` busy cores allow at ``steps_per_s``."""
    return cores * 1e6 / steps_per_s


def sleep_floor(count: int, seconds: float) -> SleepFloor:
    """(b)'s floors: ``count`` bare processes that sleep 1 ms per step.

    Each child is a bare interpreter (no rlfleet, no gymnasium) reading one
    byte per step from its stdin pipe and answering on its stdout pipe.
    Measures ``time.sleep(0.001)`` here and the pipe's round trip, then
    drives the children in lock-step (release all, wait for all) and
    free-running (each released again as soon as it answers), for
    ``seconds`` each.
    """
    sleeps = []
    for _ in range(500):
        began = time.perf_counter()
        time.sleep(0.001)
        sleeps.append(time.perf_counter() - began)
    children = [
        subprocess.Popen(
            [sys.executable, "-S", "-c", _SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(count)
    ]
    try:
        pipes = [(c.stdin.fileno(), c.stdout.fileno()) for c in children]  # type: ignore[union-attr]
        trips = []
        release, answer = pipes[0]
        for _ in range(2000):
            began = time.perf_counter()
            os.write(release, b"0")
            os.read(answer, 1)
            trips.append(time.perf_counter() - began)

        def sync() -> int:
            steps = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                for release, _ in pipes:
                    os.write(release, b".")
                for _, answer in pipes:
                    os.read(answer, 1)
                steps += count
            return steps

        def free_running() -> int:
            steps = 0
            with selectors.DefaultSelector() as selector:
                for release, answer in pipes:
                    selector.register(answer, selectors.EVENT_READ, release)
                    os.write(release, b".")
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    for key, _ in selector.select():
                        os.read(key.fd, 1)
                        os.write(key.data, b".")
                        steps += 1
                for key in list(selector.get_map().values()):  # the last answers
                    os.read(key.fd, 1)
            return steps

        watched = [psutil.Process(c.pid) for c in children]
        rates, cpu = [], 0.0
        for run in (sync, free_running):
            children_cpu, own_cpu = cpu_seconds(watched).sum(), time.thread_time()
            start = time.perf_counter()
            steps = run()
            rates.append(steps / (time.perf_counter() - start))
            spent = cpu_seconds(watched).sum() - children_cpu + time.thread_time() - own_cpu
            cpu = 1e6 * spent / max(steps, 1)
        return SleepFloor(
            sleep_ms=1000 * float(np.median(sleeps)),
            round_trip_ms=1000 * float(np.median(trips)),
            sync=rates[0],
            free_running=rates[1],
            free_running_cpu_us=cpu,
        )
    finally:
        for child in children:
            child.stdin.close()  # type: ignore[union-attr]  # EOF: the child exits
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


def echo_round_trip_ms(rounds: int) -> float:
    """Median round trip of 64-byte messages over one bidi gRPC stream (no relay)."""
    server = grpc.server(ThreadPoolExecutor(2), options=[("grpc.so_reuseport", 0)])

    def echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    handler = grpc.stream_stream_rpc_method_handler(echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    outgoing: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo_call = channel.stream_stream(
                "/bench.Echo/Echo", request_serializer=None, response_deserializer=None
            )
            answers = iter(echo_call(iter(outgoing.get, None)))
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                outgoing.put(b"x" * 64)
                next(answers)
                times.append(time.perf_counter() - start)
            outgoing.put(None)
    finally:
        server.stop(None)
    return 1000 * float(np.median(times))


def remote_round_trip_ms(fleet: Fleet | str, rounds: int) -> float:
    """Median round trip of one CartPole step through the coordinator (the relay)."""
    with RemoteVectorEnv(fleet, CARTPOLE, 1) as venv:
        venv.reset(seed=0)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            _, _, terminated, truncated, _ = venv.step([0])
            times.append(time.perf_counter() - start)
            if terminated[0] or truncated[0]:
                venv.reset(0)
    return 1000 * float(np.median(times))


T = TypeVar("T")

#: A layout: its name, the fleet (Fleet.local or an address) and the
#: processes whose CPU time is read (the learner's first).
Layout = tuple[str, Fleet | str, list[psutil.Process]]
WORKERS, ENVS_PER_WORKER = 2, 16
IMPORTS = ("rlfleet.envs.testing",)


@contextmanager
def local_layout() -> Iterator[Layout]:
    """Fleet.local: the coordinator in this (the learner's) process."""
    fleet = Fleet.local(workers=WORKERS, envs_per_worker=ENVS_PER_WORKER, imports=IMPORTS)
    try:
        workers = [psutil.Process(w.process.pid) for w in fleet.workers]
        yield "local", fleet, [psutil.Process(), *workers]
    finally:
        fleet.close()


@contextmanager
def process_layout() -> Iterator[Layout]:
    """As deployed: ``rlfleet coordinator`` and ``rlfleet worker`` processes."""
    directory = Path(tempfile.mkdtemp(prefix="rlfleet-vector-env-bench-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rlfleet = [sys.executable, "-m", "rlfleet", "--log-level", "WARNING"]
    port_file = directory / "port"
    procs = [
        subprocess.Popen(
            [*rlfleet, "coordinator", "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
            env=env,
        )
    ]
    try:
        address = f"127.0.0.1:{_wait_for_port(port_file)}"
        imports = [arg for module in IMPORTS for arg in ("--import", module)]
        for k in range(WORKERS):
            procs.append(
                subprocess.Popen(
                    [*rlfleet, "worker", "--coordinator", address, "--envs",
                     str(ENVS_PER_WORKER), "--name", f"bench-{k}", *imports],
                    env=env,
                )
            )  # fmt: skip
        # All must have joined, or the first lease would take one worker's slots only.
        with RemoteSampler(address) as sampler:
            deadline = time.monotonic() + 60
            while len(sampler.status().workers) < WORKERS:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{WORKERS} workers did not join within 60 s")
                time.sleep(0.1)
        yield "procs", address, [psutil.Process(), *(psutil.Process(p.pid) for p in procs)]
    finally:
        for proc in procs[::-1]:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def measure(make: Callable[[], Any], run: Callable[[Any], T]) -> T:
    env = make()
    try:
        return run(env)
    finally:
        env.close()


#: (a)'s samplers, run in this order in every round: the plain
#: alternatives first, then Remote. Each name's mode is "sync" or "wait_num=8".
A_SAMPLERS = (
    ("SubprocVectorEnv(16)", "sync"),
    ("SubprocVectorEnv(16)", "wait_num=8"),
    ("gymnasium AsyncVectorEnv(16)", "sync"),
    ("remote 2x8", "sync"),
    ("remote 2x8", "wait_num=8"),
)


def compare_rounds(
    remote: list[float], alternatives: dict[str, list[float]]
) -> tuple[list[float], int]:
    """Remote against the strongest alternative of each round.

    Args:
        remote: Remote's steps/s, one per round.
        alternatives: each alternative's steps/s, one per round, in the
            same rounds.

    Returns:
        The ratio remote / strongest alternative of each round, and how
        many rounds Remote won (ratio above 1).
    """
    ratios = [
        rate / max(rates[k] for rates in alternatives.values()) for k, rate in enumerate(remote)
    ]
    return ratios, sum(ratio > 1 for ratio in ratios)


def run_a_rounds(
    where: str,
    fleet: Fleet | str,
    processes: list[psutil.Process],
    *,
    rounds: int,
    seconds: float,
    warmup: float,
    figures: dict[str, float],
) -> None:
    """(a) in one layout: every sampler once per round, in the same order.

    Interleaving spreads a noisy moment of the shared machine over all
    samplers of a round instead of deciding a comparison. Prints each
    sampler's steps/s per round and median, Remote's CPU us/step per role,
    and per mode the ratio remote / strongest alternative of each round
    (sync: SubprocVectorEnv sync and AsyncVectorEnv; ``wait_num=8``:
    SubprocVectorEnv ``wait_num=8`` and AsyncVectorEnv, whose best mode is
    its sync one) with the number of rounds Remote won.
    """
    policy = BatchedMLP(4, 2)
    roles = ("learner+coordinator", *(f"worker {k}" for k in range(WORKERS)))
    if where == "procs":
        roles = ("learner", "coordinator", *(f"worker {k}" for k in range(WORKERS)))
    rates: dict[tuple[str, str], list[float]] = {sampler: [] for sampler in A_SAMPLERS}
    cpus: dict[str, list[np.ndarray]] = {"sync": [], "wait_num=8": []}
    for _ in range(rounds):
        for name, mode in A_SAMPLERS:
            wait_num = 8 if mode == "wait_num=8" else None
            if name.startswith("gymnasium"):
                rate = measure(
                    lambda: gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 16),
                    lambda envs: run_gymnasium(envs, policy, seconds, warmup),
                )
            elif name.startswith("Subproc"):
                rate, _ = measure(
                    partial(SubprocVectorEnv, [CARTPOLE] * 16, wait_num=wait_num),
                    lambda venv: run_tianshou(venv, policy, seconds, warmup),
                )
            else:
                rate, cpu = measure(
                    partial(RemoteVectorEnv, fleet, CARTPOLE, 16, wait_num=wait_num),
                    lambda venv: run_tianshou(venv, policy, seconds, warmup, processes),
                )
                cpus[mode].append(cpu)
            rates[name, mode].append(rate)
    for (name, mode), values in rates.items():
        label = f"a [{where}] {name} {mode}"
        figures[label] = float(np.median(values))
        line = f"{label:<48} median {figures[label]:>8,.0f} steps/s   rounds: " + ", ".join(
            f"{v:,.0f}" for v in values
        )
        if name.startswith("remote"):
            per_role = np.median(np.array(cpus[mode]), axis=0)
            for role, value in zip(roles, per_role, strict=True):
                figures[f"{label} cpu us/step {role}"] = float(value)
            line += "   median CPU us/step: " + ", ".join(
                f"{role} {value:.0f}" for role, value in zip(roles, per_role, strict=True)
            )
        print(line, flush=True)
    gym_rates = rates["gymnasium AsyncVectorEnv(16)", "sync"]
    for mode in ("sync", "wait_num=8"):
        alternatives = {"subproc": rates["SubprocVectorEnv(16)", mode], "gymnasium": gym_rates}
        ratios, won = compare_rounds(rates["remote 2x8", mode], alternatives)
        figures[f"a [{where}] remote {mode} rounds won"] = won
        figures[f"a [{where}] remote {mode} median ratio"] = float(np.median(ratios))
        print(
            f"a [{where}] {mode}: remote / strongest alternative per round: "
            + ", ".join(f"{ratio:.2f}" for ratio in ratios)
            + f"; remote won {won} of {rounds} rounds",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per figure")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument(
        "--quick", action="store_true", help="0.5 s per figure, 3 rounds of (a) (a smoke run)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of (a)'s samplers (default 5; 3 quick)"
    )
    parser.add_argument(
        "--only-a", action="store_true", help="run (a) only, leaving out (b), (c) and (r)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--layout",
        choices=("local", "procs", "both"),
        default="both",
        help="the coordinator in the learner (Fleet.local), in its own process, or both",
    )
    args = parser.parse_args(argv)
    seconds, warmup = (0.5, 0.2) if args.quick else (args.seconds, args.warmup)
    a_rounds = args.rounds or (3 if args.quick else 5)
    if a_rounds < 1:
        parser.error(f"--rounds must be at least 1, got {a_rounds}")
    idle = BatchedMLP(1, 2)
    figures: dict[str, float] = {}
    choices: dict[str, list[Callable[[], AbstractContextManager[Layout]]]] = {
        "local": [local_layout],
        "procs": [process_layout],
        "both": [local_layout, process_layout],
    }
    layouts = choices[args.layout]

    def tianshou(
        name: str,
        make: Callable[[], BaseVectorEnv],
        pol: Callable[[np.ndarray], np.ndarray],
        watched: list[psutil.Process],
        roles: tuple[str, ...],
    ) -> None:
        rate, cpu = measure(make, lambda venv: run_tianshou(venv, pol, seconds, warmup, watched))
        figures[name] = rate
        for role, value in zip(roles, cpu, strict=True):
            figures[f"{name} cpu us/step {role}"] = float(value)
        spent = ", ".join(f"{role} {value:.0f}" for role, value in zip(roles, cpu, strict=True))
        print(f"{name:<44} {rate:>10,.0f} steps/s   CPU us/step: {spent}", flush=True)

    floor = SleepFloor(0.0, 0.0, 0.0, 0.0, 0.0)
    cores = psutil.cpu_count() or 1
    budget = cpu_budget_us(cores, B_GOAL * B_IDEAL)
    rounds = 100 if args.quick else 1000
    if not args.only_a:
        name = "b local thread pool, 32 envs (no transport)"
        figures[name] = thread_pool_steps_per_s(IO_BOUND, 32, seconds, warmup)
        print(f"{name:<44} {figures[name]:>10,.0f} steps/s (of 32,000)", flush=True)
        floor = sleep_floor(32, 3.0 if args.quick else seconds)
        bound = latency_bound(32, floor.sleep_ms, floor.round_trip_ms)
        cycle = 32 * 1000.0 / (B_GOAL * B_IDEAL)  # ms per env step at the goal
        figures.update(
            {
                "b time.sleep(0.001) ms": floor.sleep_ms,
                "b pipe round trip ms": floor.round_trip_ms,
                "b floor, 32 bare processes, sync": floor.sync,
                "b floor, 32 bare processes, free-running": floor.free_running,
                "b floor free-running cpu us/step": floor.free_running_cpu_us,
                "b latency bound / 32,000": bound / B_IDEAL,
                "b cpu budget us/step at the goal": budget,
            }
        )
        print(
            f"(b) time.sleep(0.001) takes {floor.sleep_ms:.3f} ms here (median); a pipe round "
            f"trip to a bare process {floor.round_trip_ms:.3f} ms",
            flush=True,
        )
        for mode, rate in (("sync", floor.sync), ("free-running", floor.free_running)):
            print(
                f"{'b floor, 32 bare processes, ' + mode:<44} {rate:>10,.0f} steps/s "
                f"({rate / B_IDEAL:.2f} of 32,000; sleep 1 ms per step, no env, no policy, "
                "no network)",
                flush=True,
            )
        print(
            f"(b) bound of a central-inference learner (each env's cycle >= its sleep + one "
            f"round trip): 32 / ({floor.sleep_ms:.3f} + {floor.round_trip_ms:.3f} ms) = "
            f"{bound:,.0f} steps/s ({bound / B_IDEAL:.2f}); bare processes free-running reach "
            f"{floor.free_running / B_IDEAL:.2f} at {floor.free_running_cpu_us:.0f} CPU us/step. "
            f"The goal, {B_GOAL:g} of 32,000, needs each env's cycle <= {cycle:.2f} ms "
            f"({cycle - floor.sleep_ms:.2f} ms beyond the sleep) and <= {budget:.0f} CPU us "
            f"per step for everything on these {cores} cores",
            flush=True,
        )
        figures["r direct stream echo ms"] = echo_round_trip_ms(rounds)
        print(
            f"(r) one direct gRPC stream echo: {figures['r direct stream echo ms']:.2f} ms median"
        )
    print(f"(a) CartPole x 16, batched MLP on the learner, {a_rounds} rounds", flush=True)
    for layout in layouts:
        with layout() as (where, fleet, processes):
            print(f"--- Remote, layout {where}", flush=True)
            run_a_rounds(
                where,
                fleet,
                processes,
                rounds=a_rounds,
                seconds=seconds,
                warmup=warmup,
                figures=figures,
            )
            if args.only_a:
                continue
            workers = tuple(f"worker {k}" for k in range(WORKERS))
            roles = ("learner+coordinator", *workers)
            if where == "procs":
                roles = ("learner", "coordinator", *workers)

            def remote(
                name: str,
                venv: EnvConfig,
                num: int,
                *,
                wait_num: int | None,
                pol: Callable[[np.ndarray], np.ndarray],
                layout: Layout = (where, fleet, processes),
                roles: tuple[str, ...] = roles,
            ) -> None:
                tianshou(
                    name,
                    lambda: RemoteVectorEnv(layout[1], venv, num, wait_num=wait_num),
                    pol,
                    layout[2],
                    roles,
                )

            key = f"r relay round trip ms [{where}]"
            figures[key] = remote_round_trip_ms(fleet, rounds)
            print(f"(r) one step through the relay [{where}]: {figures[key]:.2f} ms median")
            print("(b) 1 ms I/O-bound env, 2 workers x 16 (ideal 32,000 steps/s)", flush=True)
            remote(f"b remote[{where}] 2x16 sync", IO_BOUND, 32, wait_num=None, pol=idle)
            remote(f"b remote[{where}] 2x16 wait_num=16", IO_BOUND, 32, wait_num=16, pol=idle)
            print("(c) 0.5-5 ms env, 2 workers x 16", flush=True)
            remote(f"c remote[{where}] 2x16 sync", VARIABLE, 32, wait_num=None, pol=idle)
            remote(f"c remote[{where}] 2x16 wait_num=16", VARIABLE, 32, wait_num=16, pol=idle)
        if args.only_a:
            continue
        modes = ("sync", "wait_num=16")
        best_mode = max(modes, key=lambda m: figures[f"b remote[{where}] 2x16 {m}"])
        best_b = figures[f"b remote[{where}] 2x16 {best_mode}"]
        figures[f"b best / 32,000 [{where}]"] = best_b / B_IDEAL
        spent = sum(
            value
            for key, value in figures.items()
            if key.startswith(f"b remote[{where}] 2x16 {best_mode} cpu us/step")
        )
        figures[f"b best cpu us/step, all processes [{where}]"] = spent
        # Each env's cycle holds its sleep and one relayed round trip (r).
        t_call = figures[f"r relay round trip ms [{where}]"]
        relay_bound = latency_bound(32, floor.sleep_ms, t_call) / B_IDEAL
        figures[f"b relay latency bound / 32,000 [{where}]"] = relay_bound
        speedup = (
            figures[f"c remote[{where}] 2x16 wait_num=16"] / figures[f"c remote[{where}] 2x16 sync"]
        )
        figures[f"c speedup of wait_num=16 over sync [{where}]"] = speedup
        print(
            f"[{where}] (b) best / ideal: {best_b / B_IDEAL:.2f} ({best_mode}, {spent:.0f} CPU "
            f"us/step in all, the goal allows {budget:.0f}); bound with this relay's round trip: "
            f"32 / ({floor.sleep_ms:.3f} + {t_call:.2f} ms) = {relay_bound:.2f}; floor: sync "
            f"{floor.sync / B_IDEAL:.2f}, free-running {floor.free_running / B_IDEAL:.2f}; "
            f"(c) wait_num speedup: {speedup:.2f}x",
            flush=True,
        )
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
