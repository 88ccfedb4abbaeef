"""--log-format json: one request followed across coordinator and worker logs.

Real processes (tests/fleet_processes.py) log JSON lines; the test parses
every line of both logs and matches the ids. Redaction is checked on the
JSON output of a real ``rlfleet`` process.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlfleet.coordinator import CoordinatorConfig, serve
from tests._coordinator_fakes import ROOT, ScriptedWorker, sample
from tests.fleet_processes import TEST_ENVS_MODULE, ProcessFleet

pytestmark = pytest.mark.timeout(180)

JSON_LOGS = {"RLFLEET_LOG_FORMAT": "json"}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def records(log: str) -> list[dict[str, Any]]:
    """The JSON lines of a process log (other lines: gRPC's C core, warnings)."""
    found = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    for record in found:
        assert {"timestamp", "level", "logger", "message"} <= set(record), record
    return found


def test_a_failed_request_is_followed_across_coordinator_and_worker(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator(
        "--env", "rlfleet/Crashing-v0", "--env-kwargs", '{"crash_at_step": 2}', env=JSON_LOGS
    )
    fleet.start_worker(
        "--env-restarts-total", "0", name="w-json", imports=[TEST_ENVS_MODULE], env=JSON_LOGS
    )
    fleet.wait_for_workers(1)
    with pytest.raises(grpc.RpcError):
        sample(fleet.address, mode=2, amount=2, seed=1, request_index=0)
    fleet.wait_for_log(fleet.coordinator, "failed")

    coordinator = records(fleet.coordinator.log_text())
    started = [r for r in coordinator if r["message"].startswith("request ")]
    assert len(started) == 1
    request_id = started[0]["request_id"]
    failed = [r for r in coordinator if "task_id" in r and r.get("request_id") == request_id]
    assert failed and failed[0]["worker"] == "w-json" and failed[0]["level"] == "WARNING"

    worker = records(fleet.wait_for_log(fleet.workers[0], "task error"))
    errors = [r for r in worker if r["message"].startswith("task error")]
    assert errors[0]["request_id"] == request_id
    assert errors[0]["task_id"] == failed[0]["task_id"]
    # Every line of a worker names it, so a log store can filter by worker.
    assert all(r["worker"] == "w-json" for r in worker)
    assert worker[0]["timestamp"].endswith("+00:00")


def test_json_lines_are_redacted(tmp_path: Path) -> None:
    token = "json-redaction-token-0123456789abcdef"
    script = (
        "import logging, sys\n"
        "from rlfleet.cli._logging import configure_logging\n"
        "from rlfleet.security.redact import install_redaction\n"
        "from rlfleet.security.tokens import Token\n"
        "configure_logging('INFO', 'json')\n"
        f"install_redaction([Token({token!r}, source='test')])\n"
        f"logging.getLogger('rlfleet.test').warning('sent %s', 'Bearer {token}')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    )
    (line,) = result.stderr.splitlines()
    record = json.loads(line)
    assert token not in line
    assert record["message"] == "sent Bearer ****"
    assert record["logger"] == "rlfleet.test"


def test_streams_without_hello_are_refused_in_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Like refused tokens: a flood of silent streams must not flood the log."""
    config = CoordinatorConfig(listen="127.0.0.1:0", handshake_timeout_seconds=0.2)
    caplog.set_level(logging.WARNING, logger="rlfleet.coordinator")
    with serve(config) as server:
        for _ in range(3):
            error = ScriptedWorker(server.address).ended()
            assert error is not None and error.code is grpc.StatusCode.DEADLINE_EXCEEDED
        refused = [r for r in caplog.records if "refused a worker" in r.getMessage()]
        assert len(refused) == 1, [r.getMessage() for r in refused]
        assert "no Hello within 0.2 seconds" in refused[0].getMessage()
        counted = server.coordinator.metrics.registry.get_sample_value(
            "rlfleet_errors_total", {"kind": "join_deadline_exceeded"}
        )
        assert counted == 3


def test_a_worker_logs_under_the_name_status_shows(fleet: ProcessFleet) -> None:
    # Two workers asked for the same name: the coordinator makes the second
    # one's unique, and that worker's log says the name status shows.
    fleet.start_coordinator()
    fleet.start_worker(name="vm")
    fleet.wait_for_workers(1)
    second = fleet.start_worker(name="vm", env=JSON_LOGS)
    fleet.wait_for_workers(2)
    names = sorted(worker.name for worker in fleet.status().workers)
    assert names[0] == "vm" and names[1] != "vm", names
    given = names[1]
    assert fleet.terminate(second) == 0
    lines = records(second.log_text())
    joined = next(i for i, r in enumerate(lines) if r["message"].startswith("joined coordinator"))
    assert f"as {given!r}" in lines[joined]["message"]
    # From the join on, every line carries that name, the last one too.
    assert all(r["worker"] == given for r in lines[joined:]), lines[joined:]
    assert lines[-1]["message"].startswith(f"worker {given!r} left"), lines[-1]
