"""Command-line flags for the security settings, shared by the CLI commands.

The options are settings models that the commands' models extend:
``rlfleet coordinator`` has :class:`ServerSecurityOptions` and calls
:func:`server_security_from_args`; ``rlfleet worker`` has
:class:`WorkerSecurityOptions` and calls :func:`worker_security_from_args`;
``rlfleet sample`` and ``status`` have :class:`LearnerSecurityOptions` and
call :func:`learner_options_from_args`.
Certificate paths may come from ``RLFLEET_TLS_*`` variables (ConfigMaps);
tokens from their own variables (Secrets), read by
:func:`~rlfleet.security.tokens.load_token` and never shown in ``--help``.
The ``*_from_args`` functions register the tokens they load with the log
redactor. Building the flags loads no gRPC (every CLI command builds every
parser).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlfleet.cli._parser import add_arguments
from rlfleet.cli._settings import CommandSettings, option
from rlfleet.errors import ConfigError
from rlfleet.security import pickle as pickle_gate
from rlfleet.security.redact import install_redaction
from rlfleet.security.tokens import (
    CLIENT_TOKEN,
    COORDINATOR_LEARNER_TOKEN,
    COORDINATOR_WORKER_TOKEN,
    WORKER_TOKEN,
    Token,
    TokenSetting,
    load_token,
)

if TYPE_CHECKING:
    from rlfleet.security.settings import ClientSecurity, ServerSecurity

_GROUP = "security (docs/security.md)"


def _token_help(setting: TokenSetting, what: str) -> str:
    variables = " or ".join(setting.env_vars)
    return f"{what} (visible in the process list: prefer {setting.file_flag} or {variables})"


def _token_file_help(setting: TokenSetting, what: str) -> str:
    return f"file holding {what} (if unset: the token in {' or '.join(setting.env_vars)})"


_PICKLE_NEEDS = "; needs TLS and tokens, and cloudpickle installed"
_WORKERS_TOKEN = "the token workers must present"
_LEARNERS_TOKEN = "the token learners must present"
_PRESENTED = "the token to present to the coordinator"


class ServerSecurityOptions(CommandSettings):
    """The coordinator's TLS, token and pickle options."""

    tls_cert: str | None = option(
        None, "PEM certificate chain to serve TLS with", metavar="PATH", group=_GROUP
    )
    tls_key: str | None = option(
        None, "PEM private key of --tls-cert", metavar="PATH", group=_GROUP
    )
    tls_client_ca: str | None = option(
        None,
        "PEM CA bundle: require client certificates signed by it (mutual TLS)",
        metavar="PATH",
        group=_GROUP,
    )
    worker_token: str | None = option(
        None,
        _token_help(COORDINATOR_WORKER_TOKEN, _WORKERS_TOKEN),
        env=COORDINATOR_WORKER_TOKEN.env_vars[0],
        metavar="TOKEN",
        group=_GROUP,
        secret=True,
    )
    worker_token_file: str | None = option(
        None,
        _token_file_help(COORDINATOR_WORKER_TOKEN, _WORKERS_TOKEN),
        metavar="PATH",
        group=_GROUP,
    )
    learner_token: str | None = option(
        None,
        _token_help(COORDINATOR_LEARNER_TOKEN, _LEARNERS_TOKEN),
        env=COORDINATOR_LEARNER_TOKEN.env_vars[0],
        metavar="TOKEN",
        group=_GROUP,
        secret=True,
    )
    learner_token_file: str | None = option(
        None,
        _token_file_help(COORDINATOR_LEARNER_TOKEN, _LEARNERS_TOKEN),
        metavar="PATH",
        group=_GROUP,
    )
    allow_pickle: bool = option(
        False,
        "forward pickled policies/env factories to workers that allow them" + _PICKLE_NEEDS,
        group=_GROUP,
    )


class _ClientTLSOptions(CommandSettings):
    tls_ca: str | None = option(
        None, "PEM CA bundle to verify the coordinator with", metavar="PATH", group=_GROUP
    )
    tls_cert: str | None = option(
        None, "PEM client certificate (mutual TLS)", metavar="PATH", group=_GROUP
    )
    tls_key: str | None = option(
        None, "PEM private key of --tls-cert", metavar="PATH", group=_GROUP
    )
    tls_server_name: str | None = option(
        None,
        "check the coordinator's certificate against NAME instead of the dialled host",
        metavar="NAME",
        group=_GROUP,
    )


class LearnerSecurityOptions(_ClientTLSOptions):
    """A learner command's TLS and token options (``rlfleet sample``, ``status``)."""

    token: str | None = option(
        None,
        _token_help(CLIENT_TOKEN, _PRESENTED),
        env=CLIENT_TOKEN.env_vars[0],
        metavar="TOKEN",
        group=_GROUP,
        secret=True,
    )
    token_file: str | None = option(
        None, _token_file_help(CLIENT_TOKEN, _PRESENTED), metavar="PATH", group=_GROUP
    )


class WorkerSecurityOptions(_ClientTLSOptions):
    """A worker's TLS, token and pickle options."""

    token: str | None = option(
        None,
        _token_help(WORKER_TOKEN, _PRESENTED),
        env=WORKER_TOKEN.env_vars[0],
        metavar="TOKEN",
        group=_GROUP,
        secret=True,
    )
    token_file: str | None = option(
        None, _token_file_help(WORKER_TOKEN, _PRESENTED), metavar="PATH", group=_GROUP
    )
    allow_pickle: bool = option(
        False,
        "accept pickled policies/env factories (runs code sent by the learner)" + _PICKLE_NEEDS,
        group=_GROUP,
    )


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the coordinator's TLS, token and pickle flags."""
    add_arguments(parser, ServerSecurityOptions)


def add_client_flags(parser: argparse.ArgumentParser, *, worker: bool) -> None:
    """Adds a worker's or learner's TLS and token flags (and ``--allow-pickle`` for workers)."""
    add_arguments(parser, WorkerSecurityOptions if worker else LearnerSecurityOptions)


def server_security_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> ServerSecurity:
    """The coordinator's ServerSecurity from its flags and environment.

    Raises:
        ConfigError: For unusable files or tokens, or an unsafe combination.
    """
    # Imported here: building the parser must not load gRPC.
    from rlfleet.security.auth import RoleTokens
    from rlfleet.security.settings import ServerSecurity
    from rlfleet.security.tls import ServerTLS

    tls = None
    if args.tls_cert is not None or args.tls_key is not None:
        if args.tls_cert is None or args.tls_key is None:
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        tls = ServerTLS.from_files(args.tls_cert, args.tls_key, args.tls_client_ca)
    elif args.tls_client_ca is not None:
        raise ConfigError(
            "--tls-client-ca (mutual TLS) needs the server's own --tls-cert and --tls-key"
        )
    tokens = RoleTokens.of(
        _load(args, COORDINATOR_WORKER_TOKEN, environ),
        _load(args, COORDINATOR_LEARNER_TOKEN, environ),
    )
    security = ServerSecurity(tls=tls, tokens=tokens, allow_pickle=args.allow_pickle)
    install_redaction(security.tokens_to_redact())
    return security


def worker_security_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> ClientSecurity:
    """A worker's ClientSecurity from its flags and environment.

    Raises:
        ConfigError: For unusable files or tokens, or ``--allow-pickle``
            without TLS and a token.
    """
    from rlfleet.security.settings import ClientSecurity
    from rlfleet.security.tls import ClientTLS

    tls = None
    if any(value is not None for value in _tls_values(args)):
        tls = ClientTLS.from_files(
            args.tls_ca, args.tls_cert, args.tls_key, server_name=args.tls_server_name
        )
    security = ClientSecurity(tls=tls, token=_load(args, WORKER_TOKEN, environ))
    pickle_gate.check_prerequisites(
        args.allow_pickle,
        tls=tls is not None,
        authenticated=security.token is not None,
        process="worker",
    )
    install_redaction(security.tokens_to_redact())
    return security


def learner_options_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``RemoteSampler`` keyword arguments from a learner command's flags.

    The token is loaded here (flag, file, or ``RLFLEET_TOKEN`` /
    ``RLFLEET_LEARNER_TOKEN``); the sampler checks the TLS files.

    Raises:
        ConfigError: For an unusable token or token file.
    """
    token = _load(args, CLIENT_TOKEN, environ)
    if token is not None:
        install_redaction([token])
    tls_ca, tls_cert, tls_key, tls_server_name = _tls_values(args)
    return {
        "tls_ca": tls_ca,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "tls_server_name": tls_server_name,
        "token": token,
    }


def _tls_values(args: argparse.Namespace) -> tuple[str | None, str | None, str | None, str | None]:
    return args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _load(
    args: argparse.Namespace, setting: TokenSetting, environ: Mapping[str, str] | None
) -> Token | None:
    return load_token(
        setting,
        value=getattr(args, _dest(setting.flag)),
        file=getattr(args, _dest(setting.file_flag)),
        environ=os.environ if environ is None else environ,
    )
