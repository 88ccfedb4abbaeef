"""A Sample or Subscribe call's responses, read into rlfleet types.

A Sample call answers with a ``SampleHeader`` (the agent version, the env
spec), results (chunked ``EpisodeResult``\\ s of several workers, interleaved)
and a ``SampleFooter``; a Subscribe call the same without the footer. The
sampler and the stream read both through :class:`ResponseReader`, the one
place on the learner side that looks into these messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from rlfleet import _rpc
from rlfleet.core import EnvSpec
from rlfleet.episode_results import DecodedResult, ResultAssembler
from rlfleet.errors import ProtocolError
from rlfleet.v1 import spaces_pb2


@dataclass(frozen=True)
class AnswerHeader:
    """A ``SampleHeader``: what the answer was sampled with.

    Attributes:
        agent_version: The agent version the episodes come from.
        env_spec: The env's spec, when the header carries it.
        coordinator_id: The answering coordinator's id ("" if not sent).
    """

    agent_version: int
    env_spec: EnvSpec | None
    coordinator_id: str = ""


@dataclass(frozen=True)
class AnswerFooter:
    """A ``SampleFooter``: how a Sample request ended."""

    num_episodes: int
    total_steps: int
    workers_used: int
    reassigned_units: int


#: What one response stands for (None: a chunk of a result still arriving).
Response: TypeAlias = AnswerHeader | DecodedResult | AnswerFooter | None


class ResponseReader:
    """Reads one call's responses in order.

    Args:
        what: Names the call in error messages.
        decode_spec: Decodes a header's EnvSpec (the sampler caches it).
    """

    def __init__(self, what: str, decode_spec: Callable[[spaces_pb2.EnvSpec], EnvSpec]) -> None:
        self._what = what
        self._decode_spec = decode_spec
        self._assembler = ResultAssembler(per_worker=True)

    def read(self, item: _rpc.WithChunk) -> Response:
        """What the next response stands for.

        Raises:
            ProtocolError: For an empty response, or a result that breaks
                the protocol (rlfleet.episode_results).
            WireFormatError: For chunks out of order.
        """
        message = item.message
        body = message.WhichOneof("body")
        if body == "result":
            return self._assembler.add(message.result, item.chunk)
        if body == "header":
            header = message.header
            spec = self._decode_spec(header.env_spec) if header.HasField("env_spec") else None
            if spec is not None:
                self._assembler.env_spec = spec
            return AnswerHeader(header.agent_version, spec, header.coordinator_id)
        if body == "footer":
            footer = message.footer
            return AnswerFooter(
                footer.num_episodes,
                footer.total_steps,
                footer.workers_used,
                footer.reassigned_units,
            )
        raise ProtocolError(f"{self._what}: an empty SampleResponse arrived")
