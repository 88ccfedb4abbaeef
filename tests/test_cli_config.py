"""Every option has an RLFLEET_* variable; config files; --print-config; sizes.

Each option is a field of its command's settings model (rlfleet/cli/_settings.py)
and the parsers are built from the models, so these tests walk the real parsers:
a new option without a variable fails here. docs/operations.md ("Configuration") names these tests.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.cli import COMMANDS, build_parser, parse_args
from rlfleet.cli._parser import options, subcommands, variable_of
from rlfleet.cli._settings import byte_size
from rlfleet.coordinator import CoordinatorConfig
from rlfleet.errors import ConfigError
from rlfleet.worker.remote import WorkerConfig
from tests._coordinator_fakes import ROOT


def every_parser() -> dict[str, argparse.ArgumentParser]:
    root = build_parser({})
    return {"rlfleet": root, **subcommands(root)}


def test_every_option_of_every_command_names_its_variable_in_help() -> None:
    parsers = every_parser()
    assert set(parsers) == {"rlfleet", *COMMANDS}
    missing = []
    for name, parser in parsers.items():
        variables: dict[str, str] = {}
        for action in options(parser):
            variable = variable_of(action)
            assert variable.startswith("RLFLEET_")
            if variable not in (action.help or ""):
                missing.append(f"{name} {action.option_strings[0]}")
            other = variables.setdefault(variable, action.dest)
            assert other == action.dest, f"{name}: {variable} names two options"
    assert not missing, f"options without an RLFLEET_* variable in --help: {missing}"
    # Only --help, --version and --print-config (a variable would make a
    # container print and exit) are left out, and the internal flag one
    # rlfleet process passes another (Fleet.local's workers: --parent-pipe).
    left_out = {
        a.dest
        for p in parsers.values()
        for a in p._actions
        if a.option_strings and a not in list(options(p))
    }
    assert left_out == {"help", "version", "print_config", "parent_pipe"}


@pytest.mark.parametrize(
    ("variable", "text", "argv", "dest", "expected"),
    [
        # Options that had no variable before (issue 16).
        ("RLFLEET_KEEPALIVE_INTERVAL", "2.5", ["worker"], "keepalive_interval", 2.5),
        ("RLFLEET_TIMEOUT", "2.5", ["sample", "--out", "x"], "timeout", 2.5),
        ("RLFLEET_OUT", "x.npz", ["sample"], "out", Path("x.npz")),
        ("RLFLEET_WORKERS", "3", ["demo"], "workers", 3),
        ("RLFLEET_REPEATS", "3", ["bench"], "repeats", 3),
        ("RLFLEET_WORKER_CMD", "w --x", ["conformance"], "worker_cmd", "w --x"),
        ("RLFLEET_LOCAL", "yes", ["demo"], "local", True),
        ("RLFLEET_LOCAL", "0", ["demo"], "local", False),
        ("RLFLEET_IMPORT", "a.b,c", ["worker"], "imports", ["a.b", "c"]),
        ("RLFLEET_MAX_RESULT_BYTES", "2GiB", ["coordinator"], "max_result_bytes", 2 << 30),
        ("RLFLEET_LOG_LEVEL", "DEBUG", ["status"], "log_level", "DEBUG"),
        ("RLFLEET_TAIL_MOVES", "off", ["coordinator"], "tail_moves", "off"),
    ],
)
def test_a_variable_sets_the_default(
    variable: str, text: str, argv: list[str], dest: str, expected: object
) -> None:
    assert getattr(build_parser({variable: text}).parse_args(argv), dest) == expected


def test_a_bad_choice_or_boolean_variable_names_itself() -> None:
    with pytest.raises(ConfigError, match="RLFLEET_LOG_LEVEL='LOUD' is not one of"):
        build_parser({"RLFLEET_LOG_LEVEL": "LOUD"})
    with pytest.raises(ConfigError, match="RLFLEET_LOCAL='perhaps' is not a boolean"):
        build_parser({"RLFLEET_LOCAL": "perhaps"})
    with pytest.raises(ConfigError, match="RLFLEET_TAIL_MOVES='no' is not one of 'on', 'off'"):
        build_parser({"RLFLEET_TAIL_MOVES": "no"})


def test_tail_moves_are_on_unless_the_flag_or_variable_turns_them_off() -> None:
    coordinator = build_parser({}).parse_args(["coordinator"])
    assert coordinator.tail_moves == "on" and CoordinatorConfig().tail_moves is True
    flagged = build_parser({}).parse_args(["coordinator", "--tail-moves", "off"])
    assert flagged.tail_moves == "off"
    # The flag wins over the variable, as for every option.
    both = build_parser({"RLFLEET_TAIL_MOVES": "off"}).parse_args(
        ["coordinator", "--tail-moves", "on"]
    )
    assert both.tail_moves == "on"
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["coordinator", "--tail-moves", "false"])
    with pytest.raises(ConfigError, match="tail_moves must be True or False, got 'off'"):
        CoordinatorConfig(tail_moves="off")  # type: ignore[arg-type]


def test_precedence_is_flag_then_variable_then_file_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(
        "seed = 7\n[coordinator]\nmax_workers = 9\nheartbeat-timeout = 20\n"
        "env-kwargs = { length = 5 }\n[worker]\nenvs = 4\n"
    )
    monkeypatch.setenv("RLFLEET_SEED", "8")
    monkeypatch.setenv("RLFLEET_CONFIG", str(config))
    args = parse_args(["coordinator", "--heartbeat-timeout", "30"])
    assert args.heartbeat_timeout == 30.0  # flag over file
    assert args.seed == 8  # variable over file
    assert args.max_workers == 9  # file over default
    assert args.env_kwargs == {"length": 5}  # a TOML table for a JSON option
    assert args.keepalive_interval == 10.0  # default
    # The worker reads its own table and the shared top level; switches and
    # lists keep the same precedence.
    config.write_text(config.read_text() + "allow-pickle = true\nimport = ['x']\n")
    monkeypatch.setenv("RLFLEET_ALLOW_PICKLE", "0")
    monkeypatch.setenv("RLFLEET_IMPORT", "a,b")
    worker = parse_args(["worker", "--coordinator", "h:1", "--config", str(config)])
    assert (worker.envs, worker.seed) == (4, 8)
    assert worker.allow_pickle is False and worker.imports == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max-wrokers = 3\n", "has no option 'max-wrokers'"),
        ("[cordinator]\nseed = 1\n", "has no option 'cordinator'"),
        ("seed = 'x'\n", "config file .* key 'seed'='x' is invalid"),
        ("worker-token = 'abc'\n", "'worker-token' is a secret; use --worker-token-file"),
        ("seed = \n", "not valid TOML"),
        ("allow-pickle = 'maybe'\n", "not a boolean"),
        ("max-workers = true\n", "key 'max-workers' is a boolean"),
        ("max-message-bytes = 1024\n", "key 'max-message-bytes'=1024 is invalid"),
    ],
)
def test_a_bad_config_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises((ConfigError, SystemExit)) as caught:
        parse_args(["coordinator", "--config", str(config)])
    if caught.type is ConfigError:
        assert caught.match(message)
    else:  # argparse reports conversion errors itself (exit 2, message on stderr)
        assert "invalid" in message


def test_print_config_reads_back_as_the_same_settings(tmp_path: Path) -> None:
    def printed(*argv: str, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "rlfleet", *argv, "--print-config"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, **(env or {})},
        )
        return result.stdout

    first = printed(
        "worker", "--coordinator", "h:1", "--flush-bytes", "1MiB", env={"RLFLEET_SEED": "4"}
    )
    assert 'coordinator = "h:1"  # flag' in first
    assert "seed = 4  # environment variable RLFLEET_SEED" in first
    assert "flush-bytes = 1048576  # flag" in first
    assert "keepalive-interval = 10.0  # default" in first
    config = tmp_path / "worker.toml"
    config.write_text(first)
    again = printed("worker", "--config", str(config))

    def values(text: str) -> list[str]:
        return [line.split("  #")[0] for line in text.splitlines()]

    assert values(again) == values(first)
    assert "seed = 4  # config file" in again


def test_print_config_hides_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFLEET_WORKER_TOKEN", "s3cret-token-value-0123456789")
    args = parse_args(["worker", "--coordinator", "h:1", "--token", "visible-token-0123456789"])
    from rlfleet.cli._parser import print_config

    text = print_config(subcommands(build_parser({}))["worker"], args)
    assert "visible-token" not in text and "s3cret" not in text
    assert "# token: secret, set (hidden)" in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("65536", 65536),
        ("64KiB", 65536),
        ("1GiB", 1 << 30),
        ("1.5 gib", 3 << 29),
        ("100MB", 100_000_000),
        ("2k", 2000),
    ],
)
def test_sizes_take_units(text: str, expected: int) -> None:
    assert byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "1 GB/s", "-1", "0", "1XB", "GiB"])
def test_a_bad_size_says_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"size|at least 1 byte"):
        byte_size(text)


def test_the_cli_defaults_are_the_library_defaults() -> None:
    coordinator = build_parser({}).parse_args(["coordinator"])
    library = CoordinatorConfig()
    for flag, field in {
        "max_message_bytes": "max_message_bytes",
        "max_result_bytes": "max_result_bytes",
        "max_queued_requests": "max_queued_requests",
        "max_subscribers": "max_subscribers",
        "max_learner_calls": "max_learner_calls",
        "max_buffered_steps": "max_buffered_steps",
        "prefetch_factor": "prefetch_factor",
        "capacity_steps": "capacity_steps",
        "max_workers": "max_workers",
        "keepalive_interval": "keepalive_seconds",
        "handshake_timeout": "handshake_timeout_seconds",
    }.items():
        assert getattr(coordinator, flag) == getattr(library, field), flag
    worker = build_parser({}).parse_args(["worker", "--coordinator", "h:1"])
    defaults = WorkerConfig("h:1")
    for name in ("flush_steps", "flush_bytes", "flush_seconds", "keepalive_interval"):
        assert getattr(worker, name) == getattr(defaults, name), name


def test_a_misspelt_variable_is_reported_not_ignored() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ROOT,
            "RLFLEET_MAX_WROKERS": "3",
            "RLFLEET_SOME_OTHER_TOOL": "x",  # not near any option: not ours to judge
        },
    )
    assert (
        "RLFLEET_MAX_WROKERS is set, but no rlfleet option reads it: did you mean "
        "RLFLEET_MAX_WORKERS?" in result.stderr
    )
    assert "RLFLEET_SOME_OTHER_TOOL" not in result.stderr


def test_a_message_size_beyond_grpcs_limit_is_refused_when_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # From a flag: argparse's error, before anything is printed or served.
    with pytest.raises(SystemExit) as exited:
        parse_args(["coordinator", "--max-message-bytes", "3GiB", "--print-config"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "argument --max-message-bytes: must be at most 2147483647 bytes" in captured.err
    assert "the largest message gRPC can carry" in captured.err
    # From a variable or a file: the error names it.
    monkeypatch.setenv("RLFLEET_MAX_MESSAGE_BYTES", "3GiB")
    with pytest.raises(ConfigError, match=r"RLFLEET_MAX_MESSAGE_BYTES='3GiB' is invalid \(must be"):
        parse_args(["coordinator"])
    monkeypatch.delenv("RLFLEET_MAX_MESSAGE_BYTES")
    config = tmp_path / "big.toml"
    config.write_text('max-message-bytes = "3GiB"\n')
    with pytest.raises(ConfigError, match=r"key 'max-message-bytes'='3GiB' is invalid"):
        parse_args(["coordinator", "--config", str(config)])


def test_print_config_labels_a_switch_by_where_it_was_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RLFLEET_ALLOW_PICKLE", "1")
    parse_args(["worker", "--print-config"])
    assert (
        "allow-pickle = true  # environment variable RLFLEET_ALLOW_PICKLE"
        in capsys.readouterr().out
    )
    monkeypatch.delenv("RLFLEET_ALLOW_PICKLE")
    config = tmp_path / "worker.toml"
    config.write_text("allow-pickle = true\n")
    parse_args(["worker", "--config", str(config), "--print-config"])
    assert f"allow-pickle = true  # config file {config} key 'allow-pickle'" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["health", "--timeout", "inf"],
        ["status", "--timeout", "inf"],
        ["coordinator", "--heartbeat-timeout", "inf"],
        ["conformance", "--timeout", "nan"],
    ],
)
def test_seconds_are_finite_positive_numbers_in_every_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(argv)
    assert "must be a finite number" in capsys.readouterr().err


def test_a_model_built_in_python_reads_the_variables_the_cli_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlfleet.cli.worker import WorkerSettings

    environ = {
        "RLFLEET_ENVS_PER_WORKER": "3",
        "RLFLEET_IMPORT": "a.b,c",
        "RLFLEET_FLUSH_BYTES": "1MiB",
        "RLFLEET_NONFINITE": "flag",
        "RLFLEET_ALLOW_PICKLE": "yes",
        "RLFLEET_WORKER_NAME": "pod-1",
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    cli = build_parser(environ).parse_args(["worker"])
    model = WorkerSettings()  # pydantic-settings reads os.environ
    for name in WorkerSettings.model_fields:
        if name != "token":  # a token's variable is read by the command, not as its flag
            assert getattr(model, name) == getattr(cli, name), name
    assert (model.envs, model.imports, model.flush_bytes) == (3, ["a.b", "c"], 1 << 20)


def test_the_bench_backends_are_the_native_vectorizations() -> None:
    import typing

    from rlfleet.cli.bench import BenchSettings
    from rlfleet.envs.native import NATIVE_VECTORIZATIONS

    annotation = BenchSettings.model_fields["native"].annotation
    (backends,) = [typing.get_args(a) for a in typing.get_args(annotation) if a is not type(None)]
    assert set(backends) == set(NATIVE_VECTORIZATIONS)


def test_the_settings_table_in_the_docs_is_the_models() -> None:
    from rlfleet.cli import settings_reference

    table = settings_reference()
    assert table in (Path(ROOT) / "docs" / "operations.md").read_text(), (
        "docs/operations.md's settings table is out of date; paste the output of "
        "python -c 'from rlfleet.cli import settings_reference; print(settings_reference())'"
    )


def test_an_internal_option_is_a_flag_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rlfleet process passing another a setting: no variable, no file key, not shown."""
    from rlfleet.cli._parser import SettingsParser, add_command, print_config
    from rlfleet.cli._settings import ConfigOptions, NonNegativeInt, option

    class Tool(ConfigOptions):
        handle: NonNegativeInt | None = option(None, "a descriptor", internal=True)
        level: int = option(1, "a public option")

    def build() -> argparse.ArgumentParser:
        root = SettingsParser(prog="rlfleet")
        parser = add_command(root.add_subparsers(), "tool", Tool, lambda args: 0)
        parser.environ = {"RLFLEET_HANDLE": "5"}  # type: ignore[attr-defined]
        parser.commands = ("tool",)  # type: ignore[attr-defined]
        return root

    assert build().parse_args(["tool"]).handle is None  # the variable is not read
    args = build().parse_args(["tool", "--handle", "3"])
    assert args.handle == 3
    sub = subcommands(build())["tool"]
    assert [variable_of(a) for a in options(sub)] == ["RLFLEET_LEVEL", "RLFLEET_CONFIG"]
    sub.print_help()
    assert "--handle" not in capsys.readouterr().out
    assert "handle" not in print_config(sub, args)
    config = tmp_path / "tool.toml"
    config.write_text("handle = 4\n")
    with pytest.raises(ConfigError, match="has no option 'handle'"):
        build().parse_args(["tool", "--config", str(config)])
