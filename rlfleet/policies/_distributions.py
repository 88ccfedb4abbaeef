"""Per-row generators and draws of the built-in policies.

Row i draws from ``rngs[i]`` only, a fixed number of draws per row (one
``random()`` for a categorical, ``standard_normal(d)`` for a Gaussian, none
in deterministic mode), so an episode gets the same draws whichever batch,
slot or worker computes it. What the MLPs compute from them is the C kernel's
job (``rlfleet.policies._mlp_kernel``, docs/policies.md "Exact arithmetic").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlfleet.errors import PolicyError


def row_generators(
    rngs: Sequence[np.random.Generator] | None,
    n: int,
    fallback: np.random.Generator,
    owner: str,
) -> Sequence[np.random.Generator]:
    """Returns one generator per row: ``rngs`` itself, or ``fallback`` n times.

    Raises:
        PolicyError: If ``rngs`` does not have one generator per row.
    """
    if rngs is None:
        return [fallback] * n
    if len(rngs) != n:
        raise PolicyError(
            f"{owner}.get_actions: got {len(rngs)} generators for {n} observations; "
            "pass one numpy Generator per row, or None to use the policy's own"
        )
    return rngs


def normal_draws(rngs: Sequence[np.random.Generator], d: int) -> np.ndarray:
    """Row i's ``rngs[i].standard_normal(d)``, as a float64 array (N, d)."""
    draws = np.empty((len(rngs), d), dtype=np.float64)
    for row, rng in enumerate(rngs):
        rng.standard_normal(out=draws[row])
    return draws
