"""The pickle gate: no code over the wire unless both ends opted in.

Unpickling runs arbitrary code, so a pickled policy or env factory
(``AgentUpdate.pickled_policy``, ``EnvUpdate.pickled_env_factory``) is code
execution on every worker by whoever may push updates. rlfleet therefore
refuses them unless:

1. the coordinator was started with ``--allow-pickle`` (else the update is
   refused with PERMISSION_DENIED before any worker sees it),
2. every worker it goes to was started with ``--allow-pickle`` too and so
   announced the ``rlfleet.pickle`` capability (a worker refuses on its
   own, independently, if it was not), and
3. both ends run with TLS and tokens: ``--allow-pickle`` without them is a
   :class:`~rlfleet.errors.ConfigError` at start-up, so that only the
   holder of the learner token, over an authenticated, encrypted
   connection, can ever send code.

cloudpickle is installed with rlfleet (``SubprocVectorEnv`` pickles env
factories for its own children with it: a pipe to one's own child is no
trust boundary, see docs/security.md), but the network faces import it
only when pickling is allowed.

One exception to 1-3, also no trust boundary: the workers of an embedded
fleet (``Fleet.local``) accept pickled env factories for leases from their
parent, the process that runs their coordinator and learner
(:func:`embedded_child`). That coordinator relays only the factories its
own process registered in memory (``RemoteVectorEnv(env_fns, on=fleet)``),
never pickles from the network unless it was started with the flag.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rlfleet.errors import ConfigError, PermissionDeniedError, RlfleetError

#: The Hello/Welcome capability of a worker that accepts pickles.
PICKLE_CAPABILITY = "rlfleet.pickle"
FLAG = "--allow-pickle"
#: Set by Fleet.local in its workers' environment: the pid of the process
#: whose embedded coordinator they serve.
EMBEDDED_PARENT_ENV = "RLFLEET_EMBEDDED_PARENT"


def embedded_child(coordinator: str) -> bool:
    """Whether this worker is a child of the embedded fleet it dials (``Fleet.local``).

    True only for the direct child of the process named in
    ``RLFLEET_EMBEDDED_PARENT`` that dials a loopback address: that process
    holds the coordinator's port, and the parent's death ends the child.
    """
    from rlfleet.security.listen import is_loopback

    parent = os.environ.get(EMBEDDED_PARENT_ENV, "")
    return parent == str(os.getppid()) and is_loopback(coordinator)


def cloudpickle_module() -> ModuleType:
    """Imports cloudpickle.

    Raises:
        ConfigError: If it is not installed, saying how to install it.
    """
    try:
        return importlib.import_module("cloudpickle")
    except ImportError:
        raise ConfigError(
            f"{FLAG} needs the optional dependency cloudpickle, which is not installed: "
            "`pip install cloudpickle` on the learner, the coordinator's host and every worker"
        ) from None


def check_prerequisites(
    allow_pickle: bool, *, tls: bool, authenticated: bool, process: str
) -> None:
    """Refuses ``--allow-pickle`` without TLS and a token, or without cloudpickle.

    Args:
        allow_pickle: Whether the flag was given.
        tls: Whether the process serves (coordinator) or dials (worker) with TLS.
        authenticated: Whether tokens are configured (coordinator) or
            presented (worker).
        process: "coordinator" or "worker", for the message.

    Raises:
        ConfigError: Naming what is missing.
    """
    if not allow_pickle:
        return
    missing = [what for what, present in (("TLS", tls), ("a token", authenticated)) if not present]
    if missing:
        raise ConfigError(
            f"the {process} was started with {FLAG} but without {' and '.join(missing)}: "
            "pickled policies and env factories run arbitrary code on the workers, so they "
            "are only accepted over authenticated TLS connections. Configure TLS "
            "(--tls-cert/--tls-key, --tls-ca) and tokens as docs/security.md describes, or "
            f"drop {FLAG} and send policy specs and gymnasium ids instead"
        )
    cloudpickle_module()


@dataclass(frozen=True)
class PickleGate:
    """This process's side of the pickle gate.

    Attributes:
        allowed: Whether this process was started with ``--allow-pickle``
            (and so passed :func:`check_prerequisites`).
        process: "coordinator" or "worker", for messages.
    """

    allowed: bool = False
    process: str = "worker"

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Capabilities to announce: ``rlfleet.pickle`` only when allowed."""
        return (PICKLE_CAPABILITY,) if self.allowed else ()

    def check(self, field: str) -> None:
        """Refuses a message whose ``field`` holds pickle bytes, unless allowed here.

        Raises:
            PermissionDeniedError: If this process was not started with
                ``--allow-pickle``.
        """
        if not self.allowed:
            raise PermissionDeniedError(
                f"{field} is set, but pickled code is not accepted by this {self.process} "
                f"(it was not started with {FLAG}); send a policy spec and parameters or a "
                "gymnasium id instead (docs/security.md)"
            )

    def check_peers(self, field: str, capabilities: Mapping[str, Iterable[str]]) -> None:
        """Refuses to send ``field`` unless every peer announced ``rlfleet.pickle``.

        Args:
            field: The pickle field being sent, for the message.
            capabilities: Each peer's (worker's) name and capabilities.

        Raises:
            PermissionDeniedError: If this process is not allowed, or
                naming the workers that are not.
        """
        self.check(field)
        refusing = sorted(
            name for name, caps in capabilities.items() if PICKLE_CAPABILITY not in set(caps)
        )
        if refusing:
            shown = ", ".join(repr(name) for name in refusing[:10])
            more = f" and {len(refusing) - 10} more" if len(refusing) > 10 else ""
            raise PermissionDeniedError(
                f"{field} is set, but workers {shown}{more} were not started with {FLAG} "
                "and would refuse it; restart them with the flag or send no pickle"
            )

    def loads(self, data: bytes, field: str, error: type[RlfleetError]) -> Any:
        """Unpickles ``data`` after :meth:`check`.

        Args:
            data: The pickle bytes.
            field: Where they came from, for messages.
            error: The exception type for bytes that do not unpickle
                (e.g. PolicyError for a policy).

        Raises:
            PermissionDeniedError: If not allowed here.
            RlfleetError: ``error``, if the bytes do not unpickle (a
                missing module on this host, a different Python version).
        """
        self.check(field)
        module = cloudpickle_module()
        try:
            return module.loads(data)
        except Exception as exc:
            raise error(
                f"{field} does not unpickle here ({type(exc).__name__}: {exc}); the {self.process} "
                "needs the same Python version and packages as the learner that pickled it"
            ) from exc


def dumps(obj: object, field: str) -> bytes:
    """Pickles ``obj`` with cloudpickle (the learner's side).

    Args:
        obj: A policy or env factory; classes and functions defined in the
            learner's script travel by value.
        field: What it is for, for messages (``"AgentUpdate.pickled_policy"``).

    Raises:
        ConfigError: If cloudpickle is missing or ``obj`` cannot be pickled.
    """
    module = cloudpickle_module()
    try:
        return bytes(module.dumps(obj))
    except Exception as exc:
        raise ConfigError(f"{field}: cannot pickle {obj!r} ({type(exc).__name__}: {exc})") from exc
