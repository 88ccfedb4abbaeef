"""Type stub of the compiled MLP kernel (rlfleet/policies/_mlp_kernel.c)."""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

class Kernel:
    """One parameter set of a built-in MLP, copied into the kernel's own memory."""

    def __init__(
        self,
        layers: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]],
        activation: str,
        log_std: npt.NDArray[np.float32] | None = None,
    ) -> None: ...
    def categorical(
        self, observations: np.ndarray, draws: np.ndarray | None, /
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32], int]: ...
    def gaussian(
        self, observations: np.ndarray, draws: np.ndarray | None, /
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32], int]: ...
