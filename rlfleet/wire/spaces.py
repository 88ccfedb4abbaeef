"""gymnasium spaces and EnvSpec on the wire (``rlfleet.v1.Space`` / ``EnvSpec``).

Spaces travel once per env generation, so this goes through protobuf's
generated classes. Supported: Box, Discrete, MultiDiscrete, MultiBinary,
Dict (key order kept) and Tuple, nested arbitrarily. A space's RNG state is
not sent.

Two gymnasium details the contract cannot carry (spaces.proto has no field
for them), so they do not survive a round trip:

* ``Discrete(dtype=...)``: samples travel as int64, so a Discrete space
  always decodes with dtype int64.
* ``MultiBinary([n])`` and ``MultiBinary(n)`` are both shape ``(n,)`` on the
  wire and decode as ``MultiBinary(n)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from google.protobuf.message import DecodeError

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, WireFormatError
from rlfleet.v1 import spaces_pb2
from rlfleet.wire._tensor_header import dtype_code, dtype_of_code
from rlfleet.wire.tensor_messages import decode_tensor, encode_tensor
from rlfleet.wire.tensors import element_count

_SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple"


def encode_space(space: gym.Space) -> spaces_pb2.Space:
    """Builds a ``rlfleet.v1.Space`` message from a gymnasium space.

    Args:
        space: A Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple
            space, nested arbitrarily.

    Returns:
        The Space message.

    Raises:
        WireFormatError: For any other space type (the message names it) or
            a dtype the wire cannot carry.
    """
    return _encode(space, "space")


def _encode(space: gym.Space, where: str) -> spaces_pb2.Space:
    if isinstance(space, gym.spaces.Box):
        dtype = dtype_code(space.dtype, where)
        return spaces_pb2.Space(
            box=spaces_pb2.BoxSpace(
                shape=space.shape,
                dtype=dtype,  # type: ignore[arg-type]
                low=encode_tensor(space.low),
                high=encode_tensor(space.high),
            )
        )
    if isinstance(space, gym.spaces.Discrete):
        return spaces_pb2.Space(
            discrete=spaces_pb2.DiscreteSpace(n=int(space.n), start=int(space.start))
        )
    if isinstance(space, gym.spaces.MultiDiscrete):
        return spaces_pb2.Space(
            multi_discrete=spaces_pb2.MultiDiscreteSpace(
                nvec=encode_tensor(space.nvec.astype(np.int64)),
                start=encode_tensor(space.start.astype(np.int64)),
                dtype=dtype_code(space.dtype, where),  # type: ignore[arg-type]
            )
        )
    if isinstance(space, gym.spaces.MultiBinary):
        return spaces_pb2.Space(multi_binary=spaces_pb2.MultiBinarySpace(shape=space.shape))
    if isinstance(space, gym.spaces.Dict):
        entries = [
            spaces_pb2.DictSpaceEntry(key=key, space=_encode(sub, f"{where}[{key!r}]"))
            for key, sub in space.spaces.items()
        ]
        return spaces_pb2.Space(dict=spaces_pb2.DictSpace(entries=entries))
    if isinstance(space, gym.spaces.Tuple):
        subspaces = [_encode(sub, f"{where}[{i}]") for i, sub in enumerate(space.spaces)]
        return spaces_pb2.Space(tuple=spaces_pb2.TupleSpace(spaces=subspaces))
    raise WireFormatError(
        f"{where}: gymnasium space type {type(space).__name__} cannot travel; "
        f"the wire supports {_SUPPORTED}"
    )


def decode_space(msg: spaces_pb2.Space) -> gym.Space:
    """Rebuilds a gymnasium space from a ``rlfleet.v1.Space`` message.

    Args:
        msg: The Space message.

    Returns:
        The space (unseeded). Box bounds are copies, not views of ``msg``.

    Raises:
        WireFormatError: If no kind is set, a field is inconsistent (e.g. Box
            bounds of another shape or dtype than the space's), or gymnasium
            rejects the values (e.g. low > high); the message names the
            nested position.
    """
    return _decode(msg, "space")


def _decode(msg: spaces_pb2.Space, where: str) -> gym.Space:
    kind = msg.WhichOneof("kind")
    decoder = _DECODERS.get(kind or "")
    if decoder is None:
        raise WireFormatError(
            f"{where}: the Space message sets no kind; expected one of {_SUPPORTED}"
        )
    try:
        return decoder(getattr(msg, kind or ""), where)
    except (ValueError, TypeError) as error:
        if isinstance(error, WireFormatError):
            raise
        raise WireFormatError(f"{where}: gymnasium rejected the {kind} space: {error}") from error


def _decode_box(msg: spaces_pb2.BoxSpace, where: str) -> gym.Space:
    dtype = _decoded_dtype(msg.dtype, f"{where}.dtype")
    shape = tuple(msg.shape)
    element_count(list(shape), f"{where}.shape")
    bounds = []
    for name in ("low", "high"):
        if not msg.HasField(name):
            raise WireFormatError(f"{where}.{name}: missing; Box bounds are full tensors")
        bound = decode_tensor(getattr(msg, name), name=f"{where}.{name}")
        if bound.shape != shape or bound.dtype != dtype:
            raise WireFormatError(
                f"{where}.{name}: expected a {dtype.name} tensor of shape {shape}, "
                f"got {bound.dtype.name} of shape {bound.shape}"
            )
        bounds.append(bound)
    return gym.spaces.Box(low=bounds[0], high=bounds[1], shape=shape, dtype=dtype)


def _decode_discrete(msg: spaces_pb2.DiscreteSpace, where: str) -> gym.Space:
    if msg.n < 1:
        raise WireFormatError(f"{where}.n: expected n >= 1, got {msg.n}")
    return gym.spaces.Discrete(int(msg.n), start=int(msg.start))


def _decode_multi_discrete(msg: spaces_pb2.MultiDiscreteSpace, where: str) -> gym.Space:
    dtype = _decoded_dtype(msg.dtype, f"{where}.dtype")
    nvec = _int64_tensor(msg, "nvec", where)
    start = _int64_tensor(msg, "start", where)
    if start.shape != nvec.shape:
        raise WireFormatError(
            f"{where}.start: expected shape {nvec.shape} (that of nvec), got {start.shape}"
        )
    return gym.spaces.MultiDiscrete(nvec.copy(), dtype=dtype, start=start.copy())


def _int64_tensor(msg: spaces_pb2.MultiDiscreteSpace, name: str, where: str) -> np.ndarray:
    if not msg.HasField(name):
        raise WireFormatError(f"{where}.{name}: missing")
    array = decode_tensor(getattr(msg, name), name=f"{where}.{name}")
    if array.dtype != np.int64:
        raise WireFormatError(f"{where}.{name}: expected an int64 tensor, got {array.dtype.name}")
    return array


def _decode_multi_binary(msg: spaces_pb2.MultiBinarySpace, where: str) -> gym.Space:
    shape = [int(dim) for dim in msg.shape]
    if not shape or min(shape) < 1:
        raise WireFormatError(f"{where}.shape: expected positive dimensions, got {shape}")
    element_count(shape, f"{where}.shape")
    return gym.spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)


def _decode_dict(msg: spaces_pb2.DictSpace, where: str) -> gym.Space:
    spaces: list[tuple[str, gym.Space]] = []
    seen: set[str] = set()
    for entry in msg.entries:
        if entry.key in seen:
            raise WireFormatError(f"{where}: duplicate key {entry.key!r}")
        seen.add(entry.key)
        spaces.append((entry.key, _decode(entry.space, f"{where}[{entry.key!r}]")))
    # A sequence of pairs keeps the wire order; a plain dict would be sorted.
    return gym.spaces.Dict(spaces)


def _decode_tuple(msg: spaces_pb2.TupleSpace, where: str) -> gym.Space:
    return gym.spaces.Tuple([_decode(sub, f"{where}[{i}]") for i, sub in enumerate(msg.spaces)])


def _decoded_dtype(code: int, where: str) -> np.dtype:
    dtype = dtype_of_code(code, where)
    # Spaces hold native dtypes; equality with the sender's space needs them.
    return dtype.newbyteorder("=")


_DECODERS: dict[str, Callable[[Any, str], gym.Space]] = {
    "box": _decode_box,
    "discrete": _decode_discrete,
    "multi_discrete": _decode_multi_discrete,
    "multi_binary": _decode_multi_binary,
    "dict": _decode_dict,
    "tuple": _decode_tuple,
}


def encode_env_spec(spec: EnvSpec) -> spaces_pb2.EnvSpec:
    """Builds a ``rlfleet.v1.EnvSpec`` message.

    Args:
        spec: The EnvSpec.

    Returns:
        The message; ``max_episode_length`` is absent when the spec has none.

    Raises:
        WireFormatError: If a space cannot travel (see :func:`encode_space`).
    """
    msg = spaces_pb2.EnvSpec(
        observation_space=_encode(spec.observation_space, "EnvSpec.observation_space"),
        action_space=_encode(spec.action_space, "EnvSpec.action_space"),
    )
    if spec.max_episode_length is not None:
        msg.max_episode_length = spec.max_episode_length
    return msg


def decode_env_spec(msg: spaces_pb2.EnvSpec) -> EnvSpec:
    """Rebuilds an EnvSpec from a ``rlfleet.v1.EnvSpec`` message.

    Args:
        msg: The EnvSpec message.

    Returns:
        The EnvSpec.

    Raises:
        WireFormatError: If a space is missing or malformed, or
            max_episode_length is set but < 1.
    """
    spaces = []
    for name in ("observation_space", "action_space"):
        if not msg.HasField(name):
            raise WireFormatError(f"EnvSpec.{name}: missing")
        spaces.append(_decode(getattr(msg, name), f"EnvSpec.{name}"))
    limit = msg.max_episode_length if msg.HasField("max_episode_length") else None
    try:
        return EnvSpec(spaces[0], spaces[1], limit)
    except ConfigError as error:
        raise WireFormatError(f"EnvSpec: {error}") from error


def parse_env_spec(data: bytes) -> EnvSpec:
    """Rebuilds an EnvSpec from a serialized ``rlfleet.v1.EnvSpec``.

    Raises:
        WireFormatError: If the bytes do not parse, or as :func:`decode_env_spec`.
    """
    try:
        message = spaces_pb2.EnvSpec.FromString(data)
    except DecodeError as exc:
        raise WireFormatError(f"EnvSpec: the bytes do not parse ({exc})") from None
    return decode_env_spec(message)


__all__ = [
    "decode_env_spec",
    "decode_space",
    "encode_env_spec",
    "encode_space",
    "parse_env_spec",
]
