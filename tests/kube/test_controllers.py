"""The emulator's control loops against what a real cluster does: the scheduler binds by requests,
selectors, affinity and taints (or says why not, in its words), kubelets run bound pods, Deployments
roll out through ReplicaSets (``kubectl rollout status`` agrees), Jobs complete, DaemonSets cover their
nodes, StatefulSets start in order, and every namespace has a ``default`` ServiceAccount."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandbox.kube import Cluster
from tests.support import wait_until

from .conftest import Kubectl, KubeServer
from .nodes import add_node, set_taints

HEALTH = "sagemaker.amazonaws.com/node-health-status"


def _pod(name: str, *, cpu: str = "100m", gpu: int = 0, **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if gpu:
        resources["limits"] = {"nvidia.com/gpu": str(gpu)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "resources": resources}], **spec}}


def _cluster(kube_server: KubeServer, name: str) -> Cluster:
    return kube_server.emulator.cluster(name)


def _scheduled(pod: Any) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


def test_pod_binds_to_a_ready_node_and_runs(api: client.ApiClient, kube_server: KubeServer,
                                            cluster_name: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("lonely"))
    pending = wait_until(lambda: (p := core.read_namespaced_pod("lonely", "default")) and _scheduled(p) and p)
    assert pending.status.phase == "Pending" and _scheduled(pending).reason == "Unschedulable"
    assert _scheduled(pending).message == "no nodes available to schedule pods"
    add_node(_cluster(kube_server, cluster_name), "n1")
    running = wait_until(lambda: (p := core.read_namespaced_pod("lonely", "default")).status.phase == "Running" and p)
    assert running.spec.node_name == "n1" and running.status.pod_ip and running.status.host_ip == "10.0.0.7"
    assert [c.ready for c in running.status.container_statuses] == [True]
    assert {c.type: c.status for c in running.status.conditions}["Ready"] == "True"


def test_unschedulable_reasons_read_as_the_scheduler_writes_them(api: client.ApiClient, kube_server: KubeServer,
                                                                cluster_name: str) -> None:
    cluster = _cluster(kube_server, cluster_name)
    add_node(cluster, "cpu-only")
    add_node(cluster, "checking", gpu=8, taints=[{"key": HEALTH, "value": "Unschedulable", "effect": "NoSchedule"}])
    add_node(cluster, "rebooting", gpu=8, ready=False)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("train", gpu=1))
    expected = ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
                "{node.kubernetes.io/not-ready: }, 1 node(s) had untolerated taint {" + HEALTH + ": Unschedulable}. "
                "preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, "
                "2 Preemption is not helpful for scheduling.")
    wait_until(lambda: (c := _scheduled(core.read_namespaced_pod("train", "default"))) and c.message == expected,
               message="the FailedScheduling message")
    set_taints(cluster, "checking", [])  # deep health checks passed: the taint goes, the pod lands there
    running = wait_until(lambda: (p := core.read_namespaced_pod("train", "default")).status.phase == "Running" and p)
    assert running.spec.node_name == "checking"


def test_tolerations_node_selector_and_required_affinity_choose_the_node(api: client.ApiClient,
                                                                        kube_server: KubeServer,
                                                                        cluster_name: str) -> None:
    cluster = _cluster(kube_server, cluster_name)
    add_node(cluster, "a", labels={"node.kubernetes.io/instance-type": "ml.g5.8xlarge"})
    add_node(cluster, "b", labels={"node.kubernetes.io/instance-type": "ml.p5.48xlarge"},
             taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}])
    core = client.CoreV1Api(api)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                               "values": ["ml.p5.48xlarge"]}]}]}}}
    core.create_namespaced_pod("default", _pod("no-toleration", affinity=affinity))
    core.create_namespaced_pod("default", _pod("tolerant", affinity=affinity, tolerations=[
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]))
    core.create_namespaced_pod("default", _pod("selected", nodeSelector={
        "node.kubernetes.io/instance-type": "ml.g5.8xlarge"}))
    wait_until(lambda: core.read_namespaced_pod("tolerant", "default").spec.node_name == "b")
    wait_until(lambda: core.read_namespaced_pod("selected", "default").spec.node_name == "a")
    refused = wait_until(lambda: _scheduled(core.read_namespaced_pod("no-toleration", "default")))
    assert refused.message.startswith("0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                                      "1 node(s) had untolerated taint {nvidia.com/gpu: true}.")


def test_requests_are_counted_against_allocatable(api: client.ApiClient, kube_server: KubeServer,
                                                  cluster_name: str) -> None:
    add_node(_cluster(kube_server, cluster_name), "small", cpu="2")
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("first", cpu="1500m"))
    wait_until(lambda: core.read_namespaced_pod("first", "default").spec.node_name == "small")
    core.create_namespaced_pod("default", _pod("second", cpu="1"))
    refused = wait_until(lambda: _scheduled(core.read_namespaced_pod("second", "default")))
    assert refused.reason == "Unschedulable" and "1 Insufficient cpu" in refused.message
    core.delete_namespaced_pod("first", "default")  # capacity freed: the pending pod is retried
    wait_until(lambda: core.read_namespaced_pod("second", "default").status.phase == "Running")


DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
    "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
             "template": {"metadata": {"labels": {"app": "web"}},
                          "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}}}}


def test_deployment_rolls_out_through_replicasets(api: client.ApiClient, kube_server: KubeServer,
                                                  cluster_name: str, kubectl: Kubectl) -> None:
    add_node(_cluster(kube_server, cluster_name), "n1")
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment("default", DEPLOYMENT)
    done = kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=90)
    assert 'deployment "web" successfully rolled out' in done.stdout
    deploy = apps.read_namespaced_deployment("web", "default")
    assert (deploy.status.replicas, deploy.status.updated_replicas, deploy.status.available_replicas) == (3, 3, 3)
    conditions = {c.type: c.reason for c in deploy.status.conditions}
    assert conditions == {"Available": "MinimumReplicasAvailable", "Progressing": "NewReplicaSetAvailable"}
    (first,) = apps.list_namespaced_replica_set("default").items
    assert first.metadata.owner_references[0].name == "web"
    assert first.metadata.annotations["deployment.kubernetes.io/revision"] == "1"
    pods = core.list_namespaced_pod("default", label_selector="app=web").items
    assert len(pods) == 3 and {p.metadata.labels["pod-template-hash"] for p in pods} == \
        {first.metadata.labels["pod-template-hash"]}
    apps.patch_namespaced_deployment("web", "default", {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": "nginx:1.28"}]}}}})
    kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=90)
    sets = {rs.metadata.name: rs for rs in apps.list_namespaced_replica_set("default").items}
    assert len(sets) == 2 and sets[first.metadata.name].spec.replicas == 0
    wait_until(lambda: {p.spec.containers[0].image for p in core.list_namespaced_pod(
        "default", label_selector="app=web").items if p.metadata.deletion_timestamp is None} == {"nginx:1.28"})
    apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 1}})
    wait_until(lambda: len(core.list_namespaced_pod("default", label_selector="app=web").items) == 1)


def test_a_replicaset_keeps_relabelled_pods_that_match_releases_others_and_scales_in_by_deletion_cost(
        api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    add_node(_cluster(kube_server, cluster_name), "n1")
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment("default", DEPLOYMENT)
    wait_until(lambda: apps.read_namespaced_deployment("web", "default").status.available_replicas == 3)
    kept, left, cheap = sorted(p.metadata.name for p in core.list_namespaced_pod("default", label_selector="app=web")
                               .items)
    (rs,) = apps.list_namespaced_replica_set("default").items
    core.patch_namespaced_pod(kept, "default", {"metadata": {"labels": {"business": "chat"}, "annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "1000"}}})
    core.patch_namespaced_pod(left, "default", {"metadata": {"labels": {"app": "elsewhere"}}})
    released = wait_until(lambda: (p := core.read_namespaced_pod(left, "default")) and not p.metadata.owner_references
                          and p, message="the ReplicaSet to release the pod that left its selector")
    assert released.status.phase == "Running"
    wait_until(lambda: len(core.list_namespaced_pod("default", label_selector="app=web").items) == 3,
               message="a replacement for the released pod")
    assert [o.uid for o in core.read_namespaced_pod(kept, "default").metadata.owner_references] == [rs.metadata.uid]
    apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 1}})
    wait_until(lambda: [p.metadata.name for p in core.list_namespaced_pod("default", label_selector="app=web").items
                        if p.metadata.deletion_timestamp is None] == [kept],
               message="scale-in to keep the pod with the higher deletion cost")
    assert cheap not in {p.metadata.name for p in core.list_namespaced_pod("default").items
                         if p.metadata.deletion_timestamp is None}
    apps.delete_namespaced_deployment("web", "default")
    core.delete_namespaced_pod(left, "default")


def test_settled_controllers_write_nothing(api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    cluster = _cluster(kube_server, cluster_name)
    add_node(cluster, "n1")
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment("default", DEPLOYMENT)
    wait_until(lambda: apps.read_namespaced_deployment("web", "default").status.available_replicas == 3)
    controllers = kube_server.emulator.controllers(cluster_name)
    wait_until(lambda: not controllers.busy(), message="the controllers to settle")
    before, passes = cluster.store.rv, controllers.passes
    client.CoreV1Api(api).create_namespaced_config_map("default", {"metadata": {"name": "poke"}})
    wait_until(lambda: controllers.passes > passes and not controllers.busy())
    assert cluster.store.rv == before + 1  # the config map only: no status rewritten, no loop


def test_job_runs_to_completion(api: client.ApiClient, kube_server: KubeServer, cluster_name: str,
                                kubectl: Kubectl) -> None:
    add_node(_cluster(kube_server, cluster_name), "n1")
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job("default", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "prep"},
        "spec": {"completions": 3, "parallelism": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox:1.36"}]}}}})
    kubectl("wait", "--for=condition=complete", "job/prep", "--timeout=60s", timeout=90)
    job = batch.read_namespaced_job("prep", "default")
    assert job.status.succeeded == 3 and not job.status.active and job.status.completion_time
    assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": job.metadata.uid}
    pods = client.CoreV1Api(api).list_namespaced_pod("default", label_selector="job-name=prep").items
    assert len(pods) == 3 and {p.status.phase for p in pods} == {"Succeeded"}
    assert pods[0].status.container_statuses[0].state.terminated.exit_code == 0


def test_suspended_job_starts_no_pod(api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    add_node(_cluster(kube_server, cluster_name), "n1")
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job("default", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "queued"},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox:1.36"}]}}}})
    wait_until(lambda: any(c.type == "Suspended" for c in batch.read_namespaced_job("queued", "default").status
                           .conditions or []))
    assert client.CoreV1Api(api).list_namespaced_pod("default", label_selector="job-name=queued").items == []
    batch.patch_namespaced_job("queued", "default", {"spec": {"suspend": False}})  # Kueue admits it
    wait_until(lambda: batch.read_namespaced_job("queued", "default").status.succeeded == 1)


def test_daemonset_runs_one_pod_per_matching_node(api: client.ApiClient, kube_server: KubeServer,
                                                  cluster_name: str, kubectl: Kubectl) -> None:
    cluster = _cluster(kube_server, cluster_name)
    gpu = {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}
    add_node(cluster, "g1", labels=gpu, taints=[{"key": HEALTH, "value": "Unschedulable", "effect": "NoSchedule"}])
    add_node(cluster, "g2", labels=gpu)
    add_node(cluster, "c1", labels={"node.kubernetes.io/instance-type": "ml.m5.xlarge"})
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_daemon_set("kube-system", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "nvidia-device-plugin"},
        "spec": {"selector": {"matchLabels": {"name": "dp"}}, "template": {
            "metadata": {"labels": {"name": "dp"}},
            "spec": {"nodeSelector": gpu, "tolerations": [{"key": HEALTH, "operator": "Exists"}],
                     "containers": [{"name": "dp", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.16.1"}]}}}})
    kubectl("rollout", "status", "daemonset/nvidia-device-plugin", "-n", "kube-system", "--timeout=60s", timeout=90)
    pods = core.list_namespaced_pod("kube-system", label_selector="name=dp").items
    assert sorted(p.spec.node_name for p in pods) == ["g1", "g2"]
    add_node(cluster, "g3", labels=gpu)
    wait_until(lambda: apps.read_namespaced_daemon_set("nvidia-device-plugin", "kube-system").status
               .number_available == 3)
    status = apps.read_namespaced_daemon_set("nvidia-device-plugin", "kube-system").status
    assert (status.desired_number_scheduled, status.current_number_scheduled, status.number_misscheduled) == (3, 3, 0)
    client.CoreV1Api(api).delete_node("g3")  # the pod garbage collector removes its pod
    wait_until(lambda: len(core.list_namespaced_pod("kube-system", label_selector="name=dp").items) == 2)


def test_statefulset_starts_pods_in_order_with_their_claims(api: client.ApiClient, kube_server: KubeServer,
                                                            cluster_name: str) -> None:
    add_node(_cluster(kube_server, cluster_name), "n1")
    apps, core, storage = client.AppsV1Api(api), client.CoreV1Api(api), client.StorageV1Api(api)
    storage.create_csi_driver({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                               "metadata": {"name": "ebs.csi.aws.com"}, "spec": {}})
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {
        "name": "gp3", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "ebs.csi.aws.com"})
    apps.create_namespaced_stateful_set("default", {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "main", "image": "postgres:16"}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}})
    wait_until(lambda: apps.read_namespaced_stateful_set("db", "default").status.ready_replicas == 2)
    pods = {p.metadata.name: p for p in core.list_namespaced_pod("default", label_selector="app=db").items}
    assert sorted(pods) == ["db-0", "db-1"] and pods["db-1"].spec.hostname == "db-1"
    assert pods["db-0"].metadata.creation_timestamp <= pods["db-1"].metadata.creation_timestamp
    claims = sorted(c.metadata.name for c in core.list_namespaced_persistent_volume_claim("default").items)
    assert claims == ["data-db-0", "data-db-1"]


def test_every_namespace_has_a_default_service_account(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "team-a"}})
    assert core.read_namespaced_service_account("default", "team-a").metadata.name == "default"
    core.delete_namespaced_service_account("default", "team-a")
    wait_until(lambda: core.read_namespaced_service_account("default", "team-a"), message="the recreated account")
    created = core.create_namespaced_pod("team-a", _pod("p"))
    assert created.spec.service_account_name == "default"


def test_pod_naming_a_missing_service_account_is_forbidden(api: client.ApiClient, kube_server: KubeServer,
                                                           cluster_name: str) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", _pod("p", serviceAccountName="trainer"))
    body = json.loads(exc.value.body)
    assert exc.value.status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods "p" is forbidden: error looking up service account default/trainer: '
                               'serviceaccount "trainer" not found')
    apps.create_namespaced_deployment("default", {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "template": {
        "metadata": {"labels": {"app": "web"}}, "spec": {"serviceAccountName": "trainer", "containers": [
            {"name": "main", "image": "nginx:1.27"}]}}}})
    failure = wait_until(lambda: next((c for rs in apps.list_namespaced_replica_set("default").items
                                       for c in rs.status.conditions or [] if c.type == "ReplicaFailure"), None))
    assert failure.reason == "FailedCreate" and 'serviceaccount "trainer" not found' in failure.message
    core.create_namespaced_service_account("default", {"metadata": {"name": "trainer"}})
    assert core.create_namespaced_pod("default", _pod("p", serviceAccountName="trainer")).metadata.name == "p"


def test_eviction_honours_the_disruption_budget(api: client.ApiClient, kube_server: KubeServer,
                                                cluster_name: str, kubectl: Kubectl) -> None:
    add_node(_cluster(kube_server, cluster_name), "n1")
    apps, core, policy = client.AppsV1Api(api), client.CoreV1Api(api), client.PolicyV1Api(api)
    apps.create_namespaced_deployment("default", {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "replicas": 2}})
    policy.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})
    wait_until(lambda: apps.read_namespaced_deployment("web", "default").status.available_replicas == 2)
    pdb = wait_until(lambda: (b := policy.read_namespaced_pod_disruption_budget("web", "default")).status
                     and b.status.current_healthy == 2 and b)
    assert (pdb.status.desired_healthy, pdb.status.disruptions_allowed, pdb.status.expected_pods) == (2, 0, 2)
    victim = core.list_namespaced_pod("default", label_selector="app=web").items[0].metadata.name
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim, "namespace": "default"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction(victim, "default", eviction)
    body = json.loads(exc.value.body)
    assert exc.value.status == 429 and body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget",
                                          "message": "The disruption budget web needs 2 healthy pods and has 2 "
                                                     "currently"}]
    drained = kubectl("drain", "n1", "--timeout=3s", "--ignore-daemonsets", check=False, timeout=60)
    assert drained.returncode != 0 and "disruption budget" in drained.stderr
    policy.patch_namespaced_pod_disruption_budget("web", "default", {"spec": {"minAvailable": 1}})
    wait_until(lambda: policy.read_namespaced_pod_disruption_budget("web", "default").status.disruptions_allowed == 1)
    core.create_namespaced_pod_eviction(victim, "default", eviction)
    wait_until(lambda: victim not in {p.metadata.name for p in core.list_namespaced_pod("default").items})
