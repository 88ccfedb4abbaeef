"""Validation of named parameter sets (agent updates) before they are applied."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.errors import PolicyError


def checked_params(
    params: Any, shapes: Mapping[str, tuple[int, ...]], owner: str
) -> dict[str, np.ndarray]:
    """Checks a complete parameter set and returns float32 copies of it.

    Nothing of the caller's is modified, so a policy that assigns the result
    only after this returns is updated atomically.

    Args:
        params: Mapping from parameter name to array-like.
        shapes: The expected name -> shape of every parameter.
        owner: The policy class name, for error messages.

    Returns:
        A dict name -> new float32 C-contiguous array, in ``shapes`` order.

    Raises:
        PolicyError: If names are missing or unexpected, or a value is not a
            real numeric array of the expected shape, or it is not finite
            once cast to float32.
    """
    if not isinstance(params, Mapping):
        raise PolicyError(
            f"{owner}.set_param_values takes a mapping name -> array, got {type(params).__name__}"
        )
    missing = [name for name in shapes if name not in params]
    unexpected = sorted(str(name) for name in params if name not in shapes)
    if missing or unexpected:
        raise PolicyError(
            f"{owner}.set_param_values: missing parameters {missing}, unexpected "
            f"parameters {unexpected}; expected exactly {list(shapes)} "
            "(see get_param_values() for names and shapes)"
        )
    return {
        name: _checked_value(name, params[name], shape, owner) for name, shape in shapes.items()
    }


def _checked_value(name: str, value: Any, shape: tuple[int, ...], owner: str) -> np.ndarray:
    where = f"{owner}.set_param_values: parameter {name!r}"
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{where} is not an array of numbers: {exc}") from exc
    if array.dtype.kind not in "iuf":
        raise PolicyError(f"{where} must hold real numbers (int or float), got dtype {array.dtype}")
    if array.shape != shape:
        raise PolicyError(f"{where} must have shape {shape}, got {array.shape}")
    # Overflow to inf is reported below, by name, rather than as a warning.
    with np.errstate(over="ignore"):
        converted = np.array(array, dtype=np.float32, order="C", copy=True)
    finite = np.isfinite(converted)
    if not finite.all():
        index = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise PolicyError(
            f"{where} has a non-finite float32 value at index {index} "
            f"({array[index]!r}); values must be finite and within float32 range"
        )
    return converted
