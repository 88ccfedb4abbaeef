"""A learner's arrays: one copy off the received messages, and torch takes them as they are.

A real coordinator over real gRPC, with workers that run real CartPole
envs (tests._coordinator_fakes.AutoWorker); one of them cuts its results
into small chunks, as a worker sending large observations does. The
sampler's answers are checked array by array: where their memory is, and
whether ``torch.from_numpy`` shares it.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlfleet.client import RemoteSampler
from rlfleet.client import _responses as responses_module
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.core import EpisodeBatch
from rlfleet.transport.receive_buffers import ReceiveBuffers
from rlfleet.v1 import worker_pb2
from rlfleet.wire import encode_batch_chunks
from rlfleet.wire.results import Result, ResultAssembler, ScatteredResult, assemble_episodes
from rlfleet.wire.scattered import Scattered, ScatteredBatch
from tests._coordinator_fakes import AutoWorker, batch_arrays, wait_for_workers
from tests.test_client_assembly import SPEC, batch
from tests.test_wire_placement import received

pytestmark = pytest.mark.timeout(120)

#: Small enough that every result of the second worker takes several chunks.
SMALL_CHUNK_BYTES = 2048


@pytest.fixture
def fleet() -> Iterator[str]:
    config = CoordinatorConfig(listen="127.0.0.1:0", wait_for_workers_seconds=20.0)
    with serve(config) as server:
        workers = [
            AutoWorker(server.address, num_envs=2, name="whole"),
            AutoWorker(server.address, num_envs=2, name="chunked", chunk_bytes=SMALL_CHUNK_BYTES),
        ]
        try:
            wait_for_workers(server.address, 2)
            yield server.address
        finally:
            for worker in workers:
                worker.close()


def _results_seen(monkeypatch: pytest.MonkeyPatch) -> list[Result]:
    """Records the decoded results each answer is assembled from."""
    seen: list[Result] = []
    for name in ("assemble_episodes", "assemble_fragments"):
        real = getattr(responses_module, name)

        def recording(
            results: Sequence[Result], *args: int, _real: Any = real, **kwargs: Any
        ) -> EpisodeBatch:
            seen.extend(results)
            batch: EpisodeBatch = _real(results, *args, **kwargs)
            return batch

        monkeypatch.setattr(responses_module, name, recording)
    return seen


def _assert_one_owned_writable_buffer_per_field(
    batch: EpisodeBatch, received: Sequence[Result] = ()
) -> None:
    arrays = batch_arrays(batch)
    messages = [np.frombuffer(c.data, np.uint8) for result in received for c in result.chunks]
    for name, array in arrays.items():
        # Its own memory: not a view of received bytes, nor of another field
        # (below); a large one may be memory an answer let go before.
        assert array.flags.writeable and array.flags.c_contiguous, name
        assert array.flags.aligned, name
        assert not any(np.shares_memory(array, message) for message in messages), name
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch warns on read-only arrays
            tensor = torch.from_numpy(array)
        assert tensor.data_ptr() == array.ctypes.data, f"{name}: torch copied it"
    names = list(arrays)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not np.shares_memory(arrays[a], arrays[b]), (a, b)


def test_an_answer_is_one_writable_buffer_per_field_copied_once_from_the_messages(
    fleet: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _results_seen(monkeypatch)
    with RemoteSampler(fleet, seed=3, timeout=60) as sampler:
        for batch in (sampler.obtain_samples(0, 600), sampler.obtain_fragments(200, 25)):
            _assert_one_owned_writable_buffer_per_field(batch, seen)
    whole = [r for r in seen if len(r.chunks) == 1]
    chunked = [r for r in seen if len(r.chunks) > 1]
    assert whole and chunked, "both kinds of result must have been delivered"
    for result in whole:
        # A one-chunk result was decoded in place: its arrays are views of the
        # message gRPC handed over, so the answer's buffers are the one copy.
        received = np.frombuffer(result.chunks[0].data, np.uint8)
        for name, array in batch_arrays(result.batch).items():
            assert np.shares_memory(array, received), name
            assert not array.flags.writeable, name
    for result in chunked:
        # A result of several chunks is not joined: until the answer is
        # assembled, each of its tensors is a view of one received chunk or
        # the pieces of the chunks it runs across; the answer is the one copy.
        assert isinstance(result, ScatteredResult)
        pieces = [np.frombuffer(chunk.data, np.uint8) for chunk in result.chunks]
        scattered = 0
        for name, tensor in _tensors(result.arrays).items():
            views = tensor.pieces if isinstance(tensor, Scattered) else (tensor,)
            scattered += isinstance(tensor, Scattered)
            for view in views:
                memory = np.frombuffer(view, np.uint8) if isinstance(view, memoryview) else view
                assert any(np.shares_memory(memory, chunk) for chunk in pieces), name
        assert scattered, "some tensor must run across chunks: a real test"


def _tensors(arrays: ScatteredBatch) -> dict[str, Any]:
    """Every tensor of a result kept in its chunks, by name (episode columns included)."""
    tensors: dict[str, Any] = {name: getattr(arrays, name) for name in _STEP_FIELDS}
    for group in ("episode_infos", "env_infos", "agent_infos"):
        for key, value in getattr(arrays, group).items():
            tensors[f"{group}[{key}]"] = value
    return tensors


_STEP_FIELDS = ("observations", "last_observations", "actions", "rewards", "step_types")


def _copies_of_many_chunks(keep_pieces: bool) -> tuple[float, EpisodeBatch]:
    """Bytes allocated from the first chunk to the answer per delivered byte,
    and the answer: ten results of 20,000 steps, each cut into 32 KiB chunks
    that arrive as messages of their own (bytes objects, as gRPC hands them
    over). One copy is 1.0; joining each result before placing its rows was
    about 2."""
    results = []
    for r in range(10):
        b = batch([5000] * 4, list(range(4 * r, 4 * r + 4)))
        chunks = encode_batch_chunks(b, 32768, batch_id=r, include_env_spec=False)
        meta = worker_pb2.EpisodeResult(
            task_id=r, episode_indices=list(range(4 * r, 4 * r + 4)), lengths=[5000] * 4
        )
        results.append((meta, [dataclasses.replace(c, data=bytes(c.data)) for c in chunks]))
    assert all(len(chunks) > 10 for _, chunks in results)
    tracemalloc.start()
    try:
        assembler = ResultAssembler(SPEC)
        add = assembler.add_kept if keep_pieces else assembler.add
        decoded = []
        for meta, chunks in results:
            for i, chunk in enumerate(chunks):
                out = add(meta if i == 0 else worker_pb2.EpisodeResult(), chunk)
            assert out is not None
            decoded.append(out)
        answer = assemble_episodes(decoded, 40)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    delivered = sum(array.nbytes for array in batch_arrays(answer).values())
    return peak / delivered, answer


@pytest.mark.parametrize("keep_pieces", [True, False])
def test_results_of_many_chunks_reach_the_answer_in_one_copy(keep_pieces: bool) -> None:
    # tracemalloc counts every thread's allocations: measured in a process of
    # its own, where no thread of an earlier test (this module's coordinators
    # and workers) allocates meanwhile (one did: 1.10 under pytest -n 2).
    measured = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.test_client_zero_copy import _copies_of_many_chunks as copies; "
            f"print(copies({keep_pieces})[0])",
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert measured.returncode == 0, measured.stderr
    copies = float(measured.stdout.split()[-1])
    if keep_pieces:
        assert copies < 1.05, copies  # the answer, and the chunks' small views
        _assert_one_owned_writable_buffer_per_field(_copies_of_many_chunks(True)[1])
    else:
        assert copies > 1.8, copies  # each result joined, then placed


def test_an_answer_let_go_lends_its_memory_to_a_later_one_never_one_still_held() -> None:
    # A sampler makes its answers' large arrays in kept buffers
    # (ReceiveBuffers.array): memory an answer the learner let go had,
    # already touched, and never memory an answer still held views.
    memory = ReceiveBuffers(64 << 20)

    def answer() -> EpisodeBatch:
        parts = [[0, 2, 4], [1, 3, 5]]  # interleaved results, runs of 5,000 steps
        results = [received(batch([5000] * 3, part), 1, 1 << 20, k) for k, part in enumerate(parts)]
        return assemble_episodes(results, 6, empty=memory.array)

    def kept_buffers(b: EpisodeBatch) -> set[int]:
        """The kept buffers the answer's arrays are in (ids: a buffer's bytes
        may move when it is found free, not its pages' contents)."""
        found = set()
        for array in batch_arrays(b).values():
            root: Any = array
            while isinstance(root, np.ndarray):
                root = root.base
            if isinstance(root, memoryview):
                found.add(id(root.obj))
        return found

    first = answer()
    kept = {name: array.copy() for name, array in batch_arrays(first).items()}
    buffers = kept_buffers(first)
    assert len(buffers) == 4  # observations, actions, rewards, log_prob: 120-240 kB each
    second = answer()
    _assert_one_owned_writable_buffer_per_field(second)
    for name, array in batch_arrays(first).items():
        assert not np.shares_memory(array, batch_arrays(second)[name]), name
        np.testing.assert_array_equal(array, kept[name], err_msg=name)  # held: not written
    made = memory.made
    del first, array  # nothing views the first answer now
    third = answer()
    _assert_one_owned_writable_buffer_per_field(third)
    assert memory.made == made  # no new buffer: the first answer's, taken again
    assert kept_buffers(third) == buffers
    for name, array in batch_arrays(third).items():
        np.testing.assert_array_equal(array, kept[name], err_msg=name)


def test_a_streamed_batch_is_read_only_views_of_the_received_message(fleet: str) -> None:
    with RemoteSampler(fleet, seed=3, timeout=60) as sampler, sampler.stream() as stream:
        views = 0
        for streamed, _ in zip(stream, range(6), strict=False):
            arrays = batch_arrays(streamed.batch)
            roots = set()
            for name, array in arrays.items():
                assert not array.flags.writeable, name
                root = array
                while isinstance(root.base, np.ndarray):
                    root = root.base
                roots.add(id(root.base))
            # Every array views one buffer: the message (or the joined result).
            assert len(roots) == 1
            views += 1
            # torch shares read-only memory too; it warns (once per process)
            # that writing to such a tensor is undefined.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tensor = torch.from_numpy(arrays["observations"])
            assert tensor.data_ptr() == arrays["observations"].ctypes.data
    assert views == 6
