"""Type stub of the compiled gather (rlfleet/wire/_gather.c)."""

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
from typing_extensions import Buffer

#: Any object of the buffer protocol (numpy's stubs do not say arrays are).
_Buffer: TypeAlias = Buffer | np.ndarray[Any, Any]

def gather(
    dest: _Buffer, sources: Sequence[_Buffer], pieces: _Buffer | None, rows: bool = False, /
) -> bool: ...
