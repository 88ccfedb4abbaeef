"""The coordinator's server answers a worker's messages without BDP pings, on a fixed window.

A relay between a gRPC client and a server with the coordinator's options
(``rpc.server_options``) reads the HTTP/2 frames the server sends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from rlfleet.transport import rpc as _rpc

pytestmark = pytest.mark.timeout(60)

_FRAME_HEADER = 9
_SETTINGS, _PING = 0x4, 0x6
_ACK = 0x1
_INITIAL_WINDOW_SIZE = 0x4


class FrameRelay:
    """Forwards one connection to ``target`` and records the frames coming back.

    Args:
        target: The server's port on loopback.
    """

    def __init__(self, target: int) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        #: ``(type, flags, payload)`` of each frame the server sent, in order.
        self.frames: list[tuple[int, int, bytes]] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        server = socket.create_connection(("127.0.0.1", self._target))
        self._sockets += [client, server]
        threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
        self._pipe(server, client, True)

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        pending = b""
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
            except OSError:
                break
            if not record:
                continue
            pending += data
            while len(pending) >= _FRAME_HEADER:
                length = int.from_bytes(pending[:3], "big")
                if len(pending) < _FRAME_HEADER + length:
                    break
                frame_type, flags = pending[3], pending[4]
                self.frames.append((frame_type, flags, pending[9 : 9 + length]))
                pending = pending[_FRAME_HEADER + length :]
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


def _settings(payload: bytes) -> dict[int, int]:
    return {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
        for i in range(0, len(payload), 6)
    }


def test_a_stream_of_small_messages_draws_no_pings_from_the_server() -> None:
    # A BDP probe answers a message with a PING whose acknowledgement wakes
    # gRPC's threads a second time: per worker heartbeat, on the coordinator.
    received: list[bytes] = []

    def count(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for request in requests:
            received.append(request)
        yield b"done"

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=_rpc.server_options(keepalive_seconds=60.0),
    )
    method = grpc.stream_stream_rpc_method_handler(count)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Beats", {"Beat": method}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    relay = FrameRelay(port)
    channel = grpc.insecure_channel(
        f"127.0.0.1:{relay.port}", options=_rpc.channel_options(keepalive_seconds=60.0)
    )
    try:
        beat = channel.stream_stream(
            "/test.Beats/Beat", request_serializer=None, response_deserializer=None
        )

        def beats() -> Iterator[bytes]:
            for i in range(8):
                time.sleep(0.05)  # each its own read and its own answer
                yield bytes([i]) * 16

        assert list(beat(beats(), timeout=30)) == [b"done"]
        assert len(received) == 8
        time.sleep(0.2)  # whatever the server sent last has crossed the relay
        pings = [f for f in relay.frames if f[0] == _PING and not f[1] & _ACK]
        assert pings == []
        settings = [_settings(f[2]) for f in relay.frames if f[0] == _SETTINGS and not f[1] & _ACK]
        windows = [s[_INITIAL_WINDOW_SIZE] for s in settings if _INITIAL_WINDOW_SIZE in s]
        assert windows == [_rpc.SERVER_STREAM_WINDOW_BYTES]
    finally:
        channel.close()
        server.stop(None)
        relay.close()
