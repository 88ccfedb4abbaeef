"""The coordinator's data loop per frame, on one thread: ``python -m benchmarks.data_loop``.

A worker's result frames cross a real loopback TCP connection into a
:class:`~rlfleet.coordinator.leases.data_connections.DataConnection` of a
real :class:`~rlfleet.coordinator.leases.data_server.LeaseDataServer`, whose
loop step (``_serve``: the reads, the frame cutting, the worker's peer and
the hand-off to its result lane) this thread runs itself, once the sender's
bytes of each burst wait on the socket: the case of a loop behind its
workers. The lane's thread takes the frames and refuses them (they are not
result messages), so that only the loop's work is measured here.

Prints, per frame, the loop step's thread CPU (``time.thread_time_ns``) and
the loop's reads. Its instructions are the steadiest A/B on a shared machine:
run it under ``valgrind --tool=callgrind --separate-threads=yes`` with two
``--frames`` values and take the difference of the main thread's totals.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any, cast

from rlfleet.coordinator.leases.data_connections import DataConnection
from rlfleet.coordinator.leases.data_peers import WorkerDataPeer
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.coordinator.leases.result_lane import ResultLane
from rlfleet.security.limits import InflightBudget
from rlfleet.transport.lease_channel import frame


class CountedReads:
    """A connection's socket, counting the loop's reads (``recv_into``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0

    def recv_into(self, *args: Any) -> int:
        self.reads += 1
        return self.sock.recv_into(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Refusing:
    """A worker's events that drop nothing (the lane refuses the frames)."""

    def drop(self, *args: object) -> None:
        pass


def run(frames: int, size: int, burst: int) -> tuple[float, float]:
    """The loop step's thread CPU (us) and reads per frame, over ``frames``
    frames of ``size`` bytes sent ``burst`` at a time."""
    server = LeaseDataServer(
        "127.0.0.1:0",
        tls=None,
        max_frame_bytes=64 << 20,
        handshake_timeout=5.0,
        parse_hello=lambda hello: hello,
    )
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    listener.close()
    for sock in (sender, receiver):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    receiver.setblocking(False)
    connection = DataConnection(receiver, server, "bench", 1 << 30)
    counted = CountedReads(receiver)
    connection._sock = cast(socket.socket, counted)
    handle: Any = SimpleNamespace(
        name="bench",
        inflight=InflightBudget(1 << 40, "bench"),
        alive=True,
        touch=lambda: None,
        hello=SimpleNamespace(capabilities=()),  # heartbeats come on its Join stream
    )
    events: Any = _Refusing()
    lane = ResultLane(events, handle, threading.Event(), 1 << 40, lambda reason: None)
    state: Any = SimpleNamespace()
    connection.peer = WorkerDataPeer(
        state, events, cast(Any, None), handle, lambda *args: None, results=lane
    )
    data = frame(b"\x12" + os.urandom(size - 1)) * burst
    waiting = selectors.DefaultSelector()
    waiting.register(receiver, selectors.EVENT_READ)
    cpu = 0
    try:
        for _ in range(frames // burst):
            sender.sendall(data)
            while True:
                waiting.select()
                start = time.thread_time_ns()
                server._serve(connection, selectors.EVENT_READ)
                cpu += time.thread_time_ns() - start
                if connection._body is None and not connection._head:
                    break
        if connection.closed:
            raise RuntimeError("the loop closed the connection")
    finally:
        handle.alive = False
        lane.close()
        waiting.close()
        sender.close()
        server.stop()
    count = frames // burst * burst
    return cpu / count / 1000, counted.reads / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--size", type=int, default=395_000, help="bytes per frame")
    parser.add_argument("--burst", type=int, default=1, help="frames sent per write")
    args = parser.parse_args()
    cpu, reads = run(args.frames, args.size, args.burst)
    print(
        f"{args.frames} frames of {args.size} bytes, {args.burst} per write: "
        f"{cpu:.2f} us of the loop's CPU and {reads:.2f} reads per frame"
    )


if __name__ == "__main__":
    main()
