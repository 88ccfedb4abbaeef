"""Where a data channel dials: the coordinator's host, read from the gRPC
target a learner or worker was given, and the one warning when that host's
data port is out of reach (its traffic then stays on gRPC).
"""

from __future__ import annotations

import logging

from rlfleet._util.log_limit import OncePerKey

logger = logging.getLogger("rlfleet.transport.lease_channel")

_unreachable = OncePerKey()


def coordinator_host(address: str) -> str:
    """The host of a gRPC target ``HOST:PORT`` (``[::1]:50051`` gives ``::1``;
    a ``dns:``/``ipv4:`` scheme prefix is dropped)."""
    target = address.split("///", 1)[-1]
    if target.startswith(("ipv4:", "ipv6:", "dns:")):
        target = target.split(":", 1)[1]
    host = target.rpartition(":")[0] if target.count(":") == 1 or "]" in target else target
    return host.strip("[]") or "127.0.0.1"


def warn_unreachable(host: str, port: int, who: str, reason: str) -> None:
    """Logs once per process and address that the data channel is out of reach."""
    key = f"{host}:{port}"
    if not _unreachable.first(key):
        return
    logger.warning(
        "%s cannot use the lease data channel at %s (%s); its traffic stays on gRPC, which "
        "is several times slower. Open TCP port %d of the coordinator to this host (Service, "
        "NetworkPolicy, firewall, proxy) or start the coordinator with --lease-data-listen",
        who,
        key,
        reason,
        port,
    )
