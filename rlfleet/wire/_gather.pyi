"""Type stub of the compiled gather (rlfleet/wire/_gather.c)."""

from collections.abc import Sequence

from typing_extensions import Buffer

def gather(
    dest: Buffer, sources: Sequence[Buffer], pieces: Buffer | None, rows: bool = False, /
) -> bool: ...
