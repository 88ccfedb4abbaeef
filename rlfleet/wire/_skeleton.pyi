"""Type stub of the compiled skeleton builder (rlfleet/wire/_skeleton.c)."""

from typing_extensions import Buffer

def skeleton(
    program: Buffer,
    pieces: tuple[bytes, ...],
    names: tuple[str, ...],
    placed: Buffer,
    episodes: int,
    steps: int,
    /,
) -> tuple[int, tuple[tuple[int, bytes], ...], dict[str, int], bytes, bytes] | None: ...
