"""The Node worker's golden MLP vectors are the reference's, and cover its edge cases.

clients/node/test/golden.test.js checks the Node arithmetic against
clients/node/test/fixtures/mlp-golden.json bit for bit; these tests make sure
that file is what tests/node_mlp_golden.py computes from tests/mlp_reference.py
today, and that it reaches the paths it exists for.
"""

from __future__ import annotations

import json

import numpy as np

from tests import mlp_reference as ref
from tests import node_mlp_golden as golden


def test_fixture_is_what_the_generator_writes_now() -> None:
    assert golden.FIXTURE.read_text() == golden.golden_text(), (
        "clients/node/test/fixtures/mlp-golden.json is stale: run "
        "`python -m tests.node_mlp_golden` and commit the result"
    )


def float32s(hex_values: list[str]) -> np.ndarray:
    return np.array([int(h, 16) for h in hex_values], np.uint32).view(np.float32)


def test_fixture_reaches_the_edge_cases() -> None:
    fixture = json.loads(golden.FIXTURE.read_text())
    functions = fixture["functions"]

    tanh_in = float32s([x for x, _ in functions["tanh32"]])
    assert ((tanh_in != 0) & (np.abs(tanh_in) < ref.TANH_TINY)).any()
    assert (tanh_in > ref.TANH_CLAMP).any() and (tanh_in < -ref.TANH_CLAMP).any()
    exp_in = float32s([x for x, _ in functions["exp32"]])
    exp_out = float32s([y for _, y in functions["exp32"]])
    tiny_normal = np.finfo(np.float32).tiny
    assert ((exp_out > 0) & (exp_out < tiny_normal)).any()  # subnormal results
    assert ((exp_out == 0) & np.isfinite(exp_in)).any()  # underflow
    assert np.isinf(exp_out).any()

    networks = fixture["networks"]
    assert {n["activation"] for n in networks} == {"tanh", "relu", "identity"}
    assert {n["deterministic"] for n in networks} == {True, False}
    widths = {w for n in networks for w in n["hidden_sizes"]}
    assert [] in [n["hidden_sizes"] for n in networks] and any(w % 4 for w in widths)
    logits = np.concatenate([float32s(row) for n in networks for row in n["logits"]])
    assert np.abs(logits).max() > 1e4

    # The categorical probes: zero and subnormal weights, and t = u * Z >= Z
    # (no c[i] > t), where the index is the last one of positive weight.
    fallbacks = 0
    for row, u in golden.PROBE_ROWS:
        logits32 = np.array(row, np.float32)
        with np.errstate(over="ignore"):
            weights = [ref.exp32(v - logits32.max()) for v in logits32]
        total = sum(float(w) for w in weights)
        fallbacks += u * total >= total
    assert fallbacks >= 2
    probe_logits = np.array([row for row, _ in golden.PROBE_ROWS], np.float32)
    with np.errstate(over="ignore"):
        probe_weights = np.array(
            [[ref.exp32(v - r.max()) for v in r] for r in probe_logits], np.float32
        )
    assert (probe_weights == 0).any()
    assert ((probe_weights > 0) & (probe_weights < tiny_normal)).any()
    assert golden.LARGEST_DRAW in [u for _, u in golden.PROBE_ROWS]
