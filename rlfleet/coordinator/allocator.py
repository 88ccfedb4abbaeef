"""The coordinator process's allocator: freed message buffers are reused, not unmapped.

A coordinator receives, joins and re-sends buffers of up to a chunk (1 MiB)
or a whole result per message. glibc's malloc serves such sizes with
``mmap`` and gives them back with ``munmap`` (or trims the heap's top once
2x its adaptive mmap threshold lies free), so every new buffer faults in
fresh zeroed pages: with Atari-sized results the kernel's page clearing was
a fifth of the coordinator's CPU (perf, docs/data_plane.md "The
coordinator: where a result's CPU goes"). Raising both thresholds keeps
freed buffers in the heap for the next message.

Only the ``rlfleet coordinator`` process calls :func:`keep_freed_memory`:
an embedded coordinator shares the learner's process, whose allocator is
the user's to tune (``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``
in the environment do the same).
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger("rlfleet.coordinator")

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Buffers up to this size come from the heap (glibc's ceiling on 64-bit).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Free memory at the heap's top kept for reuse before it is returned.
TRIM_THRESHOLD_BYTES = 128 << 20


def keep_freed_memory() -> bool:
    """Makes glibc's malloc reuse freed buffers of up to 32 MiB instead of unmapping them.

    Returns:
        Whether the thresholds were set (False off glibc, e.g. musl or macOS,
        where nothing is changed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not done:
        logger.debug("mallopt refused the coordinator's allocator thresholds")
    return done


__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "keep_freed_memory"]
