"""Episode results from a worker: reassembly, decoding and the rules they obey.

Every EpisodeResult a worker sends is reassembled from its chunks, decoded
with :mod:`rlfleet.wire` and checked against the task it answers
(worker.proto, batch.proto): metadata that agrees with the batch,
episode_infos that name the units, seeds, agent version and worker, step
types that follow StepType's rules, and for fragments the window layout.
The checks are vectorised over steps; each problem is reported with the
task, episode and step it concerns.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np

from rlfleet.conformance._failure import CheckFailed
from rlfleet.conformance.scripted_coordinator import Inbound
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import ResourceExhaustedError, WireFormatError
from rlfleet.seeding import stream_seeds
from rlfleet.v1 import batch_pb2, worker_pb2
from rlfleet.wire import ChunkAssembler, decode_batch

#: int64 (N,) episode_infos every result carries (batch.proto).
EPISODE_INFO_KEYS = ("agent_version", "env_seed", "policy_seed", "episode_index", "worker")
#: ... and fragments in addition.
FRAGMENT_INFO_KEYS = ("stream", "fragment_index")

_LAST = np.array([StepType.TERMINAL, StepType.TIMEOUT])
#: Problems listed per failure; the rest are counted.
_MAX_LISTED = 5


@dataclasses.dataclass(frozen=True)
class Result:
    """One reassembled, decoded EpisodeResult.

    Attributes:
        task_id: The task it answers.
        episode_indices: Metadata: its episodes (fragments: as sent).
        lengths: Metadata: their lengths.
        agent_version: Metadata: the agent version that produced it.
        env_generation: Metadata: the env generation it ran in.
        batch: The decoded batch.
        chunk_sizes: Serialized size of each message that carried a chunk.
        total_bytes: Size of the serialized batch.
        seq: Stream position of its last chunk.
        at: Arrival time of its last chunk.
    """

    task_id: int
    episode_indices: tuple[int, ...]
    lengths: tuple[int, ...]
    agent_version: int
    env_generation: int
    batch: EpisodeBatch
    chunk_sizes: tuple[int, ...]
    total_bytes: int
    seq: int
    at: float

    def infos(self, key: str) -> np.ndarray:
        """An episode_infos column (validated to exist by :func:`check_result`)."""
        return np.asarray(self.batch.episode_infos[key])


@dataclasses.dataclass(frozen=True)
class WorkerFacts:
    """What a result is checked against, besides its task.

    Attributes:
        worker_id: Welcome.worker_id.
        env_spec: The EnvSpec of the worker's EnvReady.
        first_stream: Welcome.first_stream.
        num_envs: Hello.num_envs.
    """

    worker_id: int
    env_spec: EnvSpec
    first_stream: int
    num_envs: int


class ResultAssembler:
    """Turns one stream's EpisodeResult messages into :class:`Result` objects.

    Args:
        env_spec: The spec the batches are decoded with.
    """

    def __init__(self, env_spec: EnvSpec) -> None:
        self.env_spec = env_spec
        self._chunks = ChunkAssembler()
        self._head: worker_pb2.EpisodeResult | None = None
        self._sizes: list[int] = []

    def add(self, inbound: Inbound) -> Result | None:
        """Takes a ``result`` message; returns the Result its last chunk completes.

        Raises:
            CheckFailed: If the message has no chunk, the chunks are out of
                order or inconsistent, the metadata is not on chunk 0 alone,
                or the batch does not decode.
        """
        assert inbound.message is not None  # results always carry a message
        result = inbound.message.result
        chunk = inbound.chunk
        where = f"EpisodeResult for task {result.task_id} (message #{inbound.seq})"
        if chunk is None:
            raise CheckFailed(f"{where} has no chunk: every EpisodeResult carries a BatchChunk")
        if chunk.kind != batch_pb2.PAYLOAD_KIND_EPISODE_BATCH:
            raise CheckFailed(
                f"{where}: chunk kind is {chunk.kind}, expected PAYLOAD_KIND_EPISODE_BATCH (1)"
            )
        if chunk.index == 0:
            self._head, self._sizes = result, []
        elif result.episode_indices or result.lengths:
            raise CheckFailed(
                f"{where}: chunk {chunk.index} repeats episode_indices/lengths; the metadata "
                "is set on the message carrying chunk 0 and left empty on the rest"
            )
        try:
            payload = self._chunks.add(chunk)
        except (WireFormatError, ResourceExhaustedError) as exc:
            raise CheckFailed(f"{where}: bad chunk sequence: {exc}") from exc
        self._sizes.append(inbound.size)
        if payload is None:
            return None
        head = self._head
        assert head is not None  # chunk 0 arrived: ChunkAssembler enforces the order
        try:
            batch = decode_batch(payload, env_spec=self.env_spec)
        except WireFormatError as exc:
            raise CheckFailed(f"{where}: the reassembled batch does not decode: {exc}") from exc
        assert isinstance(batch, EpisodeBatch)  # the chunk kind said so
        return Result(
            task_id=head.task_id,
            episode_indices=tuple(head.episode_indices),
            lengths=tuple(head.lengths),
            agent_version=head.agent_version,
            env_generation=head.env_generation,
            batch=batch,
            chunk_sizes=tuple(self._sizes),
            total_bytes=chunk.total_bytes,
            seq=inbound.seq,
            at=inbound.at,
        )


def check_result(result: Result, task: worker_pb2.Task, facts: WorkerFacts) -> None:
    """Checks one result against its task and the worker's handshake.

    Raises:
        CheckFailed: Listing what is wrong.
    """
    where = f"result of task {task.task_id}"
    problems = _metadata_problems(result, task, facts)
    if not problems:  # the rest indexes by the infos just checked
        if task.mode == worker_pb2.SAMPLE_MODE_FRAGMENTS:
            problems = _fragment_problems(result, task, facts)
        else:
            problems = _episode_problems(result, task, facts.env_spec)
        problems += _step_problems(result, facts.env_spec)
    _raise(where, problems)


def step_type_problems(
    step_types: np.ndarray, lengths: np.ndarray, starts_episode: np.ndarray, *, must_end: bool
) -> list[str]:
    """Checks step types against StepType's rules, one piece at a time.

    A piece is an episode or a fragment of one. Its first step is FIRST if
    it starts its episode, else MID; its last step is TERMINAL or TIMEOUT
    if it ends its episode (winning over FIRST in a one-step piece), else
    MID; every other step is MID.

    Args:
        step_types: (S,) StepType numbers.
        lengths: (N,) piece lengths, summing to S.
        starts_episode: (N,) bool: whether each piece starts its episode.
        must_end: Whether every piece must end its episode (whole episodes).

    Returns:
        The problems, at most a few listed.
    """
    types = np.asarray(step_types, dtype=np.int64)
    ends = np.cumsum(lengths) - 1
    starts = ends - lengths + 1
    last = types[ends]
    ended = np.isin(last, _LAST)
    expected = np.full(len(types), int(StepType.MID), dtype=np.int64)
    expected[starts[starts_episode]] = int(StepType.FIRST)
    expected[ends[ended]] = last[ended]
    problems = []
    if must_end and not ended.all():
        piece = int(np.argmin(ended))
        problems.append(
            f"episode {piece} of the batch ends with step type {_name(last[piece])}; the last "
            "step of a whole episode is TERMINAL or TIMEOUT"
        )
    wrong = np.flatnonzero(types != expected)
    for step in wrong[:_MAX_LISTED]:
        piece = int(np.searchsorted(ends, step))
        problems.append(
            f"episode {piece} of the batch, step {int(step - starts[piece]) + 1} of "
            f"{int(lengths[piece])}: step type {_name(types[step])}, expected "
            f"{_name(expected[step])}"
        )
    if len(wrong) > _MAX_LISTED:
        problems.append(f"... and {len(wrong) - _MAX_LISTED} more steps with a wrong step type")
    return problems


def continuity_problems(
    previous: Mapping[int, tuple[Result, int]], result: Result
) -> tuple[list[str], dict[int, tuple[Result, int]]]:
    """Checks that each fragment stream goes on where the last window left it.

    Args:
        previous: Stream -> (result, piece) of its last piece in the
            previous window of the same task.
        result: The next window.

    Returns:
        The problems, and the last piece of every stream in ``result``.
    """
    problems: list[str] = []
    streams, order = _pieces_by_stream(result)
    starts = np.cumsum(result.batch.lengths) - result.batch.lengths
    last_pieces: dict[int, tuple[Result, int]] = {}
    for stream, pieces in zip(streams, order, strict=True):
        first, last = int(pieces[0]), int(pieces[-1])
        last_pieces[stream] = (result, last)
        if stream not in previous:
            continue
        before, piece = previous[stream]
        episode = int(before.infos("episode_index")[piece])
        fragment = int(before.infos("fragment_index")[piece])
        was_cut = _cut(before.batch)[piece]
        got = (
            int(result.infos("episode_index")[first]),
            int(result.infos("fragment_index")[first]),
        )
        want = (episode, fragment + 1) if was_cut else (episode + 1, 0)
        if got != want:
            problems.append(
                f"stream {stream} starts the window with episode {got[0]} fragment {got[1]}, "
                f"expected episode {want[0]} fragment {want[1]} (the previous window "
                f"{'cut' if was_cut else 'ended'} episode {episode} at fragment {fragment})"
            )
        elif was_cut and not np.array_equal(
            before.batch.last_observations[piece],
            result.batch.observations[starts[first]],
        ):
            problems.append(
                f"stream {stream}: the fragment continuing episode {episode} does not start "
                "from the previous fragment's last observation"
            )
    return problems, last_pieces


# --- helpers -----------------------------------------------------------------


def _metadata_problems(result: Result, task: worker_pb2.Task, facts: WorkerFacts) -> list[str]:
    batch = result.batch
    n = len(batch.lengths)
    problems = []
    if list(result.lengths) != batch.lengths.tolist():
        problems.append(
            f"metadata lengths {_short(result.lengths)} disagree with the batch's lengths "
            f"{_short(batch.lengths.tolist())}"
        )
    if len(result.episode_indices) != n:
        problems.append(
            f"metadata names {len(result.episode_indices)} episodes, the batch holds {n}"
        )
    if result.env_generation != task.env_generation:
        problems.append(
            f"env_generation is {result.env_generation}, the task named {task.env_generation}"
        )
    if task.agent_version >= 0 and result.agent_version != task.agent_version:
        problems.append(
            f"agent_version is {result.agent_version}, the task named {task.agent_version}"
        )
    keys: tuple[str, ...] = EPISODE_INFO_KEYS
    if task.mode == worker_pb2.SAMPLE_MODE_FRAGMENTS:
        keys += FRAGMENT_INFO_KEYS
    for key in keys:
        value = batch.episode_infos.get(key)
        if not isinstance(value, np.ndarray):
            problems.append(f"episode_infos has no {key!r} tensor (batch.proto lists it)")
        elif value.shape != (n,) or value.dtype.kind not in "iu":
            problems.append(
                f"episode_infos[{key!r}] is {value.dtype} {value.shape}, expected int64 ({n},)"
            )
    if problems:
        return problems
    if result.infos("episode_index").tolist() != list(result.episode_indices):
        problems.append(
            f"episode_infos['episode_index'] {_short(result.infos('episode_index').tolist())} "
            f"disagrees with the metadata episode_indices {_short(result.episode_indices)}"
        )
    for key, want in (("worker", facts.worker_id), ("agent_version", result.agent_version)):
        got = result.infos(key)
        if np.any(got != want):
            problems.append(
                f"episode_infos[{key!r}] holds {_short(sorted(set(got.tolist())))}, expected "
                f"{want} for every episode"
                + (" (Welcome.worker_id)" if key == "worker" else " (the result's agent_version)")
            )
    return problems


def _episode_problems(result: Result, task: worker_pb2.Task, spec: EnvSpec) -> list[str]:
    indices = list(result.episode_indices)
    units = {unit.episode_index: unit for unit in task.units}
    problems = []
    if indices != sorted(set(indices)):
        problems.append(f"episode_indices {_short(indices)} are not strictly ascending")
    foreign = [i for i in indices if i not in units]
    if foreign:
        problems.append(f"episodes {_short(foreign)} are not units of task {task.task_id}")
        return problems
    for key in ("env_seed", "policy_seed"):
        want = np.array([getattr(units[i], key) for i in indices], dtype=np.int64)
        wrong = np.flatnonzero(result.infos(key) != want)
        if len(wrong):
            i = int(wrong[0])
            problems.append(
                f"episode {indices[i]}: episode_infos[{key!r}] is {int(result.infos(key)[i])}, "
                f"the unit's {key} is {int(want[i])}"
            )
    limit = spec.max_episode_length
    lengths = result.batch.lengths
    if limit is not None and np.any(lengths > limit):
        i = int(np.argmax(lengths))
        problems.append(
            f"episode {indices[i]} has {int(lengths[i])} steps, more than the env's "
            f"max_episode_length {limit}"
        )
    starts = np.ones(len(lengths), dtype=bool)
    problems += step_type_problems(result.batch.step_types, lengths, starts, must_end=True)
    return problems


def _fragment_problems(result: Result, task: worker_pb2.Task, facts: WorkerFacts) -> list[str]:
    problems: list[str] = []
    batch = result.batch
    expected = set(range(facts.first_stream, facts.first_stream + facts.num_envs))
    streams, order = _pieces_by_stream(result)
    if set(streams) != expected:
        problems.append(
            f"the window covers streams {sorted(streams)}, expected one piece or more of each "
            f"stream Welcome.first_stream + slot: {sorted(expected)}"
        )
    lengths = batch.lengths
    episodes, fragments = result.infos("episode_index"), result.infos("fragment_index")
    cut = _cut(batch)
    for stream, pieces in zip(streams, order, strict=True):
        steps = int(lengths[pieces].sum())
        if steps != task.fragment_length:
            problems.append(
                f"stream {stream} has {steps} steps in the window, expected fragment_length "
                f"{task.fragment_length}"
            )
        for a, b in itertools.pairwise(pieces):
            if cut[a]:
                problems.append(
                    f"stream {stream}: episode {int(episodes[a])} is cut (last step MID) but "
                    "the window goes on with another piece; only a stream's last piece in a "
                    "window may be cut"
                )
            elif (int(episodes[b]), int(fragments[b])) != (int(episodes[a]) + 1, 0):
                problems.append(
                    f"stream {stream}: after episode {int(episodes[a])} ends, the next piece is "
                    f"episode {int(episodes[b])} fragment {int(fragments[b])}, expected episode "
                    f"{int(episodes[a]) + 1} fragment 0"
                )
        for piece in pieces:
            want = stream_seeds(task.base_seed, stream, int(episodes[piece]))
            got = (int(result.infos("env_seed")[piece]), int(result.infos("policy_seed")[piece]))
            if got != want:
                problems.append(
                    f"stream {stream} episode {int(episodes[piece])}: seeds (env, policy) are "
                    f"{got}, expected {want} = stream_seeds(base_seed={task.base_seed}, "
                    f"stream={stream}, episode={int(episodes[piece])})"
                )
                break
    problems += step_type_problems(batch.step_types, lengths, fragments == 0, must_end=False)
    return problems


def _cut(batch: EpisodeBatch) -> np.ndarray:
    """(N,) bool: whether each piece ends without ending its episode."""
    return ~np.isin(batch.step_types[np.cumsum(batch.lengths) - 1], _LAST)


def _step_problems(result: Result, spec: EnvSpec) -> list[str]:
    problems = []
    rewards = np.asarray(result.batch.rewards)
    if not np.all(np.isfinite(rewards)):
        problems.append(f"rewards hold NaN or inf at step {int(np.argmin(np.isfinite(rewards)))}")
    space = spec.action_space
    if isinstance(space, gym.spaces.Discrete):
        actions = np.asarray(result.batch.actions).reshape(-1)
        outside = np.flatnonzero((actions < space.start) | (actions >= space.start + space.n))
        if len(outside):
            problems.append(
                f"action {actions[outside[0]]} at step {int(outside[0])} is outside the action "
                f"space {space}"
            )
    return problems


def _pieces_by_stream(result: Result) -> tuple[list[int], list[np.ndarray]]:
    """Streams in ascending order, and each one's pieces in episode/fragment order."""
    stream = result.infos("stream")
    order = np.lexsort((result.infos("fragment_index"), result.infos("episode_index"), stream))
    streams, starts = np.unique(stream[order], return_index=True)
    return [int(s) for s in streams], np.split(order, starts[1:])


def _raise(where: str, problems: Sequence[str]) -> None:
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems[:_MAX_LISTED])
        more = len(problems) - _MAX_LISTED
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise CheckFailed(f"{where} breaks the protocol:\n{listed}{tail}")


def _name(value: object) -> str:
    try:
        return StepType(int(value)).name  # type: ignore[call-overload]
    except ValueError:
        return f"{value} (not a StepType)"


def _short(values: Sequence[object]) -> str:
    items = list(values)
    if len(items) <= 8:
        return str(items)
    return f"[{', '.join(map(str, items[:8]))}, ... ({len(items)} in all)]"


__all__ = [
    "EPISODE_INFO_KEYS",
    "FRAGMENT_INFO_KEYS",
    "Result",
    "ResultAssembler",
    "WorkerFacts",
    "check_result",
    "continuity_problems",
    "step_type_problems",
]
