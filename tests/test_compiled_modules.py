"""rlfleet's C modules: a checkout that never compiled one says which and how to build it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "importer", "what"),
    [
        ("rlfleet.policies._mlp_kernel", "rlfleet.policies.mlp", "MLP kernel"),
        ("rlfleet.wire._result_reader", "rlfleet.wire.result_message", "result reader"),
        ("rlfleet.wire._result_check", "rlfleet.wire.result_layout", "one-pass result check"),
        ("rlfleet.wire._gather", "rlfleet.wire.placement", "gather"),
        ("rlfleet.scheduling._unit_book", "rlfleet.scheduling.task_units", "unit booking"),
        ("rlfleet.scheduling._unit_book", "rlfleet.scheduling.units", "unit booking"),
        ("rlfleet.scheduling._deal", "rlfleet.scheduling.units", "refill dealing"),
        ("rlfleet.wire._view_check", "rlfleet.wire.result_views", "view check"),
        ("rlfleet.wire._skeleton", "rlfleet.wire.result_layout", "skeleton builder"),
        ("rlfleet.core._seed_hash", "rlfleet.core.seeding", "seed hash"),
        ("rlfleet.worker._finished_pass", "rlfleet.worker.vec", "finished-episodes pass"),
    ],
)
def test_a_checkout_without_a_compiled_module_says_how_to_build_it(
    module: str, importer: str, what: str
) -> None:
    # None in sys.modules makes the import fail as a module never built does.
    code = f"import sys; sys.modules[{module!r}] = None; import {importer}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    source = module.replace(".", "/") + ".c"
    assert f"NotInstalledError: rlfleet's compiled {what} ({source}) is not built" in result.stderr
    assert "build_ext --inplace" in result.stderr
