"""ErrorReport: a structured error as rlfleet's parts hand it to each other.

A worker reports what went wrong (an env that crashed, a refused update) as
an ``ErrorDetail`` (updates.proto); the coordinator charges it to a request
or an update and passes it on to the learner in its call's status, where
it becomes a typed exception. This module is that error in rlfleet's own
terms, and the two mappings between it and exceptions; the faces convert
it to and from the message (``rlfleet.wire.encode_error_report``).
"""

from __future__ import annotations

import dataclasses
import enum

from rlfleet import errors


class ErrorKind(enum.IntEnum):
    """What kind of error a report is (updates.proto ``ErrorKind``, same numbers)."""

    UNSPECIFIED = 0
    ENV_NOT_FOUND = 1  # no env registered under the id
    ENV_CONFIG = 2  # kwargs the env rejects, bad import
    ENV_CRASHED = 3  # env raised past its restart budget
    POLICY = 4  # bad parameters, bad actions, unknown spec
    NONFINITE = 5  # NaN or inf observation (error mode)
    PROTOCOL = 6  # a message that breaks this protocol
    VERSION = 7  # protocol version mismatch at handshake
    INTERNAL = 8  # a bug: report it
    PERMISSION = 9  # refused by policy (e.g. pickle not allowed)
    NO_WORKERS = 10  # no worker joined before the deadline
    LIMIT = 11  # a resource limit was hit
    COORDINATOR_RESTARTED = 40


def kind_name(kind: int) -> str:
    """The protocol's name of a kind, e.g. ``"ERROR_KIND_POLICY"``.

    Raises:
        ValueError: For a number this version does not define.
    """
    return f"ERROR_KIND_{ErrorKind(kind).name}"


def is_known_kind(kind: int) -> bool:
    """Whether this version defines ``kind`` (a newer peer may send others)."""
    return kind in ErrorKind._value2member_map_


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """An error with where it happened (updates.proto ``ErrorDetail``).

    Attributes:
        kind: An :class:`ErrorKind` value (an int: a newer peer may send
            kinds this version does not define).
        message: Human-readable, says what to do.
        worker: The worker's name ("" if none).
        env_index: The env slot, if the error is an env's.
        step: The step within the episode (1-based), if known.
        episode_index: The episode, if known.
        task_id: The task it belongs to (0: none).
        traceback: The original traceback text ("" if none).
        exception_type: E.g. ``"RuntimeError"``.
        env_generation: The env update it refuses, if it refuses one.
        agent_version: The agent update it refuses, if it refuses one.
    """

    kind: int
    message: str = ""
    worker: str = ""
    env_index: int | None = None
    step: int | None = None
    episode_index: int | None = None
    task_id: int = 0
    traceback: str = ""
    exception_type: str = ""
    env_generation: int | None = None
    agent_version: int | None = None


def describe_report(report: ErrorReport) -> str:
    """One-line text of a report: the message and where it happened."""
    where = []
    if report.worker:
        where.append(f"worker {report.worker!r}")
    if report.env_index is not None:
        where.append(f"env {report.env_index}")
    if report.step is not None:
        where.append(f"step {report.step}")
    if report.episode_index is not None:
        where.append(f"episode {report.episode_index}")
    text = report.message or kind_name(report.kind)
    return f"{text} ({', '.join(where)})" if where else text


# --- between reports and exceptions -------------------------------------------------

_KIND_TO_ERROR: dict[int, type[errors.RlfleetError]] = {
    ErrorKind.ENV_NOT_FOUND: errors.EnvNotFoundError,
    ErrorKind.COORDINATOR_RESTARTED: errors.CoordinatorRestartedError,
    ErrorKind.ENV_CONFIG: errors.ConfigError,
    ErrorKind.ENV_CRASHED: errors.EnvError,
    ErrorKind.NONFINITE: errors.EnvError,
    ErrorKind.POLICY: errors.PolicyError,
    ErrorKind.PROTOCOL: errors.ProtocolError,
    ErrorKind.VERSION: errors.ProtocolError,
    ErrorKind.PERMISSION: errors.PermissionDeniedError,
    ErrorKind.NO_WORKERS: errors.NoWorkersError,
    ErrorKind.LIMIT: errors.ResourceExhaustedError,
}

_ERROR_TO_KIND: list[tuple[type[BaseException], ErrorKind]] = [
    (errors.EnvNotFoundError, ErrorKind.ENV_NOT_FOUND),
    (errors.ConfigError, ErrorKind.ENV_CONFIG),
    (errors.EnvError, ErrorKind.ENV_CRASHED),
    (errors.PolicyError, ErrorKind.POLICY),
    (errors.ProtocolError, ErrorKind.PROTOCOL),
    (errors.WireFormatError, ErrorKind.PROTOCOL),
    (errors.PermissionDeniedError, ErrorKind.PERMISSION),
    (errors.NoWorkersError, ErrorKind.NO_WORKERS),
    (errors.ResourceExhaustedError, ErrorKind.LIMIT),
]


def report_of_exception(
    exc: BaseException,
    *,
    worker: str = "",
    task_id: int = 0,
    traceback_text: str = "",
    env_generation: int | None = None,
    agent_version: int | None = None,
) -> ErrorReport:
    """Describes an exception as an ErrorReport for a peer.

    Args:
        exc: The exception.
        worker: The worker's name, if not on the exception.
        task_id: The task the error belongs to (0: none).
        traceback_text: The traceback, if not on the exception.
        env_generation: The env update the error refuses, if it does.
        agent_version: The agent update the error refuses, if it does.
    """
    kind = next((k for cls, k in _ERROR_TO_KIND if isinstance(exc, cls)), ErrorKind.INTERNAL)
    env_index = getattr(exc, "env_index", None)
    step = getattr(exc, "step", None)
    episode_index = getattr(exc, "episode_index", None)
    return ErrorReport(
        kind=kind,
        # The bare message: the location travels in its own fields, and the
        # receiver's WorkerError adds it back once.
        message=str(getattr(exc, "bare_message", "") or exc).split(errors.REMOTE_TRACEBACK)[0],
        worker=worker or str(getattr(exc, "worker", "") or ""),
        env_index=None if env_index is None else int(env_index),
        step=None if step is None else int(step),
        episode_index=None if episode_index is None else int(episode_index),
        task_id=task_id,
        traceback=traceback_text or str(getattr(exc, "remote_traceback", "") or ""),
        exception_type=type(exc).__name__,
        env_generation=env_generation,
        agent_version=agent_version,
    )


def error_of_report(
    report: ErrorReport, default: type[errors.RlfleetError] = errors.WorkerError
) -> errors.RlfleetError:
    """Builds the typed exception a learner sees from a report."""
    cls = _KIND_TO_ERROR.get(report.kind, default)
    if issubclass(cls, errors.WorkerError):
        return cls(
            report.message,
            worker=report.worker or None,
            env_index=report.env_index,
            step=report.step,
            episode_index=report.episode_index,
            remote_traceback=report.traceback or None,
        )
    text = report.message
    if report.worker and report.worker not in text:
        text = f"{text} (worker {report.worker!r})"
    if report.traceback:
        text = f"{text}{errors.REMOTE_TRACEBACK}{report.traceback.rstrip()}"
    return cls(text)


__all__ = [
    "ErrorKind",
    "ErrorReport",
    "describe_report",
    "error_of_report",
    "is_known_kind",
    "kind_name",
    "report_of_exception",
]
