"""Array helpers shared by the batch types: nested info dicts and padding.

Info dicts (``env_infos``, ``agent_infos``, ``episode_infos``) map names to
arrays or to nested dicts of arrays, every array sharing one leading
dimension. Each operation here walks that tree once and makes one numpy call
per leaf, never one per row.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike

from rlfleet.errors import InvalidBatchError, InvalidValueError, OutOfRangeError

#: A dict of arrays, or of nested dicts of arrays, all with the same leading
#: dimension. Typed ``Any`` so that ``batch.agent_infos["logp"].mean()``
#: type-checks without narrowing; validation enforces the structure.
NestedArrays: TypeAlias = dict[str, Any]


def map_nested(fn: Callable[[np.ndarray], np.ndarray], tree: Mapping) -> NestedArrays:
    """Applies ``fn`` to every array of a nested dict, keeping its structure.

    Args:
        fn: Function from one leaf array to its replacement.
        tree: The nested dict.

    Returns:
        A new nested dict with the same keys.
    """
    return {
        key: map_nested(fn, value) if isinstance(value, Mapping) else fn(value)
        for key, value in tree.items()
    }


def slice_nested(tree: Mapping, start: int, stop: int) -> NestedArrays:
    """Rows ``start:stop`` of every leaf (numpy views, no copies)."""
    return map_nested(lambda array: array[start:stop], tree)


def take_nested(tree: Mapping, index: int) -> NestedArrays:
    """Row ``index`` of every leaf, dropping the leading dimension."""
    return map_nested(lambda array: array[index], tree)


def repeat_nested(tree: Mapping, repeats: np.ndarray) -> NestedArrays:
    """Repeats row i of every leaf ``repeats[i]`` times along axis 0."""
    return map_nested(lambda array: np.repeat(array, repeats, axis=0), tree)


def concat_nested(trees: Sequence[Mapping], what: str) -> NestedArrays:
    """Concatenates the leaves of several nested dicts along axis 0.

    Args:
        trees: Nested dicts with identical structure.
        what: Name of the field, for error messages (e.g.
            ``"EpisodeBatch.env_infos"``).

    Returns:
        The nested dict of concatenations (one ``np.concatenate`` per leaf).

    Raises:
        InvalidBatchError: If the structures or trailing shapes differ.
    """
    if not trees:
        return {}
    first = trees[0]
    for i, tree in enumerate(trees[1:], start=1):
        if not isinstance(tree, Mapping):
            raise InvalidBatchError(
                f"{what}: is a dict in item 0 but a {type(tree).__name__} in item {i}"
            )
        if tree.keys() != first.keys():
            raise InvalidBatchError(
                f"{what}: item {i} has keys {sorted(tree)}, item 0 has keys {sorted(first)}; "
                "every item must carry the same info keys"
            )
    result: NestedArrays = {}
    for key, value in first.items():
        path = f"{what}[{key!r}]"
        values = [tree[key] for tree in trees]
        if isinstance(value, Mapping):
            result[key] = concat_nested(values, path)
            continue
        for i, other in enumerate(values):
            if isinstance(other, Mapping):
                raise InvalidBatchError(
                    f"{path}: is a {type(value).__name__} in item 0 but a dict in item {i}"
                )
        result[key] = _concatenate(values, path)
    return result


def _concatenate(arrays: Sequence[Any], what: str) -> np.ndarray:
    try:
        return np.concatenate(arrays)
    except ValueError as error:
        shapes = [np.shape(array) for array in arrays]
        raise InvalidBatchError(f"{what}: cannot concatenate shapes {shapes}: {error}") from None


def episode_starts(lengths: np.ndarray) -> np.ndarray:
    """Index of the first step of each episode in the flattened time axis."""
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return starts


def pad_batch_array(
    array: np.ndarray, lengths: np.ndarray, max_length: int | None = None
) -> np.ndarray:
    """Reshapes a flattened (N•[T], S*) array to a zero-padded (N, T_max, S*).

    garage's ``pad_batch_array``: if an episode is longer than
    ``max_length``, it warns and pads to the longest episode instead.

    Args:
        array: Array whose leading dimension is ``lengths.sum()``.
        lengths: Length of each episode, shape (N,).
        max_length: Padded length; the longest episode if None.

    Returns:
        Array of shape (N, max_length, *array.shape[1:]) with ``array.dtype``,
        zero after each episode's end.

    Raises:
        InvalidValueError: If ``array``'s leading dimension is not ``lengths.sum()``.
    """
    total = int(lengths.sum())
    if array.shape[0] != total:
        raise InvalidValueError(
            f"pad_batch_array: expected leading dimension {total} (sum of lengths), "
            f"got shape {array.shape}"
        )
    longest = int(lengths.max()) if len(lengths) else 0
    if max_length is None:
        max_length = longest
    elif max_length < longest:
        warnings.warn(
            f"pad_batch_array: an episode of length {longest} is longer than the "
            f"requested max_length {max_length}; padding to {longest}",
            stacklevel=2,
        )
        max_length = longest
    padded = np.zeros((len(lengths), max_length, *array.shape[1:]), dtype=array.dtype)
    # True cells of the mask run in C order, i.e. episode by episode and
    # step by step within it: exactly the flattened order of ``array``.
    valid = np.arange(max_length) < lengths[:, np.newaxis]
    padded[valid] = array
    return padded


def pad_to_last(nums: ArrayLike, total_length: int, axis: int = -1, val: float = 0) -> np.ndarray:
    """Pads ``val`` at the end of ``nums`` along ``axis`` up to ``total_length``.

    The numpy counterpart of garage's ``pad_to_last``. An array already at
    least ``total_length`` long along ``axis`` is returned unchanged (not
    truncated), as in garage.

    Args:
        nums: The array to pad (anything ``np.asarray`` takes).
        total_length: Length of the result along ``axis``.
        axis: Axis to pad; negative values count from the end.
        val: The padding value.

    Returns:
        The padded array, with the dtype of ``np.asarray(nums)``.

    Raises:
        OutOfRangeError: If ``axis`` is out of range for ``nums``.
    """
    array = np.asarray(nums)
    if not -array.ndim <= axis < array.ndim:
        raise OutOfRangeError(f"pad_to_last: axis {axis} is out of range for shape {array.shape}")
    axis %= array.ndim
    missing = total_length - array.shape[axis]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, missing)
    return np.pad(array, widths, constant_values=val)


def concat_fields(
    where: str,
    items: Sequence[Any],
    fields: Sequence[str],
    get: Callable[[Any, str], Any] = getattr,
) -> dict[str, Any]:
    """Concatenates fields across items: one ``np.concatenate`` per array.

    Args:
        where: Method name for messages, e.g. ``"EpisodeBatch.concatenate"``.
        items: Batches (or dicts, with ``get=operator.getitem``).
        fields: Field names; each holds an array (or anything
            ``np.concatenate`` takes) or an info dict in every item.
        get: How to read a field from an item.

    Returns:
        ``{field: concatenation}``, ready to pass to a batch constructor.

    Raises:
        InvalidBatchError: If info keys or the arrays' trailing shapes differ.
    """
    result: dict[str, Any] = {}
    for field in fields:
        values = [_get_field(where, get, i, item, field) for i, item in enumerate(items)]
        what = f"{where} {field}"
        if isinstance(values[0], Mapping):
            result[field] = concat_nested(values, what)
        else:
            result[field] = _concatenate(values, what)
    return result


def _get_field(
    where: str, get: Callable[[Any, str], Any], index: int, item: Any, field: str
) -> Any:
    try:
        return get(item, field)
    except (KeyError, AttributeError):
        raise InvalidBatchError(f"{where}: item {index} has no {field!r}") from None


def summarize(value: object) -> str:
    """A short description of an array or info dict, for ``__repr__``."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {summarize(v)}" for k, v in value.items()) + "}"
    return repr(value)


def batch_repr(batch: object, header: str, fields: Sequence[str]) -> str:
    """``Type(header, field=dtype(shape), ...)``: a repr that never prints data.

    Args:
        batch: The batch object.
        header: Leading text inside the parentheses (sizes).
        fields: Attribute names to summarise.

    Returns:
        The repr text.
    """
    parts = ", ".join(f"{name}={summarize(getattr(batch, name))}" for name in fields)
    return f"{type(batch).__name__}({header}, {parts})"


def values_equal(left: Any, right: Any) -> bool:
    """Value equality of batch fields: arrays by shape and contents, dicts by keys and values.

    garage's types are namedtuples, whose ``==`` compares fields with
    ``==``; on arrays that raises (an array's truth value is ambiguous)
    unless both sides are the same object. This compares what the fields
    hold instead. Arrays must have equal shapes and elements (NaN equals NaN
    in float arrays, since a copied batch must equal its original).
    """
    if left is right:
        return True
    if isinstance(left, Mapping) or isinstance(right, Mapping):
        return (
            isinstance(left, Mapping)
            and isinstance(right, Mapping)
            and left.keys() == right.keys()
            and all(values_equal(left[key], right[key]) for key in left)
        )
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        a, b = np.asarray(left), np.asarray(right)
        if a.shape != b.shape:
            return False
        nan_aware = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=nan_aware))
    return bool(left == right)


class ValueEquality:
    """``==`` by value over a dataclass's fields (see :func:`values_equal`); unhashable.

    Unhashable like garage's namedtuples holding arrays or dicts, whose
    ``hash`` raises too.
    """

    def __eq__(self, other: object) -> bool:
        """Whether ``other`` is of the same type and every field holds equal values."""
        if type(other) is not type(self):
            return NotImplemented
        return all(
            values_equal(getattr(self, field.name), getattr(other, field.name))
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
        )

    __hash__ = None  # type: ignore[assignment]
