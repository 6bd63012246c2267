"""Managed tiered checkpointing as a managed feature: HyperPod's ``TieredStorageConfig`` on the cluster, and the
identity chain training pods use to write checkpoints to the shared bucket.

HyperPod enables the feature cluster-wide (``UpdateCluster`` with only ``TieredStorageConfig``: the request's
one required field is ``ClusterName``, so no instance group is re-sent) and runs its memory-management daemon
on the nodes; there is no CRD (aws-facts §6, §10). Training code reaches S3 through IAM roles for service
accounts, which this component builds piece by piece, each observed before it is made:

* the customer managed policy ``<cluster>-tiered-checkpointing``: list the shared bucket, read, write and delete
  its objects, nothing else;
* the role ``<cluster>-tiered-checkpointing``, trusting the cluster's IAM OIDC provider for EXACTLY the service
  account ``<namespace>/tiered-checkpointing`` (``sub`` and ``aud`` conditions), with the policy attached;
* the service account itself, labelled ours and annotated with the role's ARN, in the training namespace (the
  jobs' default ``hyperpod-ns-training`` unless the settings name another one: HyperPod's job auto-resume only
  handles namespaces prefixed ``hyperpod`` or ``kubeflow``). A namespace that does not exist yet is created
  (labelled ours) and kept when the feature is disabled: the jobs live there.

Disabling (:meth:`leftover` → :meth:`delete`) sets ``Mode=Disable`` and removes exactly that chain, and only
what carries our tags or label.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, ClassVar, Literal

from kubernetes import client as k8s
from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.clusters.create_base import owned, tag_list
from services.components.base import Component, Leftover, Observation, Target
from services.components.manifests import COMPONENT_LABEL, MANAGED_LABEL, OURS
from services.errors import NotFound, Permanent

NAME = "tiered-checkpointing"
#: the managed features this one needs first (none: it is cluster-level HyperPod configuration plus IAM)
PREREQUISITES: tuple[str, ...] = ()
DEFAULT_NAMESPACE = "hyperpod-ns-training"
NAMESPACE_PREFIXES = ("hyperpod", "kubeflow")  # what HyperPod's job auto-resume recognises
SERVICE_ACCOUNT = "tiered-checkpointing"
ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
AUDIENCE = "sts.amazonaws.com"
MIN_PERCENT = 20  # the setup guide's range is 20-100 (the API model allows 0-100)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SETTLED_STATUSES = ("InService",)


class TieredSettings(BaseModel):
    """What the user decides: how much of each node's memory the checkpoint tier may use, and the namespace the
    training jobs (and so the service account) run in."""

    model_config = ConfigDict(extra="forbid")

    memory_percent: int | None = Field(None, ge=MIN_PERCENT, le=100, description=(
        "InstanceMemoryAllocationPercentage: the share of each node's memory HyperPod reserves for checkpoints "
        f"({MIN_PERCENT}-100); unset: HyperPod's default"))
    namespace: str = Field(DEFAULT_NAMESPACE, description=(
        "the training namespace whose service account may write checkpoints to the shared bucket; HyperPod's "
        "auto-resume needs a name starting with 'hyperpod' or 'kubeflow'"))

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.match(value) or len(value) > 63:
            raise ValueError(f"{value!r} is not a Kubernetes namespace name (lowercase letters, digits and '-', "
                             "at most 63 characters)")
        if not value.startswith(NAMESPACE_PREFIXES):
            raise ValueError(f"namespace {value!r}: HyperPod's job auto-resume only handles namespaces starting "
                             f"with 'hyperpod' or 'kubeflow'; use {DEFAULT_NAMESPACE!r} (the jobs' default) or "
                             "another 'hyperpod-' namespace")
        return value


class TieredCheckpointing(Component):
    """The feature, reconciling toward one :class:`TieredSettings` (the defaults unless :meth:`configured`)."""

    name = NAME
    kind: Literal["addon", "manifest"] = "manifest"
    version = "TieredStorageConfig"
    resource_type = "HyperPod TieredStorageConfig + IAM role (IRSA) + Kubernetes ServiceAccount"
    settings_model: ClassVar[type[BaseModel] | None] = TieredSettings

    def __init__(self, settings: TieredSettings | None = None) -> None:
        self.settings = settings or TieredSettings()

    def configured(self, settings: BaseModel | None) -> TieredCheckpointing:
        if settings is None:
            return TieredCheckpointing()
        return TieredCheckpointing(TieredSettings.model_validate(settings.model_dump()))

    # ----- names and documents ------------------------------------------------------------------------------

    @staticmethod
    def iam_name(target: Target) -> str:
        return f"{target.cluster}-{NAME}"

    def policy_arn(self, target: Target) -> str:
        from services.clusters.iam_stage import partition  # at call time: iam_stage imports this package
        return f"arn:{partition(target.region)}:iam::{target.account}:policy/{self.iam_name(target)}"

    def role_arn(self, target: Target) -> str:
        from services.clusters.iam_stage import partition
        return f"arn:{partition(target.region)}:iam::{target.account}:role/{self.iam_name(target)}"

    @staticmethod
    def policy_document(target: Target) -> dict[str, Any]:
        """The shared bucket only: list it; read, write and delete its objects."""
        if not target.bucket:
            raise Permanent(f"tiered checkpointing on {target.cluster} writes to the shared bucket, and none is "
                            "set for this cluster")
        from services.clusters.iam_stage import partition
        bucket = f"arn:{partition(target.region)}:s3:::{target.bucket}"
        return {"Version": "2012-10-17", "Statement": [
            {"Sid": "ListCheckpointBucket", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket]},
            {"Sid": "CheckpointObjects", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
             "Resource": [f"{bucket}/*"]}]}

    def trust_document(self, issuer: str, provider: str) -> dict[str, Any]:
        """Web identities from the cluster's OIDC provider, for exactly our service account."""
        host = issuer.removeprefix("https://")
        return {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": provider}, "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {
                f"{host}:sub": f"system:serviceaccount:{self.settings.namespace}:{SERVICE_ACCOUNT}",
                f"{host}:aud": AUDIENCE}}}]}

    def wanted_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"Mode": "Enable"}
        if self.settings.memory_percent is not None:
            config["InstanceMemoryAllocationPercentage"] = self.settings.memory_percent
        return config

    # ----- reads --------------------------------------------------------------------------------------------

    @staticmethod
    def _hyperpod(target: Target) -> dict[str, Any]:
        if not target.hyperpod_cluster:
            raise Permanent(f"{target.cluster} has no HyperPod cluster: tiered checkpointing is a HyperPod feature")
        cluster: dict[str, Any] = target.client("sagemaker").describe_cluster(ClusterName=target.hyperpod_cluster)
        if "Eks" not in (cluster.get("Orchestrator") or {}):
            raise Permanent(f"HyperPod cluster {target.hyperpod_cluster} is not orchestrated by EKS: tiered "
                            "checkpointing is only offered on EKS-orchestrated clusters")
        return cluster

    @staticmethod
    def _oidc(target: Target) -> tuple[str, str, str | None]:
        """The EKS cluster's OIDC issuer, its IAM provider's ARN, and why the role cannot trust it (None: it
        can; IAM has no provider for the issuer otherwise)."""
        from services.clusters.eks_stage import provider_arn
        issuer = str(target.client("eks").describe_cluster(name=target.eks_cluster)["cluster"]
                     .get("identity", {}).get("oidc", {}).get("issuer", ""))
        if not issuer:
            return "", "", f"EKS cluster {target.eks_cluster} has no OIDC issuer"
        arn = provider_arn(target.account, target.region, issuer)
        try:
            target.client("iam").get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
        except NotFound:
            return issuer, arn, (f"EKS cluster {target.eks_cluster} has no IAM OIDC provider for {issuer}: the "
                                 "checkpoint role trusts the cluster's service accounts through it; create it (IAM "
                                 "CreateOpenIDConnectProvider, audience sts.amazonaws.com), then retry")
        return issuer, arn, None

    def _policy(self, target: Target) -> dict[str, Any] | None:
        try:
            policy: dict[str, Any] = target.client("iam").get_policy(PolicyArn=self.policy_arn(target))["Policy"]
        except NotFound:
            return None
        return policy

    def _role(self, target: Target) -> dict[str, Any] | None:
        try:
            role: dict[str, Any] = target.client("iam").get_role(RoleName=self.iam_name(target))["Role"]
        except NotFound:
            return None
        return role

    def _role_tags(self, target: Target) -> dict[str, str]:
        tags = target.client("iam").list_role_tags(RoleName=self.iam_name(target)).get("Tags", [])
        return {t["Key"]: t["Value"] for t in tags}

    def _attached(self, target: Target) -> set[str]:
        pages = target.client("iam").all_pages("list_attached_role_policies", "AttachedPolicies",
                                               RoleName=self.iam_name(target))
        return {p["PolicyArn"] for p in pages}

    @staticmethod
    def _core(target: Target) -> k8s.CoreV1Api:
        if target.kube is None:
            raise Permanent(f"{NAME}: the cluster's Kubernetes API is not registered")
        return k8s.CoreV1Api(target.kube)

    def _namespace(self, target: Target) -> Any | None:
        try:
            return self._core(target).read_namespace(self.settings.namespace)
        except NotFound:
            return None

    def _ours_elsewhere(self, target: Target) -> list[Any]:
        """Our service accounts (by label) in every namespace."""
        listed = self._core(target).list_service_account_for_all_namespaces(
            label_selector=f"{MANAGED_LABEL}={OURS},{COMPONENT_LABEL}={NAME}")
        return list(listed.items or [])

    # ----- the component ------------------------------------------------------------------------------------

    def observe(self, target: Target) -> Observation:
        cluster = self._hyperpod(target)
        config = cluster.get("TieredStorageConfig") or {}
        enabled = config.get("Mode") == "Enable"
        missing: list[str] = []
        if not enabled or (self.settings.memory_percent is not None and config.get(
                "InstanceMemoryAllocationPercentage") != self.settings.memory_percent):
            missing.append("tiered-storage")
        if self._namespace(target) is None:
            missing.append("namespace")
        policy = self._policy(target)
        if policy is None:
            missing.append("policy")
        elif not owned({t["Key"]: t["Value"] for t in target.client("iam").list_policy_tags(
                PolicyArn=self.policy_arn(target)).get("Tags", [])}, target.cluster):
            raise Permanent(f"the IAM policy {self.iam_name(target)} exists and is not {target.cluster}'s (no "
                            "instantstart tags): it is left alone; delete or rename it, then retry")
        issuer, provider, no_provider = self._oidc(target)
        role = self._role(target)
        if role is None:
            missing += ["role", "attachment"]
        else:
            if not owned(self._role_tags(target), target.cluster):
                raise Permanent(f"the IAM role {self.iam_name(target)} exists and is not {target.cluster}'s (no "
                                "instantstart tags): it is left alone; delete or rename it, then retry")
            if no_provider is None and role.get("AssumeRolePolicyDocument") != self.trust_document(issuer, provider):
                missing.append("trust")
            if self.policy_arn(target) not in self._attached(target):
                missing.append("attachment")
        accounts = self._ours_elsewhere(target)
        here = [sa for sa in accounts if sa.metadata.namespace == self.settings.namespace
                and sa.metadata.name == SERVICE_ACCOUNT]
        if not here or (here[0].metadata.annotations or {}).get(ROLE_ANNOTATION) != self.role_arn(target) or \
                len(accounts) > 1:
            missing.append("service-account")
        ours = role is not None or bool(accounts)
        settings = {"memory_percent": config.get("InstanceMemoryAllocationPercentage"),
                    "namespace": accounts[0].metadata.namespace if accounts else None} if enabled else {}
        status = cluster.get("ClusterStatus", "")
        settled = not missing and no_provider is None and status in SETTLED_STATUSES
        detail = "" if settled else (no_provider or (f"to do: {', '.join(missing)}" if missing else
                                                   f"HyperPod cluster {target.hyperpod_cluster} is {status}"))
        return Observation(status="Enabled" if not missing else ("Enabled (incomplete)" if enabled else "ABSENT"),
                           missing=missing, settled=settled, healthy=settled, detail=detail,
                           version=self.version, settings=settings, foreign=enabled and not ours,
                           failed=no_provider)

    def blocked(self, target: Target) -> str | None:
        """UpdateCluster is refused while the HyperPod cluster is busy (a continuous cluster takes it while
        Updating); the IAM and Kubernetes pieces never wait."""
        cluster = self._hyperpod(target)
        status = cluster.get("ClusterStatus")
        if status == "InService" or (status == "Updating" and cluster.get("NodeProvisioningMode") == "Continuous"):
            return None
        return f"HyperPod cluster {target.hyperpod_cluster} is {status}: TieredStorageConfig waits until InService"

    def apply(self, target: Target, observed: Observation) -> None:
        if observed.failed:
            raise Permanent(f"tiered checkpointing cannot be enabled: {observed.failed}")
        todo = set(observed.missing)
        iam = target.client("iam")
        name = self.iam_name(target)
        if "tiered-storage" in todo and not self.blocked(target):
            target.client("sagemaker").update_cluster(ClusterName=target.hyperpod_cluster,
                                                      TieredStorageConfig=self.wanted_config())
        core = self._core(target)
        if "namespace" in todo:
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
                name=self.settings.namespace, labels={MANAGED_LABEL: OURS, COMPONENT_LABEL: NAME})))
        if "policy" in todo:
            iam.create_policy(PolicyName=name, PolicyDocument=json.dumps(self.policy_document(target)),
                              Description=f"Tiered checkpoints of {target.cluster} to its shared bucket",
                              Tags=tag_list(target.tags))
        if {"role", "trust"} & todo:
            issuer, provider, _ = self._oidc(target)
            trust = json.dumps(self.trust_document(issuer, provider))
            if "role" in todo:
                iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust, Tags=tag_list(target.tags),
                                Description=f"{self.settings.namespace}/{SERVICE_ACCOUNT} of {target.cluster} "
                                            "(tiered checkpointing, IAM roles for service accounts)")
            else:
                iam.update_assume_role_policy(RoleName=name, PolicyDocument=trust)
        if "attachment" in todo:
            iam.attach_role_policy(RoleName=name, PolicyArn=self.policy_arn(target))
        if "service-account" in todo:
            self._service_account(target, core)

    def _service_account(self, target: Target, core: k8s.CoreV1Api) -> None:
        """Ours in the wanted namespace, annotated with the role; ours in any other namespace (the settings
        moved) deleted."""
        body = k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(
            name=SERVICE_ACCOUNT, namespace=self.settings.namespace,
            labels={MANAGED_LABEL: OURS, COMPONENT_LABEL: NAME},
            annotations={ROLE_ANNOTATION: self.role_arn(target)}))
        found = False
        for sa in self._ours_elsewhere(target):
            if sa.metadata.namespace == self.settings.namespace and sa.metadata.name == SERVICE_ACCOUNT:
                found = True
                if (sa.metadata.annotations or {}).get(ROLE_ANNOTATION) != self.role_arn(target):
                    core.patch_namespaced_service_account(SERVICE_ACCOUNT, self.settings.namespace, body)
            else:
                core.delete_namespaced_service_account(sa.metadata.name, sa.metadata.namespace)
        if not found:
            try:
                core.create_namespaced_service_account(self.settings.namespace, body)
            except NotFound as exc:  # the namespace went away between observe and apply
                raise Permanent(f"namespace {self.settings.namespace} is gone; retry to create it") from exc

    def leftover(self, target: Target) -> Leftover:
        left = Leftover()
        if target.hyperpod_cluster:
            try:
                config = target.client("sagemaker").describe_cluster(
                    ClusterName=target.hyperpod_cluster).get("TieredStorageConfig") or {}
            except NotFound:
                config = {}
            if config.get("Mode") == "Enable":
                left.to_delete.append("tiered-storage")
        if target.kube is not None:
            left.to_delete += [f"service-account:{sa.metadata.namespace}/{sa.metadata.name}"
                               for sa in self._ours_elsewhere(target)]
        if self._role(target) is not None and owned(self._role_tags(target), target.cluster):
            left.to_delete.append(f"role:{self.iam_name(target)}")
        if self._policy(target) is not None and owned({t["Key"]: t["Value"] for t in target.client(
                "iam").list_policy_tags(PolicyArn=self.policy_arn(target)).get("Tags", [])}, target.cluster):
            left.to_delete.append(f"policy:{self.iam_name(target)}")
        return left

    def delete(self, target: Target, left: Leftover) -> None:
        iam = target.client("iam")
        for piece in left.to_delete:
            kind, _, ident = piece.partition(":")
            if kind == "tiered-storage":
                target.client("sagemaker").update_cluster(ClusterName=target.hyperpod_cluster,
                                                          TieredStorageConfig={"Mode": "Disable"})
            elif kind == "service-account":
                namespace, _, account = ident.partition("/")
                with contextlib.suppress(NotFound):  # already gone
                    self._core(target).delete_namespaced_service_account(account, namespace)
            elif kind == "role":
                for arn in self._attached(target):
                    iam.detach_role_policy(RoleName=ident, PolicyArn=arn)
                iam.delete_role(RoleName=ident)
            elif kind == "policy":
                iam.delete_policy(PolicyArn=self.policy_arn(target))
