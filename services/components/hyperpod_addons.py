"""The HyperPod operators that ship as EKS add-ons with configuration values: the training operator
(``amazon-sagemaker-hyperpod-training-operator``: HyperPodPyTorchJob, needs cert-manager and the pod identity
agent) and the inference operator (``amazon-sagemaker-hyperpod-inference``, pinned to the add-on version whose
operator matches the inference CRDs this project ships and validates against (operator v3.2, in
``sandbox/kube/crds/hyperpod-inference-operator``): v1.3.0-eksbuild.1).

Each is an :class:`~services.components.addons.Addon` whose ``configurationValues`` are part of what it wants:
the user's settings (a pydantic model, :attr:`settings_model`) plus what the control plane decides (the
inference operator's execution role, TLS bucket, HyperPod cluster ARN, and its bundled KEDA and load balancer
controller switched off: the registry owns one copy of each). The inference operator's execution role is
trusted through IRSA (the cluster's OIDC provider, for its controller's service account
``hyperpod-inference-system/hyperpod-inference-controller-manager``), not EKS Pod Identity: its add-on gets no
pod identity association, only the role's ARN in its values. Observing compares the add-on's actual
configuration and version with the wanted ones, so a changed setting is one ``UpdateAddon`` and an unchanged
one is nothing at all.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field

from services.components.addons import RESOLVE_CONFLICTS, Addon
from services.components.base import Component, Observation, Target
from services.components.identity import PodRole
from services.errors import Permanent


class TrainingOperatorSettings(BaseModel):
    """The training operator's controller: its resources and where it runs (the add-on's configurable values
    ``hpTrainingControllerManager.manager.resources`` and ``hpTrainingControllerManager.nodeSelector``)."""

    model_config = ConfigDict(extra="forbid")

    cpu_request: str = Field("1", description="CPU the controller requests (a Kubernetes quantity)")
    memory_request: str = Field("2Gi", description="memory the controller requests")
    cpu_limit: str = Field("2", description="CPU limit of the controller")
    memory_limit: str = Field("4Gi", description="memory limit of the controller")
    node_selector: dict[str, str] = Field(default_factory=dict,
                                          description="node labels the controller's pod must match (empty: any)")


def _training_values(settings: BaseModel | None, target: Target) -> dict[str, Any]:
    s = settings if isinstance(settings, TrainingOperatorSettings) else TrainingOperatorSettings()
    manager: dict[str, Any] = {"manager": {"resources": {
        "requests": {"cpu": s.cpu_request, "memory": s.memory_request},
        "limits": {"cpu": s.cpu_limit, "memory": s.memory_limit}}}}
    if s.node_selector:
        manager["nodeSelector"] = dict(s.node_selector)
    return {"hpTrainingControllerManager": manager}


def _training_settings(values: dict[str, Any]) -> dict[str, Any]:
    manager = values.get("hpTrainingControllerManager") or {}
    resources = (manager.get("manager") or {}).get("resources") or {}
    defaults = TrainingOperatorSettings()
    req, lim = resources.get("requests") or {}, resources.get("limits") or {}
    return TrainingOperatorSettings(
        cpu_request=str(req.get("cpu", defaults.cpu_request)), memory_request=str(req.get("memory",
                                                                                         defaults.memory_request)),
        cpu_limit=str(lim.get("cpu", defaults.cpu_limit)), memory_limit=str(lim.get("memory", defaults.memory_limit)),
        node_selector=dict(manager.get("nodeSelector") or {})).model_dump()


def _inference_values(settings: BaseModel | None, target: Target) -> dict[str, Any]:
    if not target.hyperpod_arn:
        raise Permanent(f"the inference operator of {target.cluster} needs its HyperPod cluster, and none is "
                        "registered with it")
    if not target.bucket:
        raise Permanent(f"the inference operator of {target.cluster} needs the shared bucket for its TLS "
                        "certificates, and none is set")
    return {"executionRoleArn": INFERENCE_ROLE.role_arn(target), "tlsCertificateS3Bucket": target.bucket,
            "hyperpodClusterArn": target.hyperpod_arn,
            # the registry installs one load balancer controller and this add-on's KEDA stays off: no second copy
            "alb": {"enabled": False}, "keda": {"enabled": False}}


def _parsed(values: str | None) -> dict[str, Any]:
    if not values:
        return {}
    loaded = yaml.safe_load(values)  # EKS takes JSON or YAML
    return loaded if isinstance(loaded, dict) else {}


@dataclass(frozen=True, eq=False)
class ConfiguredAddon(Addon):
    """An add-on installed at a pinned version with computed ``configurationValues``."""

    values: Callable[[BaseModel | None, Target], dict[str, Any]] | None = None
    #: the user's settings as read back from the add-on's configuration
    read_settings: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    settings: BaseModel | None = None
    settings_model: ClassVar[type[BaseModel] | None] = None

    def configured(self, settings: BaseModel | None) -> Component:
        return dataclasses.replace(self, settings=settings)

    def wanted_values(self, target: Target) -> dict[str, Any]:
        return self.values(self.settings, target) if self.values is not None else {}

    def observe(self, target: Target) -> Observation:
        obs = super().observe(target)
        addon = self._describe(target) if obs.status != "ABSENT" else None
        if addon is None:
            return obs
        actual = _parsed(addon.get("configurationValues"))
        if self.read_settings is not None:
            obs.settings = self.read_settings(actual)
        if obs.foreign or addon["status"] in ("CREATING", "UPDATING", "DELETING"):
            return obs
        if actual != self.wanted_values(target) or (self.version != "default"
                                                    and addon.get("addonVersion") != self.version):
            obs.missing.append("configuration")
            obs.settled = False
        return obs

    def apply(self, target: Target, observed: Observation) -> None:
        if "configuration" in observed.missing:
            params: dict[str, Any] = {"clusterName": target.eks_cluster, "addonName": self.name,
                                      "resolveConflicts": RESOLVE_CONFLICTS,
                                      "configurationValues": json.dumps(self.wanted_values(target), sort_keys=True)}
            if self.version != "default":
                params["addonVersion"] = self.version
            target.client("eks").update_addon(**params)
        super().apply(target, dataclasses.replace(observed, missing=[m for m in observed.missing
                                                                     if m != "configuration"]))

    def create_params(self, target: Target) -> dict[str, Any]:
        params: dict[str, Any] = {"configurationValues": json.dumps(self.wanted_values(target), sort_keys=True)}
        if self.version != "default":
            params["addonVersion"] = self.version
        return params


class TrainingOperator(ConfiguredAddon):
    settings_model: ClassVar[type[BaseModel] | None] = TrainingOperatorSettings


TRAINING_OPERATOR_ROLE = PodRole("hp-training-operator-role", "aws-hyperpod", "hp-training-operator-controller-manager",
                                 managed_policies=("AmazonSageMakerHyperPodTrainingOperatorAccess",),
                                 description="HyperPod training operator (EKS Pod Identity)")
INFERENCE_ROLE = PodRole("hp-inference-operator-role", "hyperpod-inference-system",
                         "hyperpod-inference-controller-manager",
                         managed_policies=("AmazonSageMakerHyperPodInferenceAccess",), irsa=True,
                         description="HyperPod inference operator execution role (IRSA)")

HYPERPOD_TRAINING_OPERATOR = TrainingOperator(
    "amazon-sagemaker-hyperpod-training-operator", identity=TRAINING_OPERATOR_ROLE, values=_training_values,
    read_settings=_training_settings, settings=TrainingOperatorSettings())
#: operator v3.2, the version of the CRDs under services/components/crds (add-on v1.3.0 <-> operator v3.2)
INFERENCE_ADDON_VERSION = "v1.3.0-eksbuild.1"
HYPERPOD_INFERENCE_OPERATOR = ConfiguredAddon("amazon-sagemaker-hyperpod-inference", version=INFERENCE_ADDON_VERSION,
                                              identity=INFERENCE_ROLE, values=_inference_values)
