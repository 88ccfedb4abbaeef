"""The learner face's calls in rlfleet's own types, as both ends see them.

The client library asks the coordinator for samples and pushes updates
(learner.proto ``LearnerService``); each end converts these types to and
from the messages in its own translation module
(``rlfleet.client._learner_messages``, ``rlfleet.coordinator.learner_messages``).
Integer fields keep the protocol's meaning: a mode is a ``SampleMode``
number (``rlfleet.protocol.modes.Mode`` names the valid ones), and
the coordinator checks every value it receives.
"""

from __future__ import annotations

import dataclasses

from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.wire import Chunk
from rlfleet.wire.results import ResultHeader


@dataclasses.dataclass(frozen=True)
class SampleAsk:
    """What a Sample call asks for (learner.proto ``SampleRequest``).

    Attributes:
        mode: A ``SampleMode`` number (steps, episodes or fragments).
        amount: Steps (steps, fragments) or episodes (episodes).
        fragment_length: Steps per slot and window (fragments only).
        seed: The base seed, or None for the coordinator's own.
        request_index: The request's index (second component of the seeds).
        agent_update: Applied before sampling, if set.
        env_update: Applied before sampling, if set.
        wait_for_workers_seconds: How long to wait for a ready worker (0:
            the coordinator's default).
        itr: The learner's iteration, for logs.
        coordinator_id: The coordinator the learner pushed its state to
            ("": none yet).
        first_episode: EPISODES only: the call runs episodes
            ``first_episode .. first_episode + amount - 1`` of the request,
            with their seeds there (one range of a request cut over several
            coordinators); 0: episodes ``0 .. amount - 1``.
        result_channel: The learner's results connection the answer's
            results may travel on (0: none; learner.proto, "Results on a
            learner's data connection").
        result_call: This call's number on that connection (>= 1).
        footer_on_data: The learner reads the footer on that connection
            too, in place of the end marker (:attr:`CallHeader.footer_on_data`).
    """

    mode: int
    amount: int
    fragment_length: int = 0
    seed: int | None = None
    request_index: int = 0
    agent_update: AgentChange | None = None
    env_update: EnvChange | None = None
    wait_for_workers_seconds: float = 0.0
    itr: int = 0
    coordinator_id: str = ""
    first_episode: int = 0
    result_channel: int = 0
    result_call: int = 0
    footer_on_data: bool = False


@dataclasses.dataclass(frozen=True)
class SubscribeAsk:
    """What a Subscribe call asks for (learner.proto ``SubscribeRequest``).

    Attributes:
        mode: A ``SampleMode`` number (episodes or fragments).
        fragment_length: Steps per fragment (fragments only).
        seed: The base seed, or None for the coordinator's own.
        max_buffered_steps: Steps the coordinator may hold for the reader
            (0: its default).
    """

    mode: int
    fragment_length: int = 0
    seed: int | None = None
    max_buffered_steps: int = 0


@dataclasses.dataclass(frozen=True)
class StatusAsk:
    """A GetStatus call (learner.proto ``StatusRequest``: no fields)."""


@dataclasses.dataclass(frozen=True)
class UpdatePush:
    """An UpdateAgent or UpdateEnv call: the change, and the coordinator it is meant for.

    Attributes:
        change: The agent or env change.
        coordinator_id: The coordinator the learner pushed its state to ("": any).
    """

    change: AgentChange | EnvChange
    coordinator_id: str = ""


@dataclasses.dataclass(frozen=True)
class UpdateReceipt:
    """The answer to an update (learner.proto ``UpdateAck``).

    Attributes:
        agent_version: The fleet's agent version now.
        env_generation: The fleet's env generation now.
        workers_updated: Workers that applied the update.
        coordinator_id: The answering coordinator's id.
    """

    agent_version: int
    env_generation: int
    workers_updated: int
    coordinator_id: str = ""


@dataclasses.dataclass(frozen=True)
class CallHeader:
    """What a Sample or Subscribe answer was sampled with (learner.proto ``SampleHeader``).

    Attributes:
        request_id: The coordinator's id of the request.
        agent_version: The agent version the episodes come from (-1 in a
            subscription: each result names its own).
        env_generation: The env generation they run in.
        coordinator_id: The answering coordinator's id.
        env_spec_wire: The env's spec as a serialized ``EnvSpec``, as the
            first ready worker reported it; None until one did.
        results_on_data: The answer's results travel on the learner's
            results connection, not the call's stream.
        footer_on_data: With ``results_on_data``: the footer follows the
            results on that connection, in place of the end marker.
    """

    request_id: int
    agent_version: int
    env_generation: int
    coordinator_id: str = ""
    env_spec_wire: bytes | None = None
    results_on_data: bool = False
    footer_on_data: bool = False


@dataclasses.dataclass(frozen=True)
class ResultPart:
    """One message of a result as a learner receives it: metadata and a chunk.

    Attributes:
        header: The message's metadata (the whole result's on chunk 0).
        chunk: The batch chunk it carries (None: a malformed message).
    """

    header: ResultHeader
    chunk: Chunk | None


__all__ = [
    "CallHeader",
    "ResultPart",
    "SampleAsk",
    "StatusAsk",
    "SubscribeAsk",
    "UpdatePush",
    "UpdateReceipt",
]
