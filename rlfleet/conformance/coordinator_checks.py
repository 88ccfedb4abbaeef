"""Coordinator checks: does a coordinator, in any language, refuse bad lease data
tickets, and answer Sample requests on a learner's results connection?

The lease data channel (leases.proto, docs/protocol.md) lets whoever
presents a ticket drive a lease or a worker's session, so a coordinator
must accept each ticket it issued once and nothing else. Each ticket check
joins the coordinator as a one-env worker that hosts leases (its Welcome
carries a ticket), presents a bad ticket on the data port, and expects the
connection to be closed without the ``LeaseDataAccepted`` frame; then it
presents the good ticket and expects it accepted, which shows that the
refusal was for the ticket. The request checks open a results connection
as a learner does and, where the coordinator offers it
(``ResultChannelOpened.requests_on_data``), send Sample requests there and
read their answers (learner.proto, "Requests on a learner's results
connection"). docs/conformance.md describes the checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from google.protobuf.message import DecodeError

from rlfleet._version import __version__
from rlfleet.conformance._failure import Check, CheckFailed, CheckResult, run_check, select
from rlfleet.conformance.kit_messages import (
    ResultsConnection,
    ResultsFrame,
    episodes_request,
    result_channel_request,
    results_connection_of,
    results_frame_of,
)
from rlfleet.errors import ProtocolError, RlfleetError
from rlfleet.security import ClientSecurity
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.data_address import coordinator_host
from rlfleet.transport.lease_channel import (
    HANDSHAKE_FRAME_BYTES,
    DataLink,
    dial,
    frame,
)
from rlfleet.wire.chunks import FORWARDED_RESULT_BYTES
from rlfleet.wire.leases import data_hello
from rlfleet.worker._connection import lease_data_ticket

#: ``Hello.implementation`` of the kit's worker.
KIT_IMPLEMENTATION = f"rlfleet-conformance/{__version__}"
#: Size of the oversized check's first frame: 64 times the largest hello a
#: coordinator needs to read (a LeaseDataHello of a 32-byte ticket is 34 bytes).
OVERSIZED_HELLO_BYTES = 64 * HANDSHAKE_FRAME_BYTES
#: What a ticket check verified when the coordinator has no data channel.
NO_DATA_CHANNEL = "the coordinator offers no lease data channel (Welcome.lease_data unset)"
#: What a request check verified when the coordinator takes no requests on a
#: results connection.
NO_REQUESTS_ON_DATA = (
    "the coordinator takes no Sample requests on a results connection "
    "(ResultChannelOpened.requests_on_data unset, or no data channel)"
)
#: ``SampleRequest.wait_for_workers_seconds`` of the request checks.
WORKER_WAIT_SECONDS = 2.0
#: gRPC status codes a request check expects, by number.
_INVALID_ARGUMENT = 3
_UNAVAILABLE = 14


@dataclasses.dataclass(frozen=True)
class CoordinatorTarget:
    """The coordinator under test.

    Attributes:
        address: Its gRPC ``HOST:PORT`` (the data port is the one its Welcome names).
        security: TLS and the worker token to join with, or None.
        timeout: Longest wait for any one answer, in seconds.
    """

    address: str
    security: ClientSecurity | None = None
    timeout: float = 15.0


#: Every coordinator check, by name, in the order they run.
COORDINATOR_CHECKS: dict[str, Check[CoordinatorTarget]] = {}


def _check(
    name: str, summary: str
) -> Callable[[Callable[[CoordinatorTarget], str]], Check[CoordinatorTarget]]:
    def register(body: Callable[[CoordinatorTarget], str]) -> Check[CoordinatorTarget]:
        def run(target: CoordinatorTarget) -> CheckResult:
            return run_check(name, body, target)

        check = Check(name, summary, run)
        COORDINATOR_CHECKS[name] = check
        return check

    return register


# --- the checks, in running order ------------------------------------------------


@_check("ticket-wrong-bytes", "a ticket the coordinator never issued is refused")
def ticket_wrong_bytes(target: CoordinatorTarget) -> str:
    with _ticket(target) as (port, ticket):
        if ticket is None:
            return NO_DATA_CHANNEL
        wrong = bytes(b ^ 0xFF for b in ticket[:1]) + ticket[1:]
        with _presented(target, port, frame(data_hello(wrong))) as accepted:
            if accepted:
                raise CheckFailed(
                    "expected the coordinator to close a data connection presenting a ticket "
                    "it never issued (the Welcome's ticket with its first byte flipped); it "
                    "answered LeaseDataAccepted"
                )
        _expect_accepted(target, port, ticket, "after the wrong one")
    return f"a {len(ticket)}-byte ticket with one byte changed was refused; the real one accepted"


@_check("ticket-used-twice", "a ticket is accepted once; presenting it again is refused")
def ticket_used_twice(target: CoordinatorTarget) -> str:
    with _ticket(target) as (port, ticket):
        if ticket is None:
            return NO_DATA_CHANNEL
        with _presented(target, port, frame(data_hello(ticket))) as first:
            if not first:
                raise CheckFailed(
                    "expected the coordinator to accept the ticket of its own Welcome (a "
                    "LeaseDataAccepted frame); it closed the connection"
                )
            # The first connection stays open: a second one with the same
            # ticket must not take it over.
            with _presented(target, port, frame(data_hello(ticket))) as again:
                if again:
                    raise CheckFailed(
                        "expected the coordinator to close a second data connection "
                        "presenting a ticket already used (tickets are single-use); it "
                        "answered LeaseDataAccepted"
                    )
    return "the Welcome's ticket was accepted once and refused the second time"


@_check(
    "ticket-oversized",
    f"a first frame of {OVERSIZED_HELLO_BYTES} bytes is refused, even holding a good ticket",
)
def ticket_oversized(target: CoordinatorTarget) -> str:
    with _ticket(target) as (port, ticket):
        if ticket is None:
            return NO_DATA_CHANNEL
        hello = data_hello(ticket)
        # Concatenated copies of a message parse as the message (a repeated
        # bytes field: the last value wins), so this frame names the good
        # ticket: only its size is wrong.
        oversized = hello * (OVERSIZED_HELLO_BYTES // len(hello) + 1)
        with _presented(target, port, frame(oversized)) as accepted:
            if accepted:
                raise CheckFailed(
                    f"expected the coordinator to close a data connection whose first frame "
                    f"is {len(oversized)} bytes (a LeaseDataHello is tiny; read a first "
                    f"frame of at most {HANDSHAKE_FRAME_BYTES} bytes); it read it and "
                    "answered LeaseDataAccepted"
                )
        _expect_accepted(target, port, ticket, "after the oversized frame")
    return (
        f"a first frame of {len(oversized)} bytes holding the good ticket was refused; "
        "the ticket was accepted afterwards"
    )


@_check(
    "request-on-results-connection",
    "a Sample request sent on a results connection is answered there: header, results, footer",
)
def request_on_results_connection(target: CoordinatorTarget) -> str:
    with _results_link(target) as link:
        if link is None:
            return NO_REQUESTS_ON_DATA
        link.send(episodes_request(1, 1, wait_for_workers_seconds=WORKER_WAIT_SECONDS))
        first = _answer_frame(link, target, 1, "the answer's first frame")
        if first.kind == "failure" and first.code == _UNAVAILABLE:
            return (
                f"no worker joined within {WORKER_WAIT_SECONDS:g} s: the request ended with a "
                f"failure frame (UNAVAILABLE: {first.message}), as its Sample call would; join "
                "a worker to check the header, results and footer too"
            )
        if first.kind != "header" or first.on_data != (True, True):
            raise CheckFailed(
                "expected the answer to a request of 1 episode to begin with a header frame "
                f"with results_on_data and footer_on_data set; got {_described(first)}"
            )
        results = 0
        while True:
            got = _answer_frame(link, target, 1, f"the frame after {results} result frame(s)")
            if got.kind == "result":
                results += 1
            elif got.kind == "footer":
                break
            else:
                raise CheckFailed(
                    f"expected a result or the footer after {results} result frame(s); got "
                    f"{_described(got)}"
                )
        if got.data_results != results or not results:
            raise CheckFailed(
                f"expected the footer's data_results to count the {results} result frame(s) "
                f"sent (at least one for an episode); it says {got.data_results}"
            )
    return (
        f"the header (results_on_data, footer_on_data), {results} result frame(s) and the "
        f"footer (data_results {results}) came on the connection"
    )


@_check(
    "bad-request-on-results-connection",
    "a bad Sample request on a results connection ends with a failure frame, and the "
    "connection serves the next",
)
def bad_request_on_results_connection(target: CoordinatorTarget) -> str:
    with _results_link(target) as link:
        if link is None:
            return NO_REQUESTS_ON_DATA
        for call in (1, 2):
            link.send(episodes_request(0, call, wait_for_workers_seconds=WORKER_WAIT_SECONDS))
            got = _answer_frame(link, target, call, f"the answer to bad request {call}")
            if got.kind != "failure" or got.code != _INVALID_ARGUMENT:
                raise CheckFailed(
                    f"expected a failure frame (SampleResponse.failure) with code "
                    f"INVALID_ARGUMENT ({_INVALID_ARGUMENT}), as the Sample call's status, for "
                    f"a request of 0 episodes (call {call}); got {_described(got)}"
                )
    return (
        "two requests of 0 episodes each ended with a failure frame (INVALID_ARGUMENT: "
        f"{got.message}), the second on the same connection"
    )


# --- running ---------------------------------------------------------------------


def run_coordinator_conformance(
    address: str,
    *,
    security: ClientSecurity | None = None,
    checks: Sequence[str] | None = None,
    timeout: float = 15.0,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Runs the coordinator checks against a running coordinator.

    Args:
        address: The coordinator's gRPC ``HOST:PORT``.
        security: TLS and the worker token to join with, or None.
        checks: Names of the checks to run (see :data:`COORDINATOR_CHECKS`);
            None runs all.
        timeout: Longest wait for any one answer, in seconds.
        on_result: Called with each result as soon as its check ends.

    Returns:
        One result per check, in running order.

    Raises:
        ConfigError: If a check name is unknown or the timeout is not positive.
    """
    selected = select(checks, COORDINATOR_CHECKS, timeout)
    target = CoordinatorTarget(address, security, timeout)
    results = []
    for check in selected:
        result = check.run(target)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


# --- helpers ---------------------------------------------------------------------


@contextlib.contextmanager
def _ticket(target: CoordinatorTarget) -> Iterator[tuple[int, bytes | None]]:
    """``(data port, ticket)`` of a fresh worker session, open meanwhile."""
    with contextlib.ExitStack() as stack:
        try:
            data = stack.enter_context(
                lease_data_ticket(
                    target.address,
                    security=target.security,
                    timeout=target.timeout,
                    implementation=KIT_IMPLEMENTATION,
                )
            )
        except Exception as exc:  # cannot join: the check cannot run
            raise CheckFailed(
                f"could not join {target.address} as a worker hosting leases to get a "
                f"ticket: {type(exc).__name__}: {exc}"
            ) from None
        yield data if data is not None else (0, None)


@contextlib.contextmanager
def _presented(target: CoordinatorTarget, port: int, first: bytes) -> Iterator[bool]:
    """Dials the data port, sends ``first`` and yields whether it was accepted.

    Accepted: the coordinator answered with an empty frame (LeaseDataAccepted).
    Refused: it closed or reset the connection. The connection stays open
    for the ``with`` body.

    Raises:
        CheckFailed: If the port cannot be reached, or neither answer came
            within the target's timeout.
    """
    host = coordinator_host(target.address)
    tls = target.security.tls if target.security is not None else None
    try:
        sock = socket.create_connection((host, port), timeout=target.timeout)
        if tls is not None:
            sock = tls.ssl_context().wrap_socket(sock, server_hostname=tls.server_name or host)
    except OSError as exc:
        raise CheckFailed(f"could not reach the lease data port {host}:{port}: {exc}") from None
    try:
        yield _answer(sock, first, target.timeout, f"{host}:{port}")
    finally:
        sock.close()


def _answer(sock: socket.socket, first: bytes, timeout: float, where: str) -> bool:
    deadline = time.monotonic() + timeout
    try:
        sock.sendall(first)
    except OSError:
        return False  # closed on us while we wrote: refused
    answer = b""
    while len(answer) < 4:
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        try:
            chunk = sock.recv(4 - len(answer))
        except TimeoutError:
            raise CheckFailed(
                f"the lease data port {where} neither accepted nor closed the connection "
                f"within {timeout:g} seconds of its first frame"
            ) from None
        except OSError:
            return False  # reset: refused
        if not chunk:
            return False
        answer += chunk
    if answer != frame(b""):
        raise CheckFailed(
            f"the lease data port {where} answered the first frame with {answer!r}, not the "
            "empty LeaseDataAccepted frame (b'\\x00\\x00\\x00\\x00') nor a close"
        )
    return True


@contextlib.contextmanager
def _results_link(target: CoordinatorTarget) -> Iterator[DataLink | None]:
    """A results connection taking requests, opened as a learner opens one; None
    when the coordinator offers none (no data channel, an older coordinator).

    Raises:
        CheckFailed: If OpenResultChannel fails otherwise, or the port cannot
            be dialled with its ticket.
    """
    channel = _rpc.open_channel(target.address, security=target.security)
    with contextlib.ExitStack() as stack:
        stack.callback(channel.close)
        call = channel.unary_unary(
            _rpc.OPEN_RESULT_CHANNEL,
            request_serializer=result_channel_request,
            response_deserializer=results_connection_of,
        )
        what = f"OpenResultChannel on {target.address}"
        opened: ResultsConnection | None = None
        try:
            opened = call(None, timeout=target.timeout)
        except Exception as exc:  # a failed call: a grpc.RpcError (not imported here)
            error = _rpc.error_from_rpc(cast(Any, exc), what=what)
            # UNIMPLEMENTED (a ProtocolError): it knows no such method.
            if type(error) is not ProtocolError:
                raise CheckFailed(f"{what} failed: {error}") from None
        if opened is None or not (opened.port and opened.requests):
            yield None
            return
        host = coordinator_host(target.address)
        tls = target.security.tls if target.security is not None else None
        try:
            link = dial(
                host,
                opened.port,
                data_hello(opened.ticket),
                tls=tls,
                timeout=target.timeout,
                max_frame_bytes=FORWARDED_RESULT_BYTES,
            )
        except (OSError, RlfleetError) as exc:
            raise CheckFailed(
                f"could not dial the results connection {host}:{opened.port} with its ticket: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        stack.callback(link.close)
        yield link


def _answer_frame(link: DataLink, target: CoordinatorTarget, call: int, what: str) -> ResultsFrame:
    """The next frame of a results connection, which must be of request ``call``.

    Raises:
        CheckFailed: If the connection closed, nothing came within the
            target's timeout, or the frame is no SampleResponse of the call.
    """
    try:
        payload = link.receive_within(target.timeout)
    except (OSError, RlfleetError) as exc:
        raise CheckFailed(
            f"expected {what} of request {call} on the results connection: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if payload is None:
        raise CheckFailed(
            f"expected {what} of request {call}; the coordinator closed the results connection"
        )
    try:
        got = results_frame_of(bytes(payload))
    except DecodeError as exc:
        raise CheckFailed(f"{what} of request {call} is no SampleResponse: {exc}") from None
    if got.call != call:
        raise CheckFailed(
            f"expected {what} of request {call} (SampleResponse.result_call {call}); "
            f"got {_described(got)}"
        )
    return got


def _described(got: ResultsFrame) -> str:
    """A results frame, for a check's message."""
    if got.kind == "failure":
        return f"a failure frame of call {got.call} (code {got.code}: {got.message})"
    return f"a {got.kind} frame of call {got.call}"


def _expect_accepted(target: CoordinatorTarget, port: int, ticket: bytes, when: str) -> None:
    with _presented(target, port, frame(data_hello(ticket))) as accepted:
        if not accepted:
            raise CheckFailed(
                f"expected the coordinator to accept the Welcome's own ticket {when} (so "
                "that the refusal was for the bad one); it closed the connection"
            )


__all__ = [
    "COORDINATOR_CHECKS",
    "CoordinatorTarget",
    "run_coordinator_conformance",
]
