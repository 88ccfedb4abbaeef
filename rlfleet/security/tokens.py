"""Bearer tokens: loading them, refusing weak ones, comparing in constant time.

A token comes from a flag, a file or an environment variable (see
:class:`TokenSetting` for each process's names). The value lives only
inside :class:`Token`, whose ``repr`` and ``str`` are ``Token(****)``, so
that logging a token, a config holding one, or an exception message that
formats one never writes it out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlfleet.errors import ConfigError, WrongTypeError

logger = logging.getLogger("rlfleet.security")

#: Shortest token accepted. 16 random characters are far beyond online
#: guessing; ``openssl rand -hex 32`` (64 characters) is what the docs suggest.
MIN_TOKEN_LENGTH = 16

#: Words of the values shipped in example manifests: a token containing one
#: (case, "-" and "_" ignored) means the operator never made the real secret.
PLACEHOLDER_WORDS = ("changeme", "replaceme")

_MASK = "Token(****)"


class Token:
    """A bearer token whose value is never shown.

    Args:
        value: The token text: printable ASCII without spaces (it travels
            in a gRPC metadata value), at least :data:`MIN_TOKEN_LENGTH`
            characters, not a placeholder such as ``CHANGE-ME``.
        source: Where it came from ("--worker-token-file /run/tok",
            "environment variable RLFLEET_WORKER_TOKEN"), for error messages.

    Raises:
        ConfigError: If the value is a placeholder, too short or has
            characters a metadata value cannot carry. The message names
            ``source``, never the value.
    """

    __slots__ = ("_digest", "_value", "source")

    def __init__(self, value: str, *, source: str = "a token given in code") -> None:
        _check_value(value, source)
        self._value = value
        # Compared by digest so that a comparison takes the same time
        # whatever the presented value's length (compare_digest leaks lengths).
        self._digest = _digest(value)
        self.source = source

    def reveal(self) -> str:
        """The token text, for the one place that sends it (call metadata)."""
        return self._value

    def matches(self, presented: str | bytes) -> bool:
        """Whether ``presented`` is this token, in constant time."""
        return hmac.compare_digest(self._digest, _digest(presented))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Token):
            return NotImplemented
        return hmac.compare_digest(self._digest, other._digest)

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        return _MASK

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        # A pickled config must not carry the secret to another process by accident.
        raise WrongTypeError("a Token cannot be pickled; pass its source (file or env var) instead")


def _digest(value: str | bytes) -> bytes:
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return hashlib.sha256(data).digest()


def _check_value(value: object, source: str) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"the token from {source} must be text, got {type(value).__name__}")
    if not value:
        raise ConfigError(f"the token from {source} is empty; {_HOW_TO_MAKE}")
    if is_placeholder(value):
        raise ConfigError(
            f"the token from {source} is a placeholder such as CHANGE-ME: refusing to start "
            f"with a publicly known token; create the real secret. {_HOW_TO_MAKE}"
        )
    if len(value) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"the token from {source} has {len(value)} characters; at least "
            f"{MIN_TOKEN_LENGTH} are needed. {_HOW_TO_MAKE}"
        )
    if not (value.isascii() and value.isprintable()) or any(c.isspace() for c in value):
        raise ConfigError(
            f"the token from {source} contains spaces or characters other than printable "
            f"ASCII, which gRPC metadata cannot carry. {_HOW_TO_MAKE}"
        )


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is (or contains) a placeholder such as ``CHANGE-ME``."""
    folded = value.lower().replace("-", "").replace("_", "")
    return any(word in folded for word in PLACEHOLDER_WORDS)


_HOW_TO_MAKE = "Make one with `openssl rand -hex 32` (docs/security.md)."


@dataclass(frozen=True)
class TokenSetting:
    """The names under which one process reads one token.

    Attributes:
        flag: The command-line flag with the value (``--worker-token``);
            ``FLAG-file`` is the flag with a file's path.
        env_vars: Environment variables read, first set wins, when
            neither flag is given.
    """

    flag: str
    env_vars: tuple[str, ...]

    @property
    def file_flag(self) -> str:
        """The flag naming a file that holds the token."""
        return f"{self.flag}-file"


#: The coordinator's worker-role token; workers read the same variable.
COORDINATOR_WORKER_TOKEN = TokenSetting("--worker-token", ("RLFLEET_WORKER_TOKEN",))
#: The coordinator's learner-role token.
COORDINATOR_LEARNER_TOKEN = TokenSetting("--learner-token", ("RLFLEET_LEARNER_TOKEN",))
#: What a worker presents.
WORKER_TOKEN = TokenSetting("--token", ("RLFLEET_WORKER_TOKEN",))
#: What a learner (client library, ``rlfleet sample``/``status``) presents.
#: RLFLEET_TOKEN first, so that a shell can point at another fleet without
#: touching the variable a pod's Secret sets.
CLIENT_TOKEN = TokenSetting("--token", ("RLFLEET_TOKEN", "RLFLEET_LEARNER_TOKEN"))


def load_token(
    setting: TokenSetting,
    *,
    value: str | Token | None = None,
    file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Token | None:
    """Reads a token from its flag, its file flag or its environment variables.

    The flag wins over the file, which wins over the environment (as every
    ``RLFLEET_*`` default does). A token on the command line is visible to
    every user of the host (``ps``), so that case logs a warning.

    Args:
        setting: Which flags and variables.
        value: The flag's value (or an already loaded Token).
        file: The file flag's value. Its content is the token; surrounding
            whitespace (the trailing newline of ``echo``) is dropped.
        environ: The environment (default: ``os.environ``).

    Returns:
        The token, or None if none of the sources is set.

    Raises:
        ConfigError: If both flags are given, the file cannot be read, or
            the token is a placeholder, too short or malformed.
    """
    if value is not None and file is not None:
        raise ConfigError(f"{setting.flag} and {setting.file_flag} are both given; pass only one")
    if isinstance(value, Token):
        return value
    if value is not None:
        logger.warning(
            "the token was given with %s, which other users of this host can read in the "
            "process list; prefer %s or the environment variable %s",
            setting.flag,
            setting.file_flag,
            setting.env_vars[0],
        )
        return Token(value, source=setting.flag)
    if file is not None:
        return read_token_file(file, flag=setting.file_flag)
    environ = os.environ if environ is None else environ
    for name in setting.env_vars:
        text = environ.get(name)
        if text is not None and text.strip():
            return Token(text.strip(), source=f"environment variable {name}")
    return None


def read_token_file(path: str | os.PathLike[str], *, flag: str = "the token file") -> Token:
    """Reads a token from a file (a mounted Kubernetes Secret, a file made by ``openssl``).

    Raises:
        ConfigError: If the file is missing or unreadable, or holds no valid token.
    """
    source = f"{flag} {os.fspath(path)}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file; check the path or the Secret mount") from None
    except PermissionError:
        raise ConfigError(
            f"{source}: permission denied for uid {os.getuid()}; make the file readable by "
            "the user rlfleet runs as"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a directory; give the file inside it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read it ({type(exc).__name__})") from None
    return Token(text.strip(), source=source)
