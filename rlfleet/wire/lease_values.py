"""The values of a LeaseReply: observations, infos and attribute values.

Worker side (:func:`add_observations`, :func:`add_infos`): observations
travel as one tensor, info entries as tensors (numbers, arrays) or JSON
(strings, None, dicts mixing kinds). Learner side
(:func:`decode_observations`, :func:`infos_of`): the same, decoded, and
checked against the lease's spaces (:class:`ReplyCheck`).

**Pickles, on leases of pickled factories only.** A lease whose envs were
built from pickled factories (``LeaseOpen.env.pickled_env_factory``) runs
the learner's code on workers that opted in to code (``--allow-pickle``
with TLS and tokens on the coordinator and the workers, or an embedded
fleet's own children: rlfleet.security.pickle). On such a lease, and only
there, what the plain fields cannot carry travels cloudpickled (leases.proto,
"Pickled values"): an env put into an info dict, Dict observations, envs
with different spaces, attributes that are objects. That is what tianshou's
``RayVectorEnv`` carries, so its users' envs run unchanged. The learner
unpickles only on a lease it opened from pickled factories
(:attr:`ReplyCheck.unpickle`): a worker that sends pickles on any other lease
breaks the protocol, and nothing is unpickled. This module holds no pickle
module of its own: the worker hands it a :data:`Pickler` and the learner an
:data:`Unpickler` for such leases only (rlfleet.security.pickle).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._util.values import json_object
from rlfleet.errors import ConfigError, ProtocolError
from rlfleet.wire import decode_tensor, decode_tensor_map, encode_tensor_into, encode_tensor_map

#: Pickles a value for a reply, naming it in errors (rlfleet.security.pickle.dumps).
Pickler = Callable[[Any, str], bytes]
#: Unpickles a value of a reply (cloudpickle.loads).
Unpickler = Callable[[bytes], Any]

#: How to make a value travel that leases of env ids do not carry (for messages).
PICKLES_HINT = (
    "or lease the envs from factories where the fleet takes code (RemoteVectorEnv(env_fns) "
    "on an embedded fleet, or on a coordinator and workers started with --allow-pickle), "
    "which carries any picklable value"
)


@dataclass(frozen=True)
class ReplyCheck:
    """What a learner checks a lease's replies against (from LeaseOpened).

    Attributes:
        spaces: Each env's observation space, env i's at index i.
        unpickle: For a lease whose envs came from pickled factories, how
            to unpickle the values its replies may carry (leases.proto);
            None for any other lease, whose pickles are refused.
        uniform: The observation space every env shares in shape and
            dtype, or None when they differ (each row is then checked
            against its env's space).
    """

    spaces: Sequence[gym.Space]
    unpickle: Unpickler | None = None
    uniform: gym.Space | None = field(init=False)

    def __post_init__(self) -> None:
        spaces = self.spaces
        first = spaces[0] if spaces else None
        alike = first is not None and all(
            s.shape == first.shape and s.dtype == first.dtype for s in spaces
        )
        object.__setattr__(self, "uniform", first if alike else None)

    def space(self, env_id: int) -> gym.Space:
        """Env ``env_id``'s observation space.

        Raises:
            ProtocolError: For an env id the lease does not have.
        """
        if not 0 <= env_id < len(self.spaces):
            raise ProtocolError(
                f"a lease reply names env {env_id}; the lease has envs 0..{len(self.spaces) - 1}"
            )
        return self.spaces[env_id]


def one_array(observations: Sequence[Any]) -> bool:
    """Whether observations stack into one tensor: numeric arrays of one shape and dtype."""
    first = observations[0]
    if not isinstance(first, np.ndarray) or first.dtype.kind not in "biuf":
        return False
    return all(
        isinstance(o, np.ndarray) and o.shape == first.shape and o.dtype == first.dtype
        for o in observations
    )


def load_values(blobs: Sequence[bytes], field_name: str, check: ReplyCheck) -> list[Any]:
    """Unpickles a reply's pickled values (the learner's side), where the lease allows it.

    Args:
        blobs: The pickle bytes, one per value (b"": None).
        field_name: The LeaseReply field, for messages.
        check: The lease's rules: pickles only on a lease of pickled factories.

    Raises:
        ProtocolError: If the lease carries no pickles (nothing is
            unpickled), or the bytes do not unpickle here.
    """
    unpickle = check.unpickle
    if unpickle is None:
        raise ProtocolError(
            f"a lease reply holds {field_name}, but the lease's envs are not from pickled "
            "factories, so this learner unpickles nothing from it; a worker sends pickles "
            "only on leases of pickled factories (leases.proto)"
        )
    try:
        return [unpickle(blob) if blob else None for blob in blobs]
    except Exception as exc:
        raise ProtocolError(
            f"LeaseReply.{field_name} does not unpickle here ({type(exc).__name__}: {exc}); "
            "the learner needs the packages and Python version of the workers that pickled it"
        ) from exc


# --- the worker's side: answers into a LeaseReply --------------------------------


def add_observations(tensor: Any, blobs: Any, rows: list[Any], pickler: Pickler | None) -> None:
    """Fills a reply's observations: one tensor, or on a lease of pickled
    factories (``pickler``) one pickle per env when they are not arrays of
    one shape and dtype."""
    if pickler is not None and not one_array(rows):
        blobs.extend(pickler(obs, "a leased env's observation") for obs in rows)
        return
    # run_env typed every observation to the space's dtype and shape already, so
    # np.array joins them (one C call; np.stack makes a view of each first).
    encode_tensor_into(tensor, np.array(rows))


def add_infos(
    maps: Any,
    texts: Any,
    blobs: Any,
    infos: Sequence[tuple[int, Mapping[str, Any]]],
    *,
    what: str,
    pickler: Pickler | None,
) -> None:
    """Appends one TensorMap per env's info (``maps``) and, unless all are
    empty, one JSON text per env (``texts``) and, on a lease of pickled
    factories, one pickle per env (``blobs``): LeaseReply.infos/_json/_pickle.

    An empty info (most steps of most envs) is an empty TensorMap, without
    the work of splitting it.
    """
    rests, pickled = [], []
    for env_id, info in infos:
        if not info:
            maps.add()
            rests.append("")
            pickled.append(b"")
            continue
        arrays, rest, blob = split_info(info, f"env {env_id}{what}", pickler)
        maps.append(encode_tensor_map(arrays))
        rests.append(rest)
        pickled.append(blob)
    if any(rests):
        texts.extend(rests)
    if any(pickled):
        blobs.extend(pickled)


def plain_json(value: Any) -> Any:
    """JSON for numpy scalars and arrays; anything else is refused."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise ConfigError(
        f"a {type(value).__name__} is not a plain value (numbers, strings, lists, dicts, "
        "numpy arrays)"
    )


def split_info(
    info: Mapping[str, Any], where: str, pickler: Pickler | None = None
) -> tuple[dict[str, Any], str, bytes]:
    """An info dict as (numeric arrays for a TensorMap, the rest as JSON object
    text, or as a pickle where the lease carries pickles and JSON cannot).

    Numbers, bools and their arrays (in nested dicts too) travel as tensors;
    other plain values (None, strings, lists of them, dicts holding any) as
    JSON. The JSON text (the pickle) is empty when there is no such value.

    Raises:
        ConfigError: For a value that is neither, on a lease that carries no
            pickler (it would be lost otherwise).
    """
    tree: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, Mapping):
            nested, rest, blob = split_info(value, f"{where} info[{key!r}]", pickler)
            if rest or blob:
                extra[key] = value  # a dict mixing kinds travels whole, as JSON
            else:
                tree[key] = nested
            continue
        array = np.asarray(value) if not isinstance(value, str | type(None)) else None
        if array is not None and array.dtype.kind in "biuf":
            tree[key] = array
        else:
            extra[key] = value
    if not extra:
        return tree, "", b""
    try:
        return tree, json.dumps(extra, default=plain_json), b""
    except (TypeError, ValueError, ConfigError) as exc:
        if pickler is not None:
            return tree, "", pickler(extra, f"{where} info")
        raise ConfigError(
            f"{where}: info holds a value that is neither numeric nor JSON ({exc}); leased "
            f"envs' infos carry numbers, bools, arrays and plain JSON values, {PICKLES_HINT}"
        ) from exc


# --- the learner's side: a LeaseReply's values -----------------------------------


def decode_observations(
    tensor: Any, blobs: Sequence[bytes], env_ids: Sequence[int], check: ReplyCheck, worker: str
) -> Any:
    """Decodes a reply's observations (a tensor, or pickles where the lease
    carries them) and checks a tensor's rows against their envs' spaces."""
    if blobs:
        return load_values(blobs, "observations_pickle", check)
    obs = decode_tensor(tensor, name="LeaseReply.observations")
    space = check.uniform
    spaces = [space] if space is not None else [check.space(i) for i in env_ids]
    for space in spaces:
        if obs.shape[1:] != (space.shape or ()) or obs.dtype != space.dtype:
            raise ProtocolError(
                f"worker {worker!r} sent observations of shape {obs.shape[1:]} and dtype "
                f"{obs.dtype} per env; the lease's observation space is {space}"
            )
    return obs


def infos_of(
    maps: Sequence[Any], texts: Sequence[str], blobs: Sequence[bytes], name: str, check: ReplyCheck
) -> list[dict[str, Any]]:
    """Info dicts from their TensorMaps, JSON texts and pickles (LeaseReply.infos/_json/_pickle)."""
    where = f"LeaseReply.{name}"
    # An empty map (most infos) is an empty dict, without a decoder call.
    infos = [info_tree(decode_tensor_map(m, name=where)) if m.entries else {} for m in maps]
    for info, text in zip(infos, texts, strict=False):
        if text:
            info.update(json_object(text, f"{where}_json"))
    if blobs:
        for info, extra in zip(infos, load_values(blobs, f"{name}_pickle", check), strict=False):
            if extra is not None:
                if not isinstance(extra, Mapping):
                    raise ProtocolError(
                        f"{where}_pickle holds a {type(extra).__name__}; each must be a dict"
                    )
                info.update(extra)
    return infos


def info_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
    """An info dict from the wire: 0-d arrays become numpy scalars, as envs give them."""
    return {
        key: info_tree(value)
        if isinstance(value, Mapping)
        else (value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value)
        for key, value in tree.items()
    }
