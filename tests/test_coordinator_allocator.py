"""The coordinator process reuses freed message buffers instead of faulting in new pages.

Each run is a fresh interpreter: the allocator's thresholds are process-wide.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlfleet.coordinator.allocator import keep_freed_memory

_PROBE = """
import resource, sys
from rlfleet.coordinator.allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
# Results of growing size, each received, then freed: by default each is a
# fresh mapping whose every page faults; reused, only the growth does.
for size in range(1 << 20, 21 << 20, 1 << 20):
    buffer = bytearray(size)
    buffer[::4096] = b"x" * len(range(0, size, 4096))
    del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not keep_freed_memory(), reason="needs glibc's mallopt")
def test_freed_buffers_are_reused_without_new_page_faults() -> None:
    # 210 MiB in all: untuned, about 54,000 pages fault in; tuned, about the
    # 5,000 of the largest buffer (fewer with transparent huge pages).
    untuned, tuned = _page_faults("untuned"), _page_faults("tuned")
    assert tuned * 4 < untuned, (tuned, untuned)


def test_the_coordinator_command_tunes_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command calls it before serving; serve() itself (embedded in a
    # learner's process too) leaves the user's allocator alone.
    from rlfleet import cli
    from rlfleet.cli import coordinator as command
    from rlfleet.coordinator import allocator, server

    calls: list[str] = []

    class ServedError(Exception):
        pass

    def fake_serve(config: object) -> object:
        calls.append("serve")
        raise ServedError

    def fake_tune() -> bool:
        calls.append("tuned")
        return True

    monkeypatch.setattr(allocator, "keep_freed_memory", fake_tune)
    monkeypatch.setattr(server, "serve", fake_serve)
    monkeypatch.setattr(command, "_install_signal_handlers", lambda stop: None)
    with pytest.raises(ServedError):
        command.run(cli.parse_args(["coordinator", "--listen", "127.0.0.1:0"]))
    assert calls == ["tuned", "serve"]
