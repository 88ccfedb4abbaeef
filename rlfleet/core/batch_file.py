"""EpisodeBatch files (``.npz``): what ``rlfleet sample`` writes and :func:`load_batch` reads.

One array per key (``numpy.load(FILE)`` reads it without rlfleet):

* ``observations``, ``last_observations``, ``actions``, ``rewards``,
  ``step_types``, ``lengths``: the EpisodeBatch fields (garage's layout,
  episodes laid end to end); docs/operations.md lists their dtypes.
* ``episode_infos.KEY``, ``env_infos.KEY``, ``agent_infos.KEY``: the info
  dicts, nested dicts flattened with dots (``env_infos.a.b``).
* ``env_spec``: JSON text, ``{"observation_space": SPACE, "action_space":
  SPACE, "max_episode_length": N or null}``, each SPACE named as gymnasium
  names it, numbers as numbers (:func:`space_to_json`).
* ``format``: :data:`FILE_FORMAT`.

Only numpy and gymnasium are needed to read one: no protobuf, no pickle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.errors import ConfigError, WireFormatError

#: The ``format`` entry of the files: bumped when the layout changes.
FILE_FORMAT = "rlfleet.episode_batch.npz/2"
_ARRAYS = ("observations", "last_observations", "actions", "rewards", "step_types", "lengths")
_INFOS = ("episode_infos", "env_infos", "agent_infos")
#: JSON has no infinity: unbounded Box bounds are these strings.
_INFINITE = {"inf": math.inf, "-inf": -math.inf}


def save_batch(path: Path | str, batch: EpisodeBatch) -> None:
    """Writes a batch as an ``.npz`` file in the layout above.

    Args:
        path: The file to write (no ``.npz`` is appended).
        batch: The batch.
    """
    arrays: dict[str, Any] = {name: getattr(batch, name) for name in _ARRAYS}
    for name in _INFOS:
        arrays.update(_flatten(getattr(batch, name), name))
    arrays["env_spec"] = np.array(json.dumps(env_spec_to_json(batch.env_spec)))
    arrays["format"] = np.array(FILE_FORMAT)
    with open(path, "wb") as file:  # a file object: savez would append ".npz" to a str path
        np.savez(file, **arrays)


def load_batch(path: Path | str) -> EpisodeBatch:
    """Reads a file written by :func:`save_batch` (or ``rlfleet sample``).

    Raises:
        ConfigError: If the file is not in this layout or its spec is malformed.
    """
    with np.load(path, allow_pickle=False) as data:
        found = str(data["format"]) if "format" in data.files else "no format entry"
        if found != FILE_FORMAT:
            raise ConfigError(
                f"{path} is not a {FILE_FORMAT} file ({found}); write it with "
                "`rlfleet sample` or rlfleet.save_batch of this version"
            )
        spec = env_spec_from_json(json.loads(str(data["env_spec"])))
        fields: dict[str, Any] = {name: data[name] for name in _ARRAYS}
        fields.update({name: {} for name in _INFOS})
        for key in data.files:
            group, _, rest = key.partition(".")
            if group in _INFOS and rest:
                _insert(fields[group], rest.split("."), data[key])
        return EpisodeBatch(env_spec=spec, **fields)


def env_spec_to_json(spec: EnvSpec) -> dict[str, Any]:
    """An EnvSpec as JSON-ready data (see :func:`space_to_json`)."""
    return {
        "observation_space": space_to_json(spec.observation_space),
        "action_space": space_to_json(spec.action_space),
        "max_episode_length": spec.max_episode_length,
    }


def env_spec_from_json(data: Mapping[str, Any]) -> EnvSpec:
    """The EnvSpec of :func:`env_spec_to_json`'s data.

    Raises:
        ConfigError: If the data does not describe an EnvSpec.
    """
    try:
        return EnvSpec(
            space_from_json(data["observation_space"]),
            space_from_json(data["action_space"]),
            data.get("max_episode_length"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"malformed env_spec JSON ({exc!r}): {str(data)[:200]}") from exc


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A gymnasium space as JSON-ready data, named and shaped as gymnasium names them.

    ``{"type": "Box", "shape": [4], "dtype": "float32", "low": [...],
    "high": [...]}`` (unbounded ends as ``"inf"``/``"-inf"``),
    ``{"type": "Discrete", "n": 2, "start": 0}``, ``{"type":
    "MultiDiscrete", "nvec": [...], "dtype": ...}``, ``{"type":
    "MultiBinary", "n": ...}``, ``{"type": "Dict", "spaces": {...}}``,
    ``{"type": "Tuple", "spaces": [...]}``.

    Raises:
        ConfigError: For another kind of space.
    """
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": space.dtype.name,
            "low": _finite_or_text(space.low),
            "high": _finite_or_text(space.high),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "dtype": space.dtype.name}
    if isinstance(space, gym.spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": n if isinstance(n, int) else list(n)}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}
    raise ConfigError(f"cannot describe {type(space).__name__} spaces in a batch file")


def space_from_json(data: Mapping[str, Any]) -> gym.Space:
    """The gymnasium space of :func:`space_to_json`'s data."""
    kind = data["type"]
    if kind == "Box":
        dtype = np.dtype(data["dtype"])
        low, high = (_with_infinities(data[end], dtype) for end in ("low", "high"))
        return gym.spaces.Box(low, high, tuple(data["shape"]), dtype)
    if kind == "Discrete":
        return gym.spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(np.array(data["nvec"]), dtype=np.dtype(data["dtype"]))
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(data["n"])
    if kind == "Dict":
        return gym.spaces.Dict({k: space_from_json(v) for k, v in data["spaces"].items()})
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_json(s) for s in data["spaces"]])
    raise WireFormatError(f"unknown space type {kind!r}")


def _finite_or_text(array: np.ndarray) -> Any:
    values = array.tolist()

    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return [convert(v) for v in value]
        if isinstance(value, float) and math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value

    return convert(values)


def _with_infinities(values: Any, dtype: np.dtype) -> np.ndarray:
    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return [convert(v) for v in value]
        return _INFINITE.get(value, value) if isinstance(value, str) else value

    return np.array(convert(values), dtype=dtype)


def _flatten(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, np.ndarray]]:
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, name)
        else:
            yield name, value


def _insert(tree: dict[str, Any], path: list[str], value: np.ndarray) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value
