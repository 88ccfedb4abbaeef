"""Whether the Node.js tests can run here, in one place.

A test that runs ``node`` (the Node client and worker in clients/node) calls
:func:`require_node`, or a module of them uses the autouse fixture
:func:`node_present`. Without ``node`` or ``clients/node/node_modules`` the
test is skipped with the reason in pytest's summary; under ``CI=true`` (as
``.ci/run`` sets, having installed both) it fails instead, so CI never
passes with the Node tests silently left out (README.md, "Quick start").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent.parent / "clients" / "node"
#: The ``node`` executable, or None when it is not on PATH.
NODE = shutil.which("node")
#: The Node worker's entry point.
NODE_WORKER = NODE_DIR / "bin" / "rlfleet-node-worker.js"


def missing_node() -> str | None:
    """Why the Node tests cannot run here, or None."""
    if NODE is None:
        return "node is not installed (Node.js >= 20 runs clients/node)"
    if not (NODE_DIR / "node_modules").is_dir():
        return "clients/node/node_modules is missing: run `cd clients/node && npm ci`"
    return None


def node_required() -> bool:
    """Whether a missing Node fails the tests (``CI`` is set to a true value)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_node() -> str:
    """The ``node`` executable; skips the calling test without it, or fails it under CI=true.

    Returns:
        The path of ``node``.
    """
    missing = missing_node()
    if missing is not None:
        if node_required():
            pytest.fail(f"CI=true but {missing}")
        pytest.skip(f"{missing} (set CI=true to make this a failure)")
    assert NODE is not None  # missing_node() checked it
    return NODE


@pytest.fixture(autouse=True, scope="module")
def node_present() -> str:
    """:func:`require_node` for every test of a module that imports this fixture."""
    return require_node()
