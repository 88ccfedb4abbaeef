"""Command-line flags for the security settings, shared by the CLI commands.

``rlfleet coordinator`` calls :func:`add_server_flags` and
:func:`server_security_from_args`; ``rlfleet worker`` calls
:func:`add_client_flags` and :func:`worker_security_from_args`;
``rlfleet sample`` and ``status`` call :func:`add_client_flags` and
:func:`learner_options_from_args`.
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

from rlfleet.cli._env import env_option, read_elsewhere
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


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the coordinator's TLS, token and pickle flags."""
    group = parser.add_argument_group(_GROUP)
    _path(group, "--tls-cert", "RLFLEET_TLS_CERT", "PEM certificate chain to serve TLS with")
    _path(group, "--tls-key", "RLFLEET_TLS_KEY", "PEM private key of --tls-cert")
    _path(
        group,
        "--tls-client-ca",
        "RLFLEET_TLS_CLIENT_CA",
        "PEM CA bundle: require client certificates signed by it (mutual TLS)",
    )
    _token_flags(group, COORDINATOR_WORKER_TOKEN, "the token workers must present")
    _token_flags(group, COORDINATOR_LEARNER_TOKEN, "the token learners must present")
    _allow_pickle(group, "forward pickled policies/env factories to workers that allow them")


def add_client_flags(parser: argparse.ArgumentParser, *, worker: bool) -> None:
    """Adds a worker's or learner's TLS and token flags (and ``--allow-pickle`` for workers)."""
    group = parser.add_argument_group(_GROUP)
    _path(group, "--tls-ca", "RLFLEET_TLS_CA", "PEM CA bundle to verify the coordinator with")
    _path(group, "--tls-cert", "RLFLEET_TLS_CERT", "PEM client certificate (mutual TLS)")
    _path(group, "--tls-key", "RLFLEET_TLS_KEY", "PEM private key of --tls-cert")
    group.add_argument(
        "--tls-server-name",
        default=None,
        metavar="NAME",
        help="check the coordinator's certificate against NAME instead of the dialled host",
    )
    setting = WORKER_TOKEN if worker else CLIENT_TOKEN
    _token_flags(group, setting, "the token to present to the coordinator")
    if worker:
        _allow_pickle(
            group, "accept pickled policies/env factories (runs code sent by the learner)"
        )


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


def _path(group: argparse._ArgumentGroup, flag: str, variable: str, help: str) -> None:
    group.add_argument(flag, metavar="PATH", **env_option(variable, default=None, help=help))


def _token_flags(group: argparse._ArgumentGroup, setting: TokenSetting, what: str) -> None:
    variables = " or ".join(setting.env_vars)
    token = group.add_argument(
        setting.flag,
        default=None,
        metavar="TOKEN",
        help=f"{what} (visible in the process list: prefer {setting.file_flag} or {variables})",
    )
    read_elsewhere(token, setting.env_vars[0])  # load_token reads it, never as a flag
    group.add_argument(
        setting.file_flag,
        default=None,
        metavar="PATH",
        help=f"file holding {what} (if unset: the token in {variables})",
    )


def _allow_pickle(group: argparse._ArgumentGroup, help: str) -> None:
    group.add_argument(
        pickle_gate.FLAG,
        action="store_true",
        help=f"{help}; needs TLS and tokens, and cloudpickle installed",
    )
