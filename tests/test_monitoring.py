"""deploy/kubernetes/monitoring: dashboard, alerts and the queue-depth HPA use real metrics.

Every ``rlfleet_*`` name in the Grafana dashboard, the alert rules and the
HPA example must be one the coordinator or a worker exports (their metric
families, read from the real registries), and every alert must be explained
in docs/operations.md. The HPA example validates against the Kubernetes
schemas like the applied manifests (tests/test_kubernetes_manifests.py).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rlfleet.coordinator import CoordinatorConfig
from rlfleet.coordinator.coordinator import Coordinator
from rlfleet.worker.metrics import WorkerMetrics

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "deploy" / "kubernetes" / "monitoring"
RUNBOOK = (REPO / "docs" / "operations.md").read_text()
yaml: Any = importlib.import_module("yaml")
kubernetes_validate: Any = importlib.import_module("kubernetes_validate")

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def exported_names() -> set[str]:
    """Every sample name the coordinator's and a worker's /metrics can show."""
    registries = [Coordinator(CoordinatorConfig()).metrics.registry, WorkerMetrics().registry]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return names


def referenced(expression: str) -> set[str]:
    return set(re.findall(r"\brlfleet_[a-z0-9_]+", expression))


def test_the_dashboard_is_valid_json_over_exported_metrics() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(dashboard["panels"]) >= 10 and all(exprs)
    used = set().union(*map(referenced, exprs))
    assert not used - exported_names(), f"dashboard uses unknown metrics: {used - exported_names()}"
    # Every metric the issue asks an operator to watch has a panel.
    for needed in (
        "rlfleet_env_steps_total",
        "rlfleet_fleet_worker_env_steps_total",
        "rlfleet_workers",
        "rlfleet_units_requeued_total",
        "rlfleet_units_lost_total",
        "rlfleet_queue_depth",
        "rlfleet_in_flight_bytes",
        "rlfleet_learner_request_duration_seconds_bucket",
        "rlfleet_policy_lag_versions_bucket",
        "rlfleet_errors_total",
        "rlfleet_worker_env_restarts_total",
        "rlfleet_lease_call_duration_seconds_bucket",
        "rlfleet_leased_envs",
    ):
        assert needed in used, needed


def test_every_alert_uses_exported_metrics_and_is_explained() -> None:
    groups = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert rules
    known = exported_names()
    for rule in rules:
        used = referenced(rule["expr"])
        assert used and not used - known, (rule["alert"], used - known)
        assert f"`{rule['alert']}`" in RUNBOOK, (
            f"docs/operations.md does not explain {rule['alert']}"
        )


def test_a_misspelt_metric_would_be_caught() -> None:
    assert referenced("rate(rlfleet_env_step_total[1m])") - exported_names()


@pytest.mark.parametrize("version", ["1.27.0", "latest"])
def test_the_queue_depth_autoscaler_validates_and_scales_on_an_exported_metric(
    version: str,
) -> None:
    hpa = yaml.safe_load((MONITORING / "worker-hpa-queue-depth.yaml").read_text())
    target = kubernetes_validate.latest_version() if version == "latest" else version
    kubernetes_validate.validate(hpa, target, strict=True)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] in exported_names()
    assert hpa["spec"]["scaleTargetRef"]["name"] == "rlfleet-worker"
