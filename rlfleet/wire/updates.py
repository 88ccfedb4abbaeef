"""Agent and env updates and error details on the wire (updates.proto).

Every face carries these messages (a learner's update, the coordinator's
copies to its workers, a worker's refusal), so their conversion to and from
rlfleet's own types lives here once: :class:`~rlfleet.protocol.updates.AgentChange`,
:class:`~rlfleet.protocol.updates.EnvChange` and
:class:`~rlfleet.protocol.error_reports.ErrorReport`. The faces set the fields that
belong to a call (``coordinator_id``) themselves.
"""

from __future__ import annotations

from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.updates import AgentChange, EnvChange, PolicyChoice
from rlfleet.v1 import updates_pb2
from rlfleet.v1.updates_pb2 import AgentUpdate as AgentUpdateMessage
from rlfleet.v1.updates_pb2 import EnvUpdate as EnvUpdateMessage
from rlfleet.wire.tensor_messages import decode_tensor_map, encode_tensor_map


def encode_error_report(report: ErrorReport) -> updates_pb2.ErrorDetail:
    """The ErrorDetail message of a report."""
    detail = updates_pb2.ErrorDetail(
        kind=report.kind,  # type: ignore[arg-type]
        message=report.message,
        worker=report.worker,
        task_id=report.task_id,
        traceback=report.traceback,
        exception_type=report.exception_type,
    )
    if report.env_index is not None:
        detail.env_index = report.env_index
    if report.step is not None:
        detail.step = report.step
    if report.episode_index is not None:
        detail.episode_index = report.episode_index
    if report.env_generation is not None:
        detail.env_generation = report.env_generation
    if report.agent_version is not None:
        detail.agent_version = report.agent_version
    return detail


def decode_error_detail(detail: updates_pb2.ErrorDetail) -> ErrorReport:
    """The report an ErrorDetail message holds."""
    return ErrorReport(
        kind=int(detail.kind),
        message=detail.message,
        worker=detail.worker,
        env_index=detail.env_index if detail.HasField("env_index") else None,
        step=detail.step if detail.HasField("step") else None,
        episode_index=detail.episode_index if detail.HasField("episode_index") else None,
        task_id=detail.task_id,
        traceback=detail.traceback,
        exception_type=detail.exception_type,
        env_generation=detail.env_generation if detail.HasField("env_generation") else None,
        agent_version=detail.agent_version if detail.HasField("agent_version") else None,
    )


def encode_agent_change(change: AgentChange) -> AgentUpdateMessage:
    """The AgentUpdate message of a change (``coordinator_id`` left unset).

    Raises:
        WireFormatError: If a parameter name or dtype cannot travel.
    """
    update = AgentUpdateMessage(version=change.version, pickled_policy=change.pickled_policy)
    if change.policy is not None:
        update.policy.name = change.policy.name
        update.policy.kwargs_json = change.policy.kwargs_json
    if change.params:
        update.params.CopyFrom(encode_tensor_map(change.params))
    return update


def decode_agent_update(update: AgentUpdateMessage) -> AgentChange:
    """The change an AgentUpdate message holds (parameters: views of its bytes).

    Raises:
        WireFormatError: If a parameter tensor is malformed (the error names
            ``AgentUpdate.params`` and the entry).
    """
    policy = None
    if update.HasField("policy"):
        policy = PolicyChoice(update.policy.name, update.policy.kwargs_json)
    return AgentChange(
        version=update.version,
        policy=policy,
        params=decode_tensor_map(update.params, name="AgentUpdate.params"),
        pickled_policy=update.pickled_policy,
    )


def encode_env_change(change: EnvChange) -> EnvUpdateMessage:
    """The EnvUpdate message of a change (``coordinator_id`` left unset)."""
    update = EnvUpdateMessage(
        generation=change.generation,
        env_id=change.env_id,
        kwargs_json=change.kwargs_json,
        pickled_env_factory=change.pickled_env_factory,
        vectorization=change.vectorization,
    )
    if change.max_episode_length is not None:
        update.max_episode_length = change.max_episode_length
    return update


def decode_env_update(update: EnvUpdateMessage) -> EnvChange:
    """The change an EnvUpdate message holds."""
    return EnvChange(
        generation=update.generation,
        env_id=update.env_id,
        kwargs_json=update.kwargs_json,
        max_episode_length=(
            update.max_episode_length if update.HasField("max_episode_length") else None
        ),
        pickled_env_factory=update.pickled_env_factory,
        vectorization=update.vectorization,
    )


__all__ = [
    "decode_agent_update",
    "decode_env_update",
    "decode_error_detail",
    "encode_agent_change",
    "encode_env_change",
    "encode_error_report",
]
