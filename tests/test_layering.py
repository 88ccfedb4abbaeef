"""The import rules of the package (docs/architecture.md, STYLE.md).

* Each package imports only the packages docs/architecture.md's import
  graph allows it (read from that page, so the page and this test agree),
  with the module exceptions listed in ``EXCEPTIONS``. Among them: ``core``
  imports no other rlfleet package; ``protocol`` only ``core``;
  ``scheduling`` neither ``coordinator``, ``client`` nor ``worker``; the
  client no coordinator module (``client/fleet.py`` may use
  ``rlfleet.coordinator``'s public names: ``Fleet.local`` starts an embedded
  coordinator); the worker neither ``coordinator`` nor ``client``.
* At most 6 modules lie loose at ``rlfleet/``'s root.
* No module passes 700 lines (rlfleet/v1's generated code aside): a module
  that grows past it is split by responsibility (STYLE.md).
* gRPC is imported only by ``rlfleet.transport.rpc`` and the faces
  (coordinator, client, the worker's connection, the conformance kit's
  coordinator, the security plumbing of channels and servers, the health
  command).
* Generated protobuf messages (``rlfleet.v1``) are held only by
  ``rlfleet.wire`` (the codec) and the translation modules listed below:
  ``rlfleet.transport.rpc``, one module per face and side, and the
  conformance kit's. Everything else holds rlfleet's own types
  (``rlfleet.protocol``): a face's servicer or connection hands the bytes to
  its translation module in the gRPC call's (de)serializers. The list is
  exact: a module may neither join it nor stay on it without importing
  ``rlfleet.v1``.
* ``rlfleet.security`` does not import ``rlfleet.cli``.
* Public class names are unique across the package (STYLE.md).
* The local path (LocalSampler, the Scheduler it drives, VecWorker,
  policies, envs, sampling utilities) loads neither gRPC nor protobuf.

The static rules read every module's imports with ``ast`` (function-level
and ``TYPE_CHECKING`` imports included); the last one imports for real, in a
fresh interpreter.
"""

from __future__ import annotations

import ast
import functools
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
    "rlfleet.client._coordinator_calls",
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
    "rlfleet.coordinator.leases.result_lane",  # drops a worker whose result it refused
    "rlfleet.coordinator.liveness",
    "rlfleet.coordinator.registry",
    "rlfleet.coordinator.requests",
    "rlfleet.coordinator.result_requests",  # a request's failure has a status code
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
#: generated messages (one per face and side).
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
    # The lease face: the learner's and the worker's side is rlfleet.wire.leases
    # (in the codec); the coordinator's relay side forwards replies as bytes.
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
    "rlfleet.scheduling",
    "rlfleet.protocol.modes",
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


@functools.cache
def modules() -> dict[str, set[str]]:
    """Module -> every module it imports (rlfleet.v1 aside), parsed once per test process."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not name.startswith("rlfleet.v1"):
            found[name] = imports_of(path)
    return found


def importers(prefix: str) -> set[str]:
    return {
        name
        for name, imported in modules().items()
        if any(i == prefix or i.startswith(prefix + ".") for i in imported)
    }


# --- the package graph (docs/architecture.md) ----------------------------------------

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

#: At most this many modules lie loose at rlfleet/'s root.
MAX_LOOSE_MODULES = 6

#: No module passes this many lines (rlfleet/v1's generated code aside).
MAX_MODULE_LINES = 700
#: Modules still past it, each with its reason in a comment; an entry whose module is
#: back under the limit fails the test, so the list only shrinks.
LONG_MODULES: set[str] = set()

#: Every package may import these besides what the graph says...
EVERYONE_MAY_IMPORT = {"errors", "_util"}
#: ... except these, which import only what is listed here.
BARE_PACKAGES = {"errors": set(), "_version": set(), "_util": {"errors"}}

#: Module exceptions to the graph: module -> the rlfleet modules it may
#: import beyond its package's edges (docs/architecture.md lists them too).
EXCEPTIONS = {
    # Fleet.local starts an embedded coordinator: rlfleet.coordinator's public
    # names (its lazy __init__), never one of its modules.
    "rlfleet.client.fleet": {"rlfleet.coordinator"},
    # Reads where rlfleet lies (rlfleet.__file__) for its subprocesses' path.
    "rlfleet.client._processes": {"rlfleet"},
    # The learner's calls carry wire value types (a result's first chunk and
    # its header); updates name TensorDict for type checking only.
    "rlfleet.protocol.learner_calls": {"rlfleet.wire", "rlfleet.wire.results"},
    "rlfleet.protocol.updates": {"rlfleet.wire.tensors"},
    # The lease face's translation builds and reads error details with the
    # gRPC boundary's helpers.
    "rlfleet.wire.leases": {"rlfleet.transport.rpc"},
}


def package_of(module: str) -> str:
    """``rlfleet.core.x`` -> ``core``; ``rlfleet`` (its __init__) -> ``(root)``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def rlfleet_imports(path: Path) -> set[str]:
    """The rlfleet modules a file imports, at any depth of its code.

    ``from rlfleet.x import y`` names ``rlfleet.x.y`` when that is a module,
    else ``rlfleet.x`` (y is a name in it).
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "rlfleet")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] != "rlfleet":
                continue
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if is_module(name) else node.module)
    return found


@functools.cache
def import_map() -> dict[str, set[str]]:
    """Module -> the rlfleet modules it imports, for the whole tree but rlfleet.v1.

    Parsed once per test process (the tree does not change during a run);
    callers only read it.
    """
    return {
        module_name(path): rlfleet_imports(path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if not module_name(path).startswith("rlfleet.v1")
    }


def documented_graph() -> dict[str, set[str]]:
    """The import graph block of docs/architecture.md: package -> packages."""
    text = ARCHITECTURE.read_text()
    block = text.split("<!-- import-graph -->", 1)[1].split("```")[1]
    graph: dict[str, set[str]] = {}
    for line in block.strip().splitlines():
        source, _, targets = line.partition("->")
        graph[source.strip()] = {t.strip() for t in targets.split(",") if t.strip()}
    return graph


def allowed_for(package: str, graph: dict[str, set[str]]) -> set[str]:
    extra = BARE_PACKAGES.get(package, EVERYONE_MAY_IMPORT)
    return graph.get(package, set()) | extra | {package}


def violations(imports: dict[str, set[str]], graph: dict[str, set[str]]) -> list[str]:
    """Every import the graph and EXCEPTIONS do not allow, as messages."""
    found = []
    for module, targets in sorted(imports.items()):
        source = package_of(module)
        if source not in graph:
            found.append(f"{module}: package {source!r} is not in docs/architecture.md's graph")
            continue
        allowed = allowed_for(source, graph)
        for target in sorted(targets):
            if package_of(target) in allowed or target in EXCEPTIONS.get(module, ()):
                continue
            found.append(
                f"{module} imports {target}: {source} may import only "
                f"{sorted(allowed - {source})} (docs/architecture.md, 'The import graph')"
            )
    return found


def used_edges(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """package -> packages its modules import (module exceptions and implicit ones aside)."""
    edges: dict[str, set[str]] = {}
    for module, targets in imports.items():
        source = package_of(module)
        for target in targets:
            if target in EXCEPTIONS.get(module, ()):
                continue
            dest = package_of(target)
            if dest != source and dest not in BARE_PACKAGES.get(source, EVERYONE_MAY_IMPORT):
                edges.setdefault(source, set()).add(dest)
    return edges


def module_lengths() -> dict[str, int]:
    """Lines of every module, rlfleet/v1's generated code aside."""
    return {
        module_name(path): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
        if not module_name(path).startswith("rlfleet.v1")
    }


def too_long(lengths: dict[str, int], allowed: set[str]) -> str | None:
    long = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES and name not in allowed}
    if not long:
        return None
    return (
        f"modules past {MAX_MODULE_LINES} lines: {long}; split each by responsibility "
        "(STYLE.md), not by line count"
    )


def loose_modules() -> list[str]:
    return sorted(p.name for p in PACKAGE.glob("*.py"))


def too_many_loose(names: list[str]) -> str | None:
    if len(names) <= MAX_LOOSE_MODULES:
        return None
    return (
        f"{len(names)} modules lie loose at rlfleet/'s root ({names}), at most "
        f"{MAX_LOOSE_MODULES}: move each into the package of its part (docs/architecture.md)"
    )


@pytest.mark.parametrize("package", sorted(documented_graph()))
def test_each_package_imports_only_what_the_architecture_allows(package: str) -> None:
    graph = documented_graph()
    mine = {m: t for m, t in import_map().items() if package_of(m) == package}
    problems = violations(mine, graph)
    assert not problems, "\n".join(problems)


def test_every_package_is_in_the_graph() -> None:
    graph = documented_graph()
    missing = sorted({package_of(m) for m in import_map()} - set(graph))
    assert not missing, f"packages missing from docs/architecture.md's import graph: {missing}"


def test_the_graph_is_the_one_the_code_has() -> None:
    """An edge nobody uses is stale: the picture must be the present one."""
    graph = documented_graph()
    used = used_edges(import_map())
    stale = {p: sorted(t - used.get(p, set())) for p, t in graph.items() if t - used.get(p, set())}
    assert not stale, f"docs/architecture.md's graph has edges no module uses: {stale}"


def test_the_exceptions_are_still_needed() -> None:
    imports = import_map()
    unused = {m: sorted(t - imports.get(m, set())) for m, t in EXCEPTIONS.items()}
    unused = {m: t for m, t in unused.items() if t}
    assert not unused, f"exceptions no module needs any more: {unused}"


def test_few_modules_lie_loose_at_the_root() -> None:
    problem = too_many_loose(loose_modules())
    assert problem is None, problem


def test_no_module_passes_700_lines() -> None:
    problem = too_long(module_lengths(), LONG_MODULES)
    assert problem is None, problem


def test_the_long_modules_listed_are_still_long() -> None:
    lengths = module_lengths()
    short = sorted(m for m in LONG_MODULES if lengths.get(m, 0) <= MAX_MODULE_LINES)
    assert not short, (
        f"{short} are no longer past {MAX_MODULE_LINES} lines: drop them from LONG_MODULES"
    )


def test_the_length_rule_refuses_a_module_of_701_lines() -> None:
    assert too_long({"rlfleet.a": MAX_MODULE_LINES + 1}, set())
    assert too_long({"rlfleet.a": MAX_MODULE_LINES}, set()) is None
    assert too_long({"rlfleet.a": MAX_MODULE_LINES + 1}, {"rlfleet.a"}) is None


# Each rule fails on a violating import (a synthetic import map, no files).


@pytest.mark.parametrize("package", sorted(documented_graph()))
def test_the_graph_rule_refuses_an_import_it_does_not_list(package: str) -> None:
    graph = documented_graph()
    allowed = allowed_for(package, graph)
    forbidden = sorted(set(graph) - allowed - {"(root)"})
    if not forbidden:
        pytest.skip(f"{package} may import every package")
    module = "rlfleet" if package == "(root)" else f"rlfleet.{package}.synthetic"
    target = f"rlfleet.{forbidden[0]}.synthetic"
    assert violations({module: {target}}, graph), f"{module} -> {target} was allowed"


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("rlfleet.core.episode_batch", "rlfleet.envs.config"),
        ("rlfleet.core.seeding", "rlfleet.worker.vec"),
        ("rlfleet.protocol.join", "rlfleet.wire.join"),
        ("rlfleet.protocol.modes", "rlfleet.transport.rpc"),
        ("rlfleet.scheduling.scheduler", "rlfleet.coordinator.state"),
        ("rlfleet.scheduling.scheduler", "rlfleet.client.sampler"),
        ("rlfleet.scheduling.scheduler", "rlfleet.worker.vec"),
        ("rlfleet.client.sampler", "rlfleet.coordinator"),
        ("rlfleet.client.fleet", "rlfleet.coordinator.state"),
        ("rlfleet.client.leases.lease_stream", "rlfleet.coordinator.leases.translation"),
        ("rlfleet.worker.remote", "rlfleet.coordinator.state"),
        ("rlfleet.worker.leases.host", "rlfleet.client.leases.lease_stream"),
        ("rlfleet.worker._session", "rlfleet.scheduling.scheduler"),
        ("rlfleet._util.values", "rlfleet.core.seeding"),
        ("rlfleet.errors", "rlfleet._util.values"),
    ],
)
def test_the_headline_rules_refuse_a_violating_import(module: str, target: str) -> None:
    assert violations({module: {target}}, documented_graph()), f"{module} -> {target} was allowed"


def test_the_embedded_fleet_may_use_the_coordinators_public_names() -> None:
    assert not violations({"rlfleet.client.fleet": {"rlfleet.coordinator"}}, documented_graph())


def test_the_loose_module_rule_refuses_a_seventh_module() -> None:
    assert too_many_loose([f"m{i}.py" for i in range(MAX_LOOSE_MODULES + 1)])
    assert too_many_loose([f"m{i}.py" for i in range(MAX_LOOSE_MODULES)]) is None


def test_only_rpc_and_the_faces_import_grpc() -> None:
    extra = importers("grpc") - GRPC_MODULES
    assert not extra, (
        f"{sorted(extra)} import grpc: keep gRPC in rlfleet.transport.rpc and the faces"
    )


def test_generated_messages_stay_in_wire_and_the_listed_modules() -> None:
    holders = {n for n in importers("rlfleet.v1") if not n.startswith("rlfleet.wire")}
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
