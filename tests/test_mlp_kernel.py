"""The compiled MLP kernel gives tests/mlp_reference.py's bits, row by row.

The contract is docs/policies.md's "Exact arithmetic": every value the
built-in MLP policies compute is the reference's, bit for bit, for every
row, whatever the batch around it. These tests compare the kernel with the
reference over random and extreme networks, observations and draws, check
batch invariance and memory layouts, every error path, and that the bits do
not change when the kernel is built for another x86-64 instruction set.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import math
import pickle
import shutil
import subprocess
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import PolicyError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, _mlp_kernel
from rlfleet.policies._mlp_kernel import Kernel
from tests import mlp_reference as ref

F32 = np.float32
Layers = list[tuple[np.ndarray, np.ndarray]]
SOURCE = Path(_mlp_kernel.__file__).with_name("_mlp_kernel.c")
ACTIVATIONS = ("tanh", "relu", "identity")

# ------------------------------------------------------------- strategies

#: Any float32, subnormals and the largest finite values included.
any_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def networks(draw: st.DrawFn, out_max: int = 19) -> Layers:
    """Layer sizes D -> hidden* -> out, widths that are not multiples of 4 or 32
    included; weights either any float32 (extremes) or scaled normals."""
    sizes = [
        draw(st.integers(0, 9)),
        *draw(st.lists(st.integers(1, 41), max_size=3)),
        draw(st.integers(1, out_max)),
    ]
    if draw(st.booleans()):
        return [
            (
                draw(hnp.arrays(F32, (k, h), elements=any_f32)),
                draw(hnp.arrays(F32, (h,), elements=any_f32)),
            )
            for k, h in itertools.pairwise(sizes)
        ]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 0.3, 1.0, 3.0, 30.0]))
    return [
        (
            (rng.standard_normal((k, h)) * scale / math.sqrt(max(k, 1))).astype(F32),
            (rng.standard_normal(h) * scale).astype(F32),
        )
        for k, h in itertools.pairwise(sizes)
    ]


@st.composite
def observations(draw: st.DrawFn, dim: int, rows: st.SearchStrategy[int]) -> np.ndarray:
    n = draw(rows)
    if draw(st.booleans()):
        extreme = st.floats(width=32)  # NaN and infinities too
        return draw(hnp.arrays(F32, (n, dim), elements=extreme))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return (rng.standard_normal((n, dim)) * draw(st.sampled_from([0.1, 1.0, 10.0]))).astype(F32)


#: random() draws, the largest one and 1.0 (t = u * Z = Z: the fallback) included.
uniforms = st.one_of(
    st.floats(0.0, 1.0, exclude_max=True),
    st.sampled_from([0.0, 1.0 - 2.0**-53, 1.0]),
)
normals = st.one_of(
    st.floats(-8.0, 8.0),
    st.sampled_from([0.0, -0.0, 1e-300, -1e30, 1e30, 1e300]),
)


# ---------------------------------------------------------------- helpers


def reference_outputs(obs: np.ndarray, layers: Layers, activation: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return ref.forward32(obs, layers, activation)


def checked_outputs(
    outputs: np.ndarray, bad: int, obs: np.ndarray, layers: Layers, activation: str
) -> tuple[np.ndarray, int]:
    """Checks the kernel's logits or means and bad row; returns the reference's
    outputs and how many rows before the first bad one hold sampled values."""
    expected = reference_outputs(obs, layers, activation)
    finite = np.isfinite(expected).all(axis=1)
    assert bad == (-1 if finite.all() else int(np.argmin(finite)))
    rows = len(obs) if bad < 0 else bad
    assert same_bits(outputs[: rows + (bad >= 0)], expected[: rows + (bad >= 0)])
    return expected, rows


def same_bits(a: Any, b: Any) -> bool:
    """Equal bit for bit; a NaN equals any NaN (its payload is not specified)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan = np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
    if a.dtype.kind == "f" and not np.array_equal(nan, np.isnan(b)):
        return False
    return a[~nan].tobytes() == b[~nan].tobytes()


def check_categorical(
    kernel: Kernel, layers: Layers, activation: str, obs: np.ndarray, u: np.ndarray | None
) -> None:
    index, log_prob, logits, bad = kernel.categorical(obs, u)
    expected, rows = checked_outputs(logits, bad, obs, layers, activation)
    for i in range(rows):
        want_index, want_log_prob = ref.categorical_row(
            expected[i], None if u is None else float(u[i])
        )
        assert index[i] == want_index, i
        assert same_bits(log_prob[i], want_log_prob), i


def check_gaussian(
    kernel: Kernel,
    layers: Layers,
    activation: str,
    obs: np.ndarray,
    eps: np.ndarray | None,
    *,
    log_std: np.ndarray,
) -> None:
    actions, log_prob, mean, bad = kernel.gaussian(obs, eps)
    expected, rows = checked_outputs(mean, bad, obs, layers, activation)
    with np.errstate(all="ignore"):
        for i in range(rows):
            want_action, want_log_prob = ref.gaussian_row(
                expected[i], log_std, None if eps is None else eps[i]
            )
            assert same_bits(actions[i], want_action), i
            assert same_bits(log_prob[i], want_log_prob), i


# --------------------------------------------------- against the reference


@settings(max_examples=300, deadline=None)
@given(data=st.data(), layers=networks(out_max=40), activation=st.sampled_from(ACTIVATIONS))
def test_categorical_rows_are_the_reference_bit_for_bit(
    data: st.DataObject, layers: Layers, activation: str
) -> None:
    obs = data.draw(observations(layers[0][0].shape[0], st.integers(0, 9)))
    kernel = Kernel(layers, activation)
    u = np.array(data.draw(st.lists(uniforms, min_size=len(obs), max_size=len(obs))))
    check_categorical(kernel, layers, activation, obs, u.reshape(len(obs)))
    check_categorical(kernel, layers, activation, obs, None)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), layers=networks(out_max=9), activation=st.sampled_from(ACTIVATIONS))
def test_gaussian_rows_are_the_reference_bit_for_bit(
    data: st.DataObject, layers: Layers, activation: str
) -> None:
    d = layers[-1][1].shape[0]
    obs = data.draw(observations(layers[0][0].shape[0], st.integers(0, 9)))
    log_std = data.draw(
        hnp.arrays(F32, (d,), elements=st.one_of(st.floats(-5, 5, width=32), any_f32))
    )
    kernel = Kernel(layers, activation, log_std)
    eps = data.draw(hnp.arrays(np.float64, (len(obs), d), elements=normals))
    check_gaussian(kernel, layers, activation, obs, eps, log_std=log_std)
    check_gaussian(kernel, layers, activation, obs, None, log_std=log_std)


def special_f32(count: int, seed: int) -> np.ndarray:
    """Finite float32 values of every exponent, and the contract's thresholds."""
    bits = np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint64)
    values = bits.astype(np.uint32).view(F32)
    values = values[np.isfinite(values)]
    edges = [0.0, 1e-45, 1e-38, 4e-4, 7.905311, 7.9053115, 8.0, 88.72283, 88.72284]
    edges += [-103.97208, -103.97209, 1.0, 0.5, 3.4e38]
    around = np.array(edges, F32)
    near = np.concatenate(
        [np.nextafter(around, F32(np.inf)), np.nextafter(around, F32(-np.inf)), around]
    )
    return np.concatenate([values, near, -near])


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_activations_are_the_reference_for_floats_of_every_exponent(activation: str) -> None:
    # Identity weights: the hidden layer's inputs are the observations.
    width = 64
    values = special_f32(400_000, 1)
    obs = np.resize(values, (len(values) // width + 1) * width).reshape(-1, width)
    eye = np.eye(width, dtype=F32)
    layers = [(eye, np.zeros(width, F32)), (eye, np.zeros(width, F32))]
    _, _, logits, bad = Kernel(layers, activation).categorical(obs, None)
    assert bad == -1
    assert logits.tobytes() == reference_outputs(obs, layers, activation).tobytes()


@pytest.mark.parametrize("width", [1, 3, 4, 16, 20, 32, 40])
def test_sums_start_from_positive_zero(width: int) -> None:
    # No inputs and a -0.0 bias: (+0) + (-0) is +0, where a sum started from
    # -0.0 (or the bias) would give -0.0. Widths take every column block.
    layers = [(np.zeros((0, width), F32), np.full(width, -0.0, F32))]
    _, _, logits, _ = Kernel(layers, "tanh").categorical(np.zeros((2, 0), F32), None)
    assert logits.tobytes() == np.zeros((2, width), F32).tobytes()
    assert logits.tobytes() == reference_outputs(np.zeros((2, 0), F32), layers, "tanh").tobytes()


def test_exp_is_the_reference_for_floats_of_every_exponent() -> None:
    # A zero network: the action is 0 + exp32(log_std) * 1 = exp32(log_std).
    # Where x * log2(e) is near k + 1/2, the rounding picks n = k or k + 1.
    halves = np.array([(k + 0.5) * math.log(2) for k in range(-151, 129)], F32)
    steps = np.arange(-8, 9, dtype=np.int32)
    near = (halves.view(np.int32)[:, None] + steps).view(F32).ravel()
    values = np.concatenate(
        [special_f32(30_000, 2), near, np.array([np.nan, np.inf, -np.inf], F32)]
    )
    zero = [(np.zeros((1, len(values)), F32), np.zeros(len(values), F32))]
    actions, _, _, bad = Kernel(zero, "tanh", values).gaussian(
        np.zeros((1, 1), F32), np.ones((1, len(values)))
    )
    assert bad == -1
    with np.errstate(all="ignore"):
        expected = np.array([ref.exp32(v) for v in values], F32)
    assert same_bits(actions[0], expected)


def test_log_prob_is_the_reference_for_many_partition_sums() -> None:
    # logits = observations (an identity layer): Z = sum(exp32(l - max)) in [1, n].
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 5, 17, 64):
        logits = (rng.standard_normal((400, n)) * rng.choice([0.01, 1, 10, 100], (400, 1))).astype(
            F32
        )
        layers = [(np.eye(n, dtype=F32), np.zeros(n, F32))]
        check_categorical(Kernel(layers, "tanh"), layers, "tanh", logits, rng.random(400))
    # Float64 roundings seldom show in a float32 result: for logits [0, a]
    # with this a (found by searching 1.4e9 values), the C library's log of Z
    # rounds the log-probability to another float32 than the contract's log.
    rare = np.array([[0.0, -0.702934980392456]], F32)
    layers = [(np.eye(2, dtype=F32), np.zeros(2, F32))]
    _, log_prob, _, _ = Kernel(layers, "tanh").categorical(rare, None)
    assert log_prob[0] != F32(-math.log(1.0 + float(ref.exp32(rare[0, 1]))))
    check_categorical(Kernel(layers, "tanh"), layers, "tanh", rare, None)


def test_gaussian_log_prob_sums_each_term_in_the_documented_order() -> None:
    # ((-0.5 z) z - log_std) - 0.5 log(2 pi), not (-0.5 z) z - (log_std +
    # 0.5 log(2 pi)): for this z and log_std (found by searching 1.3e9 pairs)
    # the two round to different float32 values.
    z, log_std = 0.005289213266223669, np.array([-0.9190742], F32)
    zero = [(np.zeros((1, 1), F32), np.zeros(1, F32))]
    _, log_prob, _, _ = Kernel(zero, "tanh", log_std).gaussian(
        np.zeros((1, 1), F32), np.array([[z]])
    )
    _, want = ref.gaussian_row(np.zeros(1, F32), log_std, np.array([z]))
    assert log_prob[0].tobytes() == want.tobytes()
    assert want != F32((-0.5 * z) * z - (float(log_std[0]) + ref.HALF_LOG_2PI))


@settings(max_examples=200, deadline=None)
@given(
    logits=hnp.arrays(
        F32,
        st.tuples(st.integers(1, 6), st.integers(1, 12)),
        elements=st.sampled_from([0.0, -1.0, -87.0, -103.9, -104.0, -200.0, -1000.0, -3e38]),
    ),
    u=uniforms,
)
def test_actions_of_zero_probability_are_never_sampled(logits: np.ndarray, u: float) -> None:
    n = logits.shape[1]
    layers = [(np.eye(n, dtype=F32), np.zeros(n, F32))]
    index, _, _, bad = Kernel(layers, "tanh").categorical(logits, np.full(len(logits), u))
    assert bad == -1
    for row, k in zip(logits, index, strict=True):
        assert ref.exp32(row[k] - row.max()) > 0


def test_the_fallback_takes_the_last_action_of_positive_weight() -> None:
    # u = 1.0 (no random() gives it) makes t = Z: no c[i] > t.
    logits = np.array([[0, 0, -1000], [0, -1000, -1000], [-3, 0, 0]], F32)
    layers = [(np.eye(3, dtype=F32), np.zeros(3, F32))]
    kernel = Kernel(layers, "tanh")
    index, _, _, _ = kernel.categorical(logits, np.ones(3))
    assert index.tolist() == [1, 0, 2]
    # The largest random() is below every rounding of u * Z up to Z.
    index, _, _, _ = kernel.categorical(logits, np.full(3, 1.0 - 2.0**-53))
    assert index.tolist() == [1, 0, 2]
    check_categorical(kernel, layers, "tanh", logits, np.ones(3))


def new_parameters(
    policy: MLPCategoricalPolicy | MLPGaussianPolicy, change: Callable[[np.ndarray], np.ndarray]
) -> tuple[dict[str, np.ndarray], Layers]:
    """Sets ``change(old)`` as the policy's parameters; returns them and its layers."""
    params = {k: change(v) for k, v in policy.get_param_values().items()}
    policy.set_param_values(params)
    count = sum(name.endswith(".weight") for name in params)
    return params, [
        (params[f"layers.{i}.weight"], params[f"layers.{i}.bias"]) for i in range(count)
    ]


def test_the_categorical_policy_gives_the_reference_actions_and_infos() -> None:
    spec = EnvSpec(gym.spaces.Box(-np.inf, np.inf, (5,), F32), gym.spaces.Discrete(4, start=-1))
    policy = MLPCategoricalPolicy(spec, hidden_sizes=(7, 3), activation="relu", seed=1)
    _, layers = new_parameters(policy, lambda v: 2 * v + 0.1)
    obs = np.random.default_rng(4).standard_normal((6, 5)).astype(F32)
    u = np.random.default_rng(5).random((6, 1))
    actions, infos = policy.get_actions_from_draws(obs, u)
    logits = reference_outputs(obs, layers, "relu")
    assert infos["logits"].tobytes() == logits.tobytes()
    for i in range(6):
        index, log_prob = ref.categorical_row(logits[i], float(u[i, 0]))
        assert actions[i] == index - 1
        assert infos["log_prob"][i].tobytes() == log_prob.tobytes()


def test_the_gaussian_policy_gives_the_reference_actions_and_infos() -> None:
    box = gym.spaces.Box(-1, 1, (2, 2), np.float64)
    policy = MLPGaussianPolicy(EnvSpec(gym.spaces.Box(-1, 1, (3,), F32), box), hidden_sizes=(5,))
    params, layers = new_parameters(policy, lambda v: v - 0.2)
    obs = np.random.default_rng(6).standard_normal((3, 3)).astype(F32)
    eps = np.random.default_rng(7).standard_normal((3, 4))
    actions, infos = policy.get_actions_from_draws(obs, eps)
    mean = reference_outputs(obs, layers, "tanh")
    assert actions.dtype == np.float64 and actions.shape == (3, 2, 2)
    for i in range(3):
        action, log_prob = ref.gaussian_row(mean[i], params["log_std"], eps[i])
        assert actions[i].ravel().tolist() == action.tolist()
        assert infos["log_prob"][i].tobytes() == log_prob.tobytes()
        assert infos["mean"][i].ravel().tobytes() == mean[i].tobytes()


# ------------------------------------------------------- batch invariance


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    layers=networks(out_max=9),
    activation=st.sampled_from(ACTIVATIONS),
    gaussian=st.booleans(),
)
def test_a_row_has_the_same_bits_alone_and_anywhere_in_any_batch(
    data: st.DataObject, layers: Layers, activation: str, gaussian: bool
) -> None:
    dim, out = layers[0][0].shape[0], layers[-1][1].shape[0]
    obs = data.draw(observations(dim, st.integers(1, 20)))
    n = len(obs)
    call: Callable[[np.ndarray, np.ndarray], tuple[Any, ...]]
    if gaussian:
        kernel = Kernel(layers, activation, np.linspace(-1, 1, out).astype(F32))
        call, draws = kernel.gaussian, np.random.default_rng(n).standard_normal((n, out))
    else:
        kernel = Kernel(layers, activation)
        call, draws = kernel.categorical, np.random.default_rng(n).random((n, 1))
    alone: list[tuple[Any, ...]] = [call(obs[i : i + 1], draws[i : i + 1]) for i in range(n)]
    order = data.draw(st.permutations(range(n)))
    start = data.draw(st.integers(0, n - 1))
    for rows in (order, order[start:]):
        batch: tuple[Any, ...] = call(obs[rows], draws[rows])
        for position, row in enumerate(rows):
            single = alone[row]
            if single[3] >= 0:  # a bad row: the batch stops at the first one
                assert batch[3] >= 0 and batch[3] <= position
                break
            for got, want in zip(batch[:3], single[:3], strict=True):
                assert same_bits(got[position], want[0]), (row, position)


def layouts(obs: np.ndarray) -> dict[str, np.ndarray]:
    """The same rows in other memory layouts."""
    n, dim = obs.shape
    ring = np.zeros((n, 3, dim), F32).swapaxes(0, 1)
    ring[1] = obs
    unaligned = np.frombuffer(b"\0" + obs.tobytes(), F32, offset=1).reshape(n, dim)
    reversed_rows = obs[::-1].copy()[::-1]
    return {
        "fortran": np.asfortranarray(obs),
        "ring view": ring[1],
        "every other column": np.repeat(obs, 2, axis=1)[:, ::2],
        "negative strides": reversed_rows,
        "unaligned": unaligned,
        "read-only": np.frombuffer(obs.tobytes(), F32).reshape(n, dim),
    }


def test_every_memory_layout_of_the_observations_gives_the_same_bits() -> None:
    rng = np.random.default_rng(8)
    layers = [
        (rng.standard_normal((5, 9)).astype(F32), rng.standard_normal(9).astype(F32)),
        (rng.standard_normal((9, 3)).astype(F32), rng.standard_normal(3).astype(F32)),
    ]
    obs = rng.standard_normal((7, 5)).astype(F32)
    u = rng.random(7)
    kernel = Kernel(layers, "tanh")
    want: tuple[Any, ...] = kernel.categorical(obs, u)
    for name, view in layouts(obs).items():
        assert np.array_equal(view, obs), name
        got: tuple[Any, ...] = kernel.categorical(view, u)
        for a, b in zip(got[:3], want[:3], strict=True):
            assert a.tobytes() == b.tobytes(), name
    # Draws may be strided too: a column of a wider array. Equal logits, so
    # every row's index is floor(3 u): each draw shows.
    even = Kernel([(np.zeros((5, 3), F32), np.zeros(3, F32))], "tanh")
    wide = np.stack([u, 1 - u], axis=1)
    index = even.categorical(obs, wide[:, :1])[0]
    assert index.tolist() == np.floor(3 * u).astype(int).tolist()
    assert len(set(index.tolist())) > 1
    # A broadcast batch (every row the same memory) gives each row the same bits.
    same = kernel.categorical(np.broadcast_to(obs[2], (4, 5)), np.full(4, u[2]))
    assert same[2].tobytes() == np.repeat(want[2][2:3], 4, axis=0).tobytes()


def test_policies_take_any_layout_and_dtype_of_observations() -> None:
    spec = EnvSpec(gym.spaces.Box(-np.inf, np.inf, (5,), F32), gym.spaces.Discrete(3))
    policy = MLPCategoricalPolicy(spec, seed=9)
    obs = np.random.default_rng(10).standard_normal((6, 5)).astype(F32)
    draws = np.random.default_rng(11).random((6, 1))
    want = policy.get_actions_from_draws(obs, draws)
    # float64 observations are cast to float32 (the encoding) first.
    others = {**layouts(obs), "float64": obs.astype(np.float64), "list": obs.tolist()}
    for name, view in others.items():
        actions, infos = policy.get_actions_from_draws(view, draws)
        assert actions.tobytes() == want[0].tobytes(), name
        for key in infos:
            assert infos[key].tobytes() == want[1][key].tobytes(), (name, key)


def test_empty_batches_give_empty_outputs() -> None:
    layers = [(np.ones((3, 4), F32), np.zeros(4, F32))]
    index, log_prob, logits, bad = Kernel(layers, "relu").categorical(np.zeros((0, 3), F32), None)
    assert (index.shape, log_prob.shape, logits.shape, bad) == ((0,), (0,), (0, 4), -1)
    assert (index.dtype, log_prob.dtype, logits.dtype) == (
        np.dtype(np.int64),
        np.dtype(F32),
        np.dtype(F32),
    )
    gaussian = Kernel(layers, "relu", np.zeros(4, F32))
    actions, log_prob, mean, bad = gaussian.gaussian(np.zeros((0, 3), F32), np.zeros((0, 4)))
    assert (actions.shape, log_prob.shape, mean.shape, bad) == ((0, 4), (0,), (0, 4), -1)


def test_non_finite_outputs_name_the_first_bad_row() -> None:
    layers = [(np.ones((2, 3), F32), np.zeros(3, F32))]
    obs = np.zeros((5, 2), F32)
    obs[3, 0], obs[4, 1] = np.inf, np.nan
    _, _, logits, bad = Kernel(layers, "tanh").categorical(obs, np.zeros(5))
    assert bad == 3 and np.isinf(logits[3]).all()
    _, _, _, bad = Kernel(layers, "tanh", np.zeros(3, F32)).gaussian(obs[4:], None)
    assert bad == 0
    # Overflow of finite values is not finite either.
    _, _, _, bad = Kernel(layers, "tanh").categorical(np.full((1, 2), 3e38, F32), None)
    assert bad == 0


def test_calls_from_many_threads_at_once_give_the_sequential_bits() -> None:
    rng = np.random.default_rng(12)
    layers = [
        (rng.standard_normal((8, 64)).astype(F32), np.zeros(64, F32)),
        (rng.standard_normal((64, 64)).astype(F32), np.zeros(64, F32)),
        (rng.standard_normal((64, 5)).astype(F32), np.zeros(5, F32)),
    ]
    kernel = Kernel(layers, "tanh")
    batches = [rng.standard_normal((600, 8)).astype(F32) for _ in range(4)]  # GIL released
    draws = rng.random(600)
    want = [[a.tobytes() for a in kernel.categorical(b, draws)[:3]] for b in batches]
    got: dict[int, list[list[bytes]]] = {i: [] for i in range(4)}
    start = threading.Barrier(4)

    def run(i: int) -> None:
        start.wait()
        for _ in range(10):
            got[i].append([a.tobytes() for a in kernel.categorical(batches[i], draws)[:3]])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(4):
        assert got[i] == [want[i]] * 10, i


@pytest.mark.parametrize("copy_policy", [copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))])
def test_policies_can_be_copied_and_pickled_with_their_kernel(
    copy_policy: Callable[[Any], Any],
) -> None:
    spec = EnvSpec(gym.spaces.Box(-1, 1, (3,), F32), gym.spaces.Box(-1, 1, (2,), F32))
    policy = MLPGaussianPolicy(spec, seed=4, init_log_std=-0.3)
    twin = copy_policy(policy)
    obs = np.random.default_rng(14).standard_normal((5, 3)).astype(F32)
    eps = np.random.default_rng(15).standard_normal((5, 2))
    want, got = policy.get_actions_from_draws(obs, eps), twin.get_actions_from_draws(obs, eps)
    assert want[0].tobytes() == got[0].tobytes()
    assert want[1]["log_prob"].tobytes() == got[1]["log_prob"].tobytes()
    # Each has its own parameters and kernel.
    twin.set_param_values({k: v + 1 for k, v in twin.get_param_values().items()})
    assert policy.get_actions_from_draws(obs, eps)[0].tobytes() == want[0].tobytes()


# ---------------------------------------------------------------- errors

W = np.ones((3, 2), F32)
B = np.zeros(2, F32)
OBS = np.zeros((4, 3), F32)
# 2**60 weights with no memory behind them (every element the same float).
HUGE = np.lib.stride_tricks.as_strided(np.zeros(1, F32), (2**30, 2**30), (0, 0))
HUGE_BIAS = np.lib.stride_tricks.as_strided(np.zeros(1, F32), (2**30,), (0,))


def build_errors() -> list[tuple[Callable[[], object], type[Exception], str]]:
    return [
        (lambda: Kernel([], "tanh"), ValueError, "at least one"),
        (lambda: Kernel(5, "tanh"), TypeError, "sequence of"),  # type: ignore[arg-type]
        (lambda: Kernel([W], "tanh"), TypeError, "layer 0 must be a"),  # type: ignore[list-item]
        (lambda: Kernel([(W, B)], "sigmoid"), ValueError, "'tanh', 'relu' or 'identity'"),
        (
            lambda: Kernel([(W.astype(np.float64), B)], "tanh"),
            TypeError,
            "float32 array, got float64",
        ),
        (lambda: Kernel([(W, np.zeros(3, F32))], "tanh"), ValueError, r"shape \(2,\), got \(3,\)"),
        (lambda: Kernel([(W[0], B)], "tanh"), ValueError, "weight must have 2 dims"),
        (lambda: Kernel([("abc", B)], "tanh"), TypeError, "weight must be a float32 array"),
        (lambda: Kernel([(W, B), (W, B)], "tanh"), ValueError, "layer 1 takes 3 inputs but"),
        (
            lambda: Kernel([(np.ones((3, 0), F32), np.zeros(0, F32))], "tanh"),
            ValueError,
            "no outputs",
        ),
        (lambda: Kernel([(W, B)], "tanh", np.zeros(3, F32)), ValueError, r"log_std .* \(2,\)"),
        (lambda: Kernel([(HUGE, HUGE_BIAS)], "tanh"), MemoryError, "too large"),
    ]


@pytest.mark.parametrize(("build", "error", "message"), build_errors())
def test_bad_parameters_are_refused_with_a_clear_error(
    build: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build()


def call_errors() -> list[tuple[Callable[[], object], type[Exception], str]]:
    cat, gau = Kernel([(W, B)], "tanh"), Kernel([(W, B)], "tanh", B)
    return [
        (
            lambda: cat.categorical(OBS.astype(np.float64), None),
            TypeError,
            "got float64 \\(4, 3\\)",
        ),
        (lambda: cat.categorical(OBS[0], None), TypeError, r"shape \(N, 3\), got float32 \(3,\)"),
        (lambda: cat.categorical(OBS[:, :2], None), ValueError, r"got float32 \(4, 2\)"),
        (lambda: cat.categorical("obs", None), TypeError, "needs float32 observations, got str"),
        (lambda: cat.categorical(OBS, [0.5] * 4), TypeError, "draws .* got list"),
        (
            lambda: cat.categorical(OBS, np.zeros(3)),
            ValueError,
            r"\(4, 1\) or \(4,\), got float64 \(3,\)",
        ),
        (lambda: cat.categorical(OBS, np.zeros((4, 2))), ValueError, r"got float64 \(4, 2\)"),
        (lambda: cat.categorical(OBS, np.zeros(4, F32)), TypeError, r"got float32 \(4,\)"),
        (lambda: gau.gaussian(OBS, np.zeros(4)), ValueError, r"shape \(4, 2\), got float64 \(4,\)"),
        (lambda: cat.gaussian(OBS, None), TypeError, "call categorical"),
        (lambda: gau.categorical(OBS, None), TypeError, "call gaussian"),
        (lambda: cat.categorical(OBS), TypeError, "takes \\(observations, draws\\)"),  # type: ignore[call-arg]
        (lambda: Kernel.__new__(Kernel).categorical(OBS, None), TypeError, "was not built"),
        (lambda: cat.__init__([(W, B)], "tanh"), TypeError, "built once"),  # type: ignore[misc]
    ]


@pytest.mark.parametrize(("call", "error", "message"), call_errors())
def test_bad_operands_are_refused_with_a_clear_error(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()


@settings(max_examples=300, deadline=None)
@given(
    obs=hnp.arrays(
        st.sampled_from([F32, np.float64, np.int32, np.uint8, np.bool_]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    ),
    draws=st.one_of(
        st.none(),
        hnp.arrays(
            st.sampled_from([np.float64, F32, np.int64]),
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        ),
    ),
    gaussian=st.booleans(),
)
def test_any_operands_give_outputs_or_an_error_never_a_crash(
    obs: np.ndarray, draws: np.ndarray | None, gaussian: bool
) -> None:
    kernel = Kernel([(W, B)], "relu", B if gaussian else None)
    call = kernel.gaussian if gaussian else kernel.categorical
    try:
        outputs = call(obs, draws)
    except (TypeError, ValueError):
        return
    assert obs.dtype == F32 and obs.ndim == 2 and obs.shape[1] == 3
    assert len(outputs[0]) == len(obs)


def test_the_policies_turn_kernel_errors_into_policy_errors() -> None:
    spec = EnvSpec(gym.spaces.Box(-1, 1, (3,), F32), gym.spaces.Discrete(2))
    policy = MLPCategoricalPolicy(spec, seed=0)
    with pytest.raises(
        PolicyError, match=r"MLPCategoricalPolicy.get_actions_from_draws: needs float64 draws"
    ):
        policy.get_actions_from_draws(OBS, np.zeros((4, 1), F32))
    gaussian = MLPGaussianPolicy(
        EnvSpec(gym.spaces.Box(-1, 1, (3,), F32), gym.spaces.Box(-1, 1, (2,)))
    )
    with pytest.raises(
        PolicyError, match=r"get_actions_from_draws: needs float64 draws of shape \(4, 2\)"
    ):
        gaussian.get_actions_from_draws(OBS, np.zeros((4, 3)))
    obs = OBS.copy()
    obs[1, 2] = np.nan
    with pytest.raises(
        PolicyError, match=r"get_actions_batched: logits of row 1 are not finite \(\[nan, nan\]\)"
    ):
        policy.get_actions_batched(obs, np.random.default_rng(0))


# ------------------------------------------------------ how it is built


def build_variant(tmp_path: Path, flags: list[str]) -> Path:
    """Compiles the kernel's source with ``flags``; returns the shared library."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    out = tmp_path / ("_mlp_kernel" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    include = sysconfig.get_paths()["include"]
    command = [
        compiler,
        "-shared",
        "-fPIC",
        "-O3",
        *flags,
        f"-I{include}",
        str(SOURCE),
        "-o",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return out


def load_variant(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("rlfleet.policies._mlp_kernel", library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_has(*flags: str) -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    words = set(text.split())
    return all(flag in words for flag in flags)


def assert_same_bits_as_the_shipped_build(variant: ModuleType, widest: int = 40) -> None:
    """Random networks (layers under ``widest`` wide) give the shipped build's bits."""
    assert variant.Kernel is not Kernel
    rng = np.random.default_rng(13)
    for trial in range(60):
        sizes = [int(s) for s in rng.integers(1, widest, int(rng.integers(2, 5)))]
        scale = [0.1, 1.0, 10.0][trial % 3]
        layers = [
            ((rng.standard_normal((k, h)) * scale).astype(F32), rng.standard_normal(h).astype(F32))
            for k, h in itertools.pairwise(sizes)
        ]
        activation = ACTIVATIONS[trial % 3]
        obs = (rng.standard_normal((9, sizes[0])) * scale).astype(F32)
        log_std = rng.standard_normal(sizes[-1]).astype(F32)
        u, eps = rng.random(9), rng.standard_normal((9, sizes[-1]))
        got, want = (
            (
                module.Kernel(layers, activation).categorical(obs, u),
                module.Kernel(layers, activation, log_std).gaussian(obs, eps),
            )
            for module in (variant, _mlp_kernel)
        )
        for got_call, want_call in zip(got, want, strict=True):
            assert got_call[3] == want_call[3] == -1
            for a, b in zip(got_call[:3], want_call[:3], strict=True):
                assert a.tobytes() == b.tobytes(), trial


@pytest.mark.skipif(not cpu_has("avx2", "fma"), reason="needs an x86-64 CPU with AVX2 and FMA")
def test_a_build_for_avx2_with_fma_units_gives_the_same_bits(tmp_path: Path) -> None:
    # -ffp-contract=off keeps the FMA units unused; AVX encodings round alike.
    variant = load_variant(build_variant(tmp_path, ["-mavx2", "-mfma", "-ffp-contract=off"]))
    assert_same_bits_as_the_shipped_build(variant)


@pytest.mark.skipif(not cpu_has("avx2"), reason="needs an x86-64 CPU with AVX2")
def test_four_lanes_give_the_bits_of_eight(tmp_path: Path) -> None:
    """The shipped build runs 8 lanes on this CPU; one kept to 4 gives the same bits,
    for widths of whole 8-lane vectors, a 4-lane remainder, and up to 8 vectors at once."""
    variant = load_variant(build_variant(tmp_path, ["-DRLFLEET_MLP_NARROW", "-ffp-contract=off"]))
    assert_same_bits_as_the_shipped_build(variant, widest=150)


@pytest.mark.skipif(not cpu_has("fma"), reason="needs an x86-64 CPU with FMA")
def test_a_build_that_fuses_products_and_sums_refuses_to_load(tmp_path: Path) -> None:
    library = build_variant(tmp_path, ["-mfma", "-ffp-contract=fast"])
    with pytest.raises(ImportError, match="rebuild it with -ffp-contract=off"):
        load_variant(library)
