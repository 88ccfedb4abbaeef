"""Type stub of the compiled one-pass result check (rlfleet/wire/_result_check.c)."""

from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray
from typing_extensions import Buffer

#: The task's units' columns: episode indices (ascending), env seeds, policy seeds.
UnitBuffers: TypeAlias = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]

def episodes_pass(
    data: Buffer | tuple[Buffer, ...],
    between: bytes,
    places: bytes,
    lengths: tuple[int, ...],
    indices: tuple[int, ...],
    worker_id: int,
    agent_version: int,
    seeds: tuple[int, int] | UnitBuffers | None,
    /,
) -> bool: ...
def values_pass(
    data: Buffer | tuple[Buffer, ...],
    screens: tuple[tuple[str, bytes], ...],
    offsets: dict[str, int],
    episodes: int,
    steps: int,
    /,
) -> bool: ...
