"""The features precheck's guards, in process against the sandbox: turning a feature off needs the admin role
(refused and audited for an operator, who can still turn features on); a toggle is a strict boolean; a CSI
driver is not turned off while PersistentVolumes of it are bound, nor the training operator while its custom
resources exist; and a component's own side-effect-free preflight refuses a change, listing each problem."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from pydantic import BaseModel, ValidationError

from app.bootstrap import Services
from services.audit import AuditQuery
from services.auth import Principal, Role
from services.components import Target
from services.components.hyperpod_addons import (
    HYPERPOD_TRAINING_OPERATOR,
    TrainingOperator,
    TrainingOperatorSettings,
)
from services.errors import Conflict, Forbidden
from services.features import Feature, Features, FeaturesPatch
from services.features.models import _patch_model
from services.operations import OperationQuery
from tests.sandbox_support import seeded_server
from tests.support import wait_until

pytestmark = pytest.mark.slow
CLUSTER = "fguard"
ADMIN = Principal("guards-admin", Role.ADMIN, "t-gadm", "api")
OPERATOR = Principal("guards-operator", Role.OPERATOR, "t-gop", "api")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with seeded_server(tmp_path_factory.mktemp("features-guards"), CLUSTER, nodes=1) as seeded, \
            seeded.imported(tmp_path_factory.mktemp("product") / "data", CLUSTER, ADMIN) as services:
        yield services


def operations(services: Services) -> int:
    return len(services.engine.list(OperationQuery(kind="features.update")))


def run(services: Services, principal: Principal, patch: BaseModel) -> list[str]:
    view, _ = services.features.update_features(principal, CLUSTER, patch)
    done = wait_until(lambda: (v := services.engine.run_until_idle(view.id)).status.value == "succeeded" and v, 180,
                      "the change to succeed")
    return [s.name for s in done.stages]


def test_a_toggle_is_a_strict_boolean() -> None:
    for value in (0, 1, "false", "true", "off"):
        with pytest.raises(ValidationError):
            FeaturesPatch.model_validate({"kuberay_operator": value})
    assert FeaturesPatch.model_validate({"kuberay_operator": False}).model_dump(exclude_none=True) == {
        "kuberay_operator": False}


def test_turning_off_needs_admin_and_is_audited_turning_on_does_not(imported: Services) -> None:
    assert run(imported, OPERATOR, FeaturesPatch(kuberay_operator=True)) == ["kuberay_operator"]
    before = operations(imported)
    with pytest.raises(Forbidden, match="admin role") as refused:
        imported.features.update_features(OPERATOR, CLUSTER, FeaturesPatch(kuberay_operator=False))
    assert refused.value.details["features"] == ["kuberay_operator"]
    with pytest.raises(Forbidden):  # any false in the request, even beside a true
        imported.features.update_features(OPERATOR, CLUSTER, FeaturesPatch(kuberay_operator=False,
                                                                          metrics_server=True))
    assert operations(imported) == before, "refused before any operation row"
    denied = [e for e in imported.audit.list(AuditQuery(actor=OPERATOR.name, action="features.update"))
              if e.outcome == "denied"]
    assert len(denied) == 2 and denied[-1].request == {"kuberay_operator": False}, denied
    assert denied[0].target.endswith(f"{CLUSTER}/features")
    assert run(imported, ADMIN, FeaturesPatch(kuberay_operator=False)) == ["remove-kuberay_operator"]


def test_a_csi_driver_stays_while_its_volumes_are_bound(imported: Services) -> None:
    run(imported, ADMIN, FeaturesPatch(s3_csi_driver=True))
    core = k8s.CoreV1Api(imported.kube.api_client(CLUSTER))
    core.create_persistent_volume({"metadata": {"name": "shared-data"}, "spec": {
        "capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
        "csi": {"driver": "s3.csi.aws.com", "volumeHandle": "shared-bucket"}}})
    core.patch_persistent_volume_status("shared-data", {"status": {"phase": "Bound"}})
    before = operations(imported)
    with pytest.raises(Conflict, match="PersistentVolume shared-data") as refused:
        imported.features.update_features(ADMIN, CLUSTER, FeaturesPatch(s3_csi_driver=False))
    assert refused.value.details == {"feature": "s3_csi_driver", "in_use": ["PersistentVolume shared-data"]}
    assert operations(imported) == before
    core.delete_persistent_volume("shared-data")
    assert run(imported, ADMIN, FeaturesPatch(s3_csi_driver=False)) == ["remove-s3_csi_driver"]


def test_the_training_operator_stays_while_its_jobs_exist(imported: Services) -> None:
    run(imported, ADMIN, FeaturesPatch(hyperpod_training_operator=True))
    custom = k8s.CustomObjectsApi(imported.kube.api_client(CLUSTER))
    custom.create_namespaced_custom_object("sagemaker.amazonaws.com", "v1", "default", "hyperpodpytorchjobs", {
        "apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob", "metadata": {"name": "llama"},
        "spec": {"replicaSpecs": [{"name": "pods", "replicas": 1, "template": {"spec": {"containers": [
            {"name": "train", "image": "pytorch"}]}}}]}})
    with pytest.raises(Conflict, match="HyperPodPyTorchJob default/llama"):
        imported.features.update_features(ADMIN, CLUSTER, FeaturesPatch(hyperpod_training_operator=False))
    custom.delete_namespaced_custom_object("sagemaker.amazonaws.com", "v1", "default", "hyperpodpytorchjobs", "llama")
    wait_until(lambda: not custom.list_cluster_custom_object("sagemaker.amazonaws.com", "v1",
                                                             "hyperpodpytorchjobs")["items"], 60, "the job gone")
    assert run(imported, ADMIN, FeaturesPatch(hyperpod_training_operator=False)) == [
        "remove-hyperpod_training_operator"]


class CheckedOperator(TrainingOperator):
    """The training operator add-on with a preflight that finds two problems and records what it was given."""

    def preflight(self, target: Target, settings: BaseModel | None) -> list[str]:
        asked.append((target.cluster, settings))
        return ["no quota for it in this region", "its bucket is missing"]


asked: list[tuple[str, BaseModel | None]] = []


def test_a_components_preflight_refuses_listing_each_problem(imported: Services) -> None:
    checked = Feature(CheckedOperator("checked-operator", values=HYPERPOD_TRAINING_OPERATOR.values,
                                      read_settings=HYPERPOD_TRAINING_OPERATOR.read_settings), key="checked")
    real = imported.features
    features = Features(real.settings, real.aws, real.kube, real.registry, imported.engine, real.cache,
                        features=(checked,))
    before = operations(imported)
    with pytest.raises(Conflict, match="no quota for it in this region; its bucket is missing") as refused:
        features.update_features(ADMIN, CLUSTER, _patch_model((checked,))(checked={"cpu_limit": "3"}))
    assert refused.value.details == {"feature": "checked", "problems": [
        "no quota for it in this region", "its bucket is missing"]}
    assert asked == [(CLUSTER, TrainingOperatorSettings(cpu_limit="3"))], "given the validated settings"
    assert operations(imported) == before
    region = real.registry.get(CLUSTER).region
    assert "checked-operator" not in imported.aws.client("eks", region).list_addons(clusterName=CLUSTER)["addons"]
