"""The kit's defaults, importable without loading gRPC, numpy or gymnasium."""

from __future__ import annotations

#: The env the kit gives workers unless told otherwise.
DEFAULT_ENV_ID = "CartPole-v1"
#: Longest wait for any one answer from a worker, in seconds.
DEFAULT_TIMEOUT = 15.0

__all__ = ["DEFAULT_ENV_ID", "DEFAULT_TIMEOUT"]
