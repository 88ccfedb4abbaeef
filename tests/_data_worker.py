"""A scripted worker whose results may take its lease data connection.

It agreed on ``rlfleet.data-results`` and has its data connection open; a
test sends what it wants on either carrier (its Join stream, or the link).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rlfleet.transport import rpc as _rpc
from rlfleet.transport.lease_channel import LeaseDataLink, dial
from rlfleet.wire.leases import data_hello
from tests._coordinator_fakes import CAPABILITIES, AutoWorker

#: Hello capabilities of a scripted worker whose results may take the data channel.
DATA_CAPABILITIES = (*CAPABILITIES, _rpc.LEASE_CAPABILITY, _rpc.DATA_RESULTS_CAPABILITY)


class HeldResults:
    """A scripted worker's results, held back to be sent when the test says."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.results = 0
        self.changed = threading.Event()

    def take(self, messages: list[_rpc.WithChunk]) -> None:
        self.messages += [_rpc.serialize(m) for m in messages]
        self.results += 1
        self.changed.set()


@contextlib.contextmanager
def scripted_data_worker(
    address: str, held: HeldResults, capabilities: tuple[str, ...] = DATA_CAPABILITIES
) -> Iterator[tuple[AutoWorker, LeaseDataLink]]:
    """A scripted worker that agreed on data results, with its data connection open."""
    worker = AutoWorker(address, num_envs=2, capabilities=capabilities, send_result=held.take)
    try:
        assert worker.welcome.HasField("lease_data")
        assert _rpc.DATA_RESULTS_CAPABILITY in worker.welcome.capabilities
        link = dial(
            "127.0.0.1",
            worker.welcome.lease_data.port,
            data_hello(worker.welcome.lease_data.ticket),
            tls=None,
            timeout=10,
            max_frame_bytes=1 << 24,
        )
        try:
            yield worker, link
        finally:
            link.close()
    finally:
        worker.close()
