"""The floor of a Python gRPC relay: ``python benchmarks/relay_floor.py [--rounds 2000]``.

A relay process serves two bidirectional streams, ``Join`` (a worker dials
in) and ``Lease`` (a learner dials in), and forwards every message of one
to the other, with no application logic at all: the least any relay built
on grpcio, like the coordinator's lease relay, can cost. The worker echoes;
the learner measures the median round trip of a 300-byte message (about a
CartPole reply) and the relay process's CPU per round trip (psutil). It runs
the relay on grpcio's sync server (a thread per stream, as rlfleet's
coordinator) and on ``grpc.aio`` (one event loop), alternating, twice each.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import psutil

SERVICE = "bench.Relay"


def serve_sync() -> None:
    """The relay on grpcio's sync server; prints its port."""
    to_worker: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    to_learner: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def forward(requests: Iterator[bytes], out: queue.SimpleQueue[bytes]) -> None:
        try:
            for request in requests:
                out.put(request)
        except Exception:  # the peer went away at the end of a measurement
            return

    def stream(
        inbox: queue.SimpleQueue[bytes], outbox: queue.SimpleQueue[bytes]
    ) -> grpc.RpcMethodHandler:
        def handler(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            threading.Thread(target=forward, args=(requests, outbox), daemon=True).start()
            while True:
                yield inbox.get()

        return grpc.stream_stream_rpc_method_handler(handler)

    server = grpc.server(ThreadPoolExecutor(8))
    methods = {"Join": stream(to_worker, to_learner), "Lease": stream(to_learner, to_worker)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    server.wait_for_termination()


async def serve_aio() -> None:
    """The relay on grpc.aio; prints its port."""
    to_worker: asyncio.Queue[bytes] = asyncio.Queue()
    to_learner: asyncio.Queue[bytes] = asyncio.Queue()
    pumps: set[asyncio.Task[None]] = set()

    async def forward(requests: AsyncIterator[bytes], out: asyncio.Queue[bytes]) -> None:
        async for request in requests:
            out.put_nowait(request)

    def stream(inbox: asyncio.Queue[bytes], outbox: asyncio.Queue[bytes]) -> grpc.RpcMethodHandler:
        async def handler(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            pumps.add(asyncio.ensure_future(forward(requests, outbox)))
            while True:
                yield await inbox.get()

        return grpc.stream_stream_rpc_method_handler(handler)

    server = grpc.aio.server()
    methods = {"Join": stream(to_worker, to_learner), "Lease": stream(to_learner, to_worker)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()


def round_trips(port: int, rounds: int) -> list[float]:
    """An echoing worker and a learner through the relay; the learner's round trips."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    to_relay: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    join = channel.stream_stream(f"/{SERVICE}/Join", None, None)(iter(to_relay.get, None))

    def echo() -> None:
        try:
            for message in join:
                to_relay.put(message)
        except grpc.RpcError:
            pass  # the relay was stopped

    threading.Thread(target=echo, daemon=True).start()
    to_relay.put(b"ready")  # relayed to the learner once its stream is open
    answers = iter(channel.stream_stream(f"/{SERVICE}/Lease", None, None)(iter(requests.get, None)))
    next(answers)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        requests.put(b"x" * 300)
        next(answers)
        times.append(time.perf_counter() - start)
    to_relay.put(None)
    requests.put(None)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000, help="round trips per figure")
    parser.add_argument("--serve", choices=("sync", "aio"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "sync":
        serve_sync()
        return 0
    if args.serve == "aio":
        asyncio.run(serve_aio())
        return 0
    for kind in ("sync", "aio", "sync", "aio"):
        relay = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE, text=True
        )
        try:
            assert relay.stdout is not None
            port = int(relay.stdout.readline())
            cpu = psutil.Process(relay.pid)
            before = sum(cpu.cpu_times()[:2])
            times = round_trips(port, args.rounds)
            spent = 1e6 * (sum(cpu.cpu_times()[:2]) - before) / args.rounds
        finally:
            relay.terminate()
            relay.wait(10)
        median = 1000 * float(np.median(times[args.rounds // 10 :]))
        print(f"{kind:<5} relay: round trip {median:.2f} ms median, relay CPU {spent:.0f} us each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
