"""A plaintext HTTP port serving Prometheus ``/metrics`` (``--metrics-listen``).

prometheus_client's own server: one daemon thread, the text exposition
format, and nothing else on the port.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

from rlfleet.cli._health_port import split_listen
from rlfleet.errors import ConfigError

logger = logging.getLogger("rlfleet.metrics")


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
        try:
            self._server, self._thread = start_http_server(port, addr=bind, registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {listen}: {exc.strerror or exc}; pick another "
                "--metrics-listen port (each process on a host needs its own)"
            ) from exc
        self.port = int(self._server.server_port)
        self.url = f"http://{host}:{self.port}/metrics"
        logger.info("serving Prometheus metrics on %s", self.url)

    def stop(self) -> None:
        """Stops serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
