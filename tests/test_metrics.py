"""Prometheus metrics of a real fleet: scraped over HTTP, parsed by prometheus_client.

Coordinator and workers run as processes with ``--metrics-listen``; the
tests sample, kill workers and break envs, and check that the scraped
values move as they must (docs/operations.md lists the metrics).
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._coordinator_fakes import sample
from tests.fleet_processes import (
    SLOW_ENV,
    TEST_ENVS_MODULE,
    ProcessFleet,
    env_flags,
    free_port,
    run_in_thread,
)

pytestmark = pytest.mark.timeout(240)

EPISODES = 2  # SAMPLE_MODE_EPISODES
STEPS = 1  # SAMPLE_MODE_STEPS


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:PORT/metrics``, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exported; got {sorted(k[0] for k in samples)}"
    return samples[key]


def scraped(fleet: ProcessFleet, port: int, check: object) -> Samples:
    """Scrapes until ``check(samples)`` is true (heartbeat-fed values lag a beat)."""
    assert callable(check)
    return fleet.wait_until(
        lambda: (s if check(s) else None) if (s := scrape(port)) else None,
        what=f"metrics on port {port} to move",
        timeout=30,
    )


def test_metrics_move_with_sampling(fleet: ProcessFleet) -> None:
    coordinator_port, worker_port = free_port(), free_port()
    # The ports come the ways an operator gives them: a config file, a variable.
    config = fleet.directory / "coordinator.toml"
    config.write_text(f'[coordinator]\nmetrics-listen = "127.0.0.1:{coordinator_port}"\n')
    coordinator = fleet.start_coordinator(
        "--config", str(config), "--health-listen", f"127.0.0.1:{free_port()}"
    )
    fleet.start_worker(envs=2, env={"RLFLEET_METRICS_LISTEN": f"127.0.0.1:{worker_port}"})
    fleet.wait_for_workers(1)
    # The log says where to find every port.
    log = coordinator.log_text()
    assert f"serving Prometheus metrics on http://127.0.0.1:{coordinator_port}/metrics" in log
    assert "serving grpc.health.v1 in plaintext on 127.0.0.1:" in log

    before = scrape(coordinator_port)
    assert value(before, "rlfleet_workers", state="idle") == 1
    assert value(before, "rlfleet_workers", state="busy") == 0
    assert value(before, "rlfleet_episodes_total") == 0
    assert value(before, "rlfleet_queue_depth") == 0
    assert value(before, "rlfleet_fleet_worker_envs", worker="w0") == 2

    answer = sample(fleet.address, mode=EPISODES, amount=6, seed=3, request_index=0)
    steps = int(answer.batch.lengths.sum())

    after = scraped(
        fleet, coordinator_port, lambda s: value(s, "rlfleet_fleet_env_steps_total") >= steps
    )
    assert value(after, "rlfleet_episodes_total") == 6
    assert value(after, "rlfleet_env_steps_total") == steps
    assert value(after, "rlfleet_result_bytes_total") > 0
    assert value(after, "rlfleet_results_total") == len(answer.results)
    assert value(after, "rlfleet_units_dispatched_total") >= 6
    assert value(after, "rlfleet_fleet_worker_env_steps_total", worker="w0") >= steps
    # Every episode ran with the newest (only) agent version: lag 0.
    assert value(after, "rlfleet_policy_lag_versions_count") == 6
    assert value(after, "rlfleet_policy_lag_versions_bucket", le="0.0") == 6
    assert value(after, "rlfleet_policy_lag_versions_sum") == 0
    latency = "rlfleet_learner_request_duration_seconds_count"
    assert value(after, latency, method="Sample", outcome="ok") == 1
    assert value(after, "rlfleet_units_in_flight") == 0

    worker = scraped(
        fleet, worker_port, lambda s: value(s, "rlfleet_worker_env_steps_total") >= steps
    )
    assert value(worker, "rlfleet_worker_episodes_sent_total") == 6
    assert value(worker, "rlfleet_worker_results_sent_total") >= 1
    assert value(worker, "rlfleet_worker_joined") == 1
    assert value(worker, "rlfleet_worker_envs") == 2
    assert value(worker, "rlfleet_worker_sessions_total") == 1


def test_a_killed_worker_shows_as_removed_and_requeued(fleet: ProcessFleet) -> None:
    port = free_port()
    fleet.start_coordinator("--metrics-listen", f"127.0.0.1:{port}", *env_flags(SLOW_ENV))
    for _ in range(2):
        fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(2)
    victim = fleet.workers[0]

    answer = run_in_thread(
        lambda: sample(fleet.address, mode=EPISODES, amount=16, seed=1, request_index=0)
    )
    fleet.wait_until(lambda: fleet.units_on(victim.name), what="units on the victim")
    fleet.kill(victim)
    result = answer(120)

    samples = scrape(port)
    assert value(samples, "rlfleet_units_requeued_total") == result.footer.reassigned_units >= 1
    removed = {
        dict(labels)["code"]: count
        for (name, labels), count in samples.items()
        if name == "rlfleet_workers_removed_total"
    }
    assert sum(removed.values()) == 1 and "OK" not in removed, removed
    assert value(samples, "rlfleet_episodes_total") == 16
    assert value(samples, "rlfleet_workers", state="idle") == 1


def test_an_env_error_is_counted_by_kind_on_both_sides(fleet: ProcessFleet) -> None:
    coordinator_port, worker_port = free_port(), free_port()
    crashing = ("--env", "rlfleet/Crashing-v0", "--env-kwargs", '{"crash_at_step": 2}')
    fleet.start_coordinator("--metrics-listen", f"127.0.0.1:{coordinator_port}", *crashing)
    fleet.start_worker(
        "--metrics-listen",
        f"127.0.0.1:{worker_port}",
        "--env-restarts-total",
        "0",
        imports=[TEST_ENVS_MODULE],
    )
    fleet.wait_for_workers(1)

    with pytest.raises(grpc.RpcError, match=r"(?i)crash"):
        sample(fleet.address, mode=EPISODES, amount=2, seed=1, request_index=0)

    coordinator = scrape(coordinator_port)
    assert value(coordinator, "rlfleet_errors_total", kind="env_crashed") == 1
    assert (
        value(
            coordinator,
            "rlfleet_learner_request_duration_seconds_count",
            method="Sample",
            outcome="error",
        )
        == 1
    )
    worker = scrape(worker_port)
    assert value(worker, "rlfleet_worker_errors_total", kind="env_crashed") == 1


def test_a_bad_or_taken_metrics_address_is_a_clear_error() -> None:
    from prometheus_client import CollectorRegistry

    from rlfleet.cli._metrics_port import MetricsPort
    from rlfleet.errors import ConfigError

    with pytest.raises(ConfigError, match="--metrics-listen '9090' must be HOST:PORT"):
        MetricsPort("9090", CollectorRegistry())
    first = MetricsPort("127.0.0.1:0", CollectorRegistry())
    try:
        with pytest.raises(ConfigError, match="pick another --metrics-listen port"):
            MetricsPort(f"127.0.0.1:{first.port}", CollectorRegistry())
    finally:
        first.stop()


def test_refused_tokens_are_counted_by_code() -> None:
    from rlfleet.client import RemoteSampler
    from rlfleet.coordinator import CoordinatorConfig, serve
    from rlfleet.errors import RlfleetError
    from rlfleet.security import ServerSecurity
    from rlfleet.security.auth import RoleTokens
    from rlfleet.security.tokens import Token

    tokens = RoleTokens(
        Token("w0rker-5ecret-0123456789abcdef"), Token("le4rner-5ecret-0123456789ab")
    )
    config = CoordinatorConfig(listen="127.0.0.1:0", security=ServerSecurity(tokens=tokens))
    with serve(config) as server:
        stranger = Token("5tranger-5ecret-0123456789abcdef")
        for _ in range(2):
            with (
                RemoteSampler(server.address, token=stranger, timeout=10) as sampler,
                pytest.raises(RlfleetError),
            ):
                sampler.status()
        counted = server.coordinator.metrics.registry.get_sample_value(
            "rlfleet_errors_total", {"kind": "auth_unauthenticated"}
        )
        assert counted == 2


def test_policy_lag_counts_each_episode_of_a_result_as_a_histogram_would() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from rlfleet.coordinator.metrics import LAG_BUCKETS, CoordinatorMetrics

    metrics = CoordinatorMetrics()
    registry = CollectorRegistry()
    reference = Histogram(
        "rlfleet_policy_lag_versions", "reference", buckets=LAG_BUCKETS, registry=registry
    )
    for lag, episodes in ((0, 3), (4, 2), (5, 1), (100, 2), (1000, 1), (0, 0)):
        metrics.forwarded(episodes=episodes, payload_bytes=100, lag=lag)
        for _ in range(episodes):
            reference.observe(lag)

    def samples(text: bytes) -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels.get("le", "")): s.value
            for family in text_string_to_metric_families(text.decode())
            if family.name == "rlfleet_policy_lag_versions"
            for s in family.samples
            if not s.name.endswith("_created")
        }

    got = samples(generate_latest(metrics.registry))
    assert got == samples(generate_latest(registry))
    assert got[("rlfleet_policy_lag_versions_count", "")] == 9


def test_forwarded_results_and_bytes_are_exported_as_prometheus_counters_would_be() -> None:
    """Counted as plain numbers under one lock per batch, the forwarded
    results and their bytes read as ``Counter``s of the same names would:
    the same families, help texts, types and samples (``_created`` too)."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from rlfleet.coordinator.metrics import CoordinatorMetrics

    metrics = CoordinatorMetrics()
    registry = CollectorRegistry()
    names = {"rlfleet_results", "rlfleet_result_bytes"}
    helps = {
        family.name: family.documentation
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        if family.name in names
    }
    assert set(helps) == names
    reference = {name: Counter(name, helps[name], registry=registry) for name in names}
    for results, payload_bytes in ((1, 100), (3, 12_000), (2, 0)):
        metrics.forwarded_many(results, payload_bytes, {0: results})
        reference["rlfleet_results"].inc(results)
        reference["rlfleet_result_bytes"].inc(payload_bytes)

    def families(text: bytes) -> dict[str, tuple[str, str, dict[str, float | None]]]:
        return {
            family.name: (
                family.type,
                family.documentation,
                {s.name: None if s.name.endswith("_created") else s.value for s in family.samples},
            )
            for family in text_string_to_metric_families(text.decode())
            if family.name in names
        }

    got = families(generate_latest(metrics.registry))
    assert got == families(generate_latest(registry))
    assert got["rlfleet_results"][2]["rlfleet_results_total"] == 6


@pytest.mark.parametrize("role", ["coordinator", "worker"])
def test_half_sent_metrics_requests_hold_no_threads_and_time_out(
    fleet: ProcessFleet, role: str
) -> None:
    # Connections that send half a request cost no thread, a real scrape
    # still works meanwhile, and each is closed at its deadline.
    from rlfleet.cli._metrics_port import MAX_CONNECTIONS

    port = free_port()
    if role == "coordinator":
        proc = fleet.start_coordinator("--metrics-listen", f"127.0.0.1:{port}")
    else:
        fleet.start_coordinator()
        proc = fleet.start_worker(envs=1, env={"RLFLEET_METRICS_LISTEN": f"127.0.0.1:{port}"})
        fleet.wait_for_workers(1)
    scrape(fleet.wait_until(lambda: port if _answers(port) else None, what="the metrics port"))
    threads = psutil.Process(proc.pid).num_threads()
    half: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            half.append(sock)
        assert scrape(port)  # a real scrape, while every slot holds a half request
        # A thread per connection would show here; a few for the process's own work.
        assert psutil.Process(proc.pid).num_threads() <= threads + 8
        # Each half request ends at its deadline: the port closes it, unanswered.
        for sock in half:
            assert _closed_unanswered(sock)
        assert scrape(port)
    finally:
        for sock in half:
            sock.close()


def _closed_unanswered(sock: socket.socket) -> bool:
    """True once the port closed ``sock`` without an answer (an end of stream, or a
    reset when it closed it before reading the half request)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_episode_and_step_counters_count_what_learners_get(fleet: ProcessFleet) -> None:
    # A STEPS answer ends at the first prefix of episodes reaching the amount:
    # episodes accepted past it never reach the learner and are not counted.
    port = free_port()
    fleet.start_coordinator("--metrics-listen", f"127.0.0.1:{port}")
    fleet.start_worker(envs=8)
    fleet.wait_for_workers(1)
    episodes = steps = 0
    for index in range(4):
        answer = sample(fleet.address, mode=STEPS, amount=30, seed=5, request_index=index)
        episodes += len(answer.batch.lengths)
        steps += int(answer.batch.lengths.sum())
    samples = scrape(port)
    assert value(samples, "rlfleet_episodes_total") == episodes
    assert value(samples, "rlfleet_env_steps_total") == steps


def test_tasks_and_cancels_are_counted_by_the_carrier_they_went_on(fleet: ProcessFleet) -> None:
    # One worker takes its Tasks and Cancels on its lease data connection
    # (rlfleet.data-tasks), one on its Join stream (--lease-slots 0: no data
    # connection); a request its learner gave up on cancels the units both
    # still hold.
    port = free_port()
    fleet.start_coordinator("--metrics-listen", f"127.0.0.1:{port}", *env_flags(SLOW_ENV))
    fleet.start_worker(envs=2, imports=[TEST_ENVS_MODULE])
    fleet.start_worker("--lease-slots", "0", envs=2, imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(2)
    fleet.wait_until(
        lambda: value(scrape(port), "rlfleet_data_task_workers") == 1 or None,
        what="the first worker's data connection",
    )
    before = scrape(port)
    assert value(before, "rlfleet_data_task_sessions_total") == 1
    for carrier in ("data", "join"):
        assert value(before, "rlfleet_tasks_sent_total", carrier=carrier) == 0
        assert value(before, "rlfleet_cancels_sent_total", carrier=carrier) == 0

    sample(fleet.address, mode=EPISODES, amount=16, seed=1, request_index=0)
    with pytest.raises(grpc.RpcError, match=r"(?i)deadline"):
        sample(fleet.address, timeout=3, mode=EPISODES, amount=400, seed=1, request_index=1)

    after = scraped(fleet, port, lambda s: _cancels(s, "data") and _cancels(s, "join"))
    tasks = {c: value(after, "rlfleet_tasks_sent_total", carrier=c) for c in ("data", "join")}
    cancels = {c: _cancels(after, c) for c in ("data", "join")}
    assert tasks["data"] >= 2 and tasks["join"] >= 2, tasks
    assert cancels["data"] >= 1 and cancels["join"] >= 1, cancels
    assert value(after, "rlfleet_data_task_sessions_total") == 1
    assert value(after, "rlfleet_data_task_workers") == 1


def _cancels(samples: Samples, carrier: str) -> float:
    return value(samples, "rlfleet_cancels_sent_total", carrier=carrier)
