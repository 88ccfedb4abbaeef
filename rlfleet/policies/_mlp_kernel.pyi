"""Type stub of the compiled MLP kernel (rlfleet/policies/_mlp_kernel.c)."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

class Kernel:
    """One parameter set of a built-in MLP, copied into the kernel's own memory."""

    def __init__(
        self,
        layers: Sequence[tuple[Any, Any]],
        activation: str,
        log_std: Any = None,
    ) -> None: ...
    def categorical(
        self, observations: Any, draws: Any, /
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32], int]: ...
    def gaussian(
        self, observations: Any, draws: Any, /
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32], int]: ...
