"""``rlfleet health``: ask a grpc.health.v1 server whether a service is SERVING.

The container image's HEALTHCHECK runs it against the plaintext health port
that ``--health-listen`` opens on the coordinator and on workers, so the
image needs no separate probe binary. Exit code 0 iff the answer is
SERVING, 1 otherwise (NOT_SERVING, unknown service, no answer), which is
what Docker's HEALTHCHECK expects.
"""

from __future__ import annotations

import argparse
import sys

from rlfleet.cli._parser import add_command
from rlfleet.cli._settings import CommandSettings, PositiveFloat, option
from rlfleet.errors import ConfigError

#: The variable the image sets; ``--health-listen`` defaults to it too.
HEALTH_LISTEN_VARIABLE = "RLFLEET_HEALTH_LISTEN"

_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")


class HealthSettings(CommandSettings):
    """The options of ``rlfleet health``."""

    address: str | None = option(
        None,
        "HOST:PORT of the health port; a wildcard listen address such as 0.0.0.0:50052 is "
        "checked on loopback",
        env=HEALTH_LISTEN_VARIABLE,
    )
    service: str = option(
        "", "service to check, e.g. rlfleet.v1.LearnerService", shown='"", the whole server'
    )
    timeout: PositiveFloat = option(5.0, "seconds to wait for an answer")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``health`` subcommand."""
    add_command(
        subparsers,
        "health",
        HealthSettings,
        run,
        help="check a coordinator's or worker's health port (exit 0 iff SERVING)",
        description=(
            "Call grpc.health.v1.Health/Check on a plaintext health port (the one "
            "--health-listen opens) and exit 0 if the service is SERVING, 1 otherwise. "
            "Used by the container image's HEALTHCHECK."
        ),
    )


def dial_address(listen: str) -> str:
    """The address to dial for a server listening on ``listen``.

    A server bound to every interface (``0.0.0.0:P``, ``[::]:P``, ``:P``) is
    reached on loopback, so the image's listen setting doubles as the probe's
    target.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"health address {listen!r} must be HOST:PORT, e.g. 127.0.0.1:50052")
    if host in _WILDCARD_HOSTS:
        return f"127.0.0.1:{port}"
    return listen


def check(address: str, service: str = "", timeout: float = 5.0) -> str:
    """Asks the health server at ``address`` for ``service``'s status.

    Args:
        address: ``HOST:PORT`` of a plaintext grpc.health.v1 server.
        service: The service name ("" for the whole server).
        timeout: Seconds to wait for the answer.

    Returns:
        The status name (``SERVING``, ``NOT_SERVING``, ...), or a short
        description of why there was no answer (``NOT_FOUND``,
        ``UNAVAILABLE: ...``).
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            if code is grpc.StatusCode.NOT_FOUND:
                return "NOT_FOUND"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            return f"{code.name}: {details}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def run(args: argparse.Namespace) -> int:
    """Runs ``rlfleet health``; 0 iff SERVING."""
    if not args.address:
        print(
            f"rlfleet health: no address: pass --address HOST:PORT or set {HEALTH_LISTEN_VARIABLE}",
            file=sys.stderr,
        )
        return 1
    try:
        address = dial_address(args.address)
    except ValueError as exc:
        print(f"rlfleet health: {exc}", file=sys.stderr)
        return 1
    status = check(address, args.service, args.timeout)
    what = f"service {args.service!r}" if args.service else "server"
    print(f"{address} {what}: {status}")
    return 0 if status == "SERVING" else 1
