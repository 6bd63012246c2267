"""The managed features: components of the registry (``services/components``) a user turns on and off per
cluster, with their dependencies declared as data. A feature is any :class:`~services.components.Component`
(with or without a ``settings_model``), so one source of truth says how a component is installed, whether at
create or by a toggle.

The order of :data:`FEATURES` is the install order: enabling runs prerequisites first, disabling runs
dependents first (the reverse). :func:`ordered` checks that every dependency comes before what needs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.components import Component
from services.components.families import (
    CERT_MANAGER,
    FSX_CSI,
    KUBERAY,
    LOAD_BALANCER_CONTROLLER,
    METRICS_SERVER,
    POD_IDENTITY_AGENT,
    S3_CSI,
)
from services.components.hyperpod_addons import HYPERPOD_INFERENCE_OPERATOR, HYPERPOD_TRAINING_OPERATOR
from services.components.karpenter import ManagedKarpenter
from services.components.tiered import TieredCheckpointing
from services.errors import Permanent
from services.features.in_use import InUse, bound_volumes, custom_resources, load_balanced


@dataclass(frozen=True)
class Feature:
    """One toggle: its ``key`` (the field of ``PATCH .../features``), the component, what it needs on first,
    one line for people, and what uses it (``in_use``: it is not turned off while that lists anything)."""

    component: Component
    depends_on: tuple[str, ...] = ()
    key: str = ""
    summary: str = ""
    in_use: InUse | None = None
    #: what to do about what ``in_use`` lists, for the refusal
    in_use_hint: str = "delete those first, then turn it off"

    @property
    def name(self) -> str:
        return self.key or self.component.name.replace("-", "_")


def ordered(features: Sequence[Feature]) -> tuple[Feature, ...]:
    """``features`` as given, once checked: unique keys, every dependency known and listed before its dependent."""
    seen: set[str] = set()
    for feature in features:
        if feature.name in seen:
            raise Permanent(f"feature {feature.name} is listed twice; this is a bug")
        late = [d for d in feature.depends_on if d not in seen]
        if late:
            raise Permanent(f"feature {feature.name} depends on {late}, which are not listed before it; this is a bug")
        seen.add(feature.name)
    return tuple(features)


FEATURES: tuple[Feature, ...] = ordered((
    Feature(POD_IDENTITY_AGENT, key="pod_identity_agent",
            summary="EKS Pod Identity agent: how the operators' pods get their IAM roles"),
    Feature(CERT_MANAGER, key="cert_manager", summary="cert-manager: webhook certificates for the HyperPod operators"),
    Feature(METRICS_SERVER, key="metrics_server", summary="metrics-server: pod and node resource metrics"),
    Feature(S3_CSI, depends_on=("pod_identity_agent",), key="s3_csi_driver",
            summary="Mountpoint for Amazon S3 CSI driver, on the shared bucket", in_use=bound_volumes("s3.csi.aws.com"),
            in_use_hint="delete those volumes (and the claims and pods that mount them) first, then turn it off"),
    Feature(FSX_CSI, depends_on=("pod_identity_agent",), key="fsx_csi_driver",
            summary="Amazon FSx for Lustre CSI driver", in_use=bound_volumes("fsx.csi.aws.com"),
            in_use_hint="delete those volumes (and the claims and pods that mount them) first, then turn it off"),
    Feature(KUBERAY, key="kuberay_operator", summary="KubeRay operator: RayCluster, RayJob, RayService"),
    Feature(LOAD_BALANCER_CONTROLLER, depends_on=("pod_identity_agent", "cert_manager"),
            key="load_balancer_controller",
            summary="AWS Load Balancer Controller: the one copy every load-balanced Service and Ingress uses",
            in_use=load_balanced,
            in_use_hint="delete those first (their load balancers go with them), then turn it off"),
    Feature(HYPERPOD_TRAINING_OPERATOR, depends_on=("cert_manager", "pod_identity_agent"),
            key="hyperpod_training_operator",
            summary="HyperPod training operator (EKS add-on): HyperPodPyTorchJob with job auto-resume",
            in_use=custom_resources(("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob", "hyperpodpytorchjobs"))),
    Feature(HYPERPOD_INFERENCE_OPERATOR,
            depends_on=("cert_manager", "metrics_server", "s3_csi_driver", "fsx_csi_driver",
                        "load_balancer_controller"),
            key="hyperpod_inference_operator",
            summary="HyperPod inference operator (EKS add-on, operator v3.2): InferenceEndpointConfig, JumpStartModel; "
                    "its bundled KEDA and load balancer controller are off",
            in_use=custom_resources(
                ("inference.sagemaker.aws.amazon.com/v1", "InferenceEndpointConfig", "inferenceendpointconfigs"),
                ("inference.sagemaker.aws.amazon.com/v1", "JumpStartModel", "jumpstartmodels"))),
    Feature(TieredCheckpointing(), key="tiered_checkpointing",
            summary="HyperPod managed tiered checkpointing (TieredStorageConfig) and its IRSA chain for the training "
                    "namespace's service account; settings: memory_percent, namespace"),
    Feature(ManagedKarpenter(), key="managed_karpenter",
            summary="HyperPod managed Karpenter autoscaling of eligible instance groups (the precheck names each "
                    "missing prerequisite and refused group); settings: instance_groups, max_nodes"),
))


def by_name(features: Iterable[Feature]) -> dict[str, Feature]:
    return {f.name: f for f in features}


def prerequisites(features: Sequence[Feature], names: Iterable[str]) -> set[str]:
    """``names`` and everything they need, transitively."""
    index = by_name(features)
    out: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo.extend(index[name].depends_on)
    return out


def dependents(features: Sequence[Feature], name: str) -> list[str]:
    """The features that need ``name`` directly."""
    return [f.name for f in features if name in f.depends_on]
