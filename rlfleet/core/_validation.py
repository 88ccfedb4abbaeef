"""Shape and type checks shared by the core data types.

Every check raises :class:`~rlfleet.errors.InvalidBatchError` (a
``ValueError``). Where garage 2021.03 checks the same thing, the message
starts with garage's text (code written against garage matches on it, e.g.
``"actions has batch size ..."``), then rlfleet's detail of the form
``"<Type>.<field>: expected ..., got ..."``. Checks look at shapes and
dtypes only, never at every value of an observation, so validating a batch
costs microseconds whatever its size.
The one exception is ``step_types``, whose values are range-checked with a
single vectorised comparison.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.core._identity_cache import IdentityCache
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError

_MIN_STEP_TYPE = min(StepType)
_MAX_STEP_TYPE = max(StepType)
_NAME = re.compile(r"^(?P<owner>\w+)\.(?P<field>\w+)(?P<keys>(?:\[.*\])?)$")


def _error(garage: str, detail: str) -> InvalidBatchError:
    """garage's wording first (code written against garage matches on it), then rlfleet's."""
    return InvalidBatchError(f"{garage.rstrip('.')}. {detail}")


def _field(name: str) -> tuple[str, str]:
    """(field, first info key or "") of a ``"<Type>.<field>[<key>]..."`` name."""
    match = _NAME.match(name)
    if match is None:
        return name, ""
    keys = match.group("keys")
    key = keys[1:].split("]", 1)[0].strip("'\"") if keys else ""
    return match.group("field"), key


#: What a count is matched against, in garage's words ("... to match <this>"),
#: for the reasons the batch types give.
_GARAGE_MATCH = {
    "sum of lengths": "the sum of lengths",
    "number of episodes": "the number of episodes",
    "one row per reward": "rewards",
}


def _match(reason: str) -> str:
    return _GARAGE_MATCH.get(reason, reason)


def _batch_size(array: np.ndarray) -> object:
    return array.shape[0] if array.ndim else "none (a scalar)"


def _batch_size_wording(name: str, expected: int, got: object, match: str) -> str:
    """garage 2021.03's text for a leading dimension that does not fit."""
    field, key = _field(name)
    if field == "episode_infos" and key:
        return (
            f"Entry {key!r} in episode_infos has batch size {got}, but must have batch size "
            f"{expected} to match the number of episodes"
        )
    if key:
        return (
            f"Entry {key!r} in {field} has batch size {got} but must have batch size {expected} "
            f"to match {match}"
        )
    return f"{field} has batch size {got}, but must have batch size {expected} to match {match}"


def _space_wording(name: str, shape: object, space: gym.Space, space_name: str) -> str:
    """garage 2021.03's text for a per-step element that does not fit its space."""
    field, _ = _field(name)
    return f"Each {field[:-1]} has shape {shape} but must match the {space_name} {space}"


def _single_step_wording(name: str, space: gym.Space, space_name: str, shape: object) -> str:
    """garage's text for one observation or action of a TimeStep or EnvStep."""
    field, _ = _field(name)
    flat_dim = gym.spaces.flatdim(space) if space.is_np_flattenable else "?"
    return (
        f"{field} should have the same dimensionality as the {space_name} ({flat_dim}), but "
        f"got data with shape {shape} instead"
    )


def check_env_spec(owner: str, env_spec: object) -> None:
    """Checks that ``env_spec`` is an :class:`EnvSpec`."""
    if not isinstance(env_spec, EnvSpec):
        raise InvalidBatchError(
            f"{owner}.env_spec: expected an rlfleet EnvSpec, got {type(env_spec).__name__}"
        )


def require_array(name: str, value: object) -> np.ndarray:
    """Returns ``value`` if it is a numpy array, else raises."""
    if not isinstance(value, np.ndarray):
        field, _ = _field(name)
        raise _error(
            f"{field} is not of type {np.ndarray!r}",
            f"{name}: expected a numpy array, got {type(value).__name__}; "
            "convert it with np.asarray",
        )
    return value


def check_leading_dim(name: str, value: object, expected: int, reason: str) -> np.ndarray:
    """Checks that ``value`` is an array with ``expected`` rows.

    Args:
        name: ``"<Type>.<field>"`` for the message.
        value: The value to check.
        expected: Required size of axis 0.
        reason: Where ``expected`` comes from, e.g. ``"sum of lengths"``.

    Returns:
        The array.
    """
    array = require_array(name, value)
    if array.ndim == 0 or array.shape[0] != expected:
        raise _error(
            _batch_size_wording(name, expected, _batch_size(array), _match(reason)),
            f"{name}: expected leading dimension {expected} ({reason}), got shape {array.shape}",
        )
    return array


def check_shape(
    name: str,
    value: object,
    expected: tuple[int, ...],
    reason: str,
    space: gym.Space | None = None,
) -> np.ndarray:
    """Checks that ``value`` is an array of exactly shape ``expected``.

    Args:
        name: ``"<Type>.<field>"`` for the message.
        value: The value to check.
        expected: The required shape.
        reason: Where ``expected`` comes from, e.g. ``"sum of lengths"``.
        space: The observation space each row belongs to, named in garage's
            text when a row's shape is what does not fit.
    """
    array = require_array(name, value)
    if array.shape != expected:
        detail = f"{name}: expected shape {expected} ({reason}), got {array.shape}"
        raise _error(_shape_wording(name, array, expected, reason, space), detail)
    return array


def _shape_wording(
    name: str,
    array: np.ndarray,
    expected: tuple[int, ...],
    reason: str,
    space: gym.Space | None,
) -> str:
    """garage 2021.03's text for an array of the wrong shape (its checks' order)."""
    field, _ = _field(name)
    per_episode = field == "last_observations"
    match = "the number of episodes" if per_episode else _match(reason)
    if field == "rewards" or (array.ndim and array.shape[0] == expected[0] and len(expected) == 1):
        # garage counts the batch from rewards, so a bad rewards array is
        # always a bad shape; a 1-D field of the right length is one too.
        return (
            f"{field} has shape {array.shape} but must have batch size {expected[0]} to match "
            f"{match}"
        )
    if not array.ndim or array.shape[0] != expected[0]:
        if per_episode:
            return (
                f"last_observations has batch size {_batch_size(array)} but must have batch "
                f"size {expected[0]} to match the number of episodes"
            )
        return _batch_size_wording(name, expected[0], _batch_size(array), match)
    if per_episode:
        return (
            f"last_observations must have the same number of entries as there are episodes "
            f"({expected[0]}) but got data with shape {array.shape[1:]} entries"
        )
    if space is not None:
        return _space_wording(name, array.shape[1:], space, "observation_space")
    return f"{field} has shape {array.shape} but must have shape {expected}"


def accepted_shapes(space: gym.Space) -> tuple[tuple[int, ...], ...] | None:
    """The shapes one element of ``space`` may have in a batch.

    An element is accepted in the space's own shape (Box, Discrete,
    MultiDiscrete, MultiBinary) or flattened to ``(flatdim,)`` (one-hot for
    Discrete and MultiDiscrete, as garage allows). Dict, Tuple and other
    composite spaces have no array shape of their own, so only their
    flattened form (``gymnasium.spaces.flatten``) is accepted.

    Returns:
        The accepted shapes, or None for spaces that cannot be flattened to
        a fixed size (Graph, Sequence): those are checked with ``contains``.
    """
    # Every batch built or decoded asks, twice: answered once per space.
    return _SHAPES.get(space, None, lambda: _accepted_shapes(space))


def _accepted_shapes(space: gym.Space) -> tuple[tuple[int, ...], ...] | None:
    shapes: list[tuple[int, ...]] = []
    if space.shape is not None:
        shapes.append(tuple(space.shape))
    if space.is_np_flattenable:
        flat = (int(gym.spaces.flatdim(space)),)
        if flat not in shapes:
            shapes.append(flat)
    return tuple(shapes) or None


#: Each space's accepted shapes.
_SHAPES: IdentityCache[tuple[tuple[int, ...], ...] | None] = IdentityCache()


def check_per_step_space(name: str, array: np.ndarray, space: gym.Space, space_name: str) -> None:
    """Checks that each row of ``array`` has a shape ``space`` accepts.

    Args:
        name: ``"<Type>.<field>"`` for the message.
        array: Array of rows (axis 0 is the batch axis).
        space: The space each row belongs to.
        space_name: ``"observation_space"`` or ``"action_space"``.
    """
    shapes = accepted_shapes(space)
    if shapes is None:
        if len(array) and not space.contains(array[0]):
            raise InvalidBatchError(f"{name}: row 0 is not in {space_name} {space}")
        return
    if array.shape[1:] not in shapes:
        raise _error(
            _space_wording(name, array.shape[1:], space, space_name),
            f"{name}: expected per-step shape {_describe(shapes)} for {space_name} {space}, "
            f"got per-step shape {array.shape[1:]} (array shape {array.shape}). "
            "Dict and Tuple elements must be flattened with gymnasium.spaces.flatten",
        )


def check_element(name: str, value: Any, space: gym.Space, space_name: str) -> None:
    """Checks that a single observation or action fits ``space``.

    Accepted: an element of the space's own shape or flattened shape (see
    :func:`accepted_shapes`), or anything ``space.contains`` accepts (e.g.
    an unflattened dict for a Dict space).
    """
    shapes = accepted_shapes(space)
    if shapes is not None and np.shape(value) in shapes:
        return
    # Spaces with an array shape of their own are settled by the shape;
    # only composite ones (Dict, Tuple, Graph, ...) take unflattened values.
    if space.shape is None and space.contains(value):
        return
    raise _error(
        _single_step_wording(name, space, space_name, np.shape(value)),
        f"{name}: expected an element of {space_name} {space} "
        f"(shape {_describe(shapes or ())}), got {type(value).__name__} "
        f"with shape {np.shape(value)}",
    )


def check_reward(name: str, value: Any) -> None:
    """Checks that a single reward is a real scalar (int, float or numpy)."""
    if (
        isinstance(value, bool | np.bool_)
        or np.ndim(value) != 0
        or np.asarray(value).dtype.kind not in "fiu"
    ):
        raise _error(
            f"reward must be type {float} but got type {type(value)} instead.",
            f"{name}: expected a real scalar, got {value!r}",
        )


def check_rewards(name: str, value: object, expected: int, reason: str) -> None:
    """Checks a rewards array: shape (expected,), integer or float dtype."""
    rewards = check_shape(name, value, (expected,), reason)
    if rewards.dtype.kind not in "fiu":
        raise InvalidBatchError(f"{name}: expected a float or integer dtype, got {rewards.dtype}")


def check_step_types(name: str, value: object, expected: int, reason: str) -> np.ndarray:
    """Checks a step_types array: shape (expected,), integer StepType values.

    Any integer dtype is accepted (the wire may carry uint8) and kept as
    given. An object array of StepType members, which is what garage's
    ``np.array(..., dtype=StepType)`` makes under numpy 2, is kept as it is,
    as garage keeps it; an object array of other ints is converted to int64.

    Returns:
        The array to store.
    """
    step_types = check_shape(name, value, (expected,), reason)
    if step_types.dtype == object:
        original = step_types
        try:
            step_types = step_types.astype(np.int64)
        except (TypeError, ValueError):
            raise InvalidBatchError(
                f"{name}: expected StepType values, got an object array that is not all ints"
            ) from None
        if all(isinstance(item, StepType) for item in original):
            return original  # members of the enum are in range by construction
    if step_types.dtype.kind not in "iu":
        raise _error(
            f"step_types has dtype {step_types.dtype} but must have dtype StepType",
            f"{name}: expected an integer dtype holding StepType values, got {step_types.dtype}",
        )
    if step_types.size == 0:
        return step_types
    # Plain-int bounds via min/max: comparing against IntEnum members sends
    # numpy down an object path (~20x slower on 100k steps, on every decode).
    # The ufuncs' reduce directly: ndarray.min/max add ~3 us of Python each.
    low, high = int(_MIN_STEP_TYPE), int(_MAX_STEP_TYPE)
    # Unsigned values (the wire's uint8) are never below the lowest, 0: one
    # pass, not two, for every result a learner decodes.
    signed = step_types.dtype.kind != "u" or low > 0
    below = signed and int(np.minimum.reduce(step_types)) < low
    if below or int(np.maximum.reduce(step_types)) > high:
        bad = (step_types < low) | (step_types > high)
        index = int(np.argmax(bad))
        raise InvalidBatchError(
            f"{name}: expected StepType values {int(_MIN_STEP_TYPE)}..{int(_MAX_STEP_TYPE)}, "
            f"got {step_types[index]} at index {index}"
        )
    return step_types


def check_lengths(name: str, value: object) -> np.ndarray:
    """Checks episode lengths: a 1-D integer array of values >= 1."""
    lengths = require_array(name, value)
    if lengths.ndim != 1:
        raise _error(
            f"lengths has shape {lengths.shape} but must be a tensor of shape (N,)",
            f"{name}: expected shape (N,), got {lengths.shape}",
        )
    if lengths.dtype.kind not in "iu":
        raise _error(
            f"lengths has dtype {lengths.dtype}, but must have an integer dtype",
            f"{name}: expected an integer dtype, got {lengths.dtype}",
        )
    if len(lengths) and np.minimum.reduce(lengths) < 1:
        index = int(np.argmin(lengths))
        raise InvalidBatchError(
            f"{name}: every episode needs at least one step, got length "
            f"{lengths[index]} at index {index}"
        )
    return lengths


def check_infos(name: str, value: object, expected: int, reason: str) -> None:
    """Checks an info dict: arrays or nested dicts of arrays, ``expected`` rows each.

    Args:
        name: ``"<Type>.<field>"`` for the message; keys are appended.
        value: The info dict.
        expected: Required leading dimension of every array.
        reason: Where ``expected`` comes from.
    """
    if not isinstance(value, Mapping):
        raise InvalidBatchError(f"{name}: expected a dict, got {type(value).__name__}")
    for key, item in value.items():
        if isinstance(item, np.ndarray) and item.ndim and item.shape[0] == expected:
            continue  # the common case, without building the path for a message
        path = f"{name}[{key!r}]"
        if isinstance(item, Mapping):
            check_infos(path, item, expected, reason)
        elif isinstance(item, np.ndarray):
            check_leading_dim(path, item, expected, reason)
        else:
            field, _ = _field(name)
            raise _error(
                f"Entry {key!r} in {field} is of type {type(item)} but must be {np.ndarray!r} "
                "or dict",
                f"{path}: expected a numpy array or a dict, got {type(item).__name__}",
            )


def check_mapping(name: str, value: object) -> None:
    """Checks that a single-step info value is a dict."""
    if not isinstance(value, Mapping):
        field, _ = _field(name)
        raise _error(
            f"{field} must be type {dict}, but got type {type(value)} instead.",
            f"{name}: expected a dict, got {type(value).__name__}",
        )


def _describe(shapes: tuple[tuple[int, ...], ...]) -> str:
    return " or ".join(str(shape) for shape in shapes) or "unknown"


def check_concatenable(owner: str, batches: Sequence[Any]) -> None:
    """Checks that batches can be concatenated: at least one, same spaces.

    ``max_episode_length`` may differ (an env update can change it between
    batches); the result keeps the first batch's env spec.
    """
    if not batches:
        raise InvalidBatchError(f"{owner}.concatenate: expected at least one batch, got none")
    first = batches[0].env_spec
    for i, batch in enumerate(batches[1:], start=1):
        spec = batch.env_spec
        if spec is first:
            continue
        if (spec.observation_space, spec.action_space) != (
            first.observation_space,
            first.action_space,
        ):
            raise InvalidBatchError(
                f"{owner}.concatenate: batch {i} has spaces ({spec.observation_space}, "
                f"{spec.action_space}), batch 0 has ({first.observation_space}, "
                f"{first.action_space}); only batches of the same env can be concatenated"
            )
