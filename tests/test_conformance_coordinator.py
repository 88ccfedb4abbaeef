"""The conformance kit's coordinator checks: bad lease data tickets are refused,
and Sample requests on a learner's results connection are answered there.

The checks run against a real coordinator (a process, through the command
line; and in-process), and fail against coordinators that accept a bad
ticket (the ticket table or the first frame's size limit loosened
in-process) or answer a request on the results connection wrongly (a
failure frame naming another call, a header that does not say the footer
comes there, a footer that miscounts the results).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlfleet.client import Fleet
from rlfleet.conformance import COORDINATOR_CHECKS, run_coordinator_conformance
from rlfleet.conformance.coordinator_checks import NO_REQUESTS_ON_DATA, OVERSIZED_HELLO_BYTES
from rlfleet.coordinator import CoordinatorConfig, result_channels, result_requests, serve
from rlfleet.coordinator.config import LEASE_DATA_OFF
from rlfleet.coordinator.leases import data_hello
from rlfleet.coordinator.server import CoordinatorServer
from rlfleet.errors import ConfigError
from rlfleet.security import ClientSecurity, ClientTLS, ServerSecurity, ServerTLS
from tests.fleet_processes import ProcessFleet
from tests.test_conformance import python_env
from tests.test_lease_data_channel import _Quiet
from tests.tls_fixtures import make_ca, make_cert

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    with serve(CoordinatorConfig(listen="127.0.0.1:0")) as running:
        yield running


def verdicts(address: str) -> dict[str, tuple[bool, str]]:
    return {r.name: (r.passed, r.message) for r in run_coordinator_conformance(address, timeout=10)}


def test_the_coordinator_process_passes_every_check_from_the_command_line(
    tmp_path: Path,
) -> None:
    with ProcessFleet(tmp_path) as processes:
        processes.start_coordinator()
        done = subprocess.run(
            [sys.executable, "-m", "rlfleet", "conformance", "--coordinator", processes.address,
             "--json", "--timeout", "10"],
            capture_output=True, text=True, env=python_env(), cwd=ROOT, timeout=90, check=False,
        )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["passed"], report
    assert done.returncode == 0
    assert [c["name"] for c in report["checks"]] == list(COORDINATOR_CHECKS)
    assert [c["name"] for c in report["checks"]] == [
        "ticket-wrong-bytes",
        "ticket-used-twice",
        "ticket-oversized",
        "request-on-results-connection",
        "bad-request-on-results-connection",
    ]


def test_a_coordinator_that_takes_any_ticket_fails_the_ticket_checks(
    server: CoordinatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = server.coordinator.lease_data
    assert data is not None
    take: Callable[[bytes], Any] = data._take

    def lax(hello: bytes) -> Any:  # the issued ticket once, then anything at all
        return take(hello) or (lambda connection: _Quiet())

    monkeypatch.setattr(data, "_take", lax)
    got = verdicts(server.address)
    assert got["ticket-wrong-bytes"][0] is False
    assert "a ticket it never issued" in got["ticket-wrong-bytes"][1]
    assert got["ticket-used-twice"][0] is False
    assert "already used" in got["ticket-used-twice"][1]
    assert got["ticket-oversized"][0] is True  # its size limit still holds


def test_a_coordinator_that_reads_any_first_frame_fails_the_oversized_check(
    server: CoordinatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(data_hello, "HANDSHAKE_FRAME_BYTES", 2 * OVERSIZED_HELLO_BYTES)
    got = verdicts(server.address)
    assert got["ticket-oversized"][0] is False
    assert "answered LeaseDataAccepted" in got["ticket-oversized"][1]
    assert got["ticket-wrong-bytes"][0] and got["ticket-used-twice"][0]


def test_the_real_coordinator_passes_in_process(server: CoordinatorServer) -> None:
    got = verdicts(server.address)
    assert all(passed for passed, _ in got.values()), got


def test_a_coordinator_without_the_data_channel_passes_saying_so() -> None:
    with serve(CoordinatorConfig(listen="127.0.0.1:0", lease_data_listen=LEASE_DATA_OFF)) as off:
        got = verdicts(off.address)
    for name, (passed, message) in got.items():
        assert passed
        if name.startswith("ticket-"):
            assert "offers no lease data channel" in message
        else:
            assert message == NO_REQUESTS_ON_DATA


def test_a_coordinator_with_a_worker_answers_a_request_on_the_results_connection() -> None:
    with Fleet.local(workers=1, envs_per_worker=1, seed=3) as fleet:
        got = verdicts(fleet.address)
    assert all(passed for passed, _ in got.values()), got
    assert got["request-on-results-connection"][1].startswith(
        "the header (results_on_data, footer_on_data), 1 result frame(s) and the footer"
    )
    assert "INVALID_ARGUMENT: SampleRequest.amount" in got["bad-request-on-results-connection"][1]


def test_a_coordinator_answering_requests_wrongly_fails_the_request_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A failure frame naming the next call, and a header that does not say
    # the footer comes on the connection.
    failure_bytes = result_channels.failure_bytes
    monkeypatch.setattr(
        result_channels, "failure_bytes", lambda error, call: failure_bytes(error, call + 1)
    )
    header_bytes = result_requests.header_bytes

    def header_without_footer(header: Any, **flags: bool) -> bytes:
        return header_bytes(header, results_on_data=True, footer_on_data=False)

    monkeypatch.setattr(result_requests, "header_bytes", header_without_footer)
    with Fleet.local(workers=1, envs_per_worker=1, seed=3) as fleet:
        got = verdicts(fleet.address)
    passed, message = got["bad-request-on-results-connection"]
    assert not passed and "(SampleResponse.result_call 1); got a failure frame of call 2" in message
    passed, message = got["request-on-results-connection"]
    assert not passed and "footer_on_data set; got a header frame of call 1" in message
    assert all(got[name][0] for name in got if name.startswith("ticket-"))


def test_a_coordinator_whose_footer_miscounts_the_results_fails_the_request_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    footer_bytes = result_channels.footer_bytes
    monkeypatch.setattr(
        result_channels, "footer_bytes", lambda footer, sent: footer_bytes(footer, sent + 1)
    )
    with Fleet.local(workers=1, envs_per_worker=1, seed=3) as fleet:
        got = verdicts(fleet.address)
    passed, message = got["request-on-results-connection"]
    assert not passed
    assert "data_results to count the 1 result frame(s) sent" in message and "says 2" in message


def test_unreachable_coordinators_fail_and_unknown_checks_are_refused() -> None:
    (result,) = run_coordinator_conformance("127.0.0.1:1", checks=["ticket-used-twice"], timeout=1)
    assert not result.passed
    assert "could not join 127.0.0.1:1" in result.message
    with pytest.raises(ConfigError, match="ticket-wrong-bytes"):
        run_coordinator_conformance("127.0.0.1:1", checks=["nope"])


def test_an_mtls_coordinator_is_checked_over_tls(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server_cert, server_key = make_cert(ca, "rlfleet-coordinator").write(tmp_path, "server")
    kit_cert, kit_key = make_cert(ca, "kit", client=True).write(tmp_path, "kit")
    tls = ServerTLS.from_files(server_cert, server_key, client_ca=tmp_path / "ca.crt")
    config = CoordinatorConfig(listen="127.0.0.1:0", security=ServerSecurity(tls=tls))
    security = ClientSecurity(tls=ClientTLS.from_files(tmp_path / "ca.crt", kit_cert, kit_key))
    with serve(config) as secure:
        results = run_coordinator_conformance(secure.address, security=security, timeout=10)
        plain = run_coordinator_conformance(secure.address, checks=["ticket-used-twice"], timeout=3)
    assert all(r.passed for r in results), results
    assert not plain[0].passed and "could not join" in plain[0].message


def test_the_command_line_without_a_target_says_which_flags_to_give(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlfleet.cli import main

    monkeypatch.delenv("RLFLEET_WORKER_CMD", raising=False)
    monkeypatch.delenv("RLFLEET_COORDINATOR", raising=False)
    assert main(["conformance"]) == 2
    error = capsys.readouterr().err
    assert "--worker-cmd CMD (or RLFLEET_WORKER_CMD)" in error
    assert "--coordinator HOST:PORT" in error
