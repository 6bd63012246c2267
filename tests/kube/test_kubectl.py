"""Conformance with ``kubectl`` (the binary on PATH; these tests fail, never skip, without it).

Each test talks to its own emulated cluster through a generated kubeconfig whose server URL carries the
``/k8s/clusters/<name>`` prefix, with its own ``--cache-dir``.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from tests.support import wait_until

from .conftest import Kubectl, KubeServer

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: main
        image: nginx:1.27
"""

HPPJ = """
apiVersion: sagemaker.amazonaws.com/v1
kind: HyperPodPyTorchJob
metadata:
  name: llama
spec:
  nprocPerNode: "8"
  replicaSpecs:
  - name: pods
    replicas: 2
    template:
      spec:
        containers: [{name: trainer, image: pytorch}]
"""


def _cm(name: str, labels: str = "") -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels: {{{labels}}}\ndata:\n  key: value\n"


def test_create_get_label_selectors_and_wide(kubectl: Kubectl) -> None:
    assert "configmap/a created" in kubectl("create", "-f", "-", stdin=_cm("a", "app: hyperpod")).stdout
    kubectl("create", "-f", "-", stdin=_cm("b", "app: other"))
    kubectl("create", "namespace", "team")
    kubectl("create", "-n", "team", "-f", "-", stdin=_cm("c", "app: hyperpod"))
    out = kubectl("get", "cm", "-A", "-l", "app in (hyperpod)").stdout.splitlines()
    assert out[0].split() == ["NAMESPACE", "NAME", "DATA", "AGE"]
    assert [line.split()[:2] for line in out[1:]] == [["default", "a"], ["team", "c"]]
    assert kubectl("get", "cm", "-l", "app!=hyperpod", "-o", "name").stdout.split() == ["configmap/b"]
    assert "No resources found" in kubectl("get", "cm", "-l", "!app").stderr
    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    wide = kubectl("get", "deploy", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1].split()[5:] == ["main", "nginx:1.27", "app=web"]
    resources = kubectl("api-resources").stdout
    assert "deployments" in resources and "deploy" in resources


def test_apply_client_and_server_side(kubectl: Kubectl) -> None:
    assert "created" in kubectl("apply", "-f", "-", stdin=DEPLOYMENT).stdout
    assert "configured" in kubectl("apply", "-f", "-", stdin=DEPLOYMENT.replace("nginx:1.27", "nginx:1.28")).stdout
    got = json.loads(kubectl("get", "deploy", "web", "-o", "json").stdout)
    assert got["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.28"
    assert got["metadata"]["generation"] == 2
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", "-", stdin=_cm("ssa")).stdout
    again = kubectl("apply", "--server-side", "-f", "-", stdin=_cm("ssa").replace("value", "other")).stdout
    assert "serverside-applied" in again
    cm = json.loads(kubectl("get", "cm", "ssa", "-o", "json", "--show-managed-fields").stdout)
    assert cm["data"] == {"key": "other"} and cm["metadata"]["managedFields"][0]["manager"] == "kubectl"
    api_service = ("apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n"
                   "  name: v1beta1.external.metrics.k8s.io\nspec:\n  service:\n    name: metrics\n"
                   "    namespace: default\n  group: external.metrics.k8s.io\n  version: v1beta1\n"
                   "  groupPriorityMinimum: 100\n  versionPriority: 100\n")
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", "-", stdin=api_service).stdout
    assert kubectl("get", "apiservices", "-o", "name").stdout.split() == [
        "apiservice.apiregistration.k8s.io/v1beta1.external.metrics.k8s.io"]


def test_patch_label_describe_scale_delete(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    kubectl("patch", "deploy", "web", "--type=merge", "-p", '{"spec":{"replicas":2}}')
    kubectl("patch", "deploy", "web", "--type=json", "-p",
            '[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"nginx:2"}]')
    # The status write is answered with the object as patched (the deployment controller, which owns the
    # status, rewrites it a moment later from the ReplicaSets it sees: no node runs its pods here).
    patched = json.loads(kubectl("patch", "deploy", "web", "--subresource=status", "--type=merge", "-p",
                                 '{"status":{"readyReplicas":2,"replicas":2}}', "-o", "json").stdout)
    assert patched["status"]["readyReplicas"] == 2
    kubectl("label", "deploy", "web", "team=ml")
    got = json.loads(kubectl("get", "deploy", "web", "-o", "json").stdout)
    assert got["spec"]["replicas"] == 2
    assert got["metadata"]["labels"]["team"] == "ml"
    assert got["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:2"
    assert "deployment.apps/web scaled" in kubectl("scale", "deploy", "web", "--replicas=5").stdout
    assert json.loads(kubectl("get", "deploy", "web", "-o", "json").stdout)["spec"]["replicas"] == 5
    described = kubectl("describe", "deploy", "web").stdout
    assert "Name:" in described and "web" in described
    assert 'deployment.apps "web" deleted' in kubectl("delete", "deploy", "web").stdout
    assert kubectl("get", "deploy", "web", check=False).returncode == 1


def test_crd_then_custom_resource_with_printer_columns(kubectl: Kubectl, kube_server: KubeServer,
                                                     cluster_name: str) -> None:
    from sandbox.kube import install_component_crds

    install_component_crds(kube_server.emulator.cluster(cluster_name), "hyperpod-training-operator")
    assert "created" in kubectl("apply", "-f", "-", stdin=HPPJ).stdout
    kubectl("patch", "hppj", "llama", "--subresource=status", "--type=merge", "-p",
            '{"status":{"conditions":[{"type":"Running","status":"True"}]}}')
    out = kubectl("get", "hyperpodpytorchjobs").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATE", "AGE"] and out[1].split()[:2] == ["llama", "Running"]
    names = kubectl("get", "hppj", "-A", "-o", "name").stdout.split()
    assert names == ["hyperpodpytorchjob.sagemaker.amazonaws.com/llama"]
    bad = kubectl("apply", "-f", "-", stdin=HPPJ.replace("replicas: 2", "replicas: two").replace(
        "nprocPerNode", "nprocsPerNode"), check=False)
    assert bad.returncode != 0
    assert "spec.replicaSpecs[0].replicas" in bad.stderr and 'unknown field "spec.nprocsPerNode"' in bad.stderr
    kubectl("delete", "crd", "hyperpodpytorchjobs.sagemaker.amazonaws.com")
    assert kubectl("get", "hppj", check=False).returncode != 0


def _background(kubectl_binary: str, kubeconfig: Path, cache: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([kubectl_binary, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lists_of(kube_server: KubeServer, cluster: str, plural: str) -> int:
    """How many list (not watch) requests for ``plural`` the cluster has answered."""
    return len([r for r in kube_server.emulator.requests_for(cluster, "GET")
                if r.path.endswith(f"/{plural}") and "watch" not in r.query])


def test_wait_for_condition_and_jsonpath(kubectl: Kubectl, kubectl_binary: str, kubeconfig_path: Path,
                                         tmp_path: Path, kube_server: KubeServer, cluster_name: str) -> None:
    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    listed = _lists_of(kube_server, cluster_name, "deployments")
    cond = _background(kubectl_binary, kubeconfig_path, tmp_path / "c1", "wait", "deploy/web",
                       "--for=condition=Available", "--timeout=120s")
    path = _background(kubectl_binary, kubeconfig_path, tmp_path / "c2", "wait", "deploy/web",
                       "--for=jsonpath={.status.readyReplicas}=1", "--timeout=120s")
    # Both found the condition unmet in their list and watch from its resourceVersion: the change must
    # reach them through the watch.
    wait_until(lambda: _lists_of(kube_server, cluster_name, "deployments") >= listed + 2, 60,
               "both kubectl wait listing the deployment")
    available = {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}
    kubectl("patch", "deploy", "web", "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"readyReplicas": 1, "conditions": [available]}}))
    for proc in (cond, path):
        out, err = proc.communicate(timeout=130)
        assert proc.returncode == 0, err
        assert "condition met" in out


def test_get_watch_shows_live_changes(kubectl: Kubectl, kubectl_binary: str, kubeconfig_path: Path,
                                      tmp_path: Path) -> None:
    kubectl("create", "-f", "-", stdin=_cm("first"))
    proc = _background(kubectl_binary, kubeconfig_path, tmp_path / "w", "get", "cm", "-w", "--output-watch-events")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")) if proc.stdout else None)
    reader.start()
    # The list is printed (the watch then starts from its resourceVersion, so nothing after it is missed)
    wait_until(lambda: any("first" in line for line in lines), 60, "kubectl printing the initial list")
    kubectl("create", "-f", "-", stdin=_cm("second"))
    kubectl("delete", "cm", "second")
    wait_until(lambda: any("DELETED" in line for line in lines), 60, "kubectl printing the DELETED event")
    proc.terminate()
    reader.join(5)
    events = [line.split()[:2] for line in lines[1:]]
    assert ["ADDED", "first"] in events and ["ADDED", "second"] in events and ["DELETED", "second"] in events


def test_logs_and_follow(kubectl: Kubectl, kubectl_binary: str, kubeconfig_path: Path, tmp_path: Path,
                         kube_server: KubeServer, cluster_name: str) -> None:
    kubectl("create", "-f", "-", stdin="apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer\nspec:\n  containers:\n"
            "  - name: main\n    image: pytorch\n")
    emu = kube_server.emulator
    for i in range(3):
        emu.append_log(cluster_name, "default", "trainer", "main", f"step {i}")
    assert kubectl("logs", "trainer").stdout == "step 0\nstep 1\nstep 2\n"
    assert kubectl("logs", "trainer", "--tail=1").stdout == "step 2\n"
    follow = _background(kubectl_binary, kubeconfig_path, tmp_path / "f", "logs", "-f", "trainer")
    assert follow.stdout is not None
    streamed = [follow.stdout.readline() for _ in range(3)]  # following: the existing lines arrived
    assert streamed == ["step 0\n", "step 1\n", "step 2\n"]
    emu.append_log(cluster_name, "default", "trainer", "main", "step 3")
    emu.end_log(cluster_name, "default", "trainer", "main")
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert out == "step 3\n"


def test_generators_and_delete_namespace(kubectl: Kubectl) -> None:
    # The server reports minor 31, so the kubectl dispatcher runs 1.31, which sends JSON for generators.
    kubectl("create", "namespace", "scratch")
    kubectl("create", "configmap", "gen", "-n", "scratch", "--from-literal=a=b")
    kubectl("create", "deployment", "web", "-n", "scratch", "--image=nginx", "--replicas=2")
    kubectl("create", "-n", "scratch", "-f", "-", stdin="apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: rs}\n"
            "spec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
            "    spec: {containers: [{name: c, image: i}]}\n")
    assert kubectl("auth", "can-i", "delete", "pods").stdout.strip() == "yes"
    assert "deployment.apps/web" in kubectl("get", "all", "-n", "scratch").stdout
    assert json.loads(kubectl("get", "cm", "gen", "-n", "scratch", "-o", "json").stdout)["data"] == {"a": "b"}
    kubectl("delete", "namespace", "scratch", "--timeout=120s", timeout=130)
    assert kubectl("get", "ns", "scratch", check=False).returncode == 1
