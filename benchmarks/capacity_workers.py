"""The capacity benchmark's synthetic workers and the shapes of the results they send.

A :class:`SyntheticWorker` joins a real coordinator over the real Join
protocol, acknowledges env and agent updates without building a policy, and
answers each task at once with results serialized once
(:class:`ResultTemplate`; fragment windows: :mod:`benchmarks.capacity_windows`).
``python -m benchmarks.capacity --serve-worker ADDRESS`` runs one
(:mod:`benchmarks.capacity` has what it measures).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from benchmarks.capacity_payloads import ZerosPayload
from benchmarks.capacity_windows import WindowTemplate
from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.envs import EnvConfig
from rlfleet.errors import RlfleetError
from rlfleet.protocol.join import (
    AgentApplied,
    DrainOrder,
    TaskAssignment,
    WorkerBeat,
    WorkerHello,
    WorkerLeaving,
    WorkerWelcome,
)
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.lease_channel import DATA_DIAL_SECONDS, LeaseDataLink, dial
from rlfleet.v1 import worker_pb2
from rlfleet.wire import DEFAULT_CHUNK_BYTES, serialize_with_chunk
from rlfleet.wire.batches import payload_kind
from rlfleet.wire.chunks import DATA_CHANNEL_CHUNK_BYTES, chunk_payload
from rlfleet.wire.leases import data_hello
from rlfleet.wire.results import EPISODE_INFO_KEYS
from rlfleet.worker._connection import JoinStream, StreamEnded
from rlfleet.worker._join_messages import DataChannelWork, env_built, parse_lease_frame

#: The Atari-sized env: 84x84x4 uint8 frames, 6 actions; registered on import.
FRAMES_ID = "rlfleet-bench/Frames-v0"
#: Room left in a message for the EpisodeResult around a chunk (as the worker leaves).
_ENVELOPE_ALLOWANCE = 64
#: Longest wait for a process to start, or for the workers' counts to settle.
START_SECONDS = 120.0
#: Where the synthetic workers' results travel.
CARRIERS = ("join", "data")


class FramesEnv(gym.Env[np.ndarray, np.int64]):
    """Atari's shape without an emulator: black 84x84x4 frames, 100-step episodes."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, shape=(84, 84, 4), dtype=np.uint8)
        self.action_space = spaces.Discrete(6)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros((84, 84, 4), np.uint8), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        return np.zeros((84, 84, 4), np.uint8), 1.0, self._t >= 100, False, {}


if FRAMES_ID not in gym.registry:
    gym.register(FRAMES_ID, entry_point=f"{__name__}:FramesEnv")


@dataclasses.dataclass(frozen=True)
class Shape:
    """One step size and the requests and results it is measured with.

    Attributes:
        name: How the report names it.
        env_id: The coordinator's env.
        episode_steps: Steps of every synthetic episode.
        result_episodes: Episodes per result, one setting per value.
        request_steps: Steps per request, one setting per value.
        capacity_steps: The coordinator's ``--capacity-steps`` (what a
            synthetic worker, which answers a whole task at once, holds).
        fragment_lengths: Fragments mode (``obtain_fragments``), one setting
            per value: each result is a window of ``Hello.num_envs`` streams
            of this many steps, cut from ``episode_steps``-step episodes
            (``result_episodes`` unused). Empty: episodes mode.
    """

    name: str
    env_id: str
    episode_steps: int
    result_episodes: tuple[int, ...]
    request_steps: tuple[int, ...]
    capacity_steps: int
    fragment_lengths: tuple[int, ...] = ()


#: The default run: about a minute on a quiet 2-core machine.
SHAPES = (
    Shape("cartpole", "CartPole-v1", 100, (4, 80), (40_000, 160_000), 16_384),
    Shape("atari", FRAMES_ID, 25, (1, 5), (1_000, 4_000), 2_048),
)
#: Fragment windows (RLlib/SB3/CleanRL-style rollouts): not in the default run.
FRAGMENT_SHAPES = (
    Shape("cartpole-fragments", "CartPole-v1", 100, (), (40_000, 160_000), 16_384, (32, 128)),
)


# --- the synthetic worker ------------------------------------------------------------


class ResultTemplate:
    """A result of ``count`` episodes of ``steps`` steps, serialized once.

    The batch holds valid values of ``spec``'s spaces (zeros, which every
    space used here contains). Its five episode_infos columns are located in
    the serialized bytes once; :meth:`messages` writes a task's values there
    and cuts the same bytes into chunk messages.
    """

    def __init__(self, spec: EnvSpec, steps: int, count: int) -> None:
        total = steps * count
        step_types = np.full(total, int(StepType.MID), np.uint8)
        step_types[::steps] = int(StepType.FIRST)
        step_types[steps - 1 :: steps] = int(StepType.TERMINAL)
        infos = {key: np.arange(count, dtype=np.int64) for key in EPISODE_INFO_KEYS}
        zeros = ZerosPayload(
            spec, infos, step_types, np.full(count, steps, np.int64), EPISODE_INFO_KEYS
        )
        batch = zeros.batch
        self.lengths = [steps] * count
        self.payload = zeros.payload
        self.infos = zeros.columns
        self.step_bytes = (
            sum(
                np.asarray(getattr(batch, name)).nbytes
                for name in ("observations", "actions", "rewards", "step_types")
            )
            / total
        )

    def messages(
        self,
        units: Sequence[tuple[int, int, int]],
        *,
        task: TaskAssignment,
        worker_id: int,
        agent_version: int,
        env_generation: int,
        batch_id: int,
        max_message_bytes: int,
        chunk_bytes: int,
    ) -> list[bytes]:
        """The serialized WorkerMessages of one result: ``units`` run by this template."""
        indices = [unit[0] for unit in units]
        columns = self.infos
        columns["episode_index"][:] = indices
        columns["env_seed"][:] = [unit[1] for unit in units]
        columns["policy_seed"][:] = [unit[2] for unit in units]
        columns["agent_version"][:] = agent_version
        columns["worker"][:] = worker_id
        meta = worker_pb2.EpisodeResult(
            task_id=task.task_id,
            episode_indices=indices,
            lengths=self.lengths,
            agent_version=agent_version,
            env_generation=env_generation,
        )
        return _result_messages(
            self.payload,
            meta,
            batch_id=batch_id,
            max_message_bytes=max_message_bytes,
            chunk_bytes=chunk_bytes,
        )


def _result_messages(
    payload: bytearray, meta: Any, *, batch_id: int, max_message_bytes: int, chunk_bytes: int
) -> list[bytes]:
    """A result's serialized WorkerMessages: ``payload`` cut into chunks of at
    most ``chunk_bytes``, ``meta`` on the first."""
    first = worker_pb2.WorkerMessage(result=meta)
    rest = worker_pb2.WorkerMessage(result=worker_pb2.EpisodeResult(task_id=meta.task_id))
    room = min(chunk_bytes, max_message_bytes - meta.ByteSize() - _ENVELOPE_ALLOWANCE)
    chunks = chunk_payload(
        memoryview(payload), kind=_EPISODE_KIND, max_bytes=room, batch_id=batch_id
    )
    return [
        serialize_with_chunk(first if chunk.index == 0 else rest, _rpc.WORKER_CHUNK_PATH, chunk)
        for chunk in chunks
    ]


_EPISODE_KIND = payload_kind(EpisodeBatch)


def _read_tasks(link: LeaseDataLink, inbox: queue.SimpleQueue[Any]) -> None:
    """Puts the Tasks and Cancels of the data connection in the inbox, as they come.

    Not held for the switch marker nor for updates, as the Python worker
    holds them: this worker answers a task whatever came before it.
    """
    try:
        while (payload := link.receive()) is not None:
            command = parse_lease_frame(payload, tasks=True)
            if isinstance(command, DataChannelWork):
                inbox.put(command.work)
    except (OSError, RlfleetError):
        pass  # the session's end: the Join stream says why


class SyntheticWorker:
    """A worker that answers tasks with pre-encoded results over a real Join stream.

    Args:
        address: The coordinator.
        num_envs: ``Hello.num_envs`` (how much work the coordinator hands it).
        episode_steps: Steps of every episode it returns.
        control: File holding the episodes per result, read at each task.
        counts: File it writes ``results messages tasks`` to after each
            result (tasks: the Task messages it got, refills included).
        carrier: ``join``: results on the Join stream; ``data``: on the lease
            data connection (framed TCP), written from this thread.
    """

    def __init__(
        self,
        address: str,
        *,
        num_envs: int,
        episode_steps: int,
        control: Path,
        counts: Path,
        carrier: str = "join",
    ) -> None:
        self.address = address
        self.carrier = carrier
        self._link: LeaseDataLink | None = None
        # As the Python worker: a result on the data channel is cut into its
        # larger chunks (rlfleet.wire.chunks.DATA_CHANNEL_CHUNK_BYTES).
        self._chunk_bytes = DATA_CHANNEL_CHUNK_BYTES if carrier == "data" else DEFAULT_CHUNK_BYTES
        self.num_envs = num_envs
        self.episode_steps = episode_steps
        self.control = control
        self.counts = counts
        self._templates: dict[int, ResultTemplate] = {}
        self._windows: dict[int, WindowTemplate] = {}
        self._steps_run = self._fragment = 0  # every stream in lockstep
        self._spec: EnvSpec | None = None
        self._generation = 0
        self._version = 0
        self._batch_ids = itertools.count(1)
        self._results = 0
        self._messages = 0
        self._tasks = 0

    def run(self) -> int:
        """Serves until the coordinator ends the stream or drains it; returns the exit code."""
        channel = _rpc.open_channel(self.address, security=None)
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stream = JoinStream(channel, inbox)
        on_data = (
            _rpc.LEASE_CAPABILITY,
            _rpc.DATA_RESULTS_CAPABILITY,
            _rpc.DATA_TASKS_CAPABILITY,
            _rpc.DATA_HEARTBEATS_CAPABILITY,
        )
        stream.send(
            WorkerHello(
                protocol_version=_rpc.PROTOCOL_VERSION,
                # As the Python worker: units as columns (their encoding is the
                # coordinator's per-request cost), results on the carrier asked for.
                capabilities=(
                    "rlfleet.episodes",
                    _rpc.UNIT_COLUMNS_CAPABILITY,
                    *(on_data if self.carrier == "data" else ()),
                ),
                num_envs=self.num_envs,
                host=socket.gethostname(),
                pid=os.getpid(),
                implementation="rlfleet-capacity-bench",
            )
        )
        try:
            return self._serve(stream, inbox)
        finally:
            if self._link is not None:
                self._link.close()
            stream.cancel()
            channel.close()

    def _serve(self, stream: JoinStream, inbox: queue.SimpleQueue[Any]) -> int:
        try:
            welcome = inbox.get(timeout=START_SECONDS)
        except queue.Empty:
            print(f"no Welcome from {self.address} within {START_SECONDS:g} s", file=sys.stderr)
            return 1
        if not isinstance(welcome, WorkerWelcome):
            print(f"expected Welcome, got {welcome!r}", file=sys.stderr)
            return 1
        if self.carrier == "data":
            if (
                welcome.lease_data is None
                or _rpc.DATA_RESULTS_CAPABILITY not in welcome.capabilities
            ):
                print("the coordinator offers no data channel for results", file=sys.stderr)
                return 1
            port, ticket = welcome.lease_data
            self._link = dial(
                self.address.rpartition(":")[0],
                port,
                data_hello(ticket),
                tls=None,
                timeout=DATA_DIAL_SECONDS,
                max_frame_bytes=welcome.max_message_bytes,
            )
            if _rpc.DATA_TASKS_CAPABILITY in welcome.capabilities:
                threading.Thread(
                    target=_read_tasks,
                    args=(self._link, inbox),
                    name="capacity-worker-data-tasks",
                    daemon=True,
                ).start()
        beat_every = welcome.heartbeat_interval_seconds
        next_beat = time.monotonic() + beat_every
        # As the Python worker: on the data connection when both agreed.
        beats_on_data = (
            self._link is not None and _rpc.DATA_HEARTBEATS_CAPABILITY in welcome.capabilities
        )
        beat = worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()).SerializeToString()
        while True:
            try:
                item = inbox.get(timeout=max(next_beat - time.monotonic(), 0.0))
            except queue.Empty:
                if beats_on_data and self._link is not None:
                    self._link.send(beat)
                else:
                    stream.send(WorkerBeat())
                next_beat = time.monotonic() + beat_every
                continue
            if isinstance(item, StreamEnded):
                return 0
            if isinstance(item, DrainOrder):
                stream.send(WorkerLeaving("drained"))
                if self._link is not None:  # the end-of-results marker
                    marker = worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason="drained"))
                    self._link.send(marker.SerializeToString())
                stream.close_send()
                return 0
            if isinstance(item, TaskAssignment):
                self._tasks += 1
            if isinstance(item, TaskAssignment) and self._link is not None:
                for messages in self._results_of(item, welcome):
                    self._link.send_frames(messages)
                continue
            for message in self._answer(item, welcome):
                stream.send(message)

    def _answer(self, item: object, welcome: WorkerWelcome) -> Iterator[Any]:
        if isinstance(item, EnvChange):
            kwargs = json.loads(item.kwargs_json or "{}")
            config = EnvConfig(item.env_id, kwargs, item.max_episode_length)
            self._spec = config.env_spec()
            self._templates.clear()
            self._windows.clear()
            self._generation = item.generation
            yield env_built(item.generation, self._spec)
        elif isinstance(item, AgentChange):
            self._version = item.version
            yield AgentApplied(item.version)
        elif isinstance(item, TaskAssignment):
            for messages in self._results_of(item, welcome):
                yield from messages
        # Cancels need nothing: every task was answered whole when it came.

    def _results_of(self, task: TaskAssignment, welcome: WorkerWelcome) -> Iterator[list[bytes]]:
        """Each result's messages: a task's episodes, or its windows."""
        if self._spec is None:
            raise RuntimeError(f"task {task.task_id} came before any EnvUpdate")
        results = (
            self._windows_of(task, welcome)
            if task.mode == int(Mode.FRAGMENTS)
            else self._episodes_of(task, welcome)
        )
        for messages in results:
            yield messages  # counted once sent
            self._results += 1
            self._messages += len(messages)
            self.counts.write_text(f"{self._results} {self._messages} {self._tasks}")

    def _episodes_of(self, task: TaskAssignment, welcome: WorkerWelcome) -> Iterator[list[bytes]]:
        """An EPISODES task's results, of the episodes per result the control file says."""
        assert self._spec is not None
        per_result = max(int(self.control.read_text()), 1)
        version = task.agent_version if task.agent_version >= 0 else self._version
        units = sorted(task.units)
        for start in range(0, len(units), per_result):
            group = units[start : start + per_result]
            template = self._templates.get(len(group))
            if template is None:
                template = ResultTemplate(self._spec, self.episode_steps, len(group))
                self._templates[len(group)] = template
            messages = template.messages(
                group,
                task=task,
                worker_id=welcome.worker_id,
                agent_version=version,
                env_generation=self._generation,
                batch_id=next(self._batch_ids),
                max_message_bytes=welcome.max_message_bytes,
                chunk_bytes=self._chunk_bytes,
            )
            yield messages

    def _windows_of(self, task: TaskAssignment, welcome: WorkerWelcome) -> Iterator[list[bytes]]:
        """A FRAGMENTS task's windows. Its streams stay on this worker (no faults
        here): each starts at episode 0 and runs in lockstep with the others."""
        assert self._spec is not None
        template = self._windows.get(task.fragment_length)
        if template is None:
            template = WindowTemplate(
                self._spec,
                streams=self.num_envs,
                episode_steps=self.episode_steps,
                length=task.fragment_length,
            )
            self._windows[task.fragment_length] = template
        streams = task.streams or tuple(
            range(welcome.first_stream, welcome.first_stream + self.num_envs)
        )
        version = task.agent_version if task.agent_version >= 0 else self._version
        for _ in range(task.rounds):
            payload, indices, lengths, self._fragment = template.window(
                streams,
                np.zeros(len(streams), np.int64),
                start=self._steps_run,
                fragment=self._fragment,
                base_seed=task.base_seed,
                agent_version=version,
                worker_id=welcome.worker_id,
            )
            self._steps_run += task.fragment_length
            messages = _result_messages(
                payload,
                worker_pb2.EpisodeResult(
                    task_id=task.task_id,
                    episode_indices=indices,
                    lengths=lengths,
                    agent_version=version,
                    env_generation=self._generation,
                ),
                batch_id=next(self._batch_ids),
                max_message_bytes=welcome.max_message_bytes,
                chunk_bytes=self._chunk_bytes,
            )
            yield messages
