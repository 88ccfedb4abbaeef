"""Python CPU per lease call, without the transport: ``python benchmarks/lease_cpu.py``.

Runs the lease path of one learner, one coordinator and two workers in one
process, with every message built and parsed by the real code
(``RemoteVectorEnv`` and ``LeaseStream`` on the learner, ``parse_request``,
``LeaseManager`` and ``relay_reply`` on the coordinator, ``LeaseHost`` on
the workers) but handed from part to part in memory instead of over gRPC:
what is left when a transport costs nothing. Each figure is CPU
microseconds per learner call of 16 envs (2 workers x 8), for each part:

* ``learner``: RemoteVectorEnv/BaseVectorEnv bookkeeping, the request's
  encoding, the reader thread's decoding of the responses;
* ``coordinator``: parsing the request, splitting it per worker, building
  and serializing the two commands, reading the two replies' headers and
  relaying them;
* ``worker``: per worker, parsing the command, running its 8 envs (the
  ``env steps`` line: the same envs stepped in a bare loop), building and
  serializing the reply.

Each figure is the least of ``--rounds`` rounds: other processes' load only
ever adds to it. ``--profile PART`` prints cProfile's top functions of that
part.

``--pool``: the worker's pool for slow envs instead. 16 leased envs that
sleep 1 ms per step (rlfleet/Slow-v0) on one ``LeaseHost``: median wall
milliseconds per call of all 16, answered whole (sync) or as each finishes
(async), against its floors: one ``time.sleep(0.001)``, and 16 bare
threads released together that each sleep 1 ms.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import pstats
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.client import RemoteSampler, RemoteVectorEnv
from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.leases.manager import Lease, LeaseManager
from rlfleet.coordinator.leases.translation import (
    RelayOpen,
    RelayReply,
    opened_response,
    parse_request,
    relay_deserializer,
)
from rlfleet.coordinator.state import FleetState
from rlfleet.envs import EnvConfig
from rlfleet.protocol.join import WorkerHello
from rlfleet.security import ClientSecurity
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import leases_pb2, updates_pb2, worker_pb2
from rlfleet.wire import encode_tensor
from rlfleet.wire.leases import (
    LeaseAnswers,
    LeaseCallOrder,
    LeaseReport,
    decode_lease_command,
    lease_report_message,
)
from rlfleet.worker.leases.host import LeaseHost

WORKERS, ENVS_PER_WORKER = 2, 8
NUM_ENVS = WORKERS * ENVS_PER_WORKER


class _Clock:
    """Thread CPU seconds spent in one part, and its profile if asked."""

    def __init__(self, profile: bool) -> None:
        self.seconds = 0.0
        self.profile = cProfile.Profile() if profile else None

    def run(self, fn: Callable[[], Any]) -> Any:
        start = time.thread_time()
        if self.profile is not None:
            self.profile.enable()
        try:
            return fn()
        finally:
            if self.profile is not None:
                self.profile.disable()
            self.seconds += time.thread_time() - start


class _InMemoryFleet:
    """The coordinator and its workers, fed the learner's requests in memory."""

    def __init__(self, env: EnvConfig, profiled: str) -> None:
        self.coordinator = _Clock(profiled == "coordinator")
        self.worker = _Clock(profiled == "worker")
        self.state = FleetState(CoordinatorConfig())
        self.manager = LeaseManager(self.state)
        self.handles = []
        self.hosts = []
        for k in range(WORKERS):
            hello = WorkerHello(protocol_version=1, name=f"w{k}", num_envs=ENVS_PER_WORKER)
            self.handles.append(self.state.registry.admit(hello, "ipv4:127.0.0.1:1"))
            self.hosts.append(LeaseHost((), self._reply_to(k)))
        self.env = env
        self.lease: Lease | None = None
        self.replies: list[tuple[int, bytes]] = []
        self.answered = 0  # envs the replies answer
        self.lock = threading.Lock()
        self.deserialize = relay_deserializer(worker_pb2.WorkerMessage.FromString)
        self.responses: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # This thread's CPU seconds: the parts' and the in-memory hand-offs'.
        self.relay_start = self.relay_seconds = 0.0

    def close(self) -> None:
        """Stops the hosts' threads, whose send callbacks would keep this fleet
        (and its lease) alive for the rest of the process."""
        for host in self.hosts:
            host.shutdown()
        self.lease = None

    def _reply_to(self, k: int) -> Callable[[LeaseReport], None]:
        def send(report: LeaseReport) -> None:  # from pool threads too
            data = lease_report_message(report, f"w{k}").SerializeToString()
            count = len(report.answers if isinstance(report, LeaseAnswers) else report.env_ids)
            with self.lock:
                self.replies.append((k, data))
                self.answered += count

        return send

    def serve(self, requests: Iterator[bytes]) -> None:
        self.relay_start = time.thread_time()
        for data in requests:
            request = self.coordinator.run(partial(parse_request, data))
            if isinstance(request, RelayOpen):
                self._open(request)
            elif isinstance(request, LeaseCallOrder) and self.lease is not None:
                self._call(request)
            self.relay_seconds = time.thread_time() - self.relay_start
        self.responses.put(None)

    def _open(self, request: RelayOpen) -> None:
        hosts = [h.worker_id for h in self.handles for _ in range(ENVS_PER_WORKER)]
        lease = Lease(1, request.env, hosts)
        self.manager._leases[1] = lease
        self.lease = lease
        self.manager._create(lease, list(range(NUM_ENVS)), lease.hosts, replaces_lost=False)
        self._deliver()
        created = self.deserialize(self.replies[0][1])
        assert isinstance(created, RelayReply)
        spec = created.spec
        self.replies.clear()
        self.answered = 0
        names = [h.name for h in self.handles for _ in range(ENVS_PER_WORKER)]
        self.responses.put(opened_response(1, spec, names))

    def _call(self, order: LeaseCallOrder) -> None:
        lease = self.lease
        assert lease is not None
        self.coordinator.run(partial(self.manager.call, lease, order))
        self._deliver()
        while self.answered < len(order.env_ids):  # slow envs answer from the pool
            time.sleep(1e-5)
        with self.lock:
            replies, self.replies, self.answered = self.replies, [], 0
        for k, data in replies:
            reply = self.coordinator.run(partial(self.deserialize, data))
            assert isinstance(reply, RelayReply)
            self.coordinator.run(partial(self.manager.on_reply, self.handles[k], reply))
        while not lease.outbox.empty():
            event = lease.outbox.get()
            assert isinstance(event, bytes), event
            self.responses.put(event)

    def _deliver(self) -> None:
        """Each worker's commands: serialized (coordinator), parsed and run (worker)."""
        for handle, host in zip(self.handles, self.hosts, strict=True):
            while not handle.outbox.empty():
                message = handle.outbox.get()
                assert isinstance(message, worker_pb2.CoordinatorMessage)
                data = self.coordinator.run(message.SerializeToString)
                self.worker.run(partial(_work, host, data))


def _work(host: LeaseHost, data: bytes) -> None:
    """A worker's part of a command: parse it, run it (the host thread's work)."""
    order = decode_lease_command(worker_pb2.CoordinatorMessage.FromString(data).lease)
    assert order is not None
    host._handle(order)


class _Call:
    """What grpcio's stream call would be: the responses, and cancel."""

    def __init__(self, fleet: _InMemoryFleet, requests: Iterator[bytes]) -> None:
        self._fleet = fleet
        self._thread = threading.Thread(target=fleet.serve, args=(requests,), daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._fleet.responses.get, None)

    def cancel(self) -> None:
        self._fleet.responses.put(None)


class _Channel:
    def __init__(self, fleet: _InMemoryFleet) -> None:
        self._fleet = fleet

    def stream_stream(self, *_: Any, **__: Any) -> Callable[[Iterator[bytes]], _Call]:
        return lambda requests: _Call(self._fleet, requests)

    def close(self) -> None:
        pass


class _Sampler(RemoteSampler):
    """A RemoteSampler whose channel is the in-memory fleet."""

    def __init__(self, fleet: _InMemoryFleet) -> None:  # no dialling
        self._fleet = fleet
        self.address = "in-memory"  # no LeaseOpened.data here: nothing dials it
        self.addresses = (self.address,)
        self._security = ClientSecurity()
        self._max_message_bytes = _rpc.DEFAULT_MAX_MESSAGE_BYTES

    def open_channel(self) -> Any:
        return _Channel(self._fleet)


def bare_steps_us(env: EnvConfig, calls: int, rounds: int) -> float:
    """CPU us of ENVS_PER_WORKER envs stepped in a plain loop, per call
    (numpy actions, as the workers get them; the least of ``rounds``)."""
    envs = [gym.make(env.id, **env.kwargs) for _ in range(ENVS_PER_WORKER)]
    for k, e in enumerate(envs):
        e.reset(seed=k)
    actions = list(np.zeros(ENVS_PER_WORKER, np.int64))
    best = np.inf
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            for e, action in zip(envs, actions, strict=True):
                _, _, terminated, truncated, _ = e.step(action)
                if terminated or truncated:
                    e.reset()
        best = min(best, 1e6 * (time.thread_time() - start) / calls)
    return float(best)


def measure(
    env: EnvConfig, calls: int, rounds: int, wait_num: int | None, profiled: str
) -> dict[str, float]:
    """CPU us per call of each part: the least of ``rounds`` rounds of
    ``calls`` calls (other processes' load only ever adds)."""
    fleet = _InMemoryFleet(env, profiled)
    venv = RemoteVectorEnv(_Sampler(fleet), env, NUM_ENVS, wait_num=wait_num, call_timeout=30)
    learner = cProfile.Profile() if profiled == "learner" else None
    best: dict[str, float] = {}
    ready = list(range(NUM_ENVS))

    def run(count: int) -> None:
        nonlocal ready
        for _ in range(count):
            actions = np.zeros(len(ready), np.int64)
            _, _, terminated, truncated, infos = venv.step(actions, id=ready)
            ready = [int(info["env_id"]) for info in infos]
            done = [i for i, end in zip(ready, terminated | truncated, strict=True) if end]
            if done:
                venv.reset(done)

    try:
        venv.reset(seed=list(range(NUM_ENVS)))
        run(calls // 5)  # warm-up
        for clock in (fleet.coordinator, fleet.worker):
            if clock.profile is not None:
                clock.profile = cProfile.Profile()
        for _ in range(rounds):
            fleet.coordinator.seconds = fleet.worker.seconds = 0.0
            relay = fleet.relay_seconds
            process = time.process_time()
            if learner is not None:
                learner.enable()
            run(calls)
            if learner is not None:
                learner.disable()
            total = time.process_time() - process
            relay = fleet.relay_seconds - relay
            part = {
                "learner": total - relay,
                "in-memory relay": relay - fleet.coordinator.seconds - fleet.worker.seconds,
                "coordinator": fleet.coordinator.seconds,
                "worker": fleet.worker.seconds / WORKERS,
            }
            for name, seconds in part.items():
                best[name] = min(best.get(name, np.inf), 1e6 * seconds / calls)
    finally:
        venv.close()
        fleet.close()
    profile = {
        "learner": learner,
        "coordinator": fleet.coordinator.profile,
        "worker": fleet.worker.profile,
    }.get(profiled)
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return best


def _pool_call_ms(count: int, calls: int) -> dict[str, float]:
    """Median ms per call of ``count`` 1 ms envs on one LeaseHost, whole and async."""
    out: queue.SimpleQueue[LeaseReport] = queue.SimpleQueue()
    host = LeaseHost(("rlfleet.envs.testing",), out.put)

    def order(**body: Any) -> Any:
        return decode_lease_command(leases_pb2.LeaseCommand(lease_id=1, **body))

    def answered() -> None:
        left = count
        while left > 0:
            report = out.get(timeout=30)
            if isinstance(report, LeaseAnswers):
                left -= len(report.answers)
            else:
                raise RuntimeError(f"the pool benchmark's envs failed: {report}")

    kwargs = json.dumps({"step_seconds": 0.001, "length": 10**9})
    env = updates_pb2.EnvUpdate(env_id="rlfleet/Slow-v0", kwargs_json=kwargs)
    figures = {}
    try:
        host.submit(order(create=leases_pb2.LeaseCreate(env=env, env_ids=range(count))))
        out.get(timeout=30)
        reset = leases_pb2.LeaseCall(call_id=1, op=leases_pb2.LEASE_OP_RESET, env_ids=range(count))
        host.submit(order(call=reset))
        answered()
        actions = encode_tensor(np.zeros(count, np.int64))
        call_ids = itertools.count(2)
        for name, whole in (("whole", True), ("async", False)):
            times = []
            for k in range(calls + 20):  # 20 first: the host learns the envs are slow
                call = leases_pb2.LeaseCall(
                    call_id=next(call_ids),
                    op=leases_pb2.LEASE_OP_STEP,
                    env_ids=range(count),
                    actions=actions,
                    whole_reply=whole,
                )
                start = time.perf_counter()
                host.submit(order(call=call))
                answered()
                if k >= 20:
                    times.append(time.perf_counter() - start)
            figures[name] = 1e3 * float(np.median(times))
    finally:
        host.shutdown()
    return figures


def _threads_ms(count: int, calls: int) -> float:
    """Median ms until ``count`` bare threads, released together, each slept 1 ms."""
    starts = [threading.Semaphore(0) for _ in range(count)]
    done: queue.SimpleQueue[None] = queue.SimpleQueue()

    def sleeper(start: threading.Semaphore) -> None:
        while True:
            start.acquire()
            time.sleep(0.001)
            done.put(None)

    for start in starts:
        threading.Thread(target=sleeper, args=(start,), daemon=True).start()
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        for start in starts:
            start.release()
        for _ in range(count):
            done.get()
        times.append(time.perf_counter() - began)
    return 1e3 * float(np.median(times))


def pool_figures(calls: int) -> None:
    """Prints the pool's figures (see the module docstring)."""
    sleeps = []
    for _ in range(calls):
        began = time.perf_counter()
        time.sleep(0.001)
        sleeps.append(time.perf_counter() - began)
    print(f"one time.sleep(0.001)            {1e3 * float(np.median(sleeps)):5.2f} ms")
    print(f"16 bare threads that sleep 1 ms  {_threads_ms(16, calls):5.2f} ms")
    pool = _pool_call_ms(16, calls)
    print(f"LeaseHost, 16 envs, whole reply  {pool['whole']:5.2f} ms per call")
    print(f"LeaseHost, 16 envs, as finished  {pool['async']:5.2f} ms per call")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each part's least counts")
    parser.add_argument("--profile", choices=("learner", "coordinator", "worker"), default="")
    parser.add_argument("--pool", action="store_true", help="the pool's figures instead")
    args = parser.parse_args(argv)
    if args.pool:
        pool_figures(args.calls)
        return 0
    env = EnvConfig("CartPole-v1")
    layout = f"{WORKERS} workers x {ENVS_PER_WORKER}"
    print(f"CPU us per call of {NUM_ENVS} CartPole envs ({layout}), no transport")
    for name, wait_num in (("sync", None), ("wait_num=8", 8)):
        profiled = args.profile if name == "sync" else ""
        part = measure(env, args.calls, args.rounds, wait_num, profiled)
        print(
            f"{name:<11} learner {part['learner']:6.0f}   coordinator {part['coordinator']:6.0f}   "
            f"worker {part['worker']:6.0f} each   (harness {part['in-memory relay']:4.0f})",
            flush=True,
        )
    steps = bare_steps_us(env, args.calls, args.rounds)
    print(f"env steps   {steps:6.0f} per worker call (8 bare env.step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
