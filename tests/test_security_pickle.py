"""The pickle gate: refused by default, opt-in only with TLS and tokens on both ends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlfleet.errors import ConfigError, PermissionDeniedError, PolicyError
from rlfleet.security import (
    PICKLE_CAPABILITY,
    PickleGate,
    RoleTokens,
    ServerSecurity,
    ServerTLS,
    Token,
)
from rlfleet.security import pickle as pickle_gate
from tests.tls_fixtures import make_ca, make_cert

TOKENS = RoleTokens(Token("w" * 8 + "0123456789ab"), Token("l" * 8 + "0123456789ab"))


def test_refused_by_default_on_both_sides() -> None:
    for process in ("coordinator", "worker"):
        gate = PickleGate(process=process)
        assert gate.capabilities == ()
        with pytest.raises(PermissionDeniedError, match=rf"not accepted by this {process}"):
            gate.check("AgentUpdate.pickled_policy")
        with pytest.raises(PermissionDeniedError, match="--allow-pickle"):
            gate.loads(b"\x80\x04K\x01.", "EnvUpdate.pickled_env_factory", ConfigError)


@pytest.mark.parametrize(
    ("tls", "authenticated", "missing"),
    [
        (False, False, "without TLS and a token"),
        (True, False, "without a token"),
        (False, True, "without TLS:"),
    ],
)
def test_allow_pickle_needs_tls_and_a_token(tls: bool, authenticated: bool, missing: str) -> None:
    with pytest.raises(ConfigError, match=f"started with --allow-pickle but {missing}"):
        pickle_gate.check_prerequisites(
            True, tls=tls, authenticated=authenticated, process="worker"
        )
    pickle_gate.check_prerequisites(False, tls=tls, authenticated=authenticated, process="worker")


def test_server_security_refuses_pickle_without_tls(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="coordinator was started with --allow-pickle but without TLS and a token"
    ):
        ServerSecurity(allow_pickle=True)
    with pytest.raises(ConfigError, match="without TLS:"):
        ServerSecurity(tokens=TOKENS, allow_pickle=True)
    ca = make_ca()
    cert, key = make_cert(ca, "coordinator").write(tmp_path, "server")
    security = ServerSecurity(tls=ServerTLS.from_files(cert, key), tokens=TOKENS, allow_pickle=True)
    assert security.pickle.allowed
    assert security.pickle.capabilities == (PICKLE_CAPABILITY,)
    assert not ServerSecurity().pickle.allowed


def test_allowed_gate_round_trips_a_closure() -> None:
    offset = 3
    data = pickle_gate.dumps(lambda x: x + offset, "AgentUpdate.pickled_policy")
    gate = PickleGate(allowed=True)
    assert gate.loads(data, "AgentUpdate.pickled_policy", PolicyError)(4) == 7


def test_bytes_that_do_not_unpickle_raise_the_given_error() -> None:
    gate = PickleGate(allowed=True, process="worker")
    with pytest.raises(PolicyError, match=r"AgentUpdate\.pickled_policy does not unpickle here"):
        gate.loads(b"not a pickle", "AgentUpdate.pickled_policy", PolicyError)


def test_coordinator_names_workers_that_would_refuse() -> None:
    gate = PickleGate(allowed=True, process="coordinator")
    gate.check_peers("f", {"w1": [PICKLE_CAPABILITY, "rlfleet.episodes"]})
    with pytest.raises(
        PermissionDeniedError, match=r"workers 'w2', 'w3' were not started with --allow-pickle"
    ):
        gate.check_peers(
            "AgentUpdate.pickled_policy",
            {"w3": ["rlfleet.episodes"], "w1": [PICKLE_CAPABILITY], "w2": []},
        )
    with pytest.raises(PermissionDeniedError, match="not accepted by this coordinator"):
        PickleGate(process="coordinator").check_peers("f", {"w1": [PICKLE_CAPABILITY]})


def test_missing_cloudpickle_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import cloudpickle` raise ImportError: the
    # real import path, as on a host without the package.
    monkeypatch.setitem(sys.modules, "cloudpickle", None)
    with pytest.raises(ConfigError, match="pip install cloudpickle"):
        pickle_gate.cloudpickle_module()
    with pytest.raises(ConfigError, match="pip install cloudpickle"):
        pickle_gate.check_prerequisites(True, tls=True, authenticated=True, process="worker")
    with pytest.raises(ConfigError, match="pip install cloudpickle"):
        pickle_gate.dumps(1, "f")


def test_unpicklable_objects_are_a_config_error() -> None:
    import threading

    with pytest.raises(ConfigError, match="f: cannot pickle"):
        pickle_gate.dumps(threading.Lock(), "f")
