"""Prometheus metrics in a registry of their own: the one setup the
coordinator's and the worker's metrics share.

Each coordinator and each worker has its own registry, so that several in
one process (tests, ``Fleet.local``) never share or clash on a metric.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class MetricSet:
    """Base of a process's metrics: its registry, the metrics made in it, and
    the error counter both kinds of process keep.

    Args:
        errors_name: The error counter's name (labelled by ``kind``).
        errors_help: Its help text.

    Attributes:
        registry: What ``/metrics`` serves.
    """

    def __init__(self, errors_name: str, errors_help: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._errors = self.counter(errors_name, errors_help, ["kind"])

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        """A counter in this registry."""
        return Counter(name, help_text, labels, registry=self.registry)

    def gauge(self, name: str, help_text: str) -> Gauge:
        """A gauge in this registry."""
        return Gauge(name, help_text, registry=self.registry)

    def histogram(
        self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        """A histogram in this registry."""
        return Histogram(name, help_text, labels, buckets=buckets, registry=self.registry)

    def error(self, kind: str) -> None:
        """An error of ``kind`` (an ErrorKind name, with or without its
        ``ERROR_KIND_`` prefix, or a status code)."""
        self._errors.labels(kind.removeprefix("ERROR_KIND_").lower()).inc()
