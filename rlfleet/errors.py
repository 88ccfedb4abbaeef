"""The rlfleet exception hierarchy.

Every error rlfleet raises on purpose derives from :class:`RlfleetError`, so
a learner can catch one type. Errors that are also misuse of a value derive
from ``ValueError`` too (garage raises ``ValueError`` for bad batches, and
users' code catches that). gRPC status codes are mapped to these classes at
the boundary (``rlfleet.client`` and the worker), never shown raw.

Messages say what was wrong, where, and what to do about it.
"""

from __future__ import annotations

#: What separates an error's message from the traceback a peer sent with it.
REMOTE_TRACEBACK = "\n--- remote traceback ---\n"


class RlfleetError(Exception):
    """Base class of every error rlfleet raises on purpose."""


class InvalidBatchError(RlfleetError, ValueError):
    """An EpisodeBatch or TimeStepBatch was built from inconsistent arrays."""


class WireFormatError(RlfleetError, ValueError):
    """Bytes from the wire do not form a valid rlfleet message.

    Raised for byte lengths that do not match dtype and shape, unknown
    dtypes, truncated varints, missing or out-of-order chunks, and the like.
    """


class ConfigError(RlfleetError, ValueError):
    """A user-supplied setting (env id, kwargs, policy spec, flag) is invalid."""


class EnvNotFoundError(ConfigError):
    """No gymnasium env is registered under the requested id."""


class InvalidValueError(RlfleetError, ValueError):
    """An argument's value is outside what the function takes (a negative
    seed, a discount outside [0, 1], env ids that repeat, ...).

    Also a ``ValueError``, as garage's and tianshou's own checks raise. Not to
    be confused with :class:`InvalidArgumentError`, the coordinator's refusal
    of a request on the wire.
    """


class WrongTypeError(RlfleetError, TypeError):
    """A value of the wrong type was given, or an object was used in a way its
    type refuses (a Token pickled).

    Also a ``TypeError``, as Python's own type checks raise (and as
    ``json.dumps``' ``default`` hook must raise).
    """


class OutOfRangeError(RlfleetError, IndexError):
    """An index (an env id, an array axis) is out of range.

    Also an ``IndexError``, as tianshou's vector envs and numpy raise.
    """


class NotInstalledError(RlfleetError, ImportError):
    """A part rlfleet needs is not installed or not built (the compiled MLP
    kernel, ...). Also an ``ImportError``: it is raised while importing."""


class SnapshotError(ConfigError):
    """A snapshot cannot be restored (an unreadable file, a bad key or tensor).

    The message names the file and the key; a refused restore changed nothing.
    """


class PolicyIdError(ConfigError, KeyError):
    """A policy id a RolloutWorker does not have, or has already (RLlib raises KeyError)."""

    __str__ = BaseException.__str__  # the message as written, not KeyError's repr of it


class BatchKeyError(RlfleetError, KeyError):
    """A key a batch read like RLlib's SampleBatch does not have."""

    __str__ = BaseException.__str__


class PolicyError(RlfleetError, ValueError):
    """A policy produced bad actions or was given parameters it cannot take."""


class UsageError(RlfleetError, RuntimeError):
    """An object was used out of order (a closed env, a shut-down worker, ...)."""


class InternalError(RlfleetError, RuntimeError):
    """rlfleet broke one of its own invariants: a bug. Report it with the message."""


class NotSetupError(UsageError):
    """A Trainer was used before ``setup()`` (or resumed before ``restore()``)."""


class InvalidArgumentError(RlfleetError, ValueError):
    """The coordinator refused a request as malformed (gRPC INVALID_ARGUMENT)."""


class ProtocolError(RlfleetError):
    """A peer broke the protocol (wrong version, unexpected message, ...)."""


class RlfleetTimeoutError(RlfleetError, TimeoutError):
    """A blocking call ran past its timeout. The message says how many seconds."""


class NoWorkersError(RlfleetTimeoutError):
    """A request waited for workers to join and none (or too few) came."""


class UnavailableError(RlfleetError):
    """The coordinator cannot be reached or went away. Safe to retry."""

    retryable = True


class ConnectionClosedError(RlfleetError, ConnectionError):
    """A connection was closed by either side before a frame could be sent.

    Also a ``ConnectionError`` (an ``OSError``), as a socket raises: the
    in-process lease data link and a TCP one fail alike.
    """


class CoordinatorRestartedError(UnavailableError):
    """The coordinator restarted since the learner pushed its env and agent to it.

    ``RemoteSampler`` handles it itself (it restores the env and agent, then
    retries); other clients see it when their call names an old coordinator.
    """


class AuthenticationError(RlfleetError):
    """The call carried no valid credentials (gRPC UNAUTHENTICATED)."""


class PermissionDeniedError(RlfleetError):
    """The credentials are valid but their role may not make this call."""


class ResourceExhaustedError(RlfleetError):
    """A limit was hit: message size, worker count, in-flight bytes, ..."""


class WorkerError(RlfleetError):
    """Something failed on a worker; names the worker, env index, step and episode.

    Attributes:
        worker: The worker's name (or id) where the error happened.
        env_index: Index of the env slot on that worker, or None.
        step: Step number within the episode, or None.
        episode_index: The episode's index in the request's answer, or None.
        remote_traceback: The original traceback text, when the worker sent it.
        bare_message: The message without the location and traceback (what
            travels in ``ErrorDetail.message``, next to the location fields).
    """

    def __init__(
        self,
        message: str,
        *,
        worker: str | None = None,
        env_index: int | None = None,
        step: int | None = None,
        episode_index: int | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        self.worker = worker
        self.env_index = env_index
        self.step = step
        self.episode_index = episode_index
        self.remote_traceback = remote_traceback
        self.bare_message = message
        where = []
        if worker is not None:
            where.append(f"worker {worker!r}")
        if env_index is not None:
            where.append(f"env {env_index}")
        if step is not None:
            where.append(f"step {step}")
        if episode_index is not None:
            where.append(f"episode {episode_index}")
        text = f"{message} ({', '.join(where)})" if where else message
        if remote_traceback:
            text = f"{text}{REMOTE_TRACEBACK}{remote_traceback.rstrip()}"
        super().__init__(text)


class EnvError(WorkerError):
    """An environment raised (in reset or step) beyond its restart budget."""


class VectorEnvError(RlfleetError):
    """A vector env's member crashed or hung; names the env index."""

    def __init__(self, message: str, *, env_index: int) -> None:
        self.env_index = env_index
        super().__init__(f"env {env_index}: {message}")


__all__ = [
    "REMOTE_TRACEBACK",
    "AuthenticationError",
    "BatchKeyError",
    "ConfigError",
    "ConnectionClosedError",
    "EnvError",
    "EnvNotFoundError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidBatchError",
    "InvalidValueError",
    "NoWorkersError",
    "NotInstalledError",
    "NotSetupError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PolicyError",
    "PolicyIdError",
    "ProtocolError",
    "ResourceExhaustedError",
    "RlfleetError",
    "RlfleetTimeoutError",
    "SnapshotError",
    "UnavailableError",
    "UsageError",
    "VectorEnvError",
    "WireFormatError",
    "WorkerError",
    "WrongTypeError",
]
