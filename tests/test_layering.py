"""The import rules of the package (DESIGN.md "Layout", STYLE.md).

* gRPC is imported only by ``rlfleet.transport.rpc`` and the faces (coordinator,
  client, the worker's connection, the conformance kit's coordinator, the
  security plumbing of channels and servers, the health command).
* Generated protobuf messages (``rlfleet.v1``) are held only by
  ``rlfleet.wire`` (the codec) and the translation modules listed below:
  ``rlfleet.transport.rpc``, one module per face and side, and the conformance
  kit's. Everything else holds rlfleet's own types (``rlfleet.protocol.join``,
  ``rlfleet.protocol.learner_calls``, ``rlfleet.protocol.updates``,
  ``rlfleet.protocol.error_reports``...): a face's servicer or connection hands the
  bytes to its translation module in the gRPC call's (de)serializers. The
  list is exact: a module may neither join it nor stay on it without
  importing ``rlfleet.v1``.
* ``rlfleet.security`` does not import ``rlfleet.cli``.
* Public class names are unique across the package (STYLE.md).
* The local path (LocalSampler, the Scheduler it drives, VecWorker,
  policies, envs, sampling utilities) loads neither gRPC nor protobuf.

The static rules read every module's imports with ``ast`` (function-level
imports included); the last one imports for real, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rlfleet"

#: Modules that may import grpc.
GRPC_MODULES = {
    "rlfleet.transport.rpc",
    "rlfleet.cli._health_port",
    "rlfleet.cli.health",
    "rlfleet.client._errors",
    "rlfleet.client._learner_messages",
    "rlfleet.client.leases.lease_stream",  # the lease face (docs/vector_env.md)
    "rlfleet.client.leases.remote_vector_env",
    "rlfleet.client.sampler",
    "rlfleet.client.stream",
    "rlfleet.conformance.checks",
    "rlfleet.conformance.link",
    "rlfleet.conformance.scripted_coordinator",
    "rlfleet.coordinator.calls",
    "rlfleet.coordinator.coordinator",
    "rlfleet.coordinator.failures",
    "rlfleet.coordinator.learner_face",
    "rlfleet.coordinator.leases.data_peers",  # drops a worker whose data connection broke
    "rlfleet.coordinator.leases.face",
    "rlfleet.coordinator.leases.translation",
    "rlfleet.coordinator.leases.manager",
    "rlfleet.coordinator.liveness",
    "rlfleet.coordinator.registry",
    "rlfleet.coordinator.requests",
    "rlfleet.coordinator.rollouts",
    "rlfleet.coordinator.server",
    "rlfleet.coordinator.state",
    "rlfleet.coordinator.updates",
    "rlfleet.coordinator.worker_events",
    "rlfleet.coordinator.worker_face",
    "rlfleet.security.auth",
    "rlfleet.security.client_auth",
    "rlfleet.security.settings",
    "rlfleet.security.tls",
    "rlfleet.worker._connection",
    "rlfleet.worker.remote",
}

#: The translation modules: the only modules outside rlfleet.wire that hold
#: generated messages (issue 15: one per face and side).
PROTOBUF_HOLDERS = {
    # gRPC plumbing every face shares: chunk-aware (de)serializers, and the
    # ErrorDetail a status carries in its trailing metadata.
    "rlfleet.transport.rpc",
    # The learner face (LearnerService): the client's side and the coordinator's.
    "rlfleet.client._learner_messages",
    "rlfleet.coordinator.learner_messages",
    # The worker face (the Join stream): the coordinator's side and the worker's.
    "rlfleet.coordinator.worker_messages",
    "rlfleet.worker._join_messages",
    # The lease face (issue 11): the learner's and the worker's side, and the
    # coordinator's relay side (which forwards replies as bytes).
    "rlfleet.wire.leases",
    "rlfleet.coordinator.leases.translation",
    # The conformance kit is a protocol peer of its own: it plays a coordinator,
    # checks a worker's messages as sent (a missing field is not an empty one)
    # and scripts what a real coordinator never sends.
    "rlfleet.conformance.kit_messages",
}

#: The local path: none of these may load gRPC or protobuf.
LOCAL_MODULES = (
    "rlfleet",
    "rlfleet.sampling.local",
    "rlfleet.scheduling.scheduler",
    "rlfleet.core.episode_order",
    "rlfleet.worker.vec",
    "rlfleet.policies",
    "rlfleet.envs",
    "rlfleet.sampling",
    "rlfleet.core.space_checks",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules() -> dict[str, set[str]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not name.startswith(("rlfleet.v1", "rlfleet.wire")):
            found[name] = imports_of(path)
    return found


def importers(prefix: str) -> set[str]:
    return {
        name
        for name, imported in modules().items()
        if any(i == prefix or i.startswith(prefix + ".") for i in imported)
    }


def test_only_rpc_and_the_faces_import_grpc() -> None:
    extra = importers("grpc") - GRPC_MODULES
    assert not extra, (
        f"{sorted(extra)} import grpc: keep gRPC in rlfleet.transport.rpc and the faces"
    )


def test_generated_messages_stay_in_wire_and_the_listed_modules() -> None:
    holders = importers("rlfleet.v1")
    joined = holders - PROTOBUF_HOLDERS
    assert not joined, (
        f"{sorted(joined)} import rlfleet.v1: translate in rlfleet.wire or the face's "
        "translation module and hand rlfleet types to domain code"
    )
    left = PROTOBUF_HOLDERS - holders
    assert not left, f"{sorted(left)} hold no protobuf: remove them from the translation modules"


def test_security_does_not_import_the_cli() -> None:
    offenders = {n for n in importers("rlfleet.cli") if n.startswith("rlfleet.security")}
    assert not offenders, f"{sorted(offenders)} import rlfleet.cli"


def test_public_class_names_are_unique() -> None:
    homes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path).startswith("rlfleet.v1"):
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                homes.setdefault(node.name, []).append(module_name(path))
    twice = {name: where for name, where in homes.items() if len(where) > 1}
    assert not twice, f"class names defined more than once: {twice}"


@pytest.mark.parametrize("module", LOCAL_MODULES)
def test_the_local_path_loads_no_grpc_or_protobuf(module: str) -> None:
    code = (
        f"import sys; import {module}; "
        "print(','.join(m for m in ('grpc', 'google.protobuf') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"
