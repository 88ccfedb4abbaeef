"""Type stub of the compiled one-pass result check (rlfleet/wire/_result_check.c)."""

from typing import TypeAlias

from typing_extensions import Buffer

#: The task's units' columns: episode indices (ascending), env seeds, policy seeds (int64).
UnitBuffers: TypeAlias = tuple[Buffer, Buffer, Buffer]

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
