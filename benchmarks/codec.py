"""Speed of rlfleet's wire codec against numpy copies, pickle and protobuf.

Run: ``python benchmarks/codec.py [--repeats N] [--no-reexec]``.

Cases:

(a) an EpisodeBatch of 1,000 steps of 84x84x4 uint8 frames in 4 episodes
    (~28 MB of observations), Atari-sized;
(b) an EpisodeBatch of 100,000 CartPole-sized steps in 500 episodes:
    float32 observations (4,), int64 actions, float32 rewards and a float32
    ``log_prob`` agent info.

Each case is encoded and decoded by

* a fresh numpy copy of every array (``array.copy()``): the **baseline**, one
  copy of the bytes into new memory, which is what encoding must at least
  do (the serialized bytes are new memory); ``np.copyto`` into preallocated
  arrays is shown too, as the upper bound of a warm copy;
* rlfleet's codec (``encode_batch`` / ``decode_batch``), and the same cut
  into 1 MiB chunks and reassembled (``encode_batch_chunks`` /
  ``decode_batch_chunks``, the path a batch takes through the fleet). As
  in the fleet, the EnvSpec is not embedded (it travels once per stream)
  and is passed to the decoder; decoding validates the batch;
* pickle protocol 5 (``dumps`` / ``loads`` of the batch, in-band buffers;
  ``loads`` rebuilds the dataclass without running its validation). **The
  pickle comparison is view against copy:** rlfleet's decoder returns numpy
  views into the received bytes (``np.frombuffer``, no copy), while
  ``pickle.loads`` with in-band buffers copies every array out of the
  pickle. So "faster than pickle" on decode largely measures a copy avoided,
  not a faster codec; compare encode times for like against like;
* protobuf's generated classes (``rlfleet.wire._reference``), for reference.

Times are warm: the best of N rounds, after one untimed round; each round
runs every method once (interleaved, so that the load of other processes
and the allocator's state weigh on all alike). GB/s is the batch's array
bytes divided by encode + decode time.

Fresh large buffers are slow on some VMs (every page faults on first touch
when glibc hands big allocations back to the kernel). Unless both
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` are set, the
script re-executes itself with ``MALLOC_MMAP_THRESHOLD_=1073741824
MALLOC_TRIM_THRESHOLD_=4294967296`` (glibc reads them at start-up only) so
that freed buffers are reused; ``--no-reexec`` measures the cold default.
The re-exec also puts the repository on ``PYTHONPATH`` when rlfleet is not
installed, so the script runs from a plain checkout.

A third line times a 20-step CartPole batch (the fleet's small messages),
where per-message overhead dominates.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pickle
import sys
import time
import timeit
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
NO_REEXEC_FLAG = "--no-reexec"


def reexec_if_needed() -> None:
    """Restarts the interpreter with the malloc settings (and PYTHONPATH) if missing."""
    if NO_REEXEC_FLAG in sys.argv:
        return
    env = dict(os.environ)
    missing_malloc = any(name not in env for name in MALLOC_ENV)
    missing_rlfleet = importlib.util.find_spec("rlfleet") is None
    if not (missing_malloc or missing_rlfleet):
        return
    for name, value in MALLOC_ENV.items():
        env.setdefault(name, value)
    if missing_rlfleet:
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # The flag stops a second re-exec if the environment still does not
    # satisfy the check (e.g. a broken PYTHONPATH).
    os.execve(sys.executable, [sys.executable, *sys.argv, NO_REEXEC_FLAG], env)


@dataclass(frozen=True)
class Method:
    """One way to turn a batch into bytes (or copies) and back."""

    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any] | None


@dataclass(frozen=True)
class Timing:
    encode: float
    decode: float

    @property
    def total(self) -> float:
        return self.encode + self.decode


def leaves(tree: Mapping) -> Iterator[np.ndarray]:
    for value in tree.values():
        if isinstance(value, Mapping):
            yield from leaves(value)
        else:
            yield value


def batch_arrays(batch: Any) -> list[np.ndarray]:
    """Every array of a batch, info dicts included."""
    fields = (
        "observations",
        "last_observations",
        "actions",
        "rewards",
        "step_types",
        "lengths",
    )
    arrays = [getattr(batch, name) for name in fields]
    for name in ("episode_infos", "env_infos", "agent_infos"):
        arrays.extend(leaves(getattr(batch, name)))
    return arrays


def episode_batch(
    num_episodes: int, episode_length: int, obs_shape: tuple[int, ...], obs_dtype: Any
) -> Any:
    import gymnasium as gym

    from rlfleet.core import EnvSpec, EpisodeBatch, StepType

    rng = np.random.default_rng(0)
    steps = num_episodes * episode_length
    space: gym.Space
    obs: np.ndarray
    last: np.ndarray
    if np.dtype(obs_dtype) == np.uint8:
        space = gym.spaces.Box(0, 255, obs_shape, np.uint8)
        obs = rng.integers(0, 256, (steps, *obs_shape), dtype=np.uint8)
        last = rng.integers(0, 256, (num_episodes, *obs_shape), dtype=np.uint8)
    else:
        space = gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32)
        obs = rng.standard_normal((steps, *obs_shape), dtype=np.float32)
        last = rng.standard_normal((num_episodes, *obs_shape), dtype=np.float32)
    step_types = np.full(steps, StepType.MID, np.uint8)
    step_types[::episode_length] = StepType.FIRST
    step_types[episode_length - 1 :: episode_length] = StepType.TIMEOUT
    n = np.arange(num_episodes, dtype=np.int64)
    return EpisodeBatch(
        env_spec=EnvSpec(space, gym.spaces.Discrete(2), episode_length),
        episode_infos={
            "agent_version": n * 0,
            "env_seed": n,
            "policy_seed": n + 1,
            "episode_index": n,
            "worker": n * 0,
        },
        observations=obs,
        last_observations=last,
        actions=rng.integers(0, 2, steps, dtype=np.int64),
        rewards=np.ones(steps, np.float32),
        env_infos={},
        agent_infos={"log_prob": np.full(steps, -0.6931, np.float32)},
        step_types=step_types,
        lengths=np.full(num_episodes, episode_length, np.int64),
    )


def methods(batch: Any) -> list[Method]:
    from rlfleet.v1 import batch_pb2
    from rlfleet.wire import (
        decode_batch,
        decode_batch_chunks,
        encode_batch,
        encode_batch_chunks,
    )
    from rlfleet.wire._reference import batch_from_proto, batch_to_proto

    arrays = batch_arrays(batch)
    targets = [np.empty_like(array) for array in arrays]
    spec = batch.env_spec

    def copy_into(_: Any) -> None:
        for target, array in zip(targets, arrays, strict=True):
            np.copyto(target, array)

    return [
        Method("numpy fresh copy (baseline)", lambda b: [a.copy() for a in arrays], None),
        Method("numpy copyto, preallocated", copy_into, None),
        Method(
            "rlfleet codec",
            lambda b: encode_batch(b, include_env_spec=False),
            lambda data: decode_batch(data, env_spec=spec),
        ),
        Method(
            "rlfleet codec, 1 MiB chunks",
            lambda b: encode_batch_chunks(b, include_env_spec=False),
            lambda chunks: decode_batch_chunks(chunks, env_spec=spec),
        ),
        Method("pickle protocol 5", lambda b: pickle.dumps(b, protocol=5), pickle.loads),
        Method(
            "protobuf generated classes",
            lambda b: batch_to_proto(b).SerializeToString(),
            lambda data: batch_from_proto(batch_pb2.EpisodeBatch.FromString(data)),
        ),
    ]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def time_methods(methods: list[Method], batch: Any, repeats: int) -> dict[str, Timing]:
    """Best encode and decode time of each method over interleaved rounds.

    Rounds run every method once, so that load from other processes and
    the allocator's state weigh on all methods alike; the first round is a
    warm-up and is not counted.
    """
    best = {method.name: [float("inf"), 0.0] for method in methods}
    for round_ in range(repeats + 1):
        for method in methods:
            encode_time = timed(partial(method.encode, batch))
            decode_time = 0.0
            if method.decode is not None:
                encoded = method.encode(batch)
                decode_time = timed(partial(method.decode, encoded))
                del encoded
            if round_:
                record = best[method.name]
                record[0] = min(record[0], encode_time)
                record[1] = decode_time if record[1] == 0.0 else min(record[1], decode_time)
    return {name: Timing(encode, decode) for name, (encode, decode) in best.items()}


def run_case(title: str, batch: Any, repeats: int) -> None:
    nbytes = sum(array.nbytes for array in batch_arrays(batch))
    print(f"\n{title}: {nbytes / 1e6:.1f} MB of arrays")
    print(f"  {'method':<30}{'encode ms':>11}{'decode ms':>11}{'total ms':>10}{'GB/s':>8}")
    candidates = methods(batch)
    timings = time_methods(candidates, batch, repeats)
    for method in candidates:
        timing = timings[method.name]
        decode = f"{timing.decode * 1e3:11.2f}" if method.decode else f"{'-':>11}"
        print(
            f"  {method.name:<30}{timing.encode * 1e3:11.2f}{decode}"
            f"{timing.total * 1e3:10.2f}{nbytes / timing.total / 1e9:8.2f}"
        )
    codec = timings["rlfleet codec"].total
    baseline = timings["numpy fresh copy (baseline)"].total
    pickled = timings["pickle protocol 5"].total
    proto = timings["protobuf generated classes"].total
    print(
        f"  codec bandwidth vs numpy fresh copy: {baseline / codec:.0%} (goal >= 50%); "
        f"vs pickle: {pickled / codec:.1f}x faster (goal > 1x; decode is a view vs a copy); "
        f"vs protobuf classes: {proto / codec:.1f}x faster"
    )


def run_small(repeats: int) -> None:
    from rlfleet.core import EpisodeBatch
    from rlfleet.wire import decode_batch, encode_batch

    batch = episode_batch(1, 20, (4,), np.float32)
    data = encode_batch(batch, include_env_spec=False)
    spec = batch.env_spec
    fields = {name: getattr(batch, name) for name in EpisodeBatch.__dataclass_fields__}
    number = 2000

    def per_call(fn: Callable[[], Any]) -> float:
        return min(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6

    encode = per_call(lambda: encode_batch(batch, include_env_spec=False))
    decode = per_call(lambda: decode_batch(data, env_spec=spec))
    construct = per_call(lambda: EpisodeBatch(**fields))
    print(
        f"\n20-step CartPole EpisodeBatch ({len(data)} bytes, no env_spec): "
        f"encode {encode:.1f} us + decode {decode:.1f} us = {encode + decode:.1f} us "
        f"(decode includes {construct:.1f} us of EpisodeBatch validation)"
    )


def main() -> None:
    reexec_if_needed()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement")
    parser.add_argument(NO_REEXEC_FLAG, action="store_true", help="keep the malloc defaults")
    args = parser.parse_args()
    malloc = " ".join(f"{name}={os.environ[name]}" for name in MALLOC_ENV if name in os.environ)
    print(
        f"rlfleet wire codec, warm, best of {args.repeats} "
        f"(numpy {np.__version__}; malloc: {malloc or 'glibc defaults'})"
    )
    run_case(
        "(a) EpisodeBatch, 1,000 steps of 84x84x4 uint8 frames, 4 episodes",
        episode_batch(4, 250, (84, 84, 4), np.uint8),
        args.repeats,
    )
    run_case(
        "(b) EpisodeBatch, 100,000 CartPole-sized steps (float32 obs (4,), int64 actions), "
        "500 episodes",
        episode_batch(500, 200, (4,), np.float32),
        args.repeats,
    )
    run_small(args.repeats)


if __name__ == "__main__":
    main()
