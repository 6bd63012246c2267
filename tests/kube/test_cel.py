"""CRD validation rules (``x-kubernetes-validations``) evaluated with CEL, as the API server does: a rule that
fails is a 422 cause with its message; a transition rule (``oldSelf``) runs on updates only."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.kube import ApiError, Cluster, WriteOptions, install_component_crds


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster("cel")
    c.bootstrap()
    for component in ("kuberay", "kueue"):
        install_component_crds(c, component)
    return c


def _ray(managed_by: str) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"}, "spec": {
        "managedBy": managed_by, "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}


def test_a_failing_rule_is_refused_with_its_message(cluster: Cluster) -> None:
    rt = cluster.find_kind("ray.io/v1", "RayCluster")
    assert rt is not None
    with pytest.raises(ApiError) as exc:
        cluster.create(rt, "default", _ray("someone-else"))
    assert exc.value.code == 422
    assert {"reason": "FieldValueInvalid", "field": "spec.managedBy",
            "message": 'Invalid value: "string": the managedBy field value must be either '
                       "'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'"} in exc.value.details["causes"]
    assert cluster.create(rt, "default", _ray("ray.io/kuberay-operator"), WriteOptions(dry_run=True)).obj


def test_transition_rules_run_on_updates(cluster: Cluster) -> None:
    rt = cluster.find_kind("kueue.x-k8s.io/v1beta1", "LocalQueue")
    assert rt is not None
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "q"},
             "spec": {"clusterQueue": "team-a"}}
    cluster.create(rt, "default", queue)  # no old value: the immutability rule does not apply
    with pytest.raises(ApiError) as exc:
        cluster.patch(rt, "default", "q", "merge", {"spec": {"clusterQueue": "team-b"}})
    assert exc.value.details["causes"][0] == {"reason": "FieldValueInvalid", "field": "spec.clusterQueue",
                                              "message": 'Invalid value: "string": field is immutable'}
    cluster.patch(rt, "default", "q", "merge", {"metadata": {"labels": {"a": "b"}}})  # other changes are fine
