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
  (labelled ours); disabling deletes it only while it holds nothing of anyone else.

The chain is made first and ``TieredStorageConfig`` sent last (with the cluster's current ``NodeRecovery``:
update-cluster does not take TieredStorageConfig alone), so a stop half-way leaves a feature that is still
recognisably ours (our tagged policy, role or labelled service account). Disabling (:meth:`leftover` →
:meth:`delete`) sets ``Mode=Disable`` first, once the cluster takes updates, and then removes exactly that
chain, and only what carries our tags or label.
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
from services.components.identity import find_role, oidc_provider, role_tags
from services.components.manifests import COMPONENT_LABEL, MANAGED_LABEL, OURS
from services.errors import NotFound, Permanent
from services.models import TRAINING_NAMESPACE

NAME = "tiered-checkpointing"
#: the managed features this one needs first (none: it is cluster-level HyperPod configuration plus IAM)
PREREQUISITES: tuple[str, ...] = ()
DEFAULT_NAMESPACE = TRAINING_NAMESPACE
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
    def _hyperpod(target: Target) -> tuple[dict[str, Any], str | None]:
        """DescribeCluster's answer, and why the feature cannot be on this cluster (None: it can)."""
        if not target.hyperpod_cluster:
            return {}, f"{target.cluster} has no HyperPod cluster: tiered checkpointing is a HyperPod feature"
        try:
            cluster: dict[str, Any] = target.client("sagemaker").describe_cluster(
                ClusterName=target.hyperpod_cluster)
        except NotFound:
            return {}, f"HyperPod cluster {target.hyperpod_cluster} does not exist"
        if "Eks" not in (cluster.get("Orchestrator") or {}):
            return cluster, (f"HyperPod cluster {target.hyperpod_cluster} is not orchestrated by EKS: tiered "
                             "checkpointing is only offered on EKS-orchestrated clusters")
        return cluster, None

    def _update(self, target: Target, cluster: dict[str, Any], config: dict[str, Any]) -> None:
        """UpdateCluster with the TieredStorageConfig and the cluster's current NodeRecovery (update-cluster
        does not take TieredStorageConfig alone, aws-facts §6)."""
        extra = {"NodeRecovery": cluster["NodeRecovery"]} if cluster.get("NodeRecovery") else {}
        target.client("sagemaker").update_cluster(ClusterName=target.hyperpod_cluster, TieredStorageConfig=config,
                                                  **extra)

    def _policy(self, target: Target) -> dict[str, Any] | None:
        try:
            policy: dict[str, Any] = target.client("iam").get_policy(PolicyArn=self.policy_arn(target))["Policy"]
        except NotFound:
            return None
        return policy

    def _role(self, target: Target) -> dict[str, Any] | None:
        return find_role(target, self.iam_name(target))

    def _role_tags(self, target: Target) -> dict[str, str]:
        return role_tags(target, self.iam_name(target))

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

    def _policy_ours(self, target: Target) -> bool:
        tags = target.client("iam").list_policy_tags(PolicyArn=self.policy_arn(target)).get("Tags", [])
        return owned({t["Key"]: t["Value"] for t in tags}, target.cluster)

    def _not_ours(self, target: Target, policy: bool, role: bool) -> str | None:
        """Why an IAM resource of our name is not ours to use (None: each is absent or ours)."""
        for kind, present in (("policy", policy), ("role", role)):
            if present and not (self._policy_ours(target) if kind == "policy" else
                                owned(self._role_tags(target), target.cluster)):
                return (f"the IAM {kind} {self.iam_name(target)} exists and is not {target.cluster}'s (no "
                        "instantstart tags): it is left alone; delete or rename it, then retry")
        return None

    def _our_namespaces(self, target: Target) -> list[Any]:
        listed = self._core(target).list_namespace(label_selector=f"{MANAGED_LABEL}={OURS},{COMPONENT_LABEL}={NAME}")
        return list(listed.items or [])

    def _holds_only_ours(self, target: Target, namespace: str) -> bool:
        """Whether the namespace holds nothing but its default service account, its root CA and our service
        account (no pod, claim, config map, secret or other service account of anyone)."""
        core = self._core(target)
        if core.list_namespaced_pod(namespace, limit=1).items or \
                core.list_namespaced_persistent_volume_claim(namespace, limit=1).items:
            return False
        accounts = {sa.metadata.name for sa in core.list_namespaced_service_account(namespace).items or []
                    if sa.metadata is not None}
        maps = {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items or []
                if cm.metadata is not None}
        if accounts - {"default", SERVICE_ACCOUNT} or maps - {"kube-root-ca.crt"}:
            return False
        return not any(sec.type != "kubernetes.io/service-account-token"
                       for sec in core.list_namespaced_secret(namespace).items or [])

    # ----- the component ------------------------------------------------------------------------------------

    def preflight(self, target: Target, settings: BaseModel | None) -> list[str]:
        """The features precheck's hook: the role trusts the cluster's IAM OIDC provider, which must exist."""
        _, _, missing = oidc_provider(target)
        return [missing] if missing else []

    def observe(self, target: Target) -> Observation:
        cluster, unusable = self._hyperpod(target)
        policy = self._policy(target)
        role = self._role(target)
        refused = unusable or self._not_ours(target, policy is not None, role is not None) or (
            f"{NAME}: the cluster's Kubernetes API is not registered" if target.kube is None else None)
        if refused:
            return Observation(status="ABSENT", missing=[], settled=False, healthy=False, detail=refused,
                               version=self.version, failed=refused)
        config = cluster.get("TieredStorageConfig") or {}
        enabled = config.get("Mode") == "Enable"
        missing: list[str] = []
        if self._namespace(target) is None:
            missing.append("namespace")
        if policy is None:
            missing.append("policy")
        issuer, provider, no_provider = oidc_provider(target)
        if role is None:
            missing += ["role", "attachment"]
        else:
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
        if not enabled or (self.settings.memory_percent is not None and config.get(
                "InstanceMemoryAllocationPercentage") != self.settings.memory_percent):
            missing.append("tiered-storage")  # last: apply enables it once the whole chain is there
        ours = role is not None or policy is not None or bool(accounts)
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
        cluster, unusable = self._hyperpod(target)
        return unusable or self._busy(target, cluster)

    @staticmethod
    def _busy(target: Target, cluster: dict[str, Any]) -> str | None:
        status = cluster.get("ClusterStatus")
        if status == "InService" or (status == "Updating" and cluster.get("NodeProvisioningMode") == "Continuous"):
            return None
        return f"HyperPod cluster {target.hyperpod_cluster} is {status}: TieredStorageConfig waits until InService"

    def apply(self, target: Target, observed: Observation) -> None:
        """The chain first (policy, role, service account: each tagged or labelled ours, so a stop half-way
        leaves the feature recognisably ours), HyperPod's TieredStorageConfig last."""
        if observed.failed:
            raise Permanent(f"tiered checkpointing cannot be enabled: {observed.failed}")
        todo = set(observed.missing)
        iam = target.client("iam")
        name = self.iam_name(target)
        core = self._core(target)
        if "namespace" in todo:
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
                name=self.settings.namespace, labels={MANAGED_LABEL: OURS, COMPONENT_LABEL: NAME})))
        if "policy" in todo:
            iam.create_policy(PolicyName=name, PolicyDocument=json.dumps(self.policy_document(target)),
                              Description=f"Tiered checkpoints of {target.cluster} to its shared bucket",
                              Tags=tag_list(target.tags))
        if {"role", "trust"} & todo:
            issuer, provider, _ = oidc_provider(target)
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
        if "tiered-storage" in todo:
            cluster, _ = self._hyperpod(target)
            if self._busy(target, cluster) is None:
                self._update(target, cluster, self.wanted_config())

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
        """What disabling still removes: TieredStorageConfig first (waiting, as ``going``, while the cluster
        takes no update), then the chain; our namespaces only if they hold nothing of anyone else."""
        left = Leftover()
        cluster, _ = self._hyperpod(target)
        if (cluster.get("TieredStorageConfig") or {}).get("Mode") == "Enable":
            (left.going if self._busy(target, cluster) else left.to_delete).append("tiered-storage")
        if target.kube is not None:
            left.to_delete += [f"service-account:{sa.metadata.namespace}/{sa.metadata.name}"
                               for sa in self._ours_elsewhere(target)]
            for ns in self._our_namespaces(target):
                if ns.metadata.deletion_timestamp is not None:
                    left.going.append(f"namespace:{ns.metadata.name}")
                elif self._holds_only_ours(target, ns.metadata.name):
                    left.to_delete.append(f"namespace:{ns.metadata.name}")
        if self._role(target) is not None and owned(self._role_tags(target), target.cluster):
            left.to_delete.append(f"role:{self.iam_name(target)}")
        if self._policy(target) is not None and self._policy_ours(target):
            left.to_delete.append(f"policy:{self.iam_name(target)}")
        return left

    def delete(self, target: Target, left: Leftover) -> None:
        """Mode=Disable alone first; the chain only once the cluster reads Disable (a later round), so a stop
        half-way never leaves the feature enabled without the pieces that prove it ours."""
        if "tiered-storage" in left.going:
            return
        if "tiered-storage" in left.to_delete:
            cluster, unusable = self._hyperpod(target)
            if unusable is None and self._busy(target, cluster) is None:
                self._update(target, cluster, {"Mode": "Disable"})
            return
        iam = target.client("iam")
        for piece in left.to_delete:
            kind, _, ident = piece.partition(":")
            if kind == "service-account":
                namespace, _, account = ident.partition("/")
                with contextlib.suppress(NotFound):  # already gone
                    self._core(target).delete_namespaced_service_account(account, namespace)
            elif kind == "role":
                for arn in self._attached(target):
                    iam.detach_role_policy(RoleName=ident, PolicyArn=arn)
                iam.delete_role(RoleName=ident)
            elif kind == "policy":
                iam.delete_policy(PolicyArn=self.policy_arn(target))
        for piece in left.to_delete:
            kind, _, ident = piece.partition(":")
            if kind == "namespace" and self._holds_only_ours(target, ident):
                with contextlib.suppress(NotFound):
                    self._core(target).delete_namespace(ident)
