"""The EKS add-on catalog and what an add-on does to its cluster, split from ``eks.py`` to keep both short.

Versions are realistic (the HyperPod add-on documentation and the public EKS add-on catalogue of 2026): the HyperPod
add-ons with their eksbuild versions, the base networking add-ons, cert-manager, CSI drivers and metrics-server. An
add-on that finishes installing applies the CRDs of its ``sandbox.kube.components`` (but not those of one its
``configurationValues`` switch off, ``<component>.enabled: false``, as Helm skips a disabled subchart), its
namespace and a controller Deployment labelled ``eks.amazonaws.com/addon``, with server-side apply under the field
manager ``eks``, so re-installing is a no-op; its health is then that Deployment's (:func:`workload_health`): ACTIVE
once every replica is available, DEGRADED with ``InsufficientNumberOfReplicas`` while a replica cannot be scheduled.
``configurationValues`` are checked against the add-on's schema (:data:`SCHEMAS`, served by
DescribeAddonConfiguration): unknown keys are refused.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml

from .base import AwsError

if TYPE_CHECKING:
    from sandbox.kube import Emulator

VERSIONS = ("1.34", "1.33", "1.32", "1.31", "1.30", "1.29", "1.28")


@dataclass(frozen=True)
class AddonSpec:
    """One add-on of the catalog: versions newest first, what it installs, which add-ons it needs."""

    type: str
    versions: tuple[str, ...]
    namespace: str = "kube-system"
    owner: str = "aws"
    publisher: str = "eks"
    components: tuple[str, ...] = ()  # sandbox.kube.components names whose CRDs it installs
    controller: str | None = None  # the Deployment it runs in ``namespace``
    csi_driver: str | None = None  # the CSIDriver object a storage add-on registers
    requires: tuple[str, ...] = ()
    iam: bool = False


ADDONS: dict[str, AddonSpec] = {
    "vpc-cni": AddonSpec("networking", ("v1.20.4-eksbuild.1", "v1.19.6-eksbuild.7", "v1.18.3-eksbuild.3"),
                         iam=True),
    "kube-proxy": AddonSpec("networking", ()),  # versions follow the cluster's minor, see _versions
    "coredns": AddonSpec("networking", ("v1.12.2-eksbuild.4", "v1.11.4-eksbuild.14"), controller="coredns"),
    "eks-pod-identity-agent": AddonSpec("security", ("v1.3.8-eksbuild.2", "v1.3.7-eksbuild.2")),
    "cert-manager": AddonSpec("security", ("v1.18.2-eksbuild.1", "v1.17.2-eksbuild.1"), namespace="cert-manager",
                              owner="community", publisher="cert-manager", components=("cert-manager",),
                              controller="cert-manager"),
    "metrics-server": AddonSpec("observability", ("v0.8.0-eksbuild.1", "v0.7.2-eksbuild.4"), owner="community",
                                publisher="metrics-server", controller="metrics-server"),
    "aws-ebs-csi-driver": AddonSpec("storage", ("v1.48.0-eksbuild.2", "v1.45.0-eksbuild.2"),
                                    controller="ebs-csi-controller", csi_driver="ebs.csi.aws.com", iam=True),
    "aws-mountpoint-s3-csi-driver": AddonSpec("storage", ("v2.1.0-eksbuild.1", "v1.14.1-eksbuild.1"),
                                              controller="s3-csi-controller", csi_driver="s3.csi.aws.com",
                                              iam=True),
    "aws-fsx-csi-driver": AddonSpec("storage", ("v1.6.0-eksbuild.1", "v1.5.0-eksbuild.1"),
                                    controller="fsx-csi-controller", csi_driver="fsx.csi.aws.com", iam=True),
    "amazon-sagemaker-hyperpod-training-operator": AddonSpec(
        "machine-learning", ("v1.2.0-eksbuild.1", "v1.1.0-eksbuild.1", "v1.0.0-eksbuild.1"), namespace="aws-hyperpod",
        components=("hyperpod-training-operator",), controller="hp-training-operator-controller-manager",
        requires=("cert-manager", "eks-pod-identity-agent"), iam=True),
    "amazon-sagemaker-hyperpod-inference": AddonSpec(
        "machine-learning", ("v1.5.0-eksbuild.1", "v1.4.0-eksbuild.1", "v1.3.0-eksbuild.1", "v1.2.0-eksbuild.1"),
        namespace="hyperpod-inference-system", components=("inference-operator", "keda"),
        controller="hyperpod-inference-controller-manager", requires=("cert-manager",), iam=True),
    "amazon-sagemaker-hyperpod-taskgovernance": AddonSpec(
        "machine-learning", ("v1.6.0-eksbuild.1", "v1.5.0-eksbuild.1", "v1.3.0-eksbuild.1"),
        namespace="kueue-system", components=("kueue",), controller="kueue-controller-manager"),
    "amazon-sagemaker-hyperpod-observability": AddonSpec(
        "observability", ("v1.0.3-eksbuild.1", "v1.0.2-eksbuild.1"), namespace="hyperpod-observability",
        controller="hyperpod-observability-operator", iam=True),
}


def addon_versions(name: str, k8s: str) -> tuple[str, ...]:
    """The versions of add-on ``name`` for Kubernetes ``k8s``, newest (the default) first."""
    if name == "kube-proxy":
        minor = int(k8s.split(".")[1])
        return (f"v{k8s}.{minor - 24}-eksbuild.2", f"v{k8s}.{minor - 26}-eksbuild.1")
    if name == "coredns":
        return ADDONS[name].versions[:1] if k8s >= "1.33" else ADDONS[name].versions[1:]
    return ADDONS[name].versions


def describe_addon_versions(p: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``addons`` of DescribeAddonVersions for its filters (before paging)."""
    k8s = p.get("kubernetesVersion")
    if k8s is not None and k8s not in VERSIONS:
        raise AwsError("InvalidParameterException", f"Unsupported Kubernetes version {k8s}")
    names = [p["addonName"]] if p.get("addonName") else sorted(ADDONS)
    infos = []
    for name in names:
        spec = ADDONS.get(name)
        if spec is None:
            raise AwsError("ResourceNotFoundException", f"Addon {name} specified is not supported", 404)
        if (p.get("types") and spec.type not in p["types"]) or (p.get("owners") and spec.owner not in p["owners"]) \
                or (p.get("publishers") and spec.publisher not in p["publishers"]):
            continue
        clusters = [k8s] if k8s else list(VERSIONS)
        versions = []
        for index, version in enumerate(addon_versions(name, clusters[0])):
            versions.append({
                "addonVersion": version, "architecture": ["amd64", "arm64"], "computeTypes": ["ec2"],
                "compatibilities": [{"clusterVersion": c, "platformVersions": ["*"], "defaultVersion": index == 0}
                                    for c in clusters],
                "requiresConfiguration": False, "requiresIamPermissions": spec.iam})
        infos.append({"addonName": name, "type": spec.type, "addonVersions": versions, "publisher": spec.publisher,
                      "owner": spec.owner, "defaultNamespace": spec.namespace})
    return infos

# --- configuration schemas (DescribeAddonConfiguration) -----------------------------------------------------


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties}


_STR: dict[str, Any] = {"type": "string"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_INT: dict[str, Any] = {"type": "integer", "minimum": 0}
_QUANTITIES = _obj({"cpu": {"type": ["string", "number"]}, "memory": _STR})
_RESOURCES = _obj({"requests": _QUANTITIES, "limits": _QUANTITIES})
_STR_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
_LIST: dict[str, Any] = {"type": "array", "items": {"type": "object"}}
# What most EKS add-on schemas share for their controller's pods.
_POD_FIELDS: dict[str, Any] = {"resources": _RESOURCES, "nodeSelector": _STR_MAP, "tolerations": _LIST,
                               "affinity": {"type": "object"}, "podAnnotations": _STR_MAP, "podLabels": _STR_MAP,
                               "priorityClassName": _STR}
_CONTROLLER = _obj({"replicaCount": _INT, **_POD_FIELDS, "topologySpreadConstraints": _LIST})
_CSI = _obj({"controller": _CONTROLLER, "node": _obj({**_POD_FIELDS, "tolerateAllTaints": _BOOL}),
             "sidecars": {"type": "object"}, "defaultStorageClass": _obj({"enabled": _BOOL})})
_LEVEL = _obj({"level": {"type": "string", "enum": ["INFO", "ADVANCED"]}, "scrapeInterval": _INT})
_IRSA = _obj({"enabled": _BOOL, "roleArn": _STR})
SCHEMAS: dict[str, dict[str, Any]] = {
    "vpc-cni": _obj({"env": _STR_MAP, "init": _obj({"env": _STR_MAP}), "nodeAgent": _obj({"enabled": _BOOL}),
                     "enableNetworkPolicy": {"type": "string", "enum": ["true", "false"]}, "resources": _RESOURCES,
                     "tolerations": _LIST}),
    "kube-proxy": _obj({"ipvs": _obj({"scheduler": _STR}), "mode": {"type": "string", "enum": ["iptables", "ipvs"]},
                        "resources": _RESOURCES, "podAnnotations": _STR_MAP}),
    "coredns": _obj({"replicaCount": _INT, **_POD_FIELDS, "corefile": _STR, "topologySpreadConstraints": _LIST,
                     "autoScaling": _obj({"enabled": _BOOL, "minReplicas": _INT, "maxReplicas": _INT}),
                     "podDisruptionBudget": _obj({"enabled": _BOOL, "maxUnavailable": {"type": ["integer", "string"]},
                                                  "minAvailable": {"type": ["integer", "string"]}})}),
    "eks-pod-identity-agent": _obj({"agent": _obj({"additionalArgs": _STR_MAP}), "resources": _RESOURCES,
                                    "tolerations": _LIST, "nodeSelector": _STR_MAP, "affinity": {"type": "object"}}),
    "cert-manager": _obj({"replicaCount": _INT, **_POD_FIELDS, "webhook": _CONTROLLER, "cainjector": _CONTROLLER}),
    "metrics-server": _obj({"replicas": _INT, **_POD_FIELDS, "args": {"type": "array", "items": _STR}}),
    "aws-ebs-csi-driver": _CSI,
    "aws-mountpoint-s3-csi-driver": _CSI,
    "aws-fsx-csi-driver": _CSI,
    "amazon-sagemaker-hyperpod-training-operator": _obj({"hpTrainingControllerManager": _obj({
        "manager": _obj({"resources": _RESOURCES}), "nodeSelector": _STR_MAP, "tolerations": _LIST})}),
    "amazon-sagemaker-hyperpod-inference": _obj({
        "executionRoleArn": _STR, "tlsCertificateS3Bucket": _STR, "hyperpodClusterArn": _STR,
        "jumpstartGatedModelDownloadRoleArn": _STR,
        "alb": _obj({"enabled": _BOOL, "serviceAccount": _obj({"create": _BOOL, "roleArn": _STR})}),
        "keda": _obj({"enabled": _BOOL, "auth": _obj({"aws": _obj({"irsa": _IRSA})})}),
        "inferenceOperator": _obj({"enabled": _BOOL}),
        "inferenceGateway": _obj({"enabled": _BOOL, "serviceAccount": _obj({"roleArn": _STR})})}),
    "amazon-sagemaker-hyperpod-taskgovernance": _obj({"controllerManager": _obj({"manager": _obj({
        "resources": _RESOURCES}), "replicas": _INT, "nodeSelector": _STR_MAP, "tolerations": _LIST})}),
    "amazon-sagemaker-hyperpod-observability": _obj({
        "ampWorkspace": _obj({"prometheusEndpoint": _STR, "arn": _STR}),
        "amgWorkspace": _obj({"workspaceName": _STR, "arn": _STR}),
        "metricsProvider": _obj({k: _LEVEL for k in (
            "trainingMetrics", "inferenceMetrics", "taskGovernanceMetrics", "scalingMetrics", "customMetrics",
            "nodeMetrics", "acceleratedComputeMetrics", "networkMetrics")}),
        "logging": _obj({"enabled": _BOOL})}),
}


def configuration_schema(name: str) -> dict[str, Any]:
    """The JSON schema (draft-07) of add-on ``name``'s ``configurationValues``."""
    return {"$schema": "http://json-schema.org/draft-07/schema#", **SCHEMAS[name]}


def describe_configuration(p: dict[str, Any]) -> dict[str, Any]:
    """DescribeAddonConfiguration: the schema of one add-on version (and the service accounts it runs as)."""
    name, version = p["addonName"], p["addonVersion"]
    if name not in ADDONS:
        raise AwsError("ResourceNotFoundException", f"Addon {name} specified is not supported", 404)
    known = {v for k8s in VERSIONS for v in addon_versions(name, k8s)}
    if version not in known:
        raise AwsError("InvalidParameterException", f"Addon version {version} specified is not supported for "
                                                    f"addon {name}")
    spec = ADDONS[name]
    pod_identity = [{"serviceAccount": spec.controller, "recommendedManagedPolicies": []}] \
        if spec.iam and spec.controller else []
    return {"addonName": name, "addonVersion": version, "configurationSchema": json.dumps(configuration_schema(name)),
            "podIdentityConfiguration": pod_identity}


def _schema_error(err: jsonschema.ValidationError) -> str:
    path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return ", ".join(f"{path}.{key}: is not defined in the schema and the schema does not allow additional "
                         "properties" for key in extra)
    if err.validator == "type":
        found = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
                 type(None): "null"}.get(type(err.instance), "value")
        wanted = err.validator_value if isinstance(err.validator_value, str) else ", ".join(err.validator_value)
        return f"{path}: {found} found, {wanted} expected"
    if err.validator == "enum":
        return f"{path}: does not have a value in the enumeration {json.dumps(err.validator_value)}"
    return f"{path}: {err.message}"


def check_configuration(name: str, values: str | None) -> None:
    """``configurationValues`` must be a JSON or YAML object valid against the add-on's schema, as EKS
    checks (unknown keys refused: the schemas do not allow additional properties)."""
    if not values:
        return
    try:
        parsed = yaml.safe_load(values)
    except yaml.YAMLError as exc:
        raise AwsError("InvalidParameterException", f"ConfigurationValue provided in request is not supported: "
                                                    f"{exc}") from exc
    if not isinstance(parsed, dict):
        raise AwsError("InvalidParameterException",
                       "ConfigurationValue provided in request is not supported: Json schema validation failed "
                       "with error: [$: must be an object]")
    validator = jsonschema.Draft7Validator(SCHEMAS[name])
    errors = sorted(validator.iter_errors(parsed), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise AwsError("InvalidParameterException",
                       "ConfigurationValue provided in request is not supported: Json schema validation failed with "
                       f"error: [{', '.join(_schema_error(e) for e in errors)}]")


# --- health from the add-on's workloads ------------------------------------------------------------------

HEALTHY, STARTING, INSUFFICIENT = "healthy", "starting", "insufficient"
DEGRADED_MESSAGE = "The add-on is unhealthy because it doesn't have the desired number of replicas."


def workload_health(kube: Emulator | None, cluster_name: str, addon_name: str) -> str:
    """How an installed add-on's controller Deployment is doing: ``healthy`` (every replica available, or no
    workload to watch), ``starting`` (pods on their way) or ``insufficient`` (a replica cannot be scheduled
    or created, or the Deployment is gone): EKS's ``InsufficientNumberOfReplicas``."""
    spec = ADDONS[addon_name]
    if kube is None or cluster_name not in kube.clusters or spec.controller is None:
        return HEALTHY
    store = kube.cluster(cluster_name).store
    deploy = store.get(("apps", "deployments"), (spec.namespace, spec.controller))
    if deploy is None:
        return INSUFFICIENT
    status = deploy.get("status") or {}
    if int(status.get("availableReplicas", 0)) >= int((deploy.get("spec") or {}).get("replicas", 1)):
        return HEALTHY
    for _, rs in store.items(("apps", "replicasets"), spec.namespace):
        owners = {r.get("uid") for r in rs["metadata"].get("ownerReferences") or ()}
        if deploy["metadata"]["uid"] in owners and any(
                c.get("type") == "ReplicaFailure" for c in (rs.get("status") or {}).get("conditions") or []):
            return INSUFFICIENT
    labels = ((deploy.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    for _, pod in store.items(("", "pods"), spec.namespace):
        if labels.items() <= (pod["metadata"].get("labels") or {}).items() and any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in (pod.get("status") or {}).get("conditions") or []):
            return INSUFFICIENT
    return STARTING


def install(kube: Emulator | None, cluster_name: str, addon_name: str, region: str,
            configuration: str | None = None) -> None:
    """Apply what an ACTIVE add-on runs: its CRDs (not those of a component its ``configuration`` switches off, as
    Helm skips a disabled subchart: the inference add-on's bundled KEDA with ``keda.enabled`` false), its CSIDriver,
    namespace and controller Deployment."""
    if kube is None or cluster_name not in kube.clusters:
        return
    from sandbox.kube import WriteOptions, install_component_crds

    spec = ADDONS[addon_name]
    cluster = kube.cluster(cluster_name)
    values = yaml.safe_load(configuration or "{}")
    for component in spec.components:
        if isinstance(values, dict) and (values.get(component) or {}).get("enabled") is False:
            continue
        install_component_crds(cluster, component, manager="eks")
    opts = WriteOptions(manager="eks", force=True)
    if spec.csi_driver is not None:
        driver = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                  "metadata": {"name": spec.csi_driver, "labels": {"eks.amazonaws.com/addon": addon_name}},
                  "spec": {"attachRequired": spec.csi_driver == "ebs.csi.aws.com", "podInfoOnMount": False}}
        cluster.patch(cluster.builtin("storage.k8s.io", "csidrivers"), None, spec.csi_driver, "apply", driver, opts)
    if spec.controller is None:
        return
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace}}
    cluster.patch(cluster.builtin("", "namespaces"), None, spec.namespace, "apply", namespace, opts)
    labels = {"app.kubernetes.io/name": spec.controller, "app.kubernetes.io/managed-by": "EKS",
              "eks.amazonaws.com/addon": addon_name}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": spec.controller, "namespace": spec.namespace, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": spec.controller}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "manager",
                                                       "image": f"602401143452.dkr.ecr.{region}.amazonaws"
                                                                f".com/eks/{addon_name}:latest"}]}}},
    }
    cluster.patch(cluster.builtin("apps", "deployments"), spec.namespace, spec.controller, "apply", deployment,
                  opts)

def uninstall(kube: Emulator | None, cluster_name: str, addon_name: str) -> None:
    """Remove a deleted add-on's controller (CRDs stay, as with EKS, so custom resources survive)."""
    spec = ADDONS[addon_name]
    if kube is None or cluster_name not in kube.clusters or spec.controller is None:
        return
    from sandbox.kube import ApiError
    from sandbox.kube.deletion import delete

    cluster = kube.cluster(cluster_name)
    with contextlib.suppress(ApiError):  # already gone: deleting an add-on is idempotent on the cluster side
        delete(cluster, cluster.builtin("apps", "deployments"), spec.namespace, spec.controller)
