"""One job, one place (docs/architecture.md, ``_util``).

* ``with obj:`` for objects with a ``close()`` is :class:`ClosesOnExit`;
  no class writes that ``__enter__``/``__exit__`` pair again. Closing an env
  without raising is ``close_quietly``, for a worker's envs and leased ones.
* JSON from users and peers is parsed by ``_util.values`` (``json_value``,
  ``json_object``), whose recursion guard turns ``"[[[[..."`` into a
  ConfigError: the lease modules of both sides parse nothing themselves.
* The Prometheus registry is set up once (``_util.metrics.MetricSet``).
* A RolloutWorker's sampling settings are one ``SamplingSettings``, read by
  name from its keyword arguments, which the collector and
  RolloutWorkerGroup share.
"""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path

import pytest

from rlfleet._util.closing import ClosesOnExit, close_quietly
from rlfleet.errors import ConfigError
from rlfleet.rllib import RolloutWorker
from rlfleet.rllib._collector import SamplingSettings
from rlfleet.wire.leases import LeaseCallOrder
from rlfleet.worker.leases.leased_env import call_args

PACKAGE = Path(__file__).resolve().parent.parent / "rlfleet"

#: JSON text deeper than Python's stack: json.loads raises RecursionError.
TOO_DEEP = "[" * 100_000


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _only_statement(function: ast.FunctionDef) -> ast.stmt:
    body = [s for s in function.body if not isinstance(s, ast.Expr | ast.Pass)]
    return body[0] if len(body) == 1 else function.body[-1]


def _is_return_self(function: ast.FunctionDef) -> bool:
    statement = _only_statement(function)
    return (
        isinstance(statement, ast.Return)
        and isinstance(statement.value, ast.Name)
        and statement.value.id == "self"
    )


def _is_self_close(function: ast.FunctionDef) -> bool:
    statement = _only_statement(function)
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and ast.unparse(statement.value.func) == "self.close"
        and len(function.body) == 1
    )


def test_no_class_writes_the_closing_with_statement_again() -> None:
    again = []
    for module, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or node.name == "ClosesOnExit":
                continue
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            enter, exit_ = methods.get("__enter__"), methods.get("__exit__")
            # A subclass that repeats only the __enter__ (for its return type) counts too.
            if enter and _is_return_self(enter) and (exit_ is None or _is_self_close(exit_)):
                again.append(f"rlfleet/{module}: {node.name}")
    assert not again, f"use rlfleet._util.closing.ClosesOnExit instead: {again}"


def test_closes_on_exit_closes_when_the_block_raises_and_lets_the_error_go() -> None:
    class Thing(ClosesOnExit):
        closed = 0

        def close(self) -> None:
            self.closed += 1

    thing = Thing()
    with pytest.raises(KeyError), thing as entered:
        assert entered is thing
        raise KeyError("x")
    assert thing.closed == 1


def test_close_quietly_logs_a_failing_close_with_what_it_was_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def close(self) -> None:
            raise RuntimeError("the env's process is gone")

    logger = logging.getLogger("rlfleet.worker")
    with caplog.at_level(logging.WARNING, logger="rlfleet.worker"):
        close_quietly(Broken(), "env CartPole-v1", logger)
    (record,) = caplog.records
    assert record.getMessage() == (
        "closing env CartPole-v1 raised RuntimeError: the env's process is gone"
    )
    assert record.exc_info is not None


def test_only_one_close_quietly_is_written() -> None:
    defined = [
        module
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "close_quietly"
    ]
    assert defined == ["_util/closing.py"], defined


def test_the_lease_modules_parse_json_only_through_the_guarded_helpers() -> None:
    parsing = []
    for module, tree in _modules():
        if "leases" not in module:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("json.loads", "json.load"):
                parsing.append(f"rlfleet/{module}:{node.lineno}")
    assert not parsing, f"parse with rlfleet._util.values.json_value/json_object: {parsing}"


@pytest.mark.parametrize(
    ("op", "fields", "where"),
    [
        ("reset", {"options_json": TOO_DEEP}, "LeaseCall.options_json"),
        ("set_attr", {"name": "x", "value_json": TOO_DEEP}, "SET_ATTR value_json"),
    ],
)
def test_a_worker_refuses_lease_json_nested_too_deeply_as_a_config_error(
    op: str, fields: dict[str, str], where: str
) -> None:
    call = LeaseCallOrder(lease_id=1, call_id=1, op=op, env_ids=[0], **fields)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"{where} (nests too deeply|is not valid JSON)"):
        call_args(call)


def test_the_prometheus_registry_is_set_up_in_one_place() -> None:
    setups = [
        f"rlfleet/{module}:{node.lineno}"
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("CollectorRegistry")
    ]
    assert setups == [f"rlfleet/_util/metrics.py:{setups[0].rsplit(':', 1)[1]}"], (
        f"one registry setup (rlfleet/_util/metrics.py), found {setups}"
    )


def test_sampling_settings_are_read_by_name_from_rollout_worker_arguments() -> None:
    parameters = inspect.signature(RolloutWorker.__init__).parameters
    fields = [f for f in SamplingSettings.__dataclass_fields__]
    assert set(fields) <= set(parameters), set(fields) - set(parameters)
    defaults = {name: p.default for name, p in parameters.items() if name in fields}
    assert SamplingSettings.of(defaults).rollout_fragment_length == 100
