"""deploy/kubernetes renders, validates strictly, and agrees with itself and the CLI.

Offline: ``kubectl kustomize`` renders the manifests (no cluster), every
object is checked against the Kubernetes OpenAPI schemas with
kubernetes-validate in strict mode, then the cross-object facts a cluster
would only reveal at run time are checked: probe ports, the Service's DNS
name, security contexts, grace periods, selectors, and that every setting
the manifests pass in the environment is one the rlfleet CLI reads. What
the manifests rely on at run time is tested on real processes in
test_deploy_behaviour.py.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rlfleet
from rlfleet.cli._health_port import LIVENESS_SERVICE
from rlfleet.coordinator.server import HEALTH_SERVICES

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = REPO / "deploy" / "kubernetes"

# Neither ships type stubs; imported by name so the checks stay typed.
yaml: Any = importlib.import_module("yaml")
kubernetes_validate: Any = importlib.import_module("kubernetes_validate")

#: Oldest Kubernetes the manifests support: gRPC probes are GA since 1.27.
OLDEST_KUBERNETES = "1.27.0"

Obj = dict[str, Any]


def render(directory: Path) -> list[Obj]:
    """The objects ``kubectl kustomize`` renders from ``directory`` (skips without kubectl)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            f"kubectl is not installed, so {directory} cannot be rendered offline; "
            "install a kubectl with kustomize v5 (Debian's kubernetes-client 1.20 is too old)"
        )
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def objects() -> list[Obj]:
    return render(MANIFESTS)


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def coordinator(objects: list[Obj]) -> Obj:
    return find(objects, "Deployment", "rlfleet-coordinator")


def worker(objects: list[Obj]) -> Obj:
    return find(objects, "Deployment", "rlfleet-worker")


def pod_spec(deployment: Obj) -> Obj:
    spec: Obj = deployment["spec"]["template"]["spec"]
    return spec


def only_container(deployment: Obj) -> Obj:
    (container,) = pod_spec(deployment)["containers"]
    result: Obj = container
    return result


def flag(container: Obj, name: str) -> str:
    """The value of ``--name=VALUE`` in a container's args."""
    values = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"{container['name']}: expected one --{name}=..., got {values}"
    return values[0]


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def container_port(container: Obj, name: str) -> int:
    ports = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    assert len(ports) == 1, f"{container['name']} has no single port named {name!r}"
    return int(ports[0])


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects ``labels``."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def template_labels(deployment: Obj) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def cli_env_variables(command: str) -> set[str]:
    """The RLFLEET_* variables ``rlfleet COMMAND --help`` says it reads."""
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    return set(re.findall(r"env\s+(RLFLEET_[A-Z0-9_]+)", result.stdout))


# --- schema -----------------------------------------------------------------


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_every_object_validates_strictly(objects: list[Obj], version: str) -> None:
    target = kubernetes_validate.latest_version() if version == "latest" else version
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "Deployment",
            "HorizontalPodAutoscaler",
            "Namespace",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Service",
        ]
    )
    for obj in objects:
        kubernetes_validate.validate(obj, target, strict=True)


def test_tokens_come_from_a_secret_the_manifests_never_overwrite(objects: list[Obj]) -> None:
    """Re-applying must not replace real tokens: the Secret is made by hand, shaped as
    secret.example.yaml shows."""
    assert not [o for o in objects if o["kind"] == "Secret"]
    example = yaml.safe_load((MANIFESTS / "secret.example.yaml").read_text())
    kubernetes_validate.validate(example, kubernetes_validate.latest_version(), strict=True)
    references = [
        (variable["name"], variable["valueFrom"]["secretKeyRef"])
        for deployment in (coordinator(objects), worker(objects))
        for variable in only_container(deployment)["env"]
        if "secretKeyRef" in variable.get("valueFrom", {})
    ]
    assert {name for name, _ in references} == {"RLFLEET_WORKER_TOKEN", "RLFLEET_LEARNER_TOKEN"}
    for _, ref in references:
        assert ref["name"] == example["metadata"]["name"]
        assert ref["key"] in example["stringData"]


def test_strict_validation_rejects_a_misspelt_field(objects: list[Obj]) -> None:
    """The validator is strict for real: a typo in a probe is refused."""
    broken = copy.deepcopy(worker(objects))
    only_container(broken)["readinessProbe"]["grpc"]["prot"] = 50052
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_everything_lives_in_the_rlfleet_namespace(objects: list[Obj]) -> None:
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "rlfleet", obj["metadata"]["name"]


# --- health probes ------------------------------------------------------------


@pytest.mark.parametrize("which", [coordinator, worker])
def test_probes_hit_the_health_port_the_process_opens(objects: list[Obj], which: Any) -> None:
    container = only_container(which(objects))
    health_port = container_port(container, "health")
    assert port_of(flag(container, "health-listen")) == health_port
    assert flag(container, "health-listen").startswith("0.0.0.0:"), "the kubelet probes the pod IP"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == health_port, probe


def test_coordinator_readiness_asks_for_a_service_it_reports(objects: list[Obj]) -> None:
    probe = only_container(coordinator(objects))["readinessProbe"]["grpc"]
    assert probe["service"] in HEALTH_SERVICES


def test_worker_probes_tell_joined_from_alive(objects: list[Obj]) -> None:
    """Readiness: joined (""); liveness: the loop runs, even while the coordinator is away."""
    container = only_container(worker(objects))
    assert container["readinessProbe"]["grpc"].get("service", "") == ""
    assert container["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    assert container["livenessProbe"]["initialDelaySeconds"] >= 10


# --- wiring -------------------------------------------------------------------


def test_workers_dial_the_coordinator_service_by_dns_name(objects: list[Obj]) -> None:
    service = find(objects, "Service", "rlfleet-coordinator")
    namespace = service["metadata"]["namespace"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    address = flag(only_container(worker(objects)), "coordinator")
    assert address == f"rlfleet-coordinator.{namespace}.svc.cluster.local:{port['port']}"
    # The Service forwards to the port the coordinator listens on.
    container = only_container(coordinator(objects))
    target = port["targetPort"]
    target_port = container_port(container, target) if isinstance(target, str) else target
    assert port_of(flag(container, "listen")) == target_port
    assert flag(container, "listen").startswith("0.0.0.0:")


def test_the_lease_data_port_is_exposed_where_the_coordinator_advertises_it(
    objects: list[Obj],
) -> None:
    # Learners and workers dial the Service's host at the port the coordinator
    # advertises (its bound port): Service port, container port and flag agree,
    # and the network policy admits workers and learners to it.
    container = only_container(coordinator(objects))
    data_port = port_of(flag(container, "lease-data-listen"))
    assert flag(container, "lease-data-listen").startswith("0.0.0.0:")
    assert container_port(container, "lease-data") == data_port
    service = find(objects, "Service", "rlfleet-coordinator")
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "lease-data"]
    assert port["port"] == data_port and port["targetPort"] == "lease-data"
    policy = find(objects, "NetworkPolicy", "rlfleet-coordinator")["spec"]
    grpc_port = port_of(flag(container, "listen"))
    (rule,) = [r for r in policy["ingress"] if {"port": grpc_port, "protocol": "TCP"} in r["ports"]]
    assert {"port": data_port, "protocol": "TCP"} in rule["ports"]


def test_service_selects_the_coordinator_and_nothing_else(objects: list[Obj]) -> None:
    selector = {"matchLabels": find(objects, "Service", "rlfleet-coordinator")["spec"]["selector"]}
    assert selects(selector, template_labels(coordinator(objects)))
    assert not selects(selector, template_labels(worker(objects)))


def test_workers_take_their_name_from_the_pod(objects: list[Obj]) -> None:
    env = {e["name"]: e for e in only_container(worker(objects))["env"]}
    assert env["RLFLEET_WORKER_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_every_setting_is_an_environment_variable_the_cli_reads(objects: list[Obj]) -> None:
    read = cli_env_variables("coordinator") | cli_env_variables("worker")
    settings = find(objects, "ConfigMap", "rlfleet-settings")["data"]
    assert set(settings) <= read, f"the CLI reads none of {sorted(set(settings) - read)}"
    for deployment in (coordinator(objects), worker(objects)):
        container = only_container(deployment)
        assert container["envFrom"] == [{"configMapRef": {"name": "rlfleet-settings"}}]
        for variable in container["env"]:
            if "secretKeyRef" not in variable.get("valueFrom", {}):
                assert variable["name"] in read, variable["name"]


def test_both_roles_run_this_version_of_the_image(objects: list[Obj]) -> None:
    for deployment in (coordinator(objects), worker(objects)):
        assert only_container(deployment)["image"] == f"rlfleet:{rlfleet.__version__}"


# --- security -----------------------------------------------------------------


def image_user() -> int:
    match = re.search(r"^USER (\d+)(?::\d+)?$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert match is not None, "the Dockerfile needs a numeric USER for runAsNonRoot"
    return int(match.group(1))


@pytest.mark.parametrize("which", [coordinator, worker])
def test_pods_run_restricted(objects: list[Obj], which: Any) -> None:
    deployment = which(objects)
    spec = pod_spec(deployment)
    context = spec["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == image_user() != 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"] + spec.get("initContainers", []):
        own = container["securityContext"]
        assert own["allowPrivilegeEscalation"] is False, container["name"]
        assert own["readOnlyRootFilesystem"] is True, container["name"]
        assert own["capabilities"] == {"drop": ["ALL"]}, container["name"]
        # A read-only root needs somewhere writable for temporary files.
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]


def test_namespace_enforces_the_restricted_pod_security_standard(objects: list[Obj]) -> None:
    labels = find(objects, "Namespace", "rlfleet")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("which", [coordinator, worker])
def test_grace_period_outlasts_the_drain(objects: list[Obj], which: Any) -> None:
    drain = float(find(objects, "ConfigMap", "rlfleet-settings")["data"]["RLFLEET_DRAIN_GRACE"])
    assert pod_spec(which(objects))["terminationGracePeriodSeconds"] > drain


def test_network_policy_admits_only_workers_and_learners(objects: list[Obj]) -> None:
    policy = find(objects, "NetworkPolicy", "rlfleet-coordinator")["spec"]
    assert selects(policy["podSelector"], template_labels(coordinator(objects)))
    assert not selects(policy["podSelector"], template_labels(worker(objects)))
    grpc_port = port_of(flag(only_container(coordinator(objects)), "listen"))
    (rule,) = [r for r in policy["ingress"] if {"port": grpc_port, "protocol": "TCP"} in r["ports"]]
    (peer,) = rule["from"]
    selector = peer["podSelector"]
    for role in ("worker", "learner"):
        assert selects(selector, {"rlfleet.io/role": role}), role
    assert not selects(selector, {"rlfleet.io/role": "other"})
    assert not selects(selector, {})
    # The workers' own pods carry the role the policy admits.
    assert selects(selector, template_labels(worker(objects)))


def test_autoscaler_scales_the_worker_deployment_on_cpu(objects: list[Obj]) -> None:
    spec = find(objects, "HorizontalPodAutoscaler", "rlfleet-worker")["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "rlfleet-worker",
    }
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    # CPU utilization is measured against requests: without them the HPA idles.
    assert only_container(worker(objects))["resources"]["requests"]["cpu"]


def test_disruption_budget_covers_workers_only(objects: list[Obj]) -> None:
    selector = find(objects, "PodDisruptionBudget", "rlfleet-worker")["spec"]["selector"]
    assert selects(selector, template_labels(worker(objects)))
    assert not selects(selector, template_labels(coordinator(objects)))


def test_single_coordinator_is_recreated_not_rolled(objects: list[Obj]) -> None:
    """Two coordinators at once would split the fleet."""
    spec = coordinator(objects)["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


def parsed_args(objects: list[Obj], deployment: Obj, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The container's args parsed by the real CLI, with the ConfigMap in the environment."""
    from rlfleet.cli import build_parser

    for key, value in find(objects, "ConfigMap", "rlfleet-settings")["data"].items():
        monkeypatch.setenv(key, value)
    return build_parser().parse_args(only_container(deployment)["args"])


def test_coordinator_args_parse_with_the_settings(
    objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every flag exists and the ConfigMap's values convert: typos would crash-loop."""
    settings = find(objects, "ConfigMap", "rlfleet-settings")["data"]
    args = parsed_args(objects, coordinator(objects), monkeypatch)
    assert args.func.__module__ == "rlfleet.cli.coordinator"
    assert args.env == settings["RLFLEET_ENV"]
    assert args.seed == int(settings["RLFLEET_SEED"])
    assert args.heartbeat_interval == float(settings["RLFLEET_HEARTBEAT_INTERVAL"])
    assert args.heartbeat_timeout == float(settings["RLFLEET_HEARTBEAT_TIMEOUT"])
    assert args.heartbeat_timeout > args.heartbeat_interval
    assert args.health_listen == flag(only_container(coordinator(objects)), "health-listen")
    assert args.drain_grace == float(settings["RLFLEET_DRAIN_GRACE"])
    assert args.tail_moves == settings["RLFLEET_TAIL_MOVES"]


def test_worker_args_parse_with_the_settings(
    objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = find(objects, "ConfigMap", "rlfleet-settings")["data"]
    monkeypatch.setenv("RLFLEET_WORKER_NAME", "rlfleet-worker-7d9f8-abcde")
    args = parsed_args(objects, worker(objects), monkeypatch)
    assert args.func.__module__ == "rlfleet.cli.worker"
    assert args.name == "rlfleet-worker-7d9f8-abcde"
    assert args.envs == int(settings["RLFLEET_ENVS_PER_WORKER"])
    assert args.drain_grace == float(settings["RLFLEET_DRAIN_GRACE"])
    assert args.coordinator == flag(only_container(worker(objects)), "coordinator")


def test_deploy_guide_names_only_variables_the_cli_reads() -> None:
    """docs/deploy.md stays in step with the CLI (tokens belong to docs/security.md)."""
    named = set(
        re.findall(r"RLFLEET_[A-Z0-9_]*[A-Z0-9]", (REPO / "docs" / "deploy.md").read_text())
    )
    read = cli_env_variables("coordinator") | cli_env_variables("worker")
    tokens = {"RLFLEET_WORKER_TOKEN", "RLFLEET_LEARNER_TOKEN", "RLFLEET_TOKEN"}
    assert len(named) >= 10, "the guide's table of variables is gone"
    assert named - tokens <= read, f"not read by the CLI: {sorted(named - tokens - read)}"


@pytest.mark.parametrize("which", [coordinator, worker])
def test_prometheus_scrapes_the_metrics_port_the_process_opens(
    objects: list[Obj], which: Any
) -> None:
    deployment = which(objects)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    container = only_container(deployment)
    port = port_of(flag(container, "metrics-listen"))
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port == container_port(container, "metrics")
    assert annotations["prometheus.io/path"] == "/metrics"
    if which is coordinator:  # its NetworkPolicy lets the scraper in
        policy = find(objects, "NetworkPolicy", "rlfleet-coordinator")["spec"]
        open_ports = [r["ports"] for r in policy["ingress"] if "from" not in r]
        assert any({"port": port, "protocol": "TCP"} in ports for ports in open_ports)
