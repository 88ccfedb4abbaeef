"""deploy/kubernetes-shards renders, validates strictly, and wires each shard's workers to it.

Offline, as tests/test_kubernetes_manifests.py checks the single-coordinator
layout it overlays: ``kubectl kustomize`` renders it, kubernetes-validate
checks every object in strict mode, then the facts a cluster would reveal
only at run time: each worker Deployment dials one coordinator pod by its
stable DNS name, no pod belongs to two worker Deployments, and the copies
of the base's pod templates did not drift from it. That one learner over
the shards gets one coordinator's batch is tests/test_shards.py's.
"""

from __future__ import annotations

import copy

import pytest

from tests.test_kubernetes_manifests import (
    MANIFESTS,
    OLDEST_KUBERNETES,
    Obj,
    find,
    flag,
    kubernetes_validate,
    only_container,
    render,
    selects,
    template_labels,
)

OVERLAY = MANIFESTS.parent / "kubernetes-shards"
SHARD_LABEL = "rlfleet.io/shard"


@pytest.fixture(scope="module")
def objects() -> list[Obj]:
    return render(OVERLAY)


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render(MANIFESTS)


def worker_deployments(objects: list[Obj]) -> list[Obj]:
    workers = [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        == "worker"
    ]
    return sorted(workers, key=lambda d: int(template_labels(d)[SHARD_LABEL]))


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_every_object_validates_strictly(objects: list[Obj], version: str) -> None:
    target = kubernetes_validate.latest_version() if version == "latest" else version
    for obj in objects:
        kubernetes_validate.validate(obj, target, strict=True)


def test_each_shard_has_a_coordinator_pod_with_a_stable_name_and_its_own_workers(
    objects: list[Obj],
) -> None:
    coordinators = find(objects, "StatefulSet", "rlfleet-coordinator")
    service = find(objects, "Service", "rlfleet-coordinator")
    assert not [
        o
        for o in objects
        if o["metadata"]["name"] == "rlfleet-coordinator" and o["kind"] == "Deployment"
    ]
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    assert coordinators["spec"]["serviceName"] == service["metadata"]["name"]
    assert selects(service["spec"]["selector"], template_labels(coordinators))
    namespace = coordinators["metadata"]["namespace"]
    workers = worker_deployments(objects)
    assert len(workers) == coordinators["spec"]["replicas"] == 2
    for shard, deployment in enumerate(workers):
        container = only_container(deployment)
        expected = f"rlfleet-coordinator-{shard}.rlfleet-coordinator.{namespace}.svc.cluster.local"
        assert flag(container, "coordinator") == f"{expected}:50051"
        # No worker pod is claimed by another shard's Deployment.
        for other in workers:
            if other is not deployment:
                assert not selects(other["spec"]["selector"], template_labels(deployment))
    autoscaled = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in objects
        if o["kind"] == "HorizontalPodAutoscaler"
    }
    assert autoscaled == {d["metadata"]["name"] for d in workers}


def test_the_copies_match_the_single_coordinator_layout(
    objects: list[Obj], base: list[Obj]
) -> None:
    """The StatefulSet's pod template is the base coordinator's, and shard 1's
    worker Deployment is the base worker's but for its name, shard label and
    coordinator: a change to the base that the copies missed fails here."""
    single = find(base, "Deployment", "rlfleet-coordinator")
    sharded = find(objects, "StatefulSet", "rlfleet-coordinator")
    assert sharded["spec"]["template"] == single["spec"]["template"]
    assert sharded["spec"]["selector"] == single["spec"]["selector"]
    base_worker = find(base, "Deployment", "rlfleet-worker")
    for deployment in worker_deployments(objects):
        shard = template_labels(deployment)[SHARD_LABEL]
        normalised = copy.deepcopy(deployment)
        normalised["metadata"]["name"] = "rlfleet-worker"
        del normalised["spec"]["selector"]["matchLabels"][SHARD_LABEL]
        del normalised["spec"]["template"]["metadata"]["labels"][SHARD_LABEL]
        args = normalised["spec"]["template"]["spec"]["containers"][0]["args"]
        args[1] = args[1].replace(
            f"rlfleet-coordinator-{shard}.rlfleet-coordinator.", "rlfleet-coordinator."
        )
        assert normalised == base_worker, f"shard {shard}'s workers drifted from the base"
    hpas = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    base_hpa = find(base, "HorizontalPodAutoscaler", "rlfleet-worker")
    for hpa in hpas:
        assert hpa["spec"]["minReplicas"] == base_hpa["spec"]["minReplicas"]
        assert hpa["spec"]["metrics"] == base_hpa["spec"]["metrics"]


def test_everything_lives_in_the_rlfleet_namespace(objects: list[Obj]) -> None:
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "rlfleet", obj["metadata"]["name"]
            assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rlfleet"


def test_the_network_policy_and_budget_still_cover_every_shard(objects: list[Obj]) -> None:
    policy = find(objects, "NetworkPolicy", "rlfleet-coordinator")
    coordinators = find(objects, "StatefulSet", "rlfleet-coordinator")
    assert selects(policy["spec"]["podSelector"], template_labels(coordinators))
    budget = find(objects, "PodDisruptionBudget", "rlfleet-worker")
    for deployment in worker_deployments(objects):
        assert selects(budget["spec"]["selector"], template_labels(deployment))
