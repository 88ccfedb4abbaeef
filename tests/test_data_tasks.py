"""Tasks and Cancels on a worker's lease data connection (capability ``rlfleet.data-tasks``).

A worker that agreed on ``rlfleet.data-tasks`` gets every Task and Cancel
sent after the switch marker on its Join stream on its lease data
connection, while agent and env updates stay on the stream. Real
coordinator and worker processes on loopback: the batch is the one tasks
on the Join stream give (LocalSampler's); a worker that does not agree
still gets them on its stream; a worker killed, or whose data connection
is cut, mid-request loses and repeats nothing. Against a scripted
coordinator, a real worker holds a Task made for an agent version it does
not run yet until the update arrives, and never runs a Task cancelled
before it arrived.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.conformance.data_task_checks import KitDataPort
from rlfleet.conformance.kit_messages import (
    command_bytes,
    heartbeat_of,
    hello_of,
    result_header_of,
    switch_marker,
)
from rlfleet.conformance.scripted_coordinator import ScriptedCoordinator, ScriptedSession
from rlfleet.protocol.join import TaskAssignment, TaskCancel, WorkerWelcome
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.protocol.updates import AgentChange, EnvChange, PolicyChoice
from rlfleet.transport import rpc as _rpc
from tests._coordinator_fakes import Answer, assert_same_batch, sample
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    Proc,
    ProcessFleet,
    env_flags,
    local_episodes,
    run_in_thread,
)
from tests.test_results_switch import late_data_port, start_late_worker
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

SEED = 29
EPISODES = 2  # SAMPLE_MODE_EPISODES
#: What a worker logs at the first Task it gets on its data connection.
TASKS_ON_DATA = "this session's tasks come on the lease data channel"


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as fleet:
        yield fleet


def test_tasks_on_the_data_connection_give_the_batch_tasks_on_the_join_stream_give(
    processes: ProcessFleet,
) -> None:
    # The same request (seed and index) answered once by a worker that takes
    # its tasks on its data connection, once by one that takes them on its
    # Join stream (--lease-slots 0: no data connection): the same batch,
    # LocalSampler's.
    processes.start_coordinator(*env_flags(SLOW_ENV))
    on_data = processes.start_worker(envs=3, imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(1)
    request = dict(mode=EPISODES, amount=12, seed=SEED, request_index=1)
    first: Answer = sample(processes.address, timeout=120, **request)
    assert TASKS_ON_DATA in on_data.log_text()
    processes.terminate(on_data)
    processes.wait_until(lambda: not processes.status().workers or None, what="no worker")
    on_join = processes.start_worker("--lease-slots", "0", envs=3, imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(1)
    second: Answer = sample(processes.address, timeout=120, **request)
    assert "tasks come on" not in on_join.log_text()
    assert_same_batch(first.batch, second.batch)
    assert_same_batch(first.batch, local_episodes(SLOW_ENV_TWIN, 12, 12, seed=SEED)[1])


def test_a_worker_without_the_capability_and_one_with_it_share_a_request(
    processes: ProcessFleet,
) -> None:
    processes.start_coordinator(*env_flags(SLOW_ENV))
    with_it = processes.start_worker(envs=2, imports=[TEST_ENVS_MODULE])
    without = processes.start_worker("--lease-slots", "0", envs=2, imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(2)
    answer: Answer = sample(
        processes.address, timeout=120, mode=EPISODES, amount=16, seed=SEED, request_index=0
    )
    assert_same_batch(answer.batch, local_episodes(SLOW_ENV_TWIN, 16, seed=SEED)[0])
    assert TASKS_ON_DATA in with_it.log_text()
    assert "tasks come on" not in without.log_text()


def test_a_worker_killed_mid_request_with_its_tasks_on_the_data_connection_loses_nothing(
    processes: ProcessFleet,
) -> None:
    processes.start_coordinator(*env_flags(SLOW_ENV))
    for _ in range(3):
        processes.start_worker(envs=2, imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(3)
    victim = processes.workers[0]
    answer = run_in_thread(
        lambda: sample(processes.address, mode=EPISODES, amount=30, seed=SEED, request_index=0)
    )
    processes.wait_for_log(victim, TASKS_ON_DATA)
    processes.wait_until(lambda: processes.units_on(victim.name), what="units on the victim")
    processes.kill(victim)
    result: Answer = answer(120)
    assert_same_batch(result.batch, local_episodes(SLOW_ENV_TWIN, 30, seed=SEED)[0])
    assert result.footer.num_episodes == 30
    assert result.footer.reassigned_units >= 1


def test_a_data_connection_cut_mid_request_loses_and_repeats_nothing(
    processes: ProcessFleet,
) -> None:
    # The worker's data connection (its tasks' carrier) breaks while it holds
    # units; its Join stream lives. The coordinator writes the session off
    # and re-runs what did not come back; the worker rejoins and helps finish.
    coordinator = processes.start_coordinator(*env_flags(SLOW_ENV))
    with late_data_port(processes) as data_port:
        data_port.open()
        victim = start_late_worker(processes)
        processes.start_worker(envs=2, imports=[TEST_ENVS_MODULE])
        processes.wait_for_workers(2)
        answer = run_in_thread(
            lambda: sample(processes.address, mode=EPISODES, amount=30, seed=SEED, request_index=0)
        )
        processes.wait_for_log(victim, TASKS_ON_DATA)
        processes.wait_until(lambda: processes.units_on(victim.name), what="units on the victim")
        data_port.close()  # cuts the connection
        # Written off by whichever break the coordinator sees first: the data
        # connection's, or the Join stream's the worker ends on seeing it.
        processes.wait_for_log(coordinator, f"worker '{victim.name}' removed")
        result: Answer = answer(120)
    assert_same_batch(result.batch, local_episodes(SLOW_ENV_TWIN, 30, seed=SEED)[0])
    assert result.footer.num_episodes == 30
    assert result.footer.reassigned_units >= 1


# --- a real worker against a scripted coordinator ------------------------------------------


def _command(command: EnvChange | AgentChange | TaskAssignment | TaskCancel) -> bytes:
    return command_bytes(command, unit_columns=True)[1]


def _task(task_id: int, agent_version: int, indices: range) -> TaskAssignment:
    return TaskAssignment(
        task_id=task_id,
        request_id=1,
        mode=int(Mode.EPISODES),
        agent_version=agent_version,
        env_generation=1,
        units=UnitColumns(list(indices), [7 + i for i in indices], [11 + i for i in indices]),
    )


def _results(session: ScriptedSession, count: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """The next ``count`` results' (task, agent version, episodes), skipping other messages."""
    got: list[tuple[int, int, tuple[int, ...]]] = []
    while len(got) < count:
        event = session.receive(timeout=60)
        assert event is not None and event.kind not in ("closed", "broken"), event
        if event.kind == "result" and event.message is not None:
            header = result_header_of(event.message)
            if header.episode_indices:  # chunk 0's metadata
                got.append((header.task_id, header.agent_version, header.episode_indices))
        assert event.kind != "error", event
    return got


def _until(session: ScriptedSession, kind: str) -> None:
    while True:
        event = session.receive(timeout=60)
        assert event is not None and event.kind not in ("closed", "broken", "result", "error"), (
            event
        )
        if event.kind == kind:
            return


@pytest.fixture
def scripted(processes: ProcessFleet) -> Iterator[tuple[ScriptedSession, KitDataPort, Proc]]:
    """A real worker joined to a scripted coordinator that granted data tasks
    (not data results: they come on the Join stream), its data connection
    accepted, env generation 1 built, the switch marker sent."""
    with ScriptedCoordinator() as coordinator:
        address = coordinator.start()
        data = KitDataPort()
        try:
            worker = processes.start_worker(envs=2, coordinator=address)
            session = coordinator.accept(timeout=60)
            assert session is not None
            hello = session.receive(timeout=60)
            assert hello is not None and hello.message is not None
            assert _rpc.DATA_TASKS_CAPABILITY in hello_of(hello.message).capabilities
            welcome = WorkerWelcome(
                protocol_version=_rpc.PROTOCOL_VERSION,
                worker_id=1,
                name="scripted",
                heartbeat_interval_seconds=1.0,
                heartbeat_timeout_seconds=30.0,
                max_message_bytes=1 << 24,
                capabilities=(
                    "rlfleet.episodes",
                    _rpc.UNIT_COLUMNS_CAPABILITY,
                    _rpc.LEASE_CAPABILITY,
                    _rpc.DATA_TASKS_CAPABILITY,
                ),
                first_stream=0,
                coordinator_id="scripted",
                lease_data=(data.port, b"ticket"),
            )
            session.send(command_bytes(welcome)[1])
            data.accept(timeout=30)
            session.send(_command(EnvChange(generation=1, env_id="CartPole-v1")))
            _until(session, "env_ready")
            session.send(switch_marker())
            yield session, data, worker
        finally:
            data.close()


def test_a_task_for_an_agent_version_not_yet_applied_waits_for_its_update(
    processes: ProcessFleet,
    scripted: tuple[ScriptedSession, KitDataPort, Proc],
) -> None:
    session, data, worker = scripted
    # Task 1 is made for agent version 1 and overtakes its update: the
    # worker (on version 0) holds it and runs it once version 1 is applied.
    data.send(_command(_task(1, agent_version=1, indices=range(4))))
    processes.wait_for_log(worker, TASKS_ON_DATA)  # it reached the worker's task path
    session.send(_command(AgentChange(version=1, policy=PolicyChoice("random", "{}"))))
    _until(session, "agent_ready")  # no result before it (_until fails on one)
    got = _results(session, 1)
    assert {version for _, version, _ in got} == {1}
    episodes = set(got[0][2])
    while len(episodes) < 4:
        more = _results(session, 1)
        assert more[0][:2] == (1, 1)
        episodes |= set(more[0][2])
    assert episodes == {0, 1, 2, 3}


def test_a_task_cancelled_before_it_arrived_never_runs(
    scripted: tuple[ScriptedSession, KitDataPort, Proc],
) -> None:
    session, data, _ = scripted
    data.send(_command(TaskCancel(5)))  # the whole task 5, not seen yet
    data.send(_command(TaskCancel(6, (1,))))  # one episode of task 6
    data.send(_command(_task(5, agent_version=-1, indices=range(3))))
    data.send(_command(_task(6, agent_version=-1, indices=range(3))))
    # Episodes run in the order they came: once task 6's two episodes are
    # back, task 5's (ahead of them) would have been too.
    episodes: set[int] = set()
    while len(episodes) < 2:
        for task_id, _, indices in _results(session, 1):
            assert task_id == 6
            episodes |= set(indices)
    assert episodes == {0, 2}
    wait_until(
        lambda: any(
            beat.message is not None
            and heartbeat_of(beat.message).queued_units == 0
            and heartbeat_of(beat.message).active_envs == 0
            for beat in session.heartbeats[-1:]
        ),
        "the worker idle",
    )


def test_a_task_behind_the_applied_update_is_dropped_without_an_error(
    scripted: tuple[ScriptedSession, KitDataPort, Proc],
) -> None:
    session, data, _ = scripted
    # Version 1 is applied; a Task made for version 0 (sent before its
    # Cancel and the update, overtaken by the update) can never be run as
    # asked: dropped, as a task held when an update arrives, with no error.
    session.send(_command(AgentChange(version=1, policy=PolicyChoice("random", "{}"))))
    _until(session, "agent_ready")
    data.send(_command(_task(8, agent_version=0, indices=range(3))))
    data.send(_command(_task(9, agent_version=1, indices=range(2))))
    episodes: set[int] = set()
    while len(episodes) < 2:
        for task_id, version, indices in _results(session, 1):
            assert (task_id, version) == (9, 1)
            episodes |= set(indices)
    assert episodes == {0, 1}


def test_a_refill_brings_back_units_an_earlier_cancel_of_its_task_took(
    scripted: tuple[ScriptedSession, KitDataPort, Proc],
) -> None:
    session, data, _ = scripted
    # A Cancel of a task the worker has seen is not kept for later Tasks of
    # that id: a refill may bring back units it took (re-queued after the
    # worker they moved to was lost), and they must run.
    data.send(_command(_task(10, agent_version=-1, indices=range(2))))
    data.send(_command(TaskCancel(10, (5,))))
    data.send(_command(_task(10, agent_version=-1, indices=range(5, 7))))
    episodes: set[int] = set()
    while len(episodes) < 4:
        for task_id, _, indices in _results(session, 1):
            assert task_id == 10
            episodes |= set(indices)
    assert episodes == {0, 1, 5, 6}
