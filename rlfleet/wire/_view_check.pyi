"""Type stub of the compiled view check (rlfleet/wire/_view_check.c)."""

from collections.abc import Sequence

from typing_extensions import Buffer

def view_check(
    frame: Buffer,
    runs: Buffer,
    joined: Buffer,
    lengths_at: int,
    lengths_size: int,
    lengths_signed: bool,
    lengths: Sequence[int],
    limits: Buffer,
    /,
) -> bool: ...
