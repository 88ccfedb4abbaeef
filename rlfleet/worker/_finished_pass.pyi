"""Type stub of the compiled finished-episodes pass (rlfleet/worker/_finished_pass.c)."""

import numpy as np

def sort_rows(rows: list[int], out: np.ndarray, /) -> None: ...
def step_index(
    table: np.ndarray,
    capacity: int,
    n_slots: int,
    index_out: np.ndarray,
    types_out: np.ndarray,
    last_out: np.ndarray,
    /,
) -> None: ...
def gather_runs(
    table: np.ndarray, capacity: int, source: np.ndarray, out: object, offset: int, /
) -> None: ...
