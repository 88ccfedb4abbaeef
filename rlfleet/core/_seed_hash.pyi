"""Type stub of the compiled seed hash (rlfleet/core/_seed_hash.c)."""

import numpy as np

def seed_pairs(
    prefix: tuple[int, ...], indices: np.ndarray, env_out: np.ndarray, policy_out: np.ndarray, /
) -> bool: ...
