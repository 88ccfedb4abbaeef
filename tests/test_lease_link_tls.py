"""A TLS data link used by two threads at once (rlfleet.transport.lease_channel).

A worker's stepping thread sends results on its data connection while its
data thread receives lease commands there, and a learner's lease sends
calls while another thread reads their replies. Over TLS both go through
one OpenSSL object, which must never be entered by two threads at once: a
real mTLS link on loopback, whose SSL socket records every thread inside
an SSL call, carries frames both ways at once, whole and in order, and no
SSL call starts while another thread's runs. A TLS send the peer does not
take fails at the send timeout, as over TCP.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from rlfleet.errors import RlfleetTimeoutError
from rlfleet.security import ClientTLS, ServerTLS
from rlfleet.transport.lease_channel import FRAME_HEADER, LeaseDataLink, frame
from tests.tls_fixtures import make_ca, make_cert
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

#: Frames each way: enough that sends and receives overlap many times.
FRAMES = 300
PAYLOAD_BYTES = 48 * 1024

#: The SSL socket calls that enter OpenSSL after the handshake.
_SSL_CALLS = ("recv", "recv_into", "read", "send", "sendall", "write", "pending")


class _Entries:
    """The threads inside an SSL call, and every time two were at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside: dict[int, int] = {}  # thread id: nesting depth
        self.overlaps: list[str] = []

    def enter(self, name: str) -> None:
        me = threading.get_ident()
        with self.lock:
            others = [thread for thread, depth in self.inside.items() if depth and thread != me]
            if others:
                self.overlaps.append(name)
            self.inside[me] = self.inside.get(me, 0) + 1

    def leave(self) -> None:
        with self.lock:
            self.inside[threading.get_ident()] -= 1


def _recording_class(entries: _Entries) -> type[ssl.SSLSocket]:
    """An SSLSocket class that reports each SSL call to ``entries``."""

    def recorded(name: str) -> Callable[..., Any]:
        original = getattr(ssl.SSLSocket, name)

        def call(self: ssl.SSLSocket, *args: Any, **kwargs: Any) -> Any:
            entries.enter(name)
            try:
                return original(self, *args, **kwargs)
            finally:
                entries.leave()

        return call

    return type("RecordingSSLSocket", (ssl.SSLSocket,), {n: recorded(n) for n in _SSL_CALLS})


def _payload(index: int) -> bytes:
    return index.to_bytes(4, "big") * (PAYLOAD_BYTES // 4)


@contextmanager
def _peer(server: ssl.SSLContext) -> Iterator[tuple[int, dict[str, Any]]]:
    """A TLS peer on loopback (asyncio: one thread, its SSL object never shared):
    sends :data:`FRAMES` frames to the one connection it accepts while it reads
    everything that connection sends, until it ends."""
    seen: dict[str, Any] = {"bytes": bytearray(), "done": threading.Event()}
    ready: dict[str, Any] = {}
    started = threading.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def drain() -> None:
            while chunk := await reader.read(1 << 16):
                seen["bytes"] += chunk

        draining = asyncio.create_task(drain())
        for index in range(FRAMES):
            writer.write(frame(_payload(index)))
            await writer.drain()
        await draining
        writer.close()
        seen["done"].set()

    def run() -> None:
        loop = asyncio.new_event_loop()
        listener = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0, ssl=server))
        ready["loop"], ready["port"] = loop, listener.sockets[0].getsockname()[1]
        started.set()
        loop.run_forever()
        listener.close()
        loop.run_until_complete(listener.wait_closed())
        loop.close()

    thread = threading.Thread(target=run, name="tls-peer", daemon=True)
    thread.start()
    wait_until(started.is_set, "the TLS peer to listen")
    try:
        yield ready["port"], seen
    finally:
        ready["loop"].call_soon_threadsafe(ready["loop"].stop)
        thread.join(30)


def _frames(data: bytes) -> list[bytes]:
    found, at = [], 0
    while at < len(data):
        (length,) = FRAME_HEADER.unpack_from(data, at)
        found.append(data[at + FRAME_HEADER.size : at + FRAME_HEADER.size + length])
        at += FRAME_HEADER.size + length
    return found


def _mtls() -> tuple[ServerTLS, ClientTLS]:
    ca = make_ca()
    server_pair, client_pair = make_cert(ca, "coordinator"), make_cert(ca, "w", client=True)
    server = ServerTLS(server_pair.cert_pem, server_pair.key_pem, client_ca=ca.cert_pem)
    return server, ClientTLS(ca.cert_pem, client_pair.cert_pem, client_pair.key_pem)


@pytest.mark.parametrize("reader", ["receive", "receive_within", "receive_message"])
def test_a_tls_link_never_enters_openssl_from_two_threads(reader: str) -> None:
    server, client = _mtls()
    entries = _Entries()
    context = client.ssl_context()
    context.sslsocket_class = _recording_class(entries)
    with _peer(server.ssl_context()) as (port, seen):
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock = context.wrap_socket(raw, server_hostname="localhost")
        sock.settimeout(None)
        link = LeaseDataLink(sock, 1 << 20)
        link.set_send_timeout(30)
        received: list[bytes] = []
        receive: Callable[[], bytes | bytearray | memoryview | None] = {
            "receive": link.receive,
            "receive_within": lambda: link.receive_within(30),
            "receive_message": lambda: link.receive_message(30),
        }[reader]

        def read_all() -> None:
            while len(received) < FRAMES and (payload := receive()) is not None:
                received.append(bytes(payload))

        receiving = threading.Thread(target=read_all, name="receiver")
        receiving.start()
        try:
            for index in range(0, FRAMES, 3):  # results: several frames per send
                link.send_frames([_payload(i) for i in range(index, min(index + 3, FRAMES))])
            link.send(b"last")
            receiving.join(60)
            assert not receiving.is_alive()
        finally:
            link.close()
        wait_until(seen["done"].is_set, "the peer to read the link's end")
    assert entries.overlaps == []
    assert received == [_payload(i) for i in range(FRAMES)]
    assert _frames(bytes(seen["bytes"])) == [*(_payload(i) for i in range(FRAMES)), b"last"]


@pytest.mark.timeout(60)
def test_a_tls_send_the_peer_does_not_take_fails_at_the_send_timeout() -> None:
    # The worker writes results from its stepping thread: a coordinator that
    # stops reading must not block it for ever, over TLS as over TCP.
    server, client = _mtls()
    held: list[ssl.SSLSocket] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def accept() -> None:  # completes the handshake, then never reads
            accepted, _ = listener.accept()
            held.append(server.ssl_context().wrap_socket(accepted, server_side=True))

        threading.Thread(target=accept, daemon=True).start()
        raw = socket.create_connection(listener.getsockname(), timeout=30)
        sock = client.ssl_context().wrap_socket(raw, server_hostname="localhost")
        sock.settimeout(None)
        link = LeaseDataLink(sock, 1)
        try:
            link.set_send_timeout(0.2)
            with pytest.raises(RlfleetTimeoutError, match=r"0\.2 seconds \(the send timeout\)"):
                for _ in range(1000):  # far more than the socket buffers hold
                    link.send_frames([bytes(1 << 20)])
        finally:
            link.close()
            for peer in held:
                peer.close()
