"""Observation batches: shape checks and the float32 encoding MLPs read.

The encoding is part of the cross-language contract (docs/policies.md): Box
and MultiBinary observations are flattened in C order and cast to float32;
Discrete observations become one-hot rows; MultiDiscrete observations become
one one-hot block per element, concatenated in C order (gymnasium's
``spaces.flatten``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.errors import ConfigError, PolicyError

#: Observation spaces the built-in MLP policies can encode.
ENCODABLE_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def batch_size(observations: Any, space: gym.Space, owner: str) -> int:
    """Checks a batch of observations against ``space``; returns its size N.

    Dict and Tuple observations are checked leaf by leaf, and every leaf must
    have the same leading dimension.

    Args:
        observations: The batch, leading dimension N.
        space: The observation space of one row.
        owner: Who checks (named in errors, e.g. ``"RandomPolicy"``).

    Returns:
        N.

    Raises:
        PolicyError: If a leaf's shape is not (N, *leaf_space.shape), or the
            leaves disagree on N.
    """
    sizes = _leaf_sizes(observations, space, owner, path="observations")
    if not sizes:
        raise PolicyError(f"{owner}.get_actions: observations for {space} have no arrays")
    first_path, n = sizes[0]
    for path, size in sizes[1:]:
        if size != n:
            raise PolicyError(
                f"{owner}.get_actions: {path} has {size} rows but {first_path} has {n}; "
                "every part of a batched observation needs the same leading dimension"
            )
    return n


def _leaf_sizes(
    observations: Any, space: gym.Space, owner: str, path: str
) -> list[tuple[str, int]]:
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(observations, dict):
            raise PolicyError(
                f"{owner}.get_actions: {path} must be a dict of batched arrays for a Dict "
                f"space, got {type(observations).__name__}"
            )
        missing = sorted(set(space.spaces) - set(observations))
        if missing:
            raise PolicyError(f"{owner}.get_actions: {path} lacks keys {missing}")
        return [
            size
            for key, sub in space.spaces.items()
            for size in _leaf_sizes(observations[key], sub, owner, f"{path}[{key!r}]")
        ]
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(observations, tuple | list) or len(observations) != len(space.spaces):
            raise PolicyError(
                f"{owner}.get_actions: {path} must be a tuple of {len(space.spaces)} batched "
                f"arrays for a Tuple space, got {type(observations).__name__}"
            )
        return [
            size
            for i, (obs, sub) in enumerate(zip(observations, space.spaces, strict=True))
            for size in _leaf_sizes(obs, sub, owner, f"{path}[{i}]")
        ]
    array = np.asarray(observations)
    return [(path, _checked_rows(array, space, owner, path))]


def _checked_rows(array: np.ndarray, space: gym.Space, owner: str, path: str) -> int:
    if space.shape is None:
        # Spaces without a fixed shape (Text, Graph, ...): only N is known.
        if array.ndim < 1:
            raise PolicyError(f"{owner}.get_actions: {path} must be batched, got a scalar")
        return int(array.shape[0])
    expected = tuple(space.shape)
    if array.ndim != len(expected) + 1 or tuple(array.shape[1:]) != expected:
        want = ", ".join(["N", *map(str, expected)])
        hint = (
            "; this looks like one observation: use get_action, or add a batch dimension"
            if tuple(array.shape) == expected
            else ""
        )
        raise PolicyError(
            f"{owner}.get_actions: {path} must have shape ({want}) for {space}, "
            f"got {tuple(array.shape)}{hint}"
        )
    return int(array.shape[0])


class ObservationEncoder:
    """Encodes observation batches of one space as float32 matrices.

    Args:
        space: The observation space (Box, Discrete, MultiDiscrete or
            MultiBinary).
        owner: The policy class name, for error messages.

    Attributes:
        dim: Width of the encoded matrix.

    Raises:
        ConfigError: If the space cannot be encoded.
    """

    def __init__(self, space: gym.Space, owner: str) -> None:
        if not isinstance(space, ENCODABLE_SPACES):
            raise ConfigError(
                f"{owner} reads Box, Discrete, MultiDiscrete or MultiBinary observations, "
                f"got {space}; flatten the observations with a gymnasium wrapper "
                "(e.g. FlattenObservation) or plug in your own Policy class"
            )
        self.space = space
        self.owner = owner
        if isinstance(space, gym.spaces.Discrete):
            self.dim = int(space.n)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            nvec = space.nvec.ravel().astype(np.int64)
            self._md_start = space.start.ravel().astype(np.int64)
            self._md_n = nvec
            self._md_offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]).astype(np.int64)
            self.dim = int(nvec.sum())
        else:
            self.dim = int(np.prod(space.shape, dtype=np.int64))
        # Float32 batches of flat Box rows are their own encoding (None: never).
        is_flat_box = isinstance(space, gym.spaces.Box) and len(space.shape) == 1
        self._flat_shape = (self.dim,) if is_flat_box else None

    def __call__(self, observations: Any) -> np.ndarray:
        """Encodes a batch.

        Args:
            observations: Array-like of shape (N, *space.shape).

        Returns:
            A float32 array of shape (N, dim).

        Raises:
            PolicyError: If the shape does not match the space, or a Discrete /
                MultiDiscrete value is not an integer inside the space.
        """
        if (
            type(observations) is np.ndarray
            and observations.dtype == np.float32
            and observations.shape[1:] == self._flat_shape
        ):
            return observations  # the worker's hot path: already the encoding
        array = np.asarray(observations)
        n = _checked_rows(array, self.space, self.owner, "observations")
        space = self.space
        if isinstance(space, gym.spaces.Discrete):
            index = self._indices(array, np.int64(space.start), np.int64(space.n))
            encoded = np.zeros((n, self.dim), dtype=np.float32)
            encoded[np.arange(n), index] = 1.0
            return encoded
        if isinstance(space, gym.spaces.MultiDiscrete):
            flat = array.reshape(n, -1)
            index = self._indices(flat, self._md_start, self._md_n) + self._md_offsets
            encoded = np.zeros((n, self.dim), dtype=np.float32)
            encoded[np.arange(n)[:, None], index] = 1.0
            return encoded
        return array.reshape(n, self.dim).astype(np.float32, copy=False)

    def _indices(self, values: np.ndarray, start: Any, size: Any) -> np.ndarray:
        """Returns ``values - start`` after checking each lies in [0, size)."""
        if values.dtype.kind not in "iu":
            raise PolicyError(
                f"{self.owner}.get_actions: {self.space} observations must be integers, "
                f"got dtype {values.dtype}"
            )
        index = values.astype(np.int64) - start
        bad = (index < 0) | (index >= size)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise PolicyError(
                f"{self.owner}.get_actions: observation row {row} ({values[row].tolist()}) "
                f"is outside {self.space}"
            )
        return index
