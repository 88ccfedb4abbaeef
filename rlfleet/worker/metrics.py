"""A worker's Prometheus metrics (``rlfleet worker --metrics-listen``).

The session reports its progress with its heartbeat (once a second: steps
and env restarts since the last beat), each result it sends and each error
it reports, so the hot path (a vector step) gains nothing. Each worker has
its own registry (:class:`~rlfleet._util.metrics.MetricSet`);
docs/operations.md lists the metrics and tests/test_metrics.py scrapes a
real worker.
"""

from __future__ import annotations

from rlfleet._util.metrics import MetricSet


class WorkerMetrics(MetricSet):
    """One worker's counters and gauges, in a registry of their own.

    Attributes:
        registry: What ``/metrics`` serves.
    """

    def __init__(self) -> None:
        super().__init__("rlfleet_worker_errors", "Errors reported to the coordinator, by kind.")
        self._steps = self.counter("rlfleet_worker_env_steps", "Env steps this worker ran.")
        self._episodes = self.counter(
            "rlfleet_worker_episodes_sent", "Finished episodes (or fragments) sent."
        )
        self._results = self.counter(
            "rlfleet_worker_results_sent", "Results (groups of episodes) sent."
        )
        self._bytes = self.counter(
            "rlfleet_worker_result_bytes_sent", "Serialized result bytes sent."
        )
        self._restarts = self.counter(
            "rlfleet_worker_env_restarts", "Crashed envs this worker rebuilt."
        )
        self._sessions = self.counter(
            "rlfleet_worker_sessions", "Times this worker joined a coordinator."
        )
        self._joined = self.gauge("rlfleet_worker_joined", "1 while joined to a coordinator.")
        self._envs = self.gauge("rlfleet_worker_envs", "Env slots (K).")
        self._active = self.gauge("rlfleet_worker_active_envs", "Env slots running an episode.")
        self._restarts_seen = 0

    def joined(self, envs: int) -> None:
        """A session started (its restart count starts at 0)."""
        self._sessions.inc()
        self._joined.set(1)
        self._envs.set(envs)
        self._restarts_seen = 0

    def left(self) -> None:
        """The session ended."""
        self._joined.set(0)
        self._active.set(0)

    def progress(self, steps: int, restarts: int, active_envs: int) -> None:
        """At a heartbeat: ``steps`` since the last one; ``restarts`` in the session."""
        if steps:
            self._steps.inc(steps)
        if restarts > self._restarts_seen:
            self._restarts.inc(restarts - self._restarts_seen)
            self._restarts_seen = restarts
        self._active.set(active_envs)

    def sent(self, episodes: int, payload_bytes: int) -> None:
        """A result went out."""
        self._results.inc()
        self._episodes.inc(episodes)
        self._bytes.inc(payload_bytes)
