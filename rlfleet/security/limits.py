"""Resource limits: what one peer may make the coordinator hold.

A coordinator on a network must not be exhausted by one client with one
huge, endless or slow message. Each limit below bounds one resource:

* ``max_message_bytes``: memory per message (gRPC refuses larger ones
  before they are buffered);
* ``max_inflight_bytes_per_worker``: memory per worker for a result whose
  chunks have not all arrived (declared size checked at the first chunk);
* ``max_tensor_elements``: any one tensor a peer declares, so that a shape
  cannot make a receiver allocate what was never sent;
* ``handshake_timeout_seconds``: how long a stream that has not said Hello
  may hold a server thread;
* ``max_workers``, ``max_subscribers``, ``max_pending_requests``: threads and
  queues (more are refused with RESOURCE_EXHAUSTED, never queued without end).

The coordinator's thread pool is sized from these (every Join stream and
learner call holds a thread), so they also bound its threads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, SupportsInt

import numpy as np

from rlfleet._util.values import check_int
from rlfleet.errors import ConfigError, ResourceExhaustedError
from rlfleet.transport.rpc import DEFAULT_MAX_MESSAGE_BYTES

#: gRPC cannot carry a message of 2 GiB or more.
_GRPC_MAX_MESSAGE_BYTES = (1 << 31) - 1
#: A chunk header and some data must fit in a message.
_MIN_MESSAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """The coordinator's resource limits. Defaults suit a few hundred workers.

    Attributes:
        max_message_bytes: Largest gRPC message sent or accepted (64 MiB).
        max_workers: Workers admitted at once (256).
        max_inflight_bytes_per_worker: Largest result a worker may be in the
            middle of sending (256 MiB); a first chunk announcing more ends
            that worker's stream with RESOURCE_EXHAUSTED.
        max_tensor_elements: Most elements of any one tensor a peer sends
            (2**28: 1 GiB of float32).
        handshake_timeout_seconds: Seconds a new Join stream may take to say
            Hello before it is closed (10).
        max_subscribers: Concurrent Subscribe streams (8).
        max_pending_requests: Sample and update requests waiting for their
            turn (64).
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_workers: int = 256
    max_inflight_bytes_per_worker: int = 256 * 1024 * 1024
    max_tensor_elements: int = 1 << 28
    handshake_timeout_seconds: float = 10.0
    max_subscribers: int = 8
    max_pending_requests: int = 64

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith("_seconds"):
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise ConfigError(f"{item.name} must be a number of seconds, got {value!r}")
                if not (math.isfinite(value) and value > 0):
                    raise ConfigError(
                        f"{item.name} must be a positive number of seconds, got {value!r}"
                    )
            else:
                check_int(item.name, value)
        if not _MIN_MESSAGE_BYTES <= self.max_message_bytes <= _GRPC_MAX_MESSAGE_BYTES:
            raise ConfigError(
                f"max_message_bytes={self.max_message_bytes} must be between "
                f"{_MIN_MESSAGE_BYTES} (a chunk header and some data) and "
                f"{_GRPC_MAX_MESSAGE_BYTES} (gRPC's own ceiling)"
            )

    def check_elements(self, shape: Iterable[SupportsInt], where: str) -> int:
        """The element count of a declared shape, within :attr:`max_tensor_elements`.

        Computed with Python ints, so no shape can overflow the check.

        Raises:
            ResourceExhaustedError: If the shape holds too many elements or
                has a negative dimension (an unsigned reading of it is huge).
        """
        dims = [int(dim) for dim in shape]
        if any(dim < 0 for dim in dims):
            raise ResourceExhaustedError(f"{where}: shape {tuple(dims)} has a negative dimension")
        count = math.prod(dims)
        if count > self.max_tensor_elements:
            raise ResourceExhaustedError(
                f"{where}: shape {tuple(dims)} has {count} elements, over the limit of "
                f"{self.max_tensor_elements} (max_tensor_elements); send smaller tensors or "
                "raise the limit"
            )
        return count

    def check_tensor_map(self, tensors: Mapping[str, Any], where: str) -> None:
        """Checks every array of a (nested) tensor map with :meth:`check_elements`."""
        for name, value in tensors.items():
            path = f"{where}[{name!r}]"
            if isinstance(value, Mapping):
                self.check_tensor_map(value, path)
            else:
                self.check_elements(np.shape(value), path)


#: What one received chunk is charged beyond its data: the Python objects,
#: envelope and list slot that keep it until its batch completes. Without
#: it, a stream of one-byte chunks would grow the bookkeeping far beyond
#: the byte limit.
CHUNK_OVERHEAD_BYTES = 1024


class _SessionBytes:
    """What one worker session holds in flight, over all its carriers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.used = 0


class InflightBudget:
    """The bytes of one worker session's unfinished results, held against one limit.

    A session's results may come on two carriers at once, its Join stream
    and its lease data connection, each read by a thread of its own and
    with an unfinished result of its own. Each carrier charges a budget of
    its own from :meth:`carrier`; all of one session's budgets share one
    total, which the limit bounds (a worker that splits its results over
    both carriers holds no more: tests/test_faults_hostile_workers.py::
    test_a_worker_splitting_unfinished_results_over_both_carriers_is_held_to_one_limit).

    Args:
        limit: Most bytes (chunk data plus :data:`CHUNK_OVERHEAD_BYTES`
            per chunk) the session's unfinished results may hold.
        worker: The worker's name, for the message.
    """

    def __init__(self, limit: int, worker: str, *, session: _SessionBytes | None = None) -> None:
        self.limit = limit
        self.worker = worker
        self.used = 0  # this carrier's unfinished result
        self._session = _SessionBytes() if session is None else session

    def carrier(self) -> InflightBudget:
        """A budget for one carrier of the session, sharing its total."""
        return InflightBudget(self.limit, self.worker, session=self._session)

    @property
    def session_used(self) -> int:
        """Bytes the session holds over all its carriers."""
        return self._session.used

    def charge(self, nbytes: int) -> None:
        """Accounts for one more chunk of ``nbytes`` data.

        Raises:
            ResourceExhaustedError: If the session now holds more than the limit.
        """
        cost = nbytes + CHUNK_OVERHEAD_BYTES
        session = self._session
        with session.lock:
            self.used += cost
            session.used += cost
            total = session.used
        if total > self.limit:
            raise ResourceExhaustedError(
                f"worker {self.worker!r} has {total} bytes of an unfinished result in "
                f"flight (chunk data plus {CHUNK_OVERHEAD_BYTES} bytes per chunk), over the "
                f"limit of {self.limit} (max_inflight_bytes_per_worker); it was dropped. "
                "Send fewer, larger chunks, or sample fewer steps per task"
            )

    def fits(self, nbytes: int) -> bool:
        """Whether a whole result of one chunk of ``nbytes`` data, on a carrier
        with no unfinished result, keeps the session within the limit: what
        :meth:`charge` then :meth:`release` would let through, with nothing
        counted (if not, ``charge`` says so)."""
        return self.used == 0 and self._session.used + nbytes + CHUNK_OVERHEAD_BYTES <= self.limit

    def release(self) -> None:
        """This carrier's result completed (or was dropped): nothing of it is in flight."""
        session = self._session
        with session.lock:
            session.used -= self.used
            self.used = 0

    def hold(self, nbytes: int) -> tuple[int, int]:
        """Counts ``nbytes`` received but not yet charged (a frame queued for its
        check) on this carrier and in the session's total.

        Returns:
            What this carrier holds so, and the session's total, read under
            one lock (the lane that queues frames keeps no count of its own).
        """
        session = self._session
        with session.lock:
            self.used += nbytes
            session.used += nbytes
            return self.used, session.used

    def let_go(self, nbytes: int) -> None:
        """Takes back what :meth:`hold` counted (the frame is about to be charged)."""
        session = self._session
        with session.lock:
            self.used -= nbytes
            session.used -= nbytes
