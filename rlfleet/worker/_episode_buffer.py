"""Where a worker keeps its steps: a time-major ring, then finished segments.

The hot loop writes each vector step into :class:`StepRing` with one numpy
assignment per field (like gymnasium's vector envs), never one per env.
When an episode (or a fragment piece) ends, its :class:`Segment` *views*
its rows in the ring, and the ring keeps those rows until the segment is
gone; :func:`build_batch` turns many segments into one
:class:`~rlfleet.core.EpisodeBatch` with one ``np.concatenate`` per field,
and :func:`build_pieces` hands a remote worker's serializer the views
themselves (contiguous: the ring is stored slot by slot), which it joins
straight into the outgoing messages. So a step's data is copied once after
stepping, into the batch or into the messages. Two
exceptions, both small: a segment's last observation is copied when it
ends (the slot's next episode writes its first observation into that cell),
and a segment that wraps around the ring's end is copied out of it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet._util.log_limit import OncePerKey
from rlfleet.core._arrays import NestedArrays, concat_nested
from rlfleet.core._pieces import EpisodePieces, RowPieces
from rlfleet.core._validation import check_per_step_space
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import PolicyError

logger = logging.getLogger("rlfleet.worker")

#: Info keys already warned about (warn once per process, not per episode).
_warned_keys = OncePerKey()

_MID = int(StepType.MID)
_FIRST = int(StepType.FIRST)

#: episode_infos of every episode, in the order of ``Segment.infos``.
EPISODE_INFO_KEYS = ("agent_version", "env_seed", "policy_seed", "episode_index", "worker")
#: episode_infos of fragment pieces (``VecWorker.collect_fragments``).
FRAGMENT_INFO_KEYS = (*EPISODE_INFO_KEYS, "stream", "fragment_index")


def _warn_once(key: str, message: str) -> None:
    if _warned_keys.first(key):
        logger.warning(message)


class StepRing:
    """Time-major ring of the steps of the segments in flight or not yet taken.

    Row ``step % capacity`` holds vector step ``step`` and column ``slot``
    holds env slot ``slot`` (stored slot by slot, see :func:`_slot_major`):
    ``obs[step % capacity, slot]`` is the observation the slot acted on at
    that step, ``rewards`` what that step returned. Actions and agent_infos
    get their arrays from the first batch the policy returns. A slot's
    segment occupies consecutive steps, so a finished segment is one
    contiguous view per field.
    Finished segments pin their rows (:meth:`pin`) until they are garbage;
    the ring doubles when a live or pinned row would be overwritten.

    ``cols`` arguments select the slots stepped together: None for all
    slots (a plain slice, the fast path), else an index array.

    A native backend's episodes are gathered from the ring with one
    ``np.take`` per field (:mod:`rlfleet.worker._native_columns`), or handed
    to the serializer as views when they are large; its ring may keep, per
    row and slot, whether the observation there is not finite
    (``obs_flags``, for ``nan_observations="flag"``).

    Args:
        n_envs: Number of env slots (columns).
        obs_shape: Shape of one observation.
        obs_dtype: Its dtype (observations are cast to it when stored).
        capacity: Initial number of rows.
        obs_flags: Keep the ``obs_flags`` column.
    """

    def __init__(
        self,
        n_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        capacity: int = 64,
        *,
        obs_flags: bool = False,
    ) -> None:
        self.n_envs = n_envs
        self.capacity = capacity
        self.obs = _slot_major((capacity, n_envs, *obs_shape), obs_dtype)
        self.rewards = _slot_major((capacity, n_envs), np.dtype(np.float64))
        self.obs_flags = _slot_major((capacity, n_envs), np.dtype(bool)) if obs_flags else None
        self.actions: np.ndarray | None = None
        self.agent_infos: dict[str, np.ndarray] = {}
        self._columns: Columns | None = None
        # (first step, weak reference) of each pinned segment; entries of
        # segments that are garbage are dropped when room is made (a plain
        # reference per episode costs less than a callback per episode).
        self._pins: list[tuple[int, weakref.ref[Any]]] = []

    @property
    def columns(self) -> Columns:
        """The ring's current arrays (a new object whenever one of them is replaced)."""
        columns = self._columns
        if columns is None:
            columns = self._columns = Columns(
                self.obs,
                self.actions,
                self.rewards,
                self.agent_infos,
                self.capacity,
                self.obs_flags,
            )
        return columns

    def reset_policy_outputs(self) -> None:
        """Forgets the action and agent_info arrays (the policy changed)."""
        self.actions = None
        self.agent_infos = {}
        self._columns = None

    def put_policy_outputs(
        self, row: int, cols: np.ndarray | None, actions: np.ndarray, agent_infos: Mapping
    ) -> None:
        """Stores one step's actions and agent_infos.

        Raises:
            PolicyError: If the agent_info keys or trailing shapes change
                between steps, or an agent_info has the wrong number of rows.
        """
        if self.actions is None or agent_infos.keys() != self.agent_infos.keys():
            self._allocate(actions, agent_infos)
        where = row if cols is None else (row, cols)
        try:
            self.actions[where] = actions  # type: ignore[index]
            for key, value in agent_infos.items():
                self.agent_infos[key][where] = value
        except (ValueError, TypeError) as exc:
            shapes = {key: np.shape(value) for key, value in agent_infos.items()}
            raise PolicyError(
                f"policy outputs changed shape between steps or do not have one row per "
                f"observation: actions {np.shape(actions)}, agent_infos {shapes} ({exc})"
            ) from exc

    def put_env_outputs(
        self, row: int, cols: np.ndarray | None, observations: list[Any], rewards: list[Any]
    ) -> None:
        """Stores what one step returned: next observations go to the next row.

        Raises:
            ValueError, TypeError: If an observation does not fit the space's
                shape or a reward is not a number (the caller finds which).
        """
        next_row = (row + 1) % self.capacity
        if cols is None:
            self.obs[next_row] = observations
            self.rewards[row] = rewards
        else:
            self.obs[next_row, cols] = observations
            self.rewards[row, cols] = rewards

    def put_env_outputs_one_by_one(
        self,
        row: int,
        slots: list[int],
        observations: list[Any],
        rewards: list[Any],
        skip: set[int],
    ) -> list[tuple[int, Exception]]:
        """Stores each slot's step results (but ``skip``'s), after
        :meth:`put_env_outputs` failed: the slow path that finds bad values.

        Returns:
            The slots whose observation does not fit the space's shape or
            whose reward is not a number, each with an error saying which.
        """
        next_row = (row + 1) % self.capacity
        bad: list[tuple[int, Exception]] = []
        for slot, observation, reward in zip(slots, observations, rewards, strict=True):
            if slot in skip:
                continue
            try:
                self.obs[next_row, slot] = observation
                self.rewards[row, slot] = reward
            except (ValueError, TypeError) as exc:
                message = (
                    f"step returned an observation of shape {np.shape(observation)} (the "
                    f"space has {self.obs.shape[2:]}) or a non-numeric reward {reward!r}: {exc}"
                )
                bad.append((slot, type(exc)(message)))
        return bad

    def _allocate(self, actions: np.ndarray, agent_infos: Mapping) -> None:
        if self.actions is not None:
            raise PolicyError(
                f"policy agent_infos keys changed between steps from {sorted(self.agent_infos)} "
                f"to {sorted(agent_infos)}; a policy must return the same keys every step"
            )
        self._columns = None
        self.actions = self._empty_like_rows(actions, "actions")
        self.agent_infos = {
            key: self._empty_like_rows(value, f"agent_infos[{key!r}]")
            for key, value in agent_infos.items()
        }

    def _empty_like_rows(self, batch: Any, what: str) -> np.ndarray:
        if not isinstance(batch, np.ndarray) or batch.ndim == 0:
            raise PolicyError(
                f"policy returned {what} of type {type(batch).__name__}; expected a numpy "
                "array with one row per observation"
            )
        return _slot_major((self.capacity, self.n_envs, *batch.shape[1:]), batch.dtype)

    def pin(self, owner: object, first_step: int) -> None:
        """Keeps the rows from ``first_step`` on until ``owner`` is garbage.

        ``owner`` holds views of those rows (a :class:`Segment`, or a native
        backend's chunk of finished-episode rows). Pins hold
        back the reuse of rows only: when the ring grows, pinned segments
        keep viewing the old arrays, which live on with them.
        """
        self._pins.append((first_step, weakref.ref(owner)))

    def make_room(self, oldest_live: int, newest_step: int) -> int:
        """Makes room to write step ``newest_step``, keeping live and pinned rows.

        Args:
            oldest_live: First step of the oldest segment in flight.
            newest_step: The step about to be written.

        Returns:
            A lower bound of the oldest step the ring must keep.
        """
        self._pins = pins = [(first, ref) for first, ref in self._pins if ref() is not None]
        oldest = min([oldest_live, *(first for first, _ in pins)])
        if newest_step - oldest + 1 <= self.capacity:
            return oldest
        self._grow(oldest_live, newest_step)
        return oldest_live

    def _grow(self, oldest_step: int, newest_step: int) -> None:
        """Moves to larger arrays holding steps ``oldest_step..newest_step - 1``.

        Pinned segments keep viewing the old arrays, so their rows need no
        copy and pin nothing in the new ones.
        """
        old_capacity = self.capacity
        self.capacity = max(2 * old_capacity, newest_step - oldest_step + 1)
        steps = np.arange(oldest_step, newest_step)
        old_rows, new_rows = steps % old_capacity, steps % self.capacity

        def regrow(array: np.ndarray) -> np.ndarray:
            grown = _slot_major((self.capacity, *array.shape[1:]), array.dtype)
            grown[new_rows] = array[old_rows]
            return grown

        self._columns = None
        self.obs, self.rewards = regrow(self.obs), regrow(self.rewards)
        if self.obs_flags is not None:
            self.obs_flags = regrow(self.obs_flags)
        if self.actions is not None:
            self.actions = regrow(self.actions)
        self.agent_infos = {key: regrow(value) for key, value in self.agent_infos.items()}
        self._pins.clear()

    def segment_steps(
        self, first_step: int, length: int, slot: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """``length`` consecutive steps of one slot, from ``first_step``.

        Views of the ring (no copy), unless the steps wrap around its end;
        :meth:`pin` them for as long as they are used.

        Returns:
            observations (``length + 1`` rows: the last is the observation
            after the last step), actions, rewards and agent_infos.
        """
        assert self.actions is not None  # a step was taken
        start = first_step % self.capacity
        if start + length < self.capacity:  # the common case: no wrap-around
            stop = start + length
            return (
                self.obs[start : stop + 1, slot],
                self.actions[start:stop, slot],
                self.rewards[start:stop, slot],
                {key: value[start:stop, slot] for key, value in self.agent_infos.items()},
            )
        steps = np.arange(first_step, first_step + length + 1) % self.capacity
        rows = steps[:-1]
        return (
            self.obs[steps, slot],
            self.actions[rows, slot],
            self.rewards[rows, slot],
            {key: value[rows, slot] for key, value in self.agent_infos.items()},
        )


def _slot_major(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros indexed ``[row, slot, ...]`` but stored slot by slot.

    A slot's consecutive rows are then contiguous, so a finished segment's
    views are C-contiguous: a remote worker's serializer joins them straight
    into the outgoing messages, the one copy of its step data.
    """
    rows, slots, *rest = shape
    return np.zeros((slots, rows, *rest), dtype=dtype).swapaxes(0, 1)


@dataclass(frozen=True, slots=True)
class Columns:
    """A :class:`StepRing`'s arrays at one time, and their number of rows.

    Attributes:
        obs: ``[row, slot, *O]``.
        actions: ``[row, slot, *A]`` (None before the first step).
        rewards: ``[row, slot]``.
        agent_infos: ``{key: [row, slot, ...]}``.
        capacity: Rows of each array.
        obs_flags: ``[row, slot]``: the observation there is not finite
            (None unless the ring keeps it).
    """

    obs: np.ndarray
    actions: np.ndarray | None
    rewards: np.ndarray
    agent_infos: dict[str, np.ndarray]
    capacity: int
    obs_flags: np.ndarray | None


@dataclass(slots=True, weakref_slot=True)
class Segment:
    """A finished episode or fragment piece.

    A worker's segments view their steps in its :class:`StepRing` (which
    keeps those rows while the segment lives); :func:`build_batch` copies
    them into a batch.

    Attributes:
        key: Sort key; batches list segments in increasing key order.
        infos: Its episode_infos values, in the order of
            :data:`EPISODE_INFO_KEYS` (or :data:`FRAGMENT_INFO_KEYS`).
        observations: (T, *O).
        last_observation: (*O): the observation after its last step.
        actions: (T, *A).
        rewards: (T,) float64.
        agent_infos: Arrays (T, ...).
        env_infos: Arrays or nested dicts of arrays (T, ...).
        first: Whether the segment starts its episode (first step FIRST).
        last: StepType of its last step if it ends the episode, else None
            (a piece cut mid-episode ends with MID).
        env_spec: Spec of the env that produced it.
    """

    key: tuple[int, ...]
    infos: tuple[int, ...]
    observations: np.ndarray
    last_observation: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    agent_infos: dict[str, np.ndarray]
    env_infos: NestedArrays
    first: bool
    last: int | None
    env_spec: EnvSpec

    @property
    def length(self) -> int:
        """Number of steps T."""
        return len(self.rewards)


#: Sort key of segments: (request, index), or (stream, episode, fragment). In C:
#: a worker sorts every finished episode by it.
record_key: Callable[[Any], tuple[int, ...]] = operator.attrgetter("key")


def stack_step_infos(infos: Sequence[Mapping[str, Any]], where: str) -> NestedArrays:
    """Stacks per-step info dicts into arrays, one per key present at every step.

    gymnasium envs may add keys on some steps only (e.g. statistics on the
    last step); such keys cannot form a column and are dropped, with one
    warning per key.

    Args:
        infos: One dict per step.
        where: Names the env in warnings.

    Returns:
        ``{key: array (T, ...)}``, nested for dict-valued keys.
    """
    if not any(infos):
        return {}
    common = [key for key in infos[0] if all(key in info for info in infos)]
    dropped = set().union(*infos) - set(common)
    for key in dropped:
        _warn_once(
            key,
            f"env {where}: env info {key!r} is missing at some steps of an episode and is "
            "left out of env_infos (only keys present at every step become columns)",
        )
    stacked: NestedArrays = {}
    for key in common:
        values = [info[key] for info in infos]
        if isinstance(values[0], Mapping) and all(isinstance(v, Mapping) for v in values):
            stacked[key] = stack_step_infos(values, where)
            continue
        try:
            column = np.asarray(values)
        except ValueError:
            column = None
        if column is None or column.dtype == object:
            _warn_once(
                key,
                f"env {where}: env info {key!r} does not stack into a numeric array "
                "(ragged or mixed values) and is left out of env_infos",
            )
            continue
        stacked[key] = column
    return stacked


def _common_infos(dicts: Sequence[Mapping], what: str) -> list[Mapping]:
    """The dicts restricted to the keys all of them have (warning about the rest)."""
    common = set(dicts[0]).intersection(*dicts[1:])
    if all(len(d) == len(common) for d in dicts):
        return list(dicts)
    for key in set().union(*dicts) - common:
        _warn_once(
            key,
            f"{what} {key!r} is present in some episodes of a batch but not all; it is "
            "left out of the batch",
        )
    return [{key: d[key] for key in d if key in common} for d in dicts]


def build_batch(
    env_spec: EnvSpec,
    segments: Sequence[Segment],
    info_keys: Sequence[str],
    *,
    from_ring: bool = False,
    actions_checked: bool = False,
) -> EpisodeBatch:
    """Builds one EpisodeBatch from segments, in the given order.

    Args:
        env_spec: The env's spec.
        segments: At least one segment.
        info_keys: Names of the segments' ``infos`` values.
        from_ring: The segments are a worker engine's (their arrays view its
            :class:`StepRing`, which has the spaces' shapes and dtypes): the
            batch fits by construction and is not re-checked
            (:meth:`EpisodeBatch.prechecked`), except its actions unless
            ``actions_checked``.
        actions_checked: Every action was checked against the action space's
            shape while stepping (the engine's enabled ActionChecker).

    Returns:
        The batch: one ``np.concatenate`` per field, step types computed with
        vectorised writes at each segment's first and last step.
    """
    if from_ring:
        make: Callable[..., EpisodeBatch] = functools.partial(
            EpisodeBatch.prechecked, check_actions=not actions_checked
        )
    else:
        make = EpisodeBatch
    return make(
        env_spec=env_spec,
        **_per_episode_fields(segments, info_keys),
        observations=np.concatenate([s.observations for s in segments]),
        actions=np.concatenate([s.actions for s in segments]),
        rewards=np.concatenate([s.rewards for s in segments]),
        env_infos=concat_infos([s.env_infos for s in segments], "env info", "env_infos"),
        agent_infos=concat_infos([s.agent_infos for s in segments], "agent info", "agent_infos"),
    )


#: Least mean bytes per segment for a field to travel as pieces. Below it,
#: handing each piece to the serializer costs more CPU (a few Python objects
#: per piece, about 1 us) than one more copy of it (under 4 KiB at a few
#: GB/s): ``np.concatenate`` joins the field in one C call instead.
MIN_PIECE_BYTES = 4096


def build_pieces(
    env_spec: EnvSpec,
    segments: Sequence[Segment],
    info_keys: Sequence[str],
    *,
    actions_checked: bool,
    min_piece_bytes: int = MIN_PIECE_BYTES,
) -> EpisodePieces:
    """:func:`build_batch` of a worker engine's segments, the step data not joined.

    Each per-step field whose segments hold at least ``min_piece_bytes`` on
    average is the segments' own arrays (views of the ring) as
    :class:`RowPieces`, so that the serializer copies it once, straight into
    the outgoing messages. Smaller fields, and fields whose pieces do not
    join as they are (another dtype after a policy change, nested or
    differing info dicts), are joined here as :func:`build_batch` joins them.

    Args:
        env_spec: The env's spec.
        segments: At least one segment of the engine's ring.
        info_keys: Names of the segments' ``infos`` values.
        actions_checked: As :func:`build_batch`'s; if False, each segment's
            actions are checked against the action space here.
        min_piece_bytes: See :data:`MIN_PIECE_BYTES`.

    Raises:
        InvalidBatchError: If ``actions_checked`` is False and an action does
            not fit the action space.
    """
    if not actions_checked:
        for s in segments:
            check_per_step_space(
                "EpisodeBatch.actions", s.actions, env_spec.action_space, "action_space"
            )
    least = min_piece_bytes * len(segments)

    def pieces(arrays: list[np.ndarray]) -> np.ndarray | RowPieces:
        if sum([a.nbytes for a in arrays]) >= least and _joins_as_is(arrays):
            return RowPieces(tuple(arrays))
        return np.concatenate(arrays)  # with the dtype promotion build_batch applies

    return EpisodePieces(
        env_spec=env_spec,
        **_per_episode_fields(segments, info_keys),
        observations=pieces([s.observations for s in segments]),
        actions=pieces([s.actions for s in segments]),
        rewards=pieces([s.rewards for s in segments]),
        env_infos=_info_pieces([s.env_infos for s in segments], pieces, "env info", "env_infos"),
        agent_infos=_info_pieces(
            [s.agent_infos for s in segments], pieces, "agent info", "agent_infos"
        ),
    )


def _per_episode_fields(segments: Sequence[Segment], info_keys: Sequence[str]) -> dict[str, Any]:
    """The batch fields made per episode: infos, last observations, step types, lengths."""
    # Sizes and step-type positions in Python ints: a few per segment, cheaper
    # than numpy calls on arrays this small.
    sizes = [len(s.rewards) for s in segments]
    starts = [0, *itertools.accumulate(sizes)]
    # uint8, the wire's dtype (batch.proto): a batch keeps one dtype from the
    # worker to the learner, with no conversion on the way.
    step_types = np.full(starts[-1], _MID, dtype=np.uint8)
    step_types[[start for start, s in zip(starts, segments, strict=False) if s.first]] = _FIRST
    # The last step's type wins over FIRST for one-step episodes, as in garage.
    stops = zip(starts[1:], segments, strict=True)
    ends = [(stop - 1, s.last) for stop, s in stops if s.last is not None]
    if ends:
        index, types = zip(*ends, strict=True)
        step_types[list(index)] = types
    # One array, one contiguous row per key (transposed while building).
    table = np.array(list(zip(*(s.infos for s in segments), strict=True)), dtype=np.int64)
    return {
        "episode_infos": dict(zip(info_keys, table, strict=True)),
        # np.array of same-shaped arrays: one C call, where np.stack makes n views first.
        "last_observations": np.array([s.last_observation for s in segments]),
        "step_types": step_types,
        "lengths": np.array(sizes, dtype=np.int64),
    }


def _joins_as_is(arrays: Sequence[np.ndarray]) -> bool:
    first = arrays[0]
    return all(a.dtype == first.dtype and a.shape[1:] == first.shape[1:] for a in arrays)


def _info_pieces(
    dicts: Sequence[NestedArrays],
    pieces: Callable[[list[np.ndarray]], np.ndarray | RowPieces],
    what: str,
    field: str,
) -> NestedArrays:
    """:func:`concat_infos`, each column of flat dicts of one key set by ``pieces``."""
    first = dicts[0]
    if first and _flat_with_one_key_set(dicts):
        columns = {key: [d[key] for d in dicts] for key in first}
        if all(_joins_as_is(column) for column in columns.values()):
            return {key: pieces(column) for key, column in columns.items()}
    return concat_infos(dicts, what, field)


def _flat_with_one_key_set(dicts: Sequence[NestedArrays]) -> bool:
    """Whether every dict has the first's keys and the first nests no dict:
    one column per key, joined without :func:`concat_nested`."""
    keys = dicts[0].keys()
    flat = not any(isinstance(value, Mapping) for value in dicts[0].values())
    return flat and all(d.keys() == keys for d in dicts)


def concat_infos(dicts: Sequence[NestedArrays], what: str, field: str) -> NestedArrays:
    """Concatenates the segments' info dicts (only the keys all of them have)."""
    if not any(dicts):  # most envs' infos: nothing to concatenate
        return {}
    if _flat_with_one_key_set(dicts):
        # The common case, one flat dict per policy or env: one call per key.
        try:
            return {key: np.concatenate([d[key] for d in dicts]) for key in dicts[0]}
        except ValueError:
            pass  # concat_nested names the key whose shapes differ
    return concat_nested(_common_infos(dicts, what), field)
