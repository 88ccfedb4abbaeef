"""Pinning workers to CPUs: ``rlfleet worker --cpus`` and ``Fleet.local(cpu_affinity=...)``.

Real worker processes: every thread the kernel lists for a worker
(``/proc/PID/task/*/status``) must be allowed exactly the CPUs asked for,
gRPC's threads included once the worker has joined and sent results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from rlfleet._util.cpus import (
    allowed_cpus,
    can_pin,
    cpu_list_text,
    parse_cpu_list,
    pin_process,
)
from rlfleet.client import Fleet
from rlfleet.client._processes import worker_cpu_sets
from rlfleet.errors import ConfigError
from tests._coordinator_fakes import ROOT
from tests.fleet_processes import ProcessFleet

pytestmark = pytest.mark.timeout(120)
needs_pinning = pytest.mark.skipif(
    not can_pin(), reason="CPU pinning needs os.sched_setaffinity (Linux)"
)


def thread_cpus(pid: int) -> dict[int, str]:
    """``Cpus_allowed_list`` of every thread of process ``pid``, by thread id."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        for line in status.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found[int(tid)] = line.split(":", 1)[1].strip()
    return found


def own_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def worker_command(
    *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rlfleet worker`` with ``flags`` and no coordinator to reach; its output."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rlfleet",
            "worker",
            "--coordinator",
            "127.0.0.1:9",
            "--connect-timeout",
            "0.5",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )


# --- the CPU lists -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("3", {3}), ("0,2", {0, 2}), ("0-3", {0, 1, 2, 3}), (" 0-1, 4 ,6-7", {0, 1, 4, 6, 7})],
)
def test_cpu_lists_read_like_tasksets(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "0-", "-1", "1,,2", "0-3-5", "1.5"])
def test_a_malformed_cpu_list_is_refused_with_examples(text: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a CPU list.*e\.g\. 3, 0,2 or 0-3"):
        parse_cpu_list(text)


def test_a_backwards_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="ends before it starts; write the lower CPU first"):
        parse_cpu_list("3-1")


def test_a_cpu_number_past_any_machine_is_refused_without_building_the_range() -> None:
    with pytest.raises(ConfigError, match=r"names CPU 99999999999; CPU numbers go up to 65535"):
        parse_cpu_list("0-99999999999")


def test_cpu_sets_print_as_the_shortest_list() -> None:
    assert cpu_list_text({5, 0, 1, 2, 7, 8}) == "0-2,5,7-8"
    assert parse_cpu_list(cpu_list_text({0, 2, 3})) == {0, 2, 3}


def test_pinning_where_the_platform_cannot_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    assert not can_pin()
    with pytest.raises(ConfigError, match=r"--cpus '0'.*needs Linux.*leave it unset"):
        pin_process({0}, "--cpus '0'")
    # "auto" pins nothing there; an explicit placement is refused.
    assert worker_cpu_sets("auto", 2) == [None, None]
    with pytest.raises(ConfigError, match="needs Linux"):
        worker_cpu_sets([0], 1)


# --- rlfleet worker --cpus -------------------------------------------------------------


@needs_pinning
def test_every_thread_of_a_worker_started_with_cpus_runs_on_those_cpus(tmp_path: Path) -> None:
    cpu = own_cpus()[0]
    with ProcessFleet(tmp_path) as fleet:
        fleet.start_coordinator()
        worker = fleet.start_worker("--cpus", str(cpu), envs=2)
        fleet.wait_for_workers(1)
        batch = fleet.sampler().obtain_samples(0, 300)
        assert batch.total_steps >= 300  # joined, stepped, sent results: gRPC's threads run
        threads = thread_cpus(worker.pid)
        assert len(threads) > 3, threads  # the main thread, gRPC's, the receiver...
        assert set(threads.values()) == {str(cpu)}, threads
        assert f"pinned to CPUs {cpu} (flag)" in worker.log_text()
        # The coordinator was not asked to pin.
        assert set(thread_cpus(fleet.coordinator.pid).values()) == {cpu_list_text(own_cpus())}


@needs_pinning
def test_the_cpus_variable_pins_a_worker_like_the_flag(tmp_path: Path) -> None:
    cpu = own_cpus()[-1]
    with ProcessFleet(tmp_path) as fleet:
        fleet.start_coordinator()
        worker = fleet.start_worker(env={"RLFLEET_CPUS": str(cpu)})
        fleet.wait_for_workers(1)
        assert set(thread_cpus(worker.pid).values()) == {str(cpu)}


@needs_pinning
def test_cpus_outside_the_workers_own_set_are_refused_naming_those_it_may_use() -> None:
    outside = max(own_cpus()) + 1
    allowed = cpu_list_text(own_cpus())
    result = worker_command("--cpus", f"{own_cpus()[0]},{outside}")
    assert result.returncode == 1, result.stderr
    assert (
        f"--cpus '{own_cpus()[0]},{outside}' names CPU(s) {outside}, which this process may "
        f"not use: it may use CPUs {allowed}"
    ) in result.stderr
    assert "kubelet" in result.stderr and "give CPUs among those" in result.stderr


@needs_pinning
@pytest.mark.parametrize("value", ["0-x", "3-1", ""])
def test_a_malformed_cpus_flag_is_refused(value: str) -> None:
    result = worker_command("--cpus", value)
    assert result.returncode == 2, result.stderr
    assert "argument --cpus:" in result.stderr
    assert "CPU" in result.stderr and value.join("''") in result.stderr


@needs_pinning
def test_a_malformed_cpus_variable_is_refused_naming_it() -> None:
    result = worker_command(env={"RLFLEET_CPUS": "zero"})
    assert result.returncode == 2, result.stderr
    assert "environment variable RLFLEET_CPUS='zero' is invalid ('zero' is not a CPU list" in (
        result.stderr
    )
    assert f"this process may use: {cpu_list_text(own_cpus())}" in result.stderr


# --- Fleet.local(cpu_affinity=...) ------------------------------------------------------


@needs_pinning
def test_fleet_local_pins_each_worker_to_a_cpu_of_its_own_with_auto() -> None:
    cpus = own_cpus()
    fleet = Fleet.local(workers=2, envs_per_worker=1, seed=0, cpu_affinity="auto")
    with fleet as sampler:
        assert sampler.obtain_samples(0, 200).total_steps >= 200
        for i, worker in enumerate(fleet.workers):
            assert set(thread_cpus(worker.process.pid).values()) == {str(cpus[i % len(cpus)])}
    assert own_cpus() == cpus  # this process was left as it was


@needs_pinning
def test_fleet_local_deals_workers_round_robin_and_leaves_coordinators_unpinned() -> None:
    cpus = own_cpus()
    workers = len(cpus) + 1
    fleet = Fleet.local(
        workers=workers, envs_per_worker=1, coordinators=2, seed=0, cpu_affinity="auto"
    )
    with fleet as sampler:
        assert sampler.obtain_samples(0, 200).total_steps >= 200
        for i, worker in enumerate(fleet.workers):
            assert set(thread_cpus(worker.process.pid).values()) == {str(cpus[i % len(cpus)])}
        for coordinator in fleet.coordinators:
            assert set(thread_cpus(coordinator.process.pid).values()) == {cpu_list_text(cpus)}


@needs_pinning
def test_fleet_local_takes_each_workers_cpus_and_pins_none_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpus = own_cpus()
    placement: list[int | str] = [cpu_list_text(cpus), cpus[-1]]
    fleet = Fleet.local(workers=2, envs_per_worker=1, cpu_affinity=placement)
    with fleet:
        got = [set(thread_cpus(w.process.pid).values()) for w in fleet.workers]
        assert got == [{cpu_list_text(cpus)}, {str(cpus[-1])}]
    # The learner's own RLFLEET_CPUS (a ConfigMap meant for remote workers)
    # does not reach its local workers: the default pins nothing.
    monkeypatch.setenv("RLFLEET_CPUS", str(cpus[0]))
    fleet = Fleet.local(workers=2, envs_per_worker=1)
    with fleet:
        for worker in fleet.workers:
            assert set(thread_cpus(worker.process.pid).values()) == {cpu_list_text(cpus)}
            assert "--cpus" not in cast("list[str]", worker.process.args)


def test_auto_leaves_workers_with_env_processes_unpinned() -> None:
    assert worker_cpu_sets("auto", 2, subprocess_envs=True) == [None, None]
    assert worker_cpu_sets(None, 2) == worker_cpu_sets(False, 2) == [None, None]


@needs_pinning
@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ("0-1", r"cpu_affinity='0-1' is not a placement; give 'auto'"),
        ([], r"cpu_affinity=\[\] is not a placement"),
        ([True], r"cpu_affinity\[0\]=True is not a CPU set"),
        ([[0], "x"], r"cpu_affinity\[1\]: 'x' is not a CPU list"),
        ([-1], r"cpu_affinity\[0\]=-1 has a negative CPU number"),
    ],
)
def test_fleet_local_refuses_a_bad_placement_before_starting_anything(
    placement: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Fleet.local(workers=2, cpu_affinity=placement)  # type: ignore[arg-type]


@needs_pinning
def test_fleet_local_refuses_cpus_this_process_may_not_use() -> None:
    outside = max(allowed_cpus()) + 1
    with pytest.raises(ConfigError, match=rf"cpu_affinity\[0\]={outside} names CPU\(s\) {outside}"):
        Fleet.local(workers=1, cpu_affinity=[outside])
