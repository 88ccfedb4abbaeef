"""A plaintext HTTP port serving Prometheus ``/metrics`` (``--metrics-listen``).

One thread serves every connection: a ``selectors`` loop reads requests
without blocking, answers each whole one with prometheus_client's WSGI app
(the text or OpenMetrics format, gzip when asked) and closes the
connection. Anyone who reaches the port can open connections that never
finish their request: they cost no thread, each is closed
:data:`REQUEST_SECONDS` after it opened, and past :data:`MAX_CONNECTIONS`
the oldest is closed to make room, so a real scrape still gets through.
"""

from __future__ import annotations

import contextlib
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from rlfleet.cli._health_port import split_listen
from rlfleet.errors import ConfigError

logger = logging.getLogger("rlfleet.metrics")

#: Seconds a connection has to send its request and read the answer.
REQUEST_SECONDS = 10.0
#: Connections open at once; a new one past this closes the oldest.
MAX_CONNECTIONS = 64
#: Longest request head read (a scrape's is a few hundred bytes).
_MAX_REQUEST_BYTES = 16 * 1024
_READ_BYTES = 4096


class _Connection:
    """One client: what it sent so far, what is left to send, its deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.received = bytearray()
        self.reply = b""


class MetricsPort:
    """Serves a registry's metrics at ``http://HOST:PORT/metrics``.

    Args:
        listen: ``HOST:PORT`` to bind (port 0 picks a free one).
        registry: The metrics to serve.

    Raises:
        ConfigError: The address is malformed or cannot be bound.
    """

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        host, port = split_listen(listen, "--metrics-listen", "Prometheus metrics")
        bind = host.strip("[]")
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((bind, port))
            self._listener.listen(128)
        except OSError as exc:
            self._listener.close()
            raise ConfigError(
                f"cannot serve metrics on {listen}: {exc.strerror or exc}; pick another "
                "--metrics-listen port (each process on a host needs its own)"
            ) from exc
        self._listener.setblocking(False)
        self._app = make_wsgi_app(registry)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        # Insertion order is age order: the first is the oldest.
        self._connections: dict[socket.socket, _Connection] = {}
        self._stopping = threading.Event()
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://{host}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._run, name="rlfleet-metrics", daemon=True)
        self._thread.start()
        logger.info("serving Prometheus metrics on %s", self.url)

    def stop(self) -> None:
        """Stops serving (closes the port and every connection)."""
        self._stopping.set()
        with contextlib.suppress(OSError):  # not connected: the close below still counts
            self._listener.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5.0)

    # --- the loop (its own thread) -----------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                events = self._selector.select(timeout=self._wait())
                for key, mask in events:
                    try:
                        if key.fileobj is self._listener:
                            self._accept()
                        else:
                            self._serve(self._connections[key.fileobj], mask)  # type: ignore[index]
                    except KeyError:
                        pass  # closed earlier in this round
                    except Exception:  # one scrape's bug must not stop the port
                        logger.exception("the metrics port failed on one connection; going on")
                        self._close(key.fileobj)  # type: ignore[arg-type]
                self._expire()
        finally:
            for sock in list(self._connections):
                self._close(sock)
            self._selector.close()
            self._listener.close()

    def _wait(self) -> float:
        """Seconds until the oldest connection's deadline (at most one)."""
        if not self._connections:
            return 1.0
        oldest = next(iter(self._connections.values()))
        return min(1.0, max(0.0, oldest.deadline - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            if len(self._connections) >= MAX_CONNECTIONS:
                self._close(next(iter(self._connections)))
            sock.setblocking(False)
            self._connections[sock] = _Connection(sock, time.monotonic() + REQUEST_SECONDS)
            self._selector.register(sock, selectors.EVENT_READ)

    def _expire(self) -> None:
        now = time.monotonic()
        for sock, connection in list(self._connections.items()):
            if connection.deadline > now:
                break  # deadlines follow age order
            self._close(sock)

    def _serve(self, connection: _Connection, mask: int) -> None:
        if mask & selectors.EVENT_READ and not connection.reply:
            try:
                data = connection.sock.recv(_READ_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(connection.sock)
                return
            connection.received += data
            head_end = connection.received.find(b"\r\n\r\n")
            if head_end < 0:
                if len(connection.received) > _MAX_REQUEST_BYTES:
                    connection.reply = _reply("431 Request Header Fields Too Large", [], b"")
                    self._selector.modify(connection.sock, selectors.EVENT_WRITE)
                return
            connection.reply = self._answer(bytes(connection.received[:head_end]))
            self._selector.modify(connection.sock, selectors.EVENT_WRITE)
        if connection.reply:
            try:
                sent = connection.sock.send(connection.reply)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                sent = len(connection.reply)  # the client left: nothing more to send
            connection.reply = connection.reply[sent:]
            if not connection.reply:
                self._close(connection.sock)

    def _answer(self, head: bytes) -> bytes:
        """The whole HTTP response to a request head, from the WSGI app."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _reply("400 Bad Request", [], b"")
        method, target, _ = parts
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": "rlfleet",
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": io.StringIO(),
            "wsgi.url_scheme": "http",
        }
        for line in lines[1:]:
            name, _, value = line.partition(":")
            environ["HTTP_" + name.strip().upper().replace("-", "_")] = value.strip()
        answer: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
            answer[:] = [status, headers]

        body = b"".join(self._app(environ, start_response))
        status, headers = answer
        return _reply(status, headers, body)

    def _close(self, sock: socket.socket) -> None:
        self._connections.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):  # never registered or gone
            self._selector.unregister(sock)
        sock.close()


def _reply(status: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """An HTTP/1.1 response that closes its connection."""
    fields = [
        (name, value)
        for name, value in headers
        if name.lower() not in ("content-length", "connection")
    ]
    fields += [("Content-Length", str(len(body))), ("Connection", "close")]
    head = "".join(f"{name}: {value}\r\n" for name, value in fields)
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode("latin-1") + body
