"""Writes the Node worker's golden vectors of the built-in MLP arithmetic.

``python -m tests.node_mlp_golden`` (from the repository root) computes, with
tests/mlp_reference.py, the contract's tanh, relu, exp and log on chosen and
random inputs, and ``mlp-categorical`` networks end to end (logits, actions,
log-probabilities), and writes them to clients/node/test/fixtures/mlp-golden.json,
which `npm test` checks bit for bit (clients/node/test/golden.test.js).
tests/test_node_mlp_golden.py fails when the committed file is not what this
script writes now, so the fixture follows the reference.

Every float travels as its IEEE bit pattern in hex (8 digits for float32, 16
for float64), so -0.0, infinities and subnormals are exact on both sides.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from tests import mlp_reference as ref

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "clients" / "node" / "test" / "fixtures" / "mlp-golden.json"
F32 = np.float32
#: The largest value numpy's ``Generator.random()`` returns: 1 - 2**-53.
LARGEST_DRAW = 1.0 - 2.0**-53


def bits32(values: Any) -> list[str]:
    """float32 bit patterns, 8 hex digits each."""
    return [f"{int(v):08x}" for v in np.asarray(values, dtype=F32).reshape(-1).view(np.uint32)]


def bits64(values: Any) -> list[str]:
    """float64 bit patterns, 16 hex digits each."""
    patterns = np.asarray(values, dtype=np.float64).reshape(-1).view(np.uint64)
    return [f"{int(v):016x}" for v in patterns]


def next32(x: float, toward: float) -> float:
    """The float32 neighbour of float32 ``x`` toward ``toward``."""
    return float(np.nextafter(F32(x), F32(toward)))


def functions() -> dict[str, list[list[str]]]:
    """[input, output] bit pairs for each elementwise function."""
    rng = np.random.default_rng(20240601)
    signs = rng.choice([-1.0, 1.0], 40)
    clamp, tiny = float(ref.TANH_CLAMP), float(ref.TANH_TINY)
    tanh_in = [
        *(0.0, -0.0, 1e-45, -1e-30, 1e-5, -3.9e-4),  # |x| < 0.0004: x itself
        *(tiny, -tiny, next32(tiny, 0.0), next32(tiny, 1.0), 1e-3),  # around 0.0004
        *(0.1, -0.5, 1.0, 2.0, -3.0, 5.0, 7.9),
        *(clamp, -clamp, next32(clamp, math.inf), 8.0, -9.0, 20.0),  # around the clamp
        *(3.4e38, -3.4e38, math.inf, -math.inf),
        *(signs * 10.0 ** rng.uniform(-5.0, 1.2, 40)),
    ]
    relu_in = [0.0, -0.0, 1e-45, -1e-45, 2.5, -2.5, 3.4e38, -3.4e38, math.inf, -math.inf]
    lo, hi = float(ref.EXP_LO), float(ref.EXP_HI)
    exp_in = [
        *(0.0, -0.0, 1e-8, -1e-8, -0.3465736, -0.5, -1.0, -10.0),  # -0.3465736: n = 0 or -1
        *(-87.33, -87.34, -88.0, -95.0, -100.0, -103.0),  # normal, then subnormal results
        *(lo, next32(lo, 0.0), next32(lo, -math.inf), -104.0, -1e4, -math.inf),  # around 0
        *(1.0, 10.0, 88.0, hi, next32(hi, math.inf), 100.0, math.inf),  # up to +inf
        *rng.uniform(-106.0, 90.0, 60),
    ]
    half = ref.LOG_SQRT_HALF
    log_in = [
        *(1.0, np.nextafter(1.0, 2.0), 1.5, 2.0, 3.0, 4.0, 10.0, 1000.0, 2.0**52 + 1.0, 1e300),
        *(2 * half, np.nextafter(2 * half, 0.0), np.nextafter(2 * half, 2.0)),  # m's fold
        *10.0 ** rng.uniform(0.0, 4.0, 40),
    ]
    out: dict[str, list[list[str]]] = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for name, fn, inputs in (
            ("tanh32", ref.tanh32, tanh_in),
            ("relu32", ref.relu32, relu_in),
            ("exp32", ref.exp32, exp_in),
        ):
            x = np.asarray(inputs, dtype=F32)
            y = [fn(v) for v in x]
            out[name] = [list(pair) for pair in zip(bits32(x), bits32(y), strict=True)]
    z = np.asarray(log_in, dtype=np.float64)
    out["log64"] = [
        list(pair) for pair in zip(bits64(z), bits64([ref.log64(float(v)) for v in z]), strict=True)
    ]
    return out


def network(
    name: str,
    *,
    activation: str,
    layers: list[tuple[np.ndarray, np.ndarray]],
    observations: np.ndarray,
    draws: list[float] | None,
) -> dict[str, Any]:
    """One ``mlp-categorical`` case: inputs and the reference's outputs."""
    layers = [(np.asarray(w, F32), np.asarray(b, F32)) for w, b in layers]
    obs = np.asarray(observations, dtype=F32)
    with np.errstate(over="ignore"):
        logits = ref.forward32(obs, layers, activation)
        rows = [
            ref.categorical_row(row, None if draws is None else draws[i])
            for i, row in enumerate(logits)
        ]
    params: dict[str, Any] = {}
    for i, (w, b) in enumerate(layers):
        params[f"layers.{i}.weight"] = {"shape": list(w.shape), "data": bits32(w)}
        params[f"layers.{i}.bias"] = {"shape": list(b.shape), "data": bits32(b)}
    return {
        "name": name,
        "activation": activation,
        "hidden_sizes": [w.shape[1] for w, _ in layers[:-1]],
        "deterministic": draws is None,
        "params": params,
        "observations": [bits32(row) for row in obs],
        "u": None if draws is None else bits64(draws),
        "logits": [bits32(row) for row in logits],
        "actions": [index for index, _ in rows],
        "log_prob": bits32([log_prob for _, log_prob in rows]),
    }


def random_layers(
    rng: np.random.Generator, sizes: list[int], scale: float
) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (rng.normal(0.0, scale, (m, n)), rng.normal(0.0, 0.5, n))
        for m, n in itertools.pairwise(sizes)
    ]


def identity_layers(width: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` identity layers: the logits are act(obs), exactly."""
    return [(np.eye(width), np.zeros(width))] * count


#: Rows of logits for the categorical probes (6 actions) and each row's draw.
PROBE_ROWS: list[tuple[list[float], float]] = [
    ([0.0, -88.0, -95.0, -103.9, -104.5, -1e4], 0.999),  # subnormal and zero weights
    ([3e38, -3e38, 1.0, 0.0, 2.5e38, -1.0], 0.9),  # l - max overflows to -inf
    ([1e4, 1e4, -1e4, 9990.0, 0.0, 1e4], 0.7),  # large logits, ties
    ([-200.0, 0.0, -200.0, 0.0, -200.0, -200.0], 0.0),  # u = 0 skips a zero weight
    ([0.0, 0.0, -1.0, -300.0, -300.0, -300.0], LARGEST_DRAW),  # the last positive weight
    ([0.0, 0.0, -1.0, -300.0, -300.0, -300.0], 1.0),  # t = Z: the fallback
    ([0.5, 1.5, 2.5, -0.5, 0.25, 3.0], 1.0),  # the fallback, every weight positive
    ([5.0, -1000.0, -1000.0, -1000.0, -1000.0, -1000.0], 0.5),  # Z = 1: log_prob 0
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 0.5),  # t = c[2] exactly: index 3
    ([-0.0, 0.0, -5.0, 1e-3, -0.0, 1e-3], 0.2),  # signed zeros, first maximum
]
#: Rows of hidden pre-activations for the activation probes (8 units).
ACTIVATION_ROWS = [
    [1e-5, -3.9e-4, 4e-4, -4e-4, 7.9, 7.91, -8.0, 100.0],
    [0.0, -0.0, 1e-30, -1e-30, 0.25, -0.25, 3.0, -3.0],
    [-1e-3, 1e-3, 0.5, 1.0, -2.0, 5.0, -7.905, 3e38],
]


#: Networks of random weights: name, activation, sizes D..O, weight scale,
#: rows (observations ~ N(0, 2)), sampled (else deterministic).
RANDOM_NETWORKS = [
    ("tanh 6-7-5-3", "tanh", [6, 7, 5, 3], 0.9, 10, True),
    ("relu 5-9-4", "relu", [5, 9, 4], 0.8, 10, True),
    ("identity 3-6-5, deterministic", "identity", [3, 6, 5], 1.0, 8, False),
    ("no hidden layer 3-5", "tanh", [3, 5], 1.0, 8, True),
    ("CartPole-sized tanh 4-33-17-2, saturating", "tanh", [4, 33, 17, 2], 1.5, 8, True),
]


def networks() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)

    def draws(n: int) -> list[float]:
        # Each row's u as a Python worker draws it: default_rng(policy_seed).random().
        return [float(np.random.default_rng(s).random()) for s in rng.integers(0, 2**32, n)]

    cases = [
        network(
            name,
            activation=activation,
            layers=random_layers(rng, sizes, scale),
            observations=rng.normal(0.0, 2.0, (rows, sizes[0])),
            draws=draws(rows) if sampled else None,
        )
        for name, activation, sizes, scale, rows, sampled in RANDOM_NETWORKS
    ]
    # Identity weights, so the logits are act(observations) exactly.
    probe_obs = np.array([row for row, _ in PROBE_ROWS])
    probe_draws = [u for _, u in PROBE_ROWS]
    act_obs = np.array(ACTIVATION_ROWS)
    for name, activation, width, count, observations, row_draws in (
        ("categorical probes", "identity", 6, 1, probe_obs, probe_draws),
        ("categorical probes, deterministic", "identity", 6, 1, probe_obs, None),
        ("tanh probes", "tanh", 8, 2, act_obs, [0.1, 0.5, 0.9]),
        ("relu probes, deterministic", "relu", 8, 2, act_obs, None),
    ):
        layers = identity_layers(width, count)
        cases.append(
            network(
                name,
                activation=activation,
                layers=layers,
                observations=observations,
                draws=row_draws,
            )
        )
    return cases


def golden() -> dict[str, Any]:
    return {
        "comment": (
            "Generated by `python -m tests.node_mlp_golden` from tests/mlp_reference.py; "
            "do not edit. Floats are IEEE bit patterns in hex."
        ),
        "functions": functions(),
        "networks": networks(),
    }


def golden_text() -> str:
    """The fixture's text: indented, each innermost list on one line."""
    text = json.dumps(golden(), indent=1)

    def one_line(match: re.Match[str]) -> str:
        return "[" + " ".join(match.group(1).split()) + "]"

    return re.sub(r"\[([^\[\]{}]*)\]", one_line, text) + "\n"


def main() -> None:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(golden_text())
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
