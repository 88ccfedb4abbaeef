"""A plaintext grpc.health.v1 server on its own port (``--health-listen``).

Kubernetes' gRPC probes take a numeric port and cannot speak TLS, and
Docker's HEALTHCHECK runs ``rlfleet health`` inside the container: both
need health checking on a port of its own, in plaintext, whatever the main
port does. The port serves only the health service.

The coordinator shares its main port's health servicer with this port, so
both report the same statuses. A worker has no server of its own; its
statuses are computed from probes (joined with a live main loop for the
whole server, a live main loop for :data:`LIVENESS_SERVICE`), refreshed on
every Check and once a second for Watch streams.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet._util.values import host_and_port
from rlfleet.errors import ConfigError
from rlfleet.security.listen import bind_problem

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

#: A worker's service for liveness probes: SERVING while its main loop runs,
#: connected or reconnecting. Kubernetes should restart a stuck worker, not
#: one that waits for a coordinator being replaced ("" covers that).
LIVENESS_SERVICE = "liveness"

#: How often a probed servicer refreshes its status for Watch streams.
_REFRESH_SECONDS = 1.0


class ProbedHealthServicer(health.HealthServicer):
    """Health computed from probes: the whole server ("") and named services.

    Args:
        probe: The status of the whole server (service ""): True while
            the process is healthy.
        services: More services, each with its own probe (e.g. a worker's
            :data:`LIVENESS_SERVICE`, which stays SERVING while it
            reconnects).

    Probes are called on every Check and once a second; they must be cheap
    and thread-safe. A probe that raises counts as unhealthy.
    """

    def __init__(
        self,
        probe: Callable[[], bool],
        services: Mapping[str, Callable[[], bool]] | None = None,
    ) -> None:
        super().__init__()
        self._probes = {"": probe, **(services or {})}
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(
            target=self._refresh_loop, name="rlfleet-health-probe", daemon=True
        )
        self._thread.start()

    def refresh(self) -> None:
        """Sets every service's status from its probe."""
        for service, probe in self._probes.items():
            try:
                healthy = bool(probe())
            except Exception:  # a failing probe means unhealthy, not a dead health port
                healthy = False
            self.set(service, SERVING if healthy else NOT_SERVING)

    def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        self.refresh()
        return super().Check(request, context)

    def close(self) -> None:
        """Stops the refresh thread."""
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(_REFRESH_SECONDS):
            self.refresh()


def split_listen(listen: str, flag: str, serves: str) -> tuple[str, int]:
    """Splits the ``HOST:PORT`` of a side port (health, metrics).

    Raises:
        ConfigError: If it is not ``HOST:PORT``; the message names ``flag``.
    """
    address = host_and_port(listen)
    if address is None:
        raise ConfigError(
            f"{flag} {listen!r} must be HOST:PORT, e.g. 0.0.0.0:50052 "
            f"(plaintext: it serves {serves} only)"
        )
    return address


class HealthPort:
    """A gRPC server answering only grpc.health.v1, in plaintext.

    Args:
        listen: ``HOST:PORT`` to bind (port 0 picks a free one).
        servicer: The health servicer to expose (shared with a main server,
            or a :class:`ProbedHealthServicer`).

    Raises:
        ConfigError: The address is malformed or cannot be bound.
    """

    def __init__(self, listen: str, servicer: health_pb2_grpc.HealthServicer) -> None:
        host = split_listen(listen, "--health-listen", "health checks")[0]
        taken = bind_problem(listen)  # before gRPC, whose own failure is a raw log line
        if taken is not None:
            raise ConfigError(
                f"cannot serve health on {listen}: {taken}; pick another --health-listen port "
                "(each process on a host needs its own)"
            )
        self._servicer = servicer
        # Probes are short unary calls; a few threads leave room for Watch
        # streams. No SO_REUSEPORT (gRPC's default): two processes sharing a
        # health port would answer each other's probes.
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="health"),
            options=[("grpc.so_reuseport", 0)],
        )
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self._server)
        cause: RuntimeError | None = None
        try:
            self._port = self._server.add_insecure_port(listen)
        except RuntimeError as exc:  # grpcio raises on some bind failures, returns 0 on others
            self._port, cause = 0, exc
        if not self._port:
            raise ConfigError(
                f"cannot serve health on {listen}: the address is in use or not local; "
                "pick another --health-listen port (each process on a host needs its own)"
            ) from cause
        self._server.start()
        self.listen = f"{host}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port."""
        return self._port

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops serving (and the probe thread of a ProbedHealthServicer)."""
        if isinstance(self._servicer, ProbedHealthServicer):
            self._servicer.close()
        self._server.stop(grace).wait()
