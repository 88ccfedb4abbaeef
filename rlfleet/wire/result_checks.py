"""Episode results: what a decoded result must be, checked vectorised over steps.

:func:`check_result` checks a result :mod:`rlfleet.wire.results` decoded
against what its sender was asked for (:class:`ResultExpectation`):
metadata, episode_infos, seeds, versions, step types, fragment windows, and
every step's observations and actions against the declared spaces. All
checks are vectorised over steps: at the fleet's rates a per-step Python
loop would cost more than the env. The coordinator, the Python client and
the conformance kit share these checks, so they agree on what a valid
result is.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.episode_order import ends_episode
from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED, stream_seeds, stream_seeds_many
from rlfleet.core.space_checks import space_problem
from rlfleet.core.step_type import StepType
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.wire.results import (
    EPISODE_INFO_KEYS,
    FRAGMENT_INFO_KEYS,
    DecodedResult,
    ResultError,
    shortened,
)

#: Problems listed per failure; the rest are counted.
_MAX_LISTED = 5


@dataclasses.dataclass(frozen=True)
class FragmentWindow:
    """What one fragment window must hold.

    Attributes:
        base_seed: The seed stream seeds derive from.
        streams: The streams the task runs (Task.streams, or the sender's
            Welcome.first_stream + slot for each of its Hello.num_envs slots).
        fragment_length: Steps per stream in the window.
    """

    base_seed: int
    streams: tuple[int, ...]
    fragment_length: int


@dataclasses.dataclass(frozen=True)
class ResultExpectation:
    """What a result is checked against: its task and its sender.

    Attributes:
        env_spec: The fleet's env spec.
        worker_id: The sender (episode_infos["worker"] must name it).
        agent_version: The version the task asked for (-1: any sent so far).
        env_generation: The generation the task asked for.
        latest_agent_version: The latest version sent (None: unknown).
        units: Episodes mode: the task's units with their seeds, ascending
            by episode index.
        window: Fragments mode: the window's layout.
        native: The fleet's env is a native vector env: episodes carry
            ``env_seed`` :data:`NO_ENV_SEED` and ``policy_seed`` :data:`NO_POLICY_SEED`.
    """

    env_spec: EnvSpec
    worker_id: int
    agent_version: int
    env_generation: int
    latest_agent_version: int | None = None
    units: UnitColumns | None = None
    window: FragmentWindow | None = None
    native: bool = False


def check_result(result: DecodedResult, expect: ResultExpectation) -> None:
    """Checks one decoded result against its task and sender.

    Raises:
        ResultError: Listing what is wrong (at most a few problems).
    """
    problems = result_problems(result, expect)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems[:_MAX_LISTED])
        more = len(problems) - _MAX_LISTED
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise ResultError(f"{result.header.where} breaks the protocol:\n{listed}{tail}")


def result_problems(result: DecodedResult, expect: ResultExpectation) -> list[str]:
    """The problems :func:`check_result` raises for, as a list (empty: valid)."""
    problems = _metadata_problems(result, expect)
    if problems:  # the rest indexes by the infos just checked
        return problems
    if expect.window is not None:
        problems += _fragment_problems(result, expect.window)
    else:
        problems += _episode_problems(result, expect)
    problems += value_problems(result.batch, expect.env_spec)
    return problems


def step_type_problems(
    step_types: np.ndarray,
    lengths: np.ndarray,
    starts_episode: np.ndarray | None,
    *,
    must_end: bool,
) -> list[str]:
    """Checks step types against StepType's rules, one piece at a time.

    A piece is an episode or a fragment of one. Its first step is FIRST if
    it starts its episode, else MID; its last step is TERMINAL or TIMEOUT
    if it ends its episode (winning over FIRST in a one-step piece), else
    MID; every other step is MID.

    Args:
        step_types: (S,) StepType numbers.
        lengths: (N,) piece lengths, summing to S.
        starts_episode: (N,) bool: whether each piece starts its episode;
            None: every piece does (whole episodes).
        must_end: Whether every piece must end its episode (whole episodes).

    Returns:
        The problems, at most a few listed.
    """
    types = np.asarray(step_types)
    lengths = np.asarray(lengths)
    ends = lengths.cumsum() - 1
    starts = ends - lengths + 1
    last = types[ends]
    ended = ends_episode(last)
    every_end = bool(ended.all())
    expected = np.full(len(types), int(StepType.MID), dtype=types.dtype)
    # Whole episodes (every piece starts and ends one): no masks to apply.
    expected[starts if starts_episode is None else starts[starts_episode]] = int(StepType.FIRST)
    if every_end:
        expected[ends] = last
    else:
        expected[ends[ended]] = last[ended]
    mismatched = types != expected
    if not mismatched.any() and (every_end or not must_end):
        return []  # the common case: no Python per piece or step
    problems = []
    if must_end and not every_end:
        piece = int(np.argmin(ended))
        problems.append(
            f"episode {piece} of the batch ends with step type {_name(last[piece])}; the last "
            "step of a whole episode is TERMINAL or TIMEOUT"
        )
    wrong = np.flatnonzero(mismatched)
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


def value_problems(batch: EpisodeBatch, env_spec: EnvSpec) -> list[str]:
    """Checks every step's values against the declared spaces, vectorised.

    Observations and last observations must lie in the observation space
    and actions in the action space, as :mod:`rlfleet.core.space_checks` says
    (float Box actions need only be finite; NaN observations pass). Rewards
    must be finite. Shapes were checked when the batch was built.

    Returns:
        The problems (empty: every value fits).
    """
    problems = []
    for name, array, space in (
        ("observations", batch.observations, env_spec.observation_space),
        ("last_observations", batch.last_observations, env_spec.observation_space),
        ("actions", batch.actions, env_spec.action_space),
    ):
        problem = space_problem(name, np.asarray(array), space, actions=name == "actions")
        if problem:
            problems.append(problem)
    rewards = np.asarray(batch.rewards)
    finite = np.isfinite(rewards)
    if not finite.all():
        problems.append(f"rewards hold NaN or inf at step {int(np.argmin(finite))}")
    return problems


# --- helpers ---------------------------------------------------------------------------


def _metadata_problems(result: DecodedResult, expect: ResultExpectation) -> list[str]:
    header, batch = result.header, result.batch
    n = len(batch.lengths)
    problems = []
    if list(header.lengths) != batch.lengths.tolist():
        problems.append(
            f"metadata lengths {shortened(header.lengths)} disagree with the batch's lengths "
            f"{shortened(batch.lengths.tolist())}"
        )
    if len(header.episode_indices) != n:
        problems.append(
            f"metadata names {len(header.episode_indices)} episodes, the batch holds {n}"
        )
    if header.env_generation != expect.env_generation:
        problems.append(
            f"env_generation is {header.env_generation}, the task named {expect.env_generation}"
        )
    if expect.agent_version >= 0 and header.agent_version != expect.agent_version:
        problems.append(
            f"agent_version is {header.agent_version}, the task named {expect.agent_version}"
        )
    latest = expect.latest_agent_version
    if latest is not None and not 0 <= header.agent_version <= latest:
        problems.append(
            f"agent_version {header.agent_version} was never sent (the latest is {latest})"
        )
    keys: tuple[str, ...] = EPISODE_INFO_KEYS
    if expect.window is not None:
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
    if result.infos("episode_index").tolist() != list(header.episode_indices):
        problems.append(
            f"episode_infos['episode_index'] {shortened(result.infos('episode_index').tolist())} "
            f"disagrees with the metadata episode_indices {shortened(header.episode_indices)}"
        )
    for key, want in (("worker", expect.worker_id), ("agent_version", header.agent_version)):
        got = result.infos(key)
        if np.any(got != want):
            problems.append(
                f"episode_infos[{key!r}] holds {shortened(sorted(set(got.tolist())))}, expected "
                f"{want} for every episode"
                + (" (Welcome.worker_id)" if key == "worker" else " (the result's agent_version)")
            )
    return problems


def _episode_problems(result: DecodedResult, expect: ResultExpectation) -> list[str]:
    # Array operations over the episodes: a native worker's result holds
    # hundreds. Python runs per episode only to name what is wrong.
    indices = result.header.episode_indices  # equal to index_array: checked before
    problems = []
    index_array = result.infos("episode_index")
    if index_array.size and (index_array[0] < 0 or (index_array[1:] <= index_array[:-1]).any()):
        problems.append(f"episode_indices {shortened(indices)} are not strictly ascending from 0")
    units = expect.units
    if units is not None:
        positions, found = units.positions(np.asarray(index_array, dtype=np.int64))
        if not found.all():
            foreign = [i for i, held in zip(indices, found.tolist(), strict=True) if not held]
            problems.append(
                f"episodes {shortened(foreign)} are not units of task {result.header.task_id}"
            )
            return problems
        seeds = np.stack([units.env_seeds[positions], units.policy_seeds[positions]], axis=1)
        if expect.native:
            seeds[:, :] = (NO_ENV_SEED, NO_POLICY_SEED)
        for column, key in enumerate(("env_seed", "policy_seed")):
            want = seeds[:, column]
            mismatched = result.infos(key) != want
            if not mismatched.any():
                continue
            wrong = np.flatnonzero(mismatched)
            if len(wrong):
                i = int(wrong[0])
                problems.append(
                    f"episode {indices[i]}: episode_infos[{key!r}] is "
                    f"{int(result.infos(key)[i])}, the unit's {key} is {int(want[i])}"
                )
    limit = expect.env_spec.max_episode_length
    lengths = result.batch.lengths
    if limit is not None and len(lengths) and lengths.max() > limit:
        i = int(np.argmax(lengths))
        problems.append(
            f"episode {indices[i]} has {int(lengths[i])} steps, more than the env's "
            f"max_episode_length {limit}"
        )
    problems += step_type_problems(result.batch.step_types, lengths, None, must_end=True)
    return problems


def _fragment_problems(result: DecodedResult, window: FragmentWindow) -> list[str]:
    batch = result.batch
    return window_problems(WindowPieces.of(result.infos, batch.lengths, batch.step_types), window)


@dataclasses.dataclass(frozen=True)
class WindowPieces:
    """A fragment window's pieces as columns, wherever they were read from.

    The general path takes them from a decoded batch, the one-pass check
    (:mod:`rlfleet.wire.result_layout`) from views of the received bytes:
    both run :func:`window_problems` on them, so they agree.

    Attributes:
        stream: (N,) each piece's stream.
        episodes: (N,) its episode index.
        fragments: (N,) its fragment index.
        env_seeds: (N,) its episode's env seed.
        policy_seeds: (N,) its episode's policy seed.
        lengths: (N,) its steps, each >= 1.
        step_types: (S,) every step's StepType number.
    """

    stream: np.ndarray
    episodes: np.ndarray
    fragments: np.ndarray
    env_seeds: np.ndarray
    policy_seeds: np.ndarray
    lengths: np.ndarray
    step_types: np.ndarray

    @classmethod
    def of(
        cls, info: Callable[[str], np.ndarray], lengths: np.ndarray, step_types: np.ndarray
    ) -> WindowPieces:
        """The pieces whose episode infos ``info`` reads by key."""
        return cls(
            stream=info("stream"),
            episodes=info("episode_index"),
            fragments=info("fragment_index"),
            env_seeds=info("env_seed"),
            policy_seeds=info("policy_seed"),
            lengths=lengths,
            step_types=step_types,
        )


def window_problems(pieces: WindowPieces, window: FragmentWindow) -> list[str]:
    """What is wrong with a window's pieces: its streams, each stream's steps,
    continuity and seeds, and the step types (empty: nothing).

    The episode infos must have been checked to be int columns of one row per
    piece (:func:`check_result` does that first).
    """
    # Vectorised over pieces: a window of 64 streams is 128 pieces or more,
    # and a Python loop per piece (seeds, continuity) cost ~4 us each on
    # the coordinator's path. Python runs only for the problems found, in
    # the order a loop over streams would list them.
    problems: list[str] = []
    expected = set(window.streams)
    stream, episodes, fragments = pieces.stream, pieces.episodes, pieces.fragments
    order = np.lexsort((fragments, episodes, stream))
    in_order = stream[order]
    # Sorted by stream: each stream's first piece is where the column changes.
    head = np.ones(min(len(in_order), 1), dtype=bool)  # none for an empty window
    starts = np.flatnonzero(np.concatenate((head, in_order[1:] != in_order[:-1])))
    streams = in_order[starts].tolist()
    covered = set(streams) == expected
    if not covered:
        problems.append(
            f"the window covers streams {shortened(streams)}, expected one piece or more of each "
            f"stream of the task (Task.streams, or Welcome.first_stream + slot): "
            f"{shortened(sorted(expected))}"
        )
    lengths = pieces.lengths
    if episodes.size and (episodes.min() < 0 or fragments.min() < 0):
        problems.append("episode_infos hold a negative episode_index or fragment_index")
        return problems
    if not order.size:
        return problems
    cut = ~ends_episode(pieces.step_types[np.cumsum(lengths) - 1])
    steps = np.add.reduceat(lengths[order], starts)
    # Each pair of consecutive pieces of one stream, in episode and fragment order.
    first, then = order[:-1], order[1:]
    same = in_order[1:] == in_order[:-1]
    cut_inside = same & cut[first]
    broken = same & ~cut[first] & ((episodes[then] != episodes[first] + 1) | (fragments[then] != 0))
    owned = (
        np.ones(len(stream), dtype=bool)
        if covered
        else np.isin(stream, np.fromiter(expected, dtype=np.int64, count=len(expected)))
    )
    wrong_seed = np.zeros(len(order), dtype=bool)
    if owned.any():
        env, policy = _seeds(window, stream[owned], episodes[owned])
        mismatch = (pieces.env_seeds[owned] != env) | (pieces.policy_seeds[owned] != policy)
        wrong_seed[np.flatnonzero(owned)[mismatch]] = True
    wrong_seed = wrong_seed[order]
    bad_steps = steps != window.fragment_length
    if bad_steps.any() or cut_inside.any() or broken.any() or wrong_seed.any():
        ends = [*starts[1:].tolist(), len(order)]
        for k, (value, begin, end) in enumerate(zip(streams, starts.tolist(), ends, strict=True)):
            problems += _stream_problems(
                pieces,
                window,
                value,
                order[begin:end],
                steps=int(steps[k]),
                cut_inside=cut_inside[begin : end - 1],
                broken=broken[begin : end - 1],
            )
            seeds_wrong = np.flatnonzero(wrong_seed[begin:end])
            if seeds_wrong.size:
                piece = int(order[begin + int(seeds_wrong[0])])
                episode = int(episodes[piece])
                want = stream_seeds(window.base_seed, value, episode)
                got = (int(pieces.env_seeds[piece]), int(pieces.policy_seeds[piece]))
                problems.append(
                    f"stream {value} episode {episode}: seeds (env, policy) are "
                    f"{got}, expected {want} = stream_seeds(base_seed={window.base_seed}, "
                    f"stream={value}, episode={episode})"
                )
    problems += step_type_problems(pieces.step_types, lengths, fragments == 0, must_end=False)
    return problems


#: Fewer pieces than this take the cached per-piece seeds (an episode spans
#: several windows, so most are cache hits); more, the vectorised hash.
_VECTORISED_SEEDS = 32


def _seeds(
    window: FragmentWindow, streams: np.ndarray, episodes: np.ndarray
) -> tuple[np.ndarray, ...]:
    """:func:`stream_seeds` of each (stream, episode), as (env, policy) int64 columns."""
    base_seed = window.base_seed
    if len(streams) >= _VECTORISED_SEEDS:
        key = (base_seed, window.streams)
        table = _seed_tables.get(key)
        found = None if table is None else table.lookup(streams, episodes)
        if found is not None:
            return found
        table = _SeedTable.derive(base_seed, streams, episodes)
        if table is None:  # episodes too far apart to derive ahead
            return stream_seeds_many(base_seed, streams, episodes)
        if len(_seed_tables) >= _MAX_SEED_TABLES:
            _seed_tables.clear()  # windows of more tasks than this at once: start over
        _seed_tables[key] = table
        found = table.lookup(streams, episodes)
        if found is None:  # cannot happen: derived for these very pieces
            return stream_seeds_many(base_seed, streams, episodes)
        return found
    pairs = [
        _stream_seeds(base_seed, s, e)
        for s, e in zip(streams.tolist(), episodes.tolist(), strict=True)
    ]
    seeds = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return seeds[:, 0], seeds[:, 1]


#: Episodes ahead a :class:`_SeedTable` derives per stream, at least.
_SEEDS_AHEAD = 16
#: A window whose pieces of one stream span more episodes than this is not tabled.
_MAX_SEED_SPAN = 64
#: Seed tables kept, one per (base seed, a task's streams).
_MAX_SEED_TABLES = 256


@dataclasses.dataclass(frozen=True)
class _SeedTable:
    """The seeds of each stream's next episodes, derived a block at a time.

    The hash over a window's pieces costs about as much for 100 pairs as
    for 1,000 (numpy's per-operation cost): a task's streams' seeds for
    their next :data:`_SEEDS_AHEAD` episodes are derived in one hash, and
    the windows after look theirs up, until a stream runs past its block.
    Immutable: replaced whole, so threads may share it.
    """

    streams: np.ndarray  # (S,) ascending
    first: np.ndarray  # (S,) each stream's first episode in the table
    env: np.ndarray  # (S, K)
    policy: np.ndarray  # (S, K)

    @classmethod
    def derive(cls, base_seed: int, streams: np.ndarray, episodes: np.ndarray) -> _SeedTable | None:
        """A table holding every (stream, episode) given (None: they span too many episodes)."""
        order = np.lexsort((episodes, streams))
        ordered = streams[order]
        unique, starts = np.unique(ordered, return_index=True)
        first = episodes[order][starts]
        last = np.maximum.reduceat(episodes[order], starts)
        span = int((last - first).max()) + 1
        if span > _MAX_SEED_SPAN:
            return None
        ahead = max(span, _SEEDS_AHEAD)
        rows = np.repeat(unique, ahead)
        columns = (first[:, None] + np.arange(ahead)).reshape(-1)
        env, policy = stream_seeds_many(base_seed, rows, columns)
        shape = (len(unique), ahead)
        return cls(unique, first, env.reshape(shape), policy.reshape(shape))

    def lookup(self, streams: np.ndarray, episodes: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """The seeds of every (stream, episode), or None if one is not in the table."""
        rows = np.minimum(np.searchsorted(self.streams, streams), len(self.streams) - 1)
        columns = episodes - self.first[rows]
        if not (
            (self.streams[rows] == streams).all()
            and (columns >= 0).all()
            and (columns < self.env.shape[1]).all()
        ):
            return None
        return self.env[rows, columns], self.policy[rows, columns]


_seed_tables: dict[tuple[int, tuple[int, ...]], _SeedTable] = {}


@functools.lru_cache(maxsize=4096)
def _stream_seeds(base_seed: int, stream: int, episode: int) -> tuple[int, int]:
    # A stream's episode spans several windows: derive its seeds once.
    return stream_seeds(base_seed, stream, episode)


def _stream_problems(
    columns: WindowPieces,
    window: FragmentWindow,
    stream: int,
    pieces: np.ndarray,
    *,
    steps: int,
    cut_inside: np.ndarray,
    broken: np.ndarray,
) -> list[str]:
    """One stream's step count and continuity problems.

    Args:
        columns: The window's pieces.
        window: The window's layout.
        stream: The stream.
        pieces: Its pieces, in episode and fragment order.
        steps: Their steps.
        cut_inside: Per consecutive pair of ``pieces``: the first is cut.
        broken: Per pair: the second does not continue the first's episode.
    """
    problems = []
    episodes, fragments = columns.episodes, columns.fragments
    if steps != window.fragment_length:
        problems.append(
            f"stream {stream} has {steps} steps in the window, expected fragment_length "
            f"{window.fragment_length}"
        )
    for position in np.flatnonzero(cut_inside | broken).tolist():
        a, b = int(pieces[position]), int(pieces[position + 1])
        if cut_inside[position]:
            problems.append(
                f"stream {stream}: episode {int(episodes[a])} is cut (last step MID) but "
                "the window goes on with another piece; only a stream's last piece in a "
                "window may be cut"
            )
        else:
            problems.append(
                f"stream {stream}: after episode {int(episodes[a])} ends, the next piece is "
                f"episode {int(episodes[b])} fragment {int(fragments[b])}, expected episode "
                f"{int(episodes[a]) + 1} fragment 0"
            )
    return problems


def pieces_by_stream(result: DecodedResult) -> tuple[list[int], list[np.ndarray]]:
    """Streams in ascending order, and each one's pieces in episode/fragment order."""
    stream = result.infos("stream")
    order = np.lexsort((result.infos("fragment_index"), result.infos("episode_index"), stream))
    streams, starts = np.unique(stream[order], return_index=True)
    return [int(s) for s in streams], np.split(order, starts[1:])


def _name(value: object) -> str:
    try:
        return StepType(int(value)).name  # type: ignore[call-overload]
    except ValueError:
        return f"{value} (not a StepType)"


__all__ = [
    "FragmentWindow",
    "ResultExpectation",
    "WindowPieces",
    "check_result",
    "pieces_by_stream",
    "result_problems",
    "step_type_problems",
    "value_problems",
    "window_problems",
]
