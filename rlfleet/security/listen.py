"""Where the coordinator listens, and the warning when that exposes it.

The default address is loopback: listening on a network is a deliberate
choice, and doing it without TLS or without tokens gets one loud warning
paragraph at start-up (logging.WARNING), not a refusal, because a private
network behind a NetworkPolicy is a legitimate place for a plaintext fleet.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket

logger = logging.getLogger("rlfleet.security")

#: The host the coordinator listens on unless told otherwise.
DEFAULT_HOST = "127.0.0.1"

_LOCAL_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
# gRPC target prefixes that may come before HOST:PORT on the client side.
_TARGET_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")


def is_loopback(address: str) -> bool:
    """Whether a listen address or a dial target stays on this host.

    ``unix:`` sockets, ``localhost`` and loopback IPs do; wildcards
    (``0.0.0.0``, ``[::]``) and every other name or IP do not. Names are not
    resolved: a name that happens to resolve to loopback counts as remote,
    which errs on the side of warning.
    """
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in _TARGET_SCHEMES:
        if address.startswith(scheme):
            address = address[len(scheme) :]
            break
    host, sep, port = address.rpartition(":")
    # A bare host ("::1", "localhost") or HOST:PORT.
    hosts = (address, host) if sep and port.isdigit() else (address,)
    return any(_is_local_host(candidate) for candidate in hosts)


def _is_local_host(host: str) -> bool:
    host = host.removeprefix("[").removesuffix("]").lower()
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(address: str, *, tls: bool, authenticated: bool) -> str | None:
    """The warning for a coordinator on ``address``, or None if there is nothing to say."""
    if is_loopback(address) or (tls and authenticated):
        return None
    missing = [
        what
        for what, present in (
            ("TLS (--tls-cert/--tls-key)", tls),
            ("tokens (--worker-token-file/--learner-token-file)", authenticated),
        )
        if not present
    ]
    consequences = []
    if not authenticated:
        consequences.append(
            "anyone who can reach this port can join as a worker, read every sample and "
            "push agent and env updates to every worker"
        )
    if not tls:
        consequences.append(
            "traffic (samples, parameters"
            + (", and the tokens themselves" if authenticated else "")
            + ") crosses the network in plaintext"
        )
    return (
        f"SECURITY: the coordinator listens on {address}, which is reachable from other "
        f"hosts, without {' and without '.join(missing)}: {'; and '.join(consequences)}. "
        "Do this only on a network you trust completely (e.g. a Kubernetes NetworkPolicy "
        f"that admits only your pods); otherwise listen on {DEFAULT_HOST} or configure "
        "TLS and tokens as docs/security.md describes."
    )


def warn_if_exposed(address: str, *, tls: bool, authenticated: bool) -> bool:
    """Logs :func:`exposure_warning` at WARNING if there is one; returns whether it did."""
    message = exposure_warning(address, tls=tls, authenticated=authenticated)
    if message is not None:
        logger.warning("%s", message)
    return message is not None


def plaintext_token_warning(target: str) -> str | None:
    """The warning for sending a token without TLS to ``target``, or None on loopback."""
    if is_loopback(target):
        return None
    return (
        f"SECURITY: sending a bearer token to {target} without TLS: anyone on the network "
        "path can read it and then call the coordinator with this token's role. Configure "
        "TLS (--tls-ca, tls_ca=...) as docs/security.md describes, or use this only on a "
        "network you trust completely."
    )


def bind_problem(address: str) -> str | None:
    """Why a TCP ``HOST:PORT`` cannot be listened on now (e.g. "Address already
    in use"), or None when it can, or when only gRPC can tell (port 0, names
    that do not resolve, ``unix:`` addresses).

    Checked before gRPC binds, so that a taken port is named in one clear
    line: gRPC's own failure is a raw C-core log line and a vague error.
    Like gRPC's, the probe sets SO_REUSEADDR, so only a listening socket
    counts, not the TIME_WAIT of a previous run; and like gRPC, one address
    of a name that binds is enough.
    """
    from rlfleet._util.values import host_and_port  # numpy: not on the CLI's flag-building path

    parsed = host_and_port(address)
    if parsed is None or parsed[1] == 0:
        return None
    host, port = parsed
    try:
        found = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return None
    problem = None
    for family, kind, proto, _, sockaddr in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
                probe.listen(1)
            except OSError as exc:
                if problem is None or exc.errno == errno.EADDRINUSE:
                    problem = exc.strerror or str(exc)
                continue
        return None
    return problem
