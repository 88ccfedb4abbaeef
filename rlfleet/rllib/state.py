"""The saved state of a RolloutWorker: a versioned, pickle-free byte format.

Layout: the magic line ``b"RLFLEET-ROLLOUT-WORKER\\n"``, then a numpy
``.npz`` archive (read back with ``allow_pickle=False``) holding

- ``meta``: UTF-8 JSON as uint8, ``{"format": 1, "policies": {id: spec
  JSON}, "filters": {id: name}, "global_vars": {...}}``;
- ``weights/<policy id>/<parameter>``: each policy's parameters;
- ``filters/<policy id>/<key>``: each policy's filter state.

Policy ids and parameter names may not contain ``/``.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.errors import ConfigError

MAGIC = b"RLFLEET-ROLLOUT-WORKER\n"
#: The format version :func:`dump_state` writes and :func:`load_state` reads.
STATE_FORMAT = 1


@dataclass(frozen=True)
class WorkerState:
    """What ``RolloutWorker.save()`` keeps.

    Attributes:
        policy_specs: Policy id -> its PolicySpec's JSON text.
        weights: Policy id -> parameter name -> array.
        filter_names: Policy id -> filter name.
        filters: Policy id -> filter state arrays.
        global_vars: The global vars (JSON values).
    """

    policy_specs: dict[str, str]
    weights: dict[str, dict[str, np.ndarray]]
    filter_names: dict[str, str]
    filters: dict[str, dict[str, np.ndarray]]
    global_vars: dict[str, Any]


def dump_state(state: WorkerState) -> bytes:
    """Serialises a state.

    Raises:
        ConfigError: If a policy id or parameter name contains ``/``, or the
            global vars are not JSON.
    """
    try:
        meta = json.dumps(
            {
                "format": STATE_FORMAT,
                "policies": state.policy_specs,
                "filters": state.filter_names,
                "global_vars": state.global_vars,
            },
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"RolloutWorker.save: global vars must be JSON values ({exc})") from exc
    arrays = {"meta": np.frombuffer(meta.encode(), dtype=np.uint8)}
    for group, table in (("weights", state.weights), ("filters", state.filters)):
        for policy_id, named in table.items():
            for name, value in named.items():
                if "/" in policy_id or "/" in name:
                    raise ConfigError(
                        f"RolloutWorker.save: policy id {policy_id!r} and name {name!r} may not "
                        "contain '/'"
                    )
                arrays[f"{group}/{policy_id}/{name}"] = np.asarray(value)
    buffer = io.BytesIO()
    buffer.write(MAGIC)
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def load_state(data: bytes) -> WorkerState:
    """Parses what :func:`dump_state` wrote; never unpickles.

    Raises:
        ConfigError: If the bytes are not a RolloutWorker state, or of
            another format version.
    """
    if not isinstance(data, bytes | bytearray | memoryview) or bytes(data[: len(MAGIC)]) != MAGIC:
        raise ConfigError(
            "RolloutWorker.restore: these bytes are not a state written by RolloutWorker.save() "
            f"(they do not start with {MAGIC!r})"
        )
    try:
        archive = np.load(io.BytesIO(bytes(data[len(MAGIC) :])), allow_pickle=False)
        arrays = {name: archive[name] for name in archive.files}
        meta = json.loads(bytes(arrays.pop("meta")).decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"RolloutWorker.restore: the state is damaged ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ConfigError(
            f"RolloutWorker.restore: state format {found!r}; this rlfleet reads format "
            f"{STATE_FORMAT}"
        )
    weights: dict[str, dict[str, np.ndarray]] = {pid: {} for pid in meta["policies"]}
    filters: dict[str, dict[str, np.ndarray]] = {pid: {} for pid in meta["filters"]}
    for key, value in arrays.items():
        group, policy_id, name = key.split("/", 2)
        table = weights if group == "weights" else filters
        table.setdefault(policy_id, {})[name] = value
    return WorkerState(
        policy_specs=dict(meta["policies"]),
        weights=weights,
        filter_names=dict(meta["filters"]),
        filters=filters,
        global_vars=dict(meta["global_vars"]),
    )


def check_same_policies(state: WorkerState, policy_ids: Mapping[str, Any]) -> None:
    """Checks that a state belongs to a worker with these policies.

    Raises:
        ConfigError: Naming the policy ids that differ.
    """
    if set(state.policy_specs) != set(policy_ids):
        raise ConfigError(
            f"RolloutWorker.restore: the state has policies {sorted(state.policy_specs)}, this "
            f"worker has {sorted(policy_ids)}; add or remove policies to match first"
        )
