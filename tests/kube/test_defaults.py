"""API defaulting of built-in kinds (defaults.py): what clients read back after every kind of write, the
Service cluster IP allocator, and the restart policy a workload's pod template may have."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandbox.kube import ApiError, Cluster, Emulator, WriteOptions
from sandbox.kube.defaults import SERVICE_CIDR, image_pull_policy

from .conftest import Kubectl
from .test_semantics import CRD


@pytest.fixture
def c() -> Cluster:
    cluster = Cluster("t")
    cluster.bootstrap()
    return cluster


def _template(restart: str | None = None, image: str = "nginx:1.27") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": image, "ports": [{"containerPort": 80}]}]}
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"labels": {"app": "web"}}, "spec": spec}


def _deployment(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": _template(), **spec}}


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}], **spec}}


POD_SPEC_DEFAULTS = {"restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 30,
                     "schedulerName": "default-scheduler", "securityContext": {}}
CONTAINER_DEFAULTS = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                      "imagePullPolicy": "IfNotPresent"}


def test_deployment_and_its_pod_template_are_defaulted_on_create(c: Cluster) -> None:
    obj = c.create(c.builtin("apps", "deployments"), "default", _deployment()).obj
    spec = obj["spec"]
    assert spec["replicas"] == 1 and spec["revisionHistoryLimit"] == 10 and spec["progressDeadlineSeconds"] == 600
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    pod_spec = spec["template"]["spec"]
    assert {k: pod_spec[k] for k in POD_SPEC_DEFAULTS} == POD_SPEC_DEFAULTS
    container = pod_spec["containers"][0]
    assert {k: container[k] for k in CONTAINER_DEFAULTS} == CONTAINER_DEFAULTS
    assert container["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    recreate = c.create(c.builtin("apps", "deployments"), "default",
                        _deployment("re", replicas=3, strategy={"type": "Recreate"})).obj["spec"]
    assert recreate["replicas"] == 3 and recreate["strategy"] == {"type": "Recreate"}


def test_pod_and_other_workloads_get_their_defaults(c: Cluster) -> None:
    pod = c.create(c.builtin("", "pods"), "default", {"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "init", "image": "busybox"}],
        "containers": [{"name": "main", "image": "registry:5000/team/app:latest"}]}}).obj["spec"]
    assert {k: pod[k] for k in POD_SPEC_DEFAULTS} == POD_SPEC_DEFAULTS
    assert [x["imagePullPolicy"] for x in (*pod["initContainers"], *pod["containers"])] == ["Always", "Always"]
    selector = {"matchLabels": {"app": "web"}}
    rs = c.create(c.builtin("apps", "replicasets"), "default", {"metadata": {"name": "rs"}, "spec": {
        "selector": selector, "template": _template()}}).obj["spec"]
    assert rs["replicas"] == 1 and rs["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    sts = c.create(c.builtin("apps", "statefulsets"), "default", {"metadata": {"name": "db"}, "spec": {
        "selector": selector, "serviceName": "db", "template": _template()}}).obj["spec"]
    assert sts["replicas"] == 1 and sts["podManagementPolicy"] == "OrderedReady" and sts["revisionHistoryLimit"] == 10
    assert sts["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    ds = c.create(c.builtin("apps", "daemonsets"), "default", {"metadata": {"name": "ds"}, "spec": {
        "selector": selector, "template": _template()}}).obj["spec"]
    assert ds["revisionHistoryLimit"] == 10
    assert ds["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert ds["template"]["spec"]["restartPolicy"] == "Always"


@pytest.mark.parametrize(("image", "policy"), [
    ("nginx", "Always"), ("nginx:latest", "Always"), ("registry:5000/nginx", "Always"),
    ("nginx:1.27", "IfNotPresent"), ("registry:5000/team/nginx:1.27", "IfNotPresent"),
    ("nginx@sha256:" + "a" * 64, "IfNotPresent"),
])
def test_image_pull_policy_follows_the_tag(image: str, policy: str) -> None:
    assert image_pull_policy(image) == policy


def test_job_defaults_and_template_restart_policy(c: Cluster) -> None:
    jobs = c.builtin("batch", "jobs")
    with pytest.raises(ApiError) as exc:  # the template's restartPolicy defaults to Always, which a Job refuses
        c.create(jobs, "default", {"metadata": {"name": "j"}, "spec": {"template": _template()}})
    assert exc.value.code == 422
    assert exc.value.details["causes"] == [{
        "reason": "FieldValueNotSupported", "field": "spec.template.spec.restartPolicy",
        "message": 'Unsupported value: "Always": supported values: "OnFailure", "Never"'}]
    spec = c.create(jobs, "default", {"metadata": {"name": "j"}, "spec": {"template": _template("Never")}}).obj["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert spec["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    queue = c.create(jobs, "default", {"metadata": {"name": "q"}, "spec": {
        "parallelism": 3, "template": _template("OnFailure")}}).obj["spec"]
    assert "completions" not in queue and queue["parallelism"] == 3  # a work queue: no completion count
    with pytest.raises(ApiError) as exc:
        c.create(c.builtin("apps", "deployments"), "default", _deployment(template=_template("Never")))
    assert exc.value.details["causes"][0]["message"] == 'Unsupported value: "Never": supported values: "Always"'


def test_defaults_run_on_every_write_and_make_resending_a_no_op(c: Cluster) -> None:
    deployments = c.builtin("apps", "deployments")
    first = c.create(deployments, "default", _deployment()).obj
    body = _deployment()
    body["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    again = c.replace(deployments, "default", "web", body).obj  # the manifest as sent, without the defaults
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert again["metadata"]["generation"] == 1 and again["spec"]["replicas"] == 1
    patched = c.patch(deployments, "default", "web", "json", [{"op": "remove", "path": "/spec/replicas"},
                                                              {"op": "remove", "path": "/spec/strategy"}]).obj
    assert patched["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert patched["spec"]["replicas"] == 1 and patched["spec"]["strategy"]["type"] == "RollingUpdate"
    changed = c.patch(deployments, "default", "web", "merge", {"spec": {"template": {"spec": {
        "containers": [{"name": "main", "image": "nginx"}]}}}}).obj
    assert changed["metadata"]["generation"] == 2
    assert changed["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    opts = WriteOptions(manager="kubectl", force=True)
    applied = c.patch(deployments, "default", "fresh", "apply", _deployment("fresh"), opts).obj
    assert applied["spec"]["replicas"] == 1
    reapplied = c.patch(deployments, "default", "fresh", "apply", _deployment("fresh"), opts).obj
    assert reapplied["metadata"]["resourceVersion"] == applied["metadata"]["resourceVersion"]


def test_custom_resource_schema_defaults_also_run_on_updates(c: Cluster) -> None:
    c.create(c.builtin("apiextensions.k8s.io", "customresourcedefinitions"), None, CRD)
    widgets = c.lookup("example.com", "v1", "widgets")
    first = c.create(widgets, "default", {"apiVersion": "example.com/v1", "kind": "Widget",
                                          "metadata": {"name": "w"}, "spec": {"size": "S"}}).obj
    assert first["spec"]["replicas"] == 1
    patched = c.patch(widgets, "default", "w", "json", [{"op": "remove", "path": "/spec/replicas"}]).obj
    assert patched["spec"]["replicas"] == 1
    assert patched["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_service_defaults_and_cluster_ip_allocation(c: Cluster) -> None:
    services = c.builtin("", "services")
    svc = c.create(services, "default", _service("a", ports=[{"name": "http", "port": 80},
                                                             {"name": "alt", "port": 81, "targetPort": "web"}])).obj
    spec = svc["spec"]
    assert spec["type"] == "ClusterIP" and spec["sessionAffinity"] == "None"
    assert spec["ports"] == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80},
                             {"name": "alt", "port": 81, "protocol": "TCP", "targetPort": "web"}]
    ip = spec["clusterIP"]
    assert ipaddress.IPv4Address(ip) in SERVICE_CIDR and spec["clusterIPs"] == [ip]
    ips = {c.create(services, "default", _service(f"s{i}")).obj["spec"]["clusterIP"] for i in range(30)}
    assert len(ips | {ip}) == 31  # unique within the cluster
    headless = c.create(services, "default", _service("h", clusterIP="None")).obj["spec"]
    assert headless["clusterIP"] == "None" and headless["clusterIPs"] == ["None"]
    external = c.create(services, "default", {"metadata": {"name": "ext"}, "spec": {
        "type": "ExternalName", "externalName": "example.com"}}).obj["spec"]
    assert "clusterIP" not in external
    body = _service("a")  # an update without the IP keeps it; changing it is refused
    body["metadata"]["resourceVersion"] = svc["metadata"]["resourceVersion"]
    assert c.replace(services, "default", "a", body).obj["spec"]["clusterIP"] == ip
    with pytest.raises(ApiError) as exc:
        c.patch(services, "default", "a", "merge", {"spec": {"clusterIP": "10.100.9.9"}})
    assert exc.value.code == 422 and "field is immutable" in exc.value.message
    with pytest.raises(ApiError) as exc:
        c.create(services, "default", _service("taken", clusterIP=ip))
    assert exc.value.code == 422 and "provided IP is already allocated" in exc.value.message
    with pytest.raises(ApiError) as exc:
        c.create(services, "default", _service("outside", clusterIP="10.0.0.5"))
    assert exc.value.code == 422 and "not in the valid range" in exc.value.message
    assert c.create(services, "default", _service("chosen", clusterIP="10.100.200.7")).obj["spec"]["clusterIP"] \
        == "10.100.200.7"


def test_cluster_ips_are_kept_across_restarts_and_stay_unique(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sandbox.kube.defaults.random.randrange", lambda n: 0)  # always start the search at .0.1
    emulator = Emulator(tmp_path, debounce=0.01)
    cluster = emulator.ensure_cluster("k")
    services = cluster.builtin("", "services")
    assert cluster.create(services, "default", _service("a")).obj["spec"]["clusterIP"] == "10.100.0.1"
    emulator.close()
    restarted = Emulator(tmp_path, debounce=0.01)
    cluster = restarted.cluster("k")
    assert cluster.get(services, "default", "a")["spec"]["clusterIP"] == "10.100.0.1"
    assert cluster.create(services, "default", _service("b")).obj["spec"]["clusterIP"] == "10.100.0.2"
    restarted.close()


def test_kubectl_and_python_client_see_the_defaults(kubectl: Kubectl, api: client.ApiClient) -> None:
    job = json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                      "spec": {"template": _template("Never")}})
    kubectl("apply", "-f", "-", stdin=job)
    assert kubectl("get", "job", "train").stdout.splitlines()[1].split()[1] == "0/1"
    assert "unchanged" in kubectl("apply", "-f", "-", stdin=job).stdout
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment("default", _deployment())
    got = apps.read_namespaced_deployment("web", "default")
    assert got.spec.replicas == 1 and got.spec.strategy.rolling_update.max_surge == "25%"
    assert got.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"
    svc = client.CoreV1Api(api).create_namespaced_service("default", _service("web"))
    assert svc.spec.cluster_ip.startswith("10.100.") and svc.spec.ports[0].target_port == 80
