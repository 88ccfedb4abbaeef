"""The coordinator's Prometheus metrics (``rlfleet coordinator --metrics-listen``).

Two kinds, so that the hot paths stay cheap and the hooks stay small:

* event counters and histograms, bumped by one call where the event happens
  (units dispatched, results delivered or thrown away, workers lost, errors,
  learner-call and lease-call latency);
* gauges read from the fleet state at scrape time (workers by state, queue
  depth, units and bytes in flight, per-worker steps from heartbeats), so
  nothing on the hot path maintains them.

Each coordinator has its own registry (:class:`~rlfleet._util.metrics.MetricSet`).
docs/operations.md lists every metric; tests/test_metrics.py scrapes a real
fleet.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rlfleet._util.metrics import MetricSet

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from rlfleet.coordinator.state import FleetState
    from rlfleet.scheduling.scheduler import TaskOrder

R = TypeVar("R")

#: Worker states of GetStatus, always exported (0 when none is in the state).
WORKER_STATES = ("starting", "idle", "busy", "leaving")
#: Policy lag buckets: agent versions between a result's policy and the newest.
LAG_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100)
#: Learner call latency buckets (seconds): from a status call to a long Sample.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
#: Lease call latency buckets (seconds): a relayed CartPole step takes ~1 ms.
LEASE_CALL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30)


class CoordinatorMetrics(MetricSet):
    """The coordinator's metrics, in a registry of their own.

    The scrape-time gauges need the fleet state, which owns this object:
    :meth:`watch` binds it.

    Attributes:
        registry: What ``/metrics`` serves.
    """

    def __init__(self) -> None:
        super().__init__(
            "rlfleet_errors", "Errors reported by workers or raised for them, by kind."
        )
        self._episodes = self.counter(
            "rlfleet_episodes", "Episodes delivered to learners (fleet-wide)."
        )
        self._steps = self.counter(
            "rlfleet_env_steps", "Env steps delivered to learners (fleet-wide)."
        )
        self._dispatched = self.counter(
            "rlfleet_units_dispatched", "Units (episodes or fragment windows) sent to workers."
        )
        self._requeued = self.counter(
            "rlfleet_units_requeued",
            "Units put back in their request's queue because their worker was lost.",
        )
        self._moved = self.counter(
            "rlfleet_units_moved",
            "Unstarted units moved at a request's tail from the worker holding the most "
            "to one that ran out.",
        )
        self._lost = self.counter(
            "rlfleet_units_lost",
            "Episodes a worker delivered that were thrown away (their request had ended, "
            "or they were already re-assigned).",
        )
        self._workers_lost = self.counter(
            "rlfleet_workers_removed",
            "Workers removed from the fleet, by gRPC status of the removal (OK: left).",
            ["code"],
        )
        self._forwarded = _Forwarded()
        self.registry.register(self._forwarded)
        #: Tasks and Cancels sent to workers, by carrier (``state.dispatch``).
        self.work_frames = WorkFrames()
        self.registry.register(self.work_frames)
        self._latency = self.histogram(
            "rlfleet_learner_request_duration_seconds",
            "Duration of learner calls, by method and outcome.",
            ["method", "outcome"],
            LATENCY_BUCKETS,
        )
        self._lease_calls = self.histogram(
            "rlfleet_lease_call_duration_seconds",
            "Env lease calls, from the learner's call reaching the coordinator to its last "
            "env's answer leaving for the learner, by op (reset, step, ...).",
            ["op"],
            LEASE_CALL_BUCKETS,
        )
        self._lease_call_ops: dict[str, Histogram] = {}  # children of _lease_calls by op
        # Children of _latency by (method, outcome).
        self._latency_children: dict[tuple[str, str], Histogram] = {}
        self._data_connections = self.counter(
            "rlfleet_lease_data_connections",
            "Connections to the lease data channel, by outcome (accepted: a valid ticket; "
            "refused: anything else).",
            ["outcome"],
        )
        data_frames = self.counter(
            "rlfleet_lease_data_frames",
            "Messages received on the lease data channel, by party (learner: lease calls; "
            "worker: lease replies; results: workers' result messages and end-of-results markers).",
            ["party"],
        )
        # Bound once: a frame's count is one lock-and-add on the hot path.
        self._data_frames = {
            party: data_frames.labels(party) for party in ("learner", "worker", "results")
        }

    def watch(self, state: FleetState, status: Callable[[], Any]) -> None:
        """Exports the scrape-time gauges of ``state``.

        Args:
            state: The fleet (in-flight bytes of its workers' assemblers).
            status: What GetStatus answers (a ``FleetStatus``, lease counts
                included), so /metrics and GetStatus read one source.
        """
        self.registry.register(_FleetCollector(state, status))

    # --- events (cheap; called where they happen) ---------------------------------

    def dispatched(self, orders: Iterable[TaskOrder]) -> None:
        """Tasks were sent to workers."""
        units = sum(len(order.units) or order.rounds for order in orders)
        if units:
            self._dispatched.inc(units)

    def forwarded(self, episodes: int, payload_bytes: int, lag: int) -> None:
        """A result was accepted and forwarded to its learner (its bytes, its lag)."""
        self.forwarded_many(1, payload_bytes, {lag: episodes})

    def forwarded_many(self, results: int, payload_bytes: int, lags: Mapping[int, int]) -> None:
        """Results were accepted and forwarded (a worker's batch): their number,
        bytes, and episodes by lag (counted once per batch, not per result)."""
        self._forwarded.add(results, payload_bytes, lags)

    def delivered(self, episodes: int, steps: int) -> None:
        """Episodes and steps reached a learner's answer: a Sample request's
        whole answer (its footer; a STEPS request's surplus episodes past the
        answer are not in it), or a subscription's result."""
        self._episodes.inc(episodes)
        self._steps.inc(steps)

    def moved(self, units: int) -> None:
        """Units were moved from a busy worker to one that ran out."""
        self._moved.inc(units)

    def discarded(self, episodes: int) -> None:
        """A result arrived for units no longer its worker's."""
        self._lost.inc(episodes)

    def worker_removed(self, code: str, requeued: int) -> None:
        """A worker left or was dropped; ``requeued`` of its units went back."""
        self._workers_lost.labels(code).inc()
        if requeued:
            self._requeued.inc(requeued)

    def lease_call(self, op: str, seconds: float) -> None:
        """A lease call of ``op`` was answered for all its envs after ``seconds``."""
        child = self._lease_call_ops.get(op)
        if child is None:  # labels() takes a lock and builds a key: once per op
            child = self._lease_call_ops[op] = self._lease_calls.labels(op)
        child.observe(seconds)

    def lease_data_connection(self, outcome: str) -> None:
        """A lease data connection was ``accepted`` or ``refused``."""
        self._data_connections.labels(outcome).inc()

    def lease_data_frame(self, party: str, count: int = 1) -> None:
        """A message (``count`` of them) from a ``learner`` or ``worker`` (or a
        worker's ``results``) came on the data channel."""
        self._data_frames[party].inc(count)

    def timed(self, method: str, behavior: Callable[..., R]) -> Callable[..., R]:
        """Wraps a gRPC method handler so that its duration is observed.

        Streaming handlers are timed until their last message, not their
        first: a Sample call lasts as long as its sampling.
        """

        def handle(*args: Any) -> Any:
            started = time.monotonic()
            try:
                result = behavior(*args)
            except BaseException:
                self._observe(method, "error", started)
                raise
            if isinstance(result, Iterator):
                return self._timed_stream(method, result, started)
            self._observe(method, "ok", started)
            return result

        return handle

    def request_done(self, method: str, outcome: str, started: float) -> None:
        """A request that is no gRPC call (``method``: its label) ended with
        ``outcome`` (``"ok"`` or ``"error"``), begun at ``started`` (``time.monotonic()``)."""
        self._observe(method, outcome, started)

    def _timed_stream(self, method: str, stream: Iterator[Any], started: float) -> Iterator[Any]:
        outcome = "error"
        try:
            yield from stream
            outcome = "ok"
        finally:
            self._observe(method, outcome, started)

    def _observe(self, method: str, outcome: str, started: float) -> None:
        child = self._latency_children.get((method, outcome))
        if child is None:  # labels() takes a lock and builds a key: once per pair
            child = self._latency_children[method, outcome] = self._latency.labels(method, outcome)
        child.observe(time.monotonic() - started)


class _Forwarded(Collector):
    """The forwarded results' counters, ``rlfleet_results``,
    ``rlfleet_result_bytes`` and ``rlfleet_policy_lag_versions`` (one
    observation per delivered episode), counted under one lock per batch.

    A result's episodes share one lag, so it is counted once with their
    number: a Histogram's ``observe`` per episode cost the coordinator about
    1.5 us each, a tenth of its CPU per result. The two counters are plain
    numbers here too, exported as Prometheus's counters are (``_total`` and
    ``_created``): its ``Counter.inc`` is two calls and a lock of its own each.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._created = time.time()
        self._results = 0
        self._bytes = 0
        self._counts = [0] * (len(LAG_BUCKETS) + 1)  # the last: above every bound
        self._sum = 0

    def add(self, results: int, payload_bytes: int, lags: Mapping[int, int]) -> None:
        """Counts ``results`` results of ``payload_bytes`` bytes, and
        ``episodes`` observations of each ``lag`` of ``lags``."""
        with self._lock:
            self._results += results
            self._bytes += payload_bytes
            for lag, episodes in lags.items():
                self._counts[bisect.bisect_left(LAG_BUCKETS, lag)] += episodes
                self._sum += lag * episodes

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            results, payload_bytes = self._results, self._bytes
            counts, total = list(self._counts), self._sum
        yield CounterMetricFamily(
            "rlfleet_result_bytes",
            "Serialized result bytes forwarded to learners.",
            value=payload_bytes,
            created=self._created,
        )
        yield CounterMetricFamily(
            "rlfleet_results",
            "Results (EpisodeResult messages, whatever their chunks) forwarded to learners; "
            "each costs the coordinator about the same CPU whatever its size.",
            value=results,
            created=self._created,
        )
        bounds = [*LAG_BUCKETS, float("inf")]
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        yield HistogramMetricFamily(
            "rlfleet_policy_lag_versions",
            "Agent versions between the policy of a delivered episode and the newest version.",
            buckets=[
                (floatToGoString(bound), count)
                for bound, count in zip(bounds, cumulative, strict=True)
            ],
            sum_value=total,
        )


class WorkFrames(Collector):
    """Tasks and Cancels sent to workers, by carrier (``data``: frames on
    their lease data connections, ``rlfleet.data-tasks``; ``join``: their
    Join streams), ``rlfleet_tasks_sent`` and ``rlfleet_cancels_sent``,
    and the worker sessions whose Tasks and Cancels moved to their data
    connection, ``rlfleet_data_task_sessions``.

    Plain numbers under one lock, counted once per dispatch, exported as
    Prometheus's counters are (``_total`` and ``_created``), as
    :class:`_Forwarded`'s: a labelled ``Counter.inc`` per Task would be a
    lock and a lookup on the dispatch path for each.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._created = time.time()
        self._tasks = [0, 0]  # data, join
        self._cancels = [0, 0]
        self._sessions = 0

    def tasks(self, on_data: int, on_join: int) -> None:
        """Counts Tasks sent on data connections and on Join streams."""
        self._add(self._tasks, on_data, on_join)

    def cancels(self, on_data: int, on_join: int) -> None:
        """Counts Cancels sent on data connections and on Join streams."""
        self._add(self._cancels, on_data, on_join)

    def _add(self, counts: list[int], on_data: int, on_join: int) -> None:
        if on_data or on_join:  # the common dispatch sends nothing: no lock taken
            with self._lock:
                counts[0] += on_data
                counts[1] += on_join

    def session_agreed(self) -> None:
        """A worker session's Tasks and Cancels moved to its data connection."""
        with self._lock:
            self._sessions += 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            tasks, cancels, sessions = list(self._tasks), list(self._cancels), self._sessions
        for name, what, counts in (
            ("rlfleet_tasks_sent", "Tasks", tasks),
            ("rlfleet_cancels_sent", "Cancels", cancels),
        ):
            family = CounterMetricFamily(
                name,
                f"{what} sent to workers, by carrier (data: frames on their lease data "
                "connections, rlfleet.data-tasks; join: their Join streams).",
                labels=["carrier"],
                created=self._created,
            )
            family.add_metric(["data"], counts[0], created=self._created)
            family.add_metric(["join"], counts[1], created=self._created)
            yield family
        yield CounterMetricFamily(
            "rlfleet_data_task_sessions",
            "Worker sessions whose Tasks and Cancels moved to their lease data connection "
            "(they agreed on rlfleet.data-tasks and attached it).",
            value=sessions,
            created=self._created,
        )


class _FleetCollector(Collector):
    """Gauges read from the fleet state when Prometheus scrapes."""

    def __init__(self, state: FleetState, status: Callable[[], Any]) -> None:
        self._state = state
        self._status = status

    def collect(self) -> Iterator[Metric]:
        state = self._state
        status = self._status()
        queued = status.requests_in_flight  # the gate's waiting count
        with state.lock:
            in_flight_bytes = sum(
                h.assembler.buffered_bytes + h.data_assembler.buffered_bytes for h in state.registry
            )
            data_tasks = sum(h.task_data is not None for h in state.registry)
        by_state = dict.fromkeys(WORKER_STATES, 0)
        for worker in status.workers:
            by_state[worker.state] = by_state.get(worker.state, 0) + 1
        workers = GaugeMetricFamily(
            "rlfleet_workers", "Connected workers by state.", labels=["state"]
        )
        for name, count in by_state.items():
            workers.add_metric([name], count)
        yield workers
        yield GaugeMetricFamily(
            "rlfleet_queue_depth",
            "Sample and update requests waiting for their turn.",
            value=queued,
        )
        yield GaugeMetricFamily(
            "rlfleet_units_in_flight",
            "Units handed to workers and not yet delivered.",
            value=sum(w.units_in_flight for w in status.workers),
        )
        yield GaugeMetricFamily(
            "rlfleet_in_flight_bytes",
            "Bytes of results partly received from workers (chunks being reassembled).",
            value=in_flight_bytes,
        )
        yield GaugeMetricFamily(
            "rlfleet_data_task_workers",
            "Connected workers whose Tasks and Cancels come on their lease data connection.",
            value=data_tasks,
        )
        yield GaugeMetricFamily(
            "rlfleet_leases", "Open env leases (learners' RemoteVectorEnvs).", value=status.leases
        )
        yield GaugeMetricFamily(
            "rlfleet_leased_envs", "Envs held by open leases.", value=status.leased_envs
        )
        yield GaugeMetricFamily(
            "rlfleet_agent_version", "The fleet's newest agent version.", value=status.agent_version
        )
        yield GaugeMetricFamily(
            "rlfleet_fleet_env_steps_per_second",
            "Env steps per second of the fleet (sum of the workers' heartbeats).",
            value=status.steps_per_second,
        )
        fleet_steps = CounterMetricFamily(
            "rlfleet_fleet_env_steps",
            "Env steps the fleet ran (heartbeats, including departed workers).",
            value=status.steps_total,
        )
        yield fleet_steps
        per_worker = CounterMetricFamily(
            "rlfleet_fleet_worker_env_steps",
            "Env steps each connected worker ran (its heartbeats).",
            labels=["worker"],
        )
        envs = GaugeMetricFamily(
            "rlfleet_fleet_worker_envs", "Env slots of each connected worker.", labels=["worker"]
        )
        for worker in status.workers:
            per_worker.add_metric([worker.name], worker.steps_total)
            envs.add_metric([worker.name], worker.num_envs)
        yield per_worker
        yield envs
