"""Protobuf in and out of the coordinator: request checks and message builders.

Kept apart from the Coordinator so that its methods read as the rules they
implement, and so that what goes on the wire is easy to find.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlfleet.coordinator.failures import invalid
from rlfleet.coordinator.scheduler import CancelOrder, Footer, Mode, TaskOrder
from rlfleet.episode_results import ResultMetadata
from rlfleet.stream_replay import StreamReplay
from rlfleet.v1 import learner_pb2, worker_pb2
from rlfleet.wire import encode_tensor


def sample_mode(request: learner_pb2.SampleRequest, max_fragment_length: int) -> Mode:
    """The mode of a Sample request, after checking its fields.

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field (or the limit).
    """
    if int(request.mode) not in tuple(Mode):
        raise invalid(
            f"SampleRequest.mode must be SAMPLE_MODE_STEPS (1), SAMPLE_MODE_EPISODES (2) or "
            f"SAMPLE_MODE_FRAGMENTS (3), got {int(request.mode)}"
        )
    mode = Mode(request.mode)
    if request.amount < 1:
        raise invalid(f"SampleRequest.amount must be >= 1, got {request.amount}")
    if mode is Mode.FRAGMENTS:
        if request.fragment_length < 1:
            raise invalid("SAMPLE_MODE_FRAGMENTS needs fragment_length >= 1")
        check_fragment_length(request.fragment_length, max_fragment_length)
    # NaN fails every comparison, so "not >= 0" refuses it too (it would wait forever).
    if not request.wait_for_workers_seconds >= 0:
        raise invalid(
            f"wait_for_workers_seconds must be >= 0, got {request.wait_for_workers_seconds}"
        )
    return mode


def check_fragment_length(fragment_length: int, limit: int) -> None:
    """Refuses windows longer than the coordinator's limit.

    A worker holds a whole window of every env slot in memory and sends it
    as one result, so an unbounded window could exhaust its memory.

    Raises:
        CallError: INVALID_ARGUMENT naming the limit and the flag that sets it.
    """
    if fragment_length > limit:
        raise invalid(
            f"fragment_length {fragment_length} is above this coordinator's limit of {limit} "
            "steps per env slot and window (--max-fragment-length); ask for more windows of "
            "at most that length instead"
        )


def subscription_mode(request: learner_pb2.SubscribeRequest, max_fragment_length: int) -> Mode:
    """The mode of a Subscribe request, after checking its fields.

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field.
    """
    if int(request.mode) not in (Mode.EPISODES, Mode.FRAGMENTS):
        raise invalid(
            "SubscribeRequest.mode must be SAMPLE_MODE_EPISODES (2) or SAMPLE_MODE_FRAGMENTS "
            f"(3), got {int(request.mode)}"
        )
    mode = Mode(request.mode)
    if mode is Mode.FRAGMENTS:
        if request.fragment_length < 1:
            raise invalid("a FRAGMENTS subscription needs fragment_length >= 1")
        check_fragment_length(request.fragment_length, max_fragment_length)
    if request.max_buffered_steps < 0:
        raise invalid(f"max_buffered_steps must be >= 0, got {request.max_buffered_steps}")
    return mode


def task_message(
    order: TaskOrder, replays: Sequence[StreamReplay] = ()
) -> worker_pb2.CoordinatorMessage:
    """The Task message of a scheduler order, with the replays of the streams it takes over."""
    return worker_pb2.CoordinatorMessage(
        task=worker_pb2.Task(
            task_id=order.task_id,
            request_id=order.request_id,
            mode=order.mode.value,  # type: ignore[arg-type]
            agent_version=order.agent_version,
            env_generation=order.env_generation,
            units=[
                worker_pb2.EpisodeUnit(
                    episode_index=u.episode_index, env_seed=u.env_seed, policy_seed=u.policy_seed
                )
                for u in order.units
            ],
            fragment_length=order.fragment_length,
            rounds=order.rounds,
            base_seed=order.base_seed,
            streams=order.streams,
            replays=[replay_message(replay) for replay in replays],
        )
    )


def replay_message(replay: StreamReplay) -> worker_pb2.ReliabilityStreamReplay:
    """The ReliabilityStreamReplay message of a stream's replay."""
    message = worker_pb2.ReliabilityStreamReplay(
        stream=replay.stream,
        episode_index=replay.episode_index,
        fragment_index=replay.fragment_index,
    )
    if replay.actions is not None and replay.last_observation is not None:
        message.actions.CopyFrom(encode_tensor(replay.actions))
        message.last_observation.CopyFrom(encode_tensor(replay.last_observation))
    return message


def cancel_message(order: CancelOrder) -> worker_pb2.CoordinatorMessage:
    """The Cancel message of a scheduler order."""
    return worker_pb2.CoordinatorMessage(
        cancel=worker_pb2.Cancel(task_id=order.task_id, episode_indices=order.episode_indices)
    )


def forwarded_result(meta: ResultMetadata, worker_id: int) -> worker_pb2.EpisodeResult:
    """The EpisodeResult metadata the learner gets: the worker's, whole, with its id."""
    if not isinstance(meta, worker_pb2.EpisodeResult):  # the worker face's; narrows the type
        raise TypeError(f"expected the worker's EpisodeResult, got {type(meta).__name__}")
    forwarded = worker_pb2.EpisodeResult()
    forwarded.CopyFrom(meta)
    forwarded.worker_id = worker_id
    return forwarded


def footer_message(footer: Footer) -> learner_pb2.SampleFooter:
    """The SampleFooter of a finished request."""
    return learner_pb2.SampleFooter(
        num_episodes=footer.num_episodes,
        total_steps=footer.total_steps,
        workers_used=footer.workers_used,
        reassigned_units=footer.reassigned_units,
    )
