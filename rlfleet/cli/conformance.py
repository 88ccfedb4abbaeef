"""``rlfleet conformance``: check that a worker or coordinator speaks the protocol."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, TextIO

from pydantic import BeforeValidator
from pydantic_settings import NoDecode

from rlfleet.cli._parser import add_command
from rlfleet.cli._settings import CommandSettings, PositiveFloat, option
from rlfleet.conformance.defaults import DEFAULT_ENV_ID, DEFAULT_TIMEOUT
from rlfleet.errors import ConfigError

if TYPE_CHECKING:
    from rlfleet.conformance import CheckResult

#: Lines of a failure message shown under its row in the table.
_MESSAGE_LINES = 40


def _names(value: Any) -> Any:
    if isinstance(value, str):
        names = [name.strip() for name in value.split(",") if name.strip()]
        if not names:
            raise ConfigError("name at least one check")
        return names
    return value


#: Check names: ``A,B`` in a flag or variable, an array in a config file.
CheckNames = Annotated[list[str] | None, NoDecode, BeforeValidator(_names)]
_TARGET = "target"


class ConformanceSettings(CommandSettings):
    """The options of ``rlfleet conformance``."""

    # Not required: run() asks for one of the two, from a flag or a variable.
    worker_cmd: str | None = option(
        None,
        "command that starts one worker; {address} is replaced by the test coordinator's "
        'HOST:PORT, e.g. "node bin/rlfleet-node-worker.js --coordinator {address} --envs 2"',
        metavar="CMD",
        exclusive=_TARGET,
    )
    coordinator: str | None = option(
        None,
        "check a running coordinator instead (plaintext, no token): that it refuses bad lease "
        "data tickets and answers Sample requests on a results connection (the coordinator "
        "checks of docs/conformance.md)",
        metavar="HOST:PORT",
        exclusive=_TARGET,
    )
    env_id: str = option(DEFAULT_ENV_ID, "env id given to the worker")
    checks: CheckNames = option(
        None,
        "run only these checks (docs/conformance.md lists them, and an unknown name is "
        "answered with the list)",
        metavar="A,B,...",
        shown="all",
    )
    timeout: PositiveFloat = option(
        DEFAULT_TIMEOUT, "longest wait for any one answer from the worker", metavar="S"
    )
    as_json: bool = option(False, "print the results as JSON", flag="--json")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``conformance`` subcommand."""
    add_command(
        subparsers,
        "conformance",
        ConformanceSettings,
        run,
        help="check that a worker implementation (any language) speaks the protocol",
        description=(
            "Start a scripted test coordinator on 127.0.0.1, run the worker command against "
            "it (as often as the checks need) and check the handshake, sampling modes, "
            "updates, chunking, errors, heartbeats, cancels and draining. Prints one line "
            "per check; exits 0 if and only if every check passes. See docs/conformance.md."
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Runs the kit; returns 0 if every check passed, else 1."""
    from rlfleet.conformance import run_conformance

    if args.coordinator is None and not args.worker_cmd:
        print(
            "rlfleet conformance: error: give the worker to check with --worker-cmd CMD (or "
            "RLFLEET_WORKER_CMD), or a running coordinator with --coordinator HOST:PORT",
            file=sys.stderr,
        )
        return 2
    out = sys.stdout
    on_result = None if args.as_json else lambda result: print_row(result, out)
    if args.coordinator is not None:
        from rlfleet.conformance import run_coordinator_conformance

        results = run_coordinator_conformance(
            args.coordinator, checks=args.checks, timeout=args.timeout, on_result=on_result
        )
    else:
        results = run_conformance(
            args.worker_cmd,
            env_id=args.env_id,
            checks=args.checks,
            timeout=args.timeout,
            on_result=on_result,
        )
    if args.as_json:
        json.dump(
            {
                "passed": all(r.passed for r in results),
                "checks": [
                    {"name": r.name, "passed": r.passed, "message": r.message, "seconds": r.seconds}
                    for r in results
                ],
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        print_summary(results, out)
    return 0 if all(r.passed for r in results) else 1


def print_row(result: CheckResult, out: TextIO) -> None:
    """Prints one check's line, and a failure's whole message indented below it."""
    verdict = "PASS" if result.passed else "FAIL"
    first, _, rest = result.message.partition("\n")
    out.write(f"{verdict}  {result.name:<17} {result.seconds:6.1f}s  {first}\n")
    if not result.passed and rest:
        lines = rest.splitlines()[:_MESSAGE_LINES]
        out.write("".join(f"      {line}\n" for line in lines))
    out.flush()


def print_summary(results: Sequence[CheckResult], out: TextIO) -> None:
    """Prints the totals line."""
    failed = [r.name for r in results if not r.passed]
    seconds = sum(r.seconds for r in results)
    if failed:
        out.write(
            f"{len(results) - len(failed)} of {len(results)} checks passed in {seconds:.1f}s; "
            f"failed: {', '.join(failed)}\n"
        )
    else:
        out.write(f"all {len(results)} checks passed in {seconds:.1f}s\n")


__all__ = ["print_row", "print_summary", "register", "run"]
