"""The ``eks`` stage of ``cluster.create`` and of ``cluster.delete``: the EKS control plane, its IAM OIDC provider,
the access entries of this control plane and of the user's admins, and the registry row that makes the new
cluster reachable by name.

CreateCluster is sent once: the cluster is observed by name first (one of that name without our tags is
someone else's and is refused) and the request carries a ``clientRequestToken`` derived from the operation
and the attempt's generation, so a retried call is the same request to EKS. A FAILED cluster of ours fails
the stage with EKS's health issues; a retry deletes it, waits until it is gone and creates a new one (the
next generation, a new token), keeping the failure's issues in the stage's messages and result. The control
plane takes AWS 8-15 minutes; the stage waits with its status as the reason, then makes the rest, each
observed before it is made. The teardown deletes
only what carries this cluster's tags, waits until EKS has removed the cluster, then forgets it here; an EKS
cluster of that name without our tags (a create refused because the name was taken) is left alone, the
stage says so and the teardown goes on.
"""

from __future__ import annotations

import hashlib
from typing import Any

from services.clusters.create_base import ClusterDeletePlan, CreateStage, DeleteStage, owned, result_of, tag_list
from services.clusters.create_models import ClusterCreatePlan, EksResult, IamResult, NetworkResult, PlannedResource
from services.clusters.iam_stage import partition
from services.clusters.models import ClusterRecord, Ownership
from services.errors import NotFound, Permanent
from services.stages import Done, Observed, StageContext, Wait

OIDC_AUDIENCE = "sts.amazonaws.com"
CREATE_POLL_SECONDS = 30.0
DELETE_POLL_SECONDS = 20.0


def admin_policy_arn(region: str) -> str:
    """EKS's cluster-admin access policy in the partition of ``region``."""
    return f"arn:{partition(region)}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def request_token(operation_id: str, generation: int = 0) -> str:
    """CreateCluster's idempotency token: the same for every try of one attempt of an operation, unique across
    operations and across the attempts (``generation``: how many FAILED clusters it replaced)."""
    seed = operation_id if generation == 0 else f"{operation_id}:{generation}"
    return "instantstart-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def provider_arn(account: str, region: str, issuer: str) -> str:
    """The ARN IAM gives the OIDC provider of ``issuer`` (its URL without the scheme)."""
    return f"arn:{partition(region)}:iam::{account}:oidc-provider/{issuer.removeprefix('https://')}"


def _issues(cluster: dict[str, Any]) -> str:
    issues = (cluster.get("health") or {}).get("issues") or []
    return "; ".join(f"{i.get('code')}: {i.get('message')}" for i in issues) or "EKS gave no reason"


class EksStage(CreateStage):
    """Create the EKS control plane and wait until ACTIVE; then the OIDC provider, access entries, registry row."""

    name = "eks"
    expected_seconds = 600.0

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        access = "API; admins: " + ", ".join([plan.control_plane_principal, *plan.admin_principals])
        return [
            PlannedResource(stage=self.name, type="AWS::EKS::Cluster", name=plan.names.eks_cluster,
                            detail=f"Kubernetes {plan.kubernetes_version}, authentication {access}"),
            PlannedResource(stage=self.name, type="AWS::IAM::OIDCProvider", name=f"{plan.names.eks_cluster} issuer",
                            detail="for IAM roles of service accounts"),
        ]

    def _ours(self, plan: ClusterCreatePlan) -> dict[str, Any] | None:
        """The EKS cluster of the plan's name if it exists; Permanent if it is not ours."""
        try:
            cluster: dict[str, Any] = self.deps.aws.client("eks", plan.region).describe_cluster(
                name=plan.names.eks_cluster)["cluster"]
        except NotFound:
            return None
        if not owned(cluster.get("tags"), plan.name):
            raise Permanent(f"an EKS cluster named {plan.names.eks_cluster} already exists and is not this "
                            f"cluster's (it lacks the instantstart tags of {plan.name}); import it instead "
                            "(clusters_import) or choose another name", details={"eks_arn": cluster.get("arn")})
        return cluster

    @staticmethod
    def _replacing(ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any] | None:
        """The FAILED cluster this attempt replaces (its creation time and issues), if it replaces one."""
        replacing: dict[str, Any] | None = ctx.data.get("replacing")
        return replacing

    def _previous(self, ctx: StageContext[ClusterCreatePlan]) -> str:
        replacing = self._replacing(ctx)
        return f"; the previous attempt FAILED: {replacing['issues']}" if replacing else ""

    # ----- observe / act / poll --------------------------------------------------------------------------

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        plan = ctx.request
        cluster = self._ours(plan)
        if cluster is None:
            return Observed.ABSENT
        status = cluster.get("status")
        if status == "FAILED":  # a retry: act deletes it, poll creates the next generation once it is gone
            failed = {"created_at": str(cluster.get("createdAt")), "issues": _issues(cluster),
                      "eks_arn": cluster.get("arn")}
            replacing = self._replacing(ctx)
            if replacing is None or replacing["created_at"] != failed["created_at"]:
                # in ctx.data before the delete (the engine saves it before act): a crash cannot lose it
                ctx.data["replacing"] = failed
                ctx.data["generation"] = int(ctx.data.get("generation", 0)) + 1
            return Observed.ABSENT
        if status == "DELETING" and self._replacing(ctx) is None:
            raise Permanent(f"EKS cluster {plan.names.eks_cluster} is being deleted; create it again once it is gone",
                            details={"eks_arn": cluster.get("arn")})
        if status == "ACTIVE" and not self._follow_ups_missing(plan, cluster):
            return Observed.DONE
        return Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        plan = ctx.request
        cluster = self._ours(plan)
        if cluster is not None and cluster.get("status") == "FAILED":
            self.deps.aws.client("eks", plan.region).delete_cluster(name=plan.names.eks_cluster)
            return
        if cluster is None:
            self._create(ctx)

    def _create(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        plan = ctx.request
        network = result_of(ctx, "network", NetworkResult) if "network" in ctx.results else None
        subnets = plan.subnet_ids if plan.vpc_id and plan.subnet_ids else (network.private_subnets if network else [])
        if not subnets:
            raise Permanent("the eks stage has no subnets: neither the network stage's private subnets nor the "
                            "plan's subnet_ids; this is a bug in the kind's stage order")
        vpc: dict[str, Any] = {"subnetIds": subnets, "endpointPublicAccess": True, "endpointPrivateAccess": True}
        if network is not None:
            vpc["securityGroupIds"] = [network.security_group]
        if plan.endpoint_public_access_cidrs:
            vpc["publicAccessCidrs"] = plan.endpoint_public_access_cidrs
        iam = result_of(ctx, "iam", IamResult)
        self.deps.aws.client("eks", plan.region).create_cluster(
            name=plan.names.eks_cluster, version=plan.kubernetes_version, roleArn=iam.eks_role_arn,
            resourcesVpcConfig=vpc, tags=plan.tags,
            clientRequestToken=request_token(ctx.operation_id, int(ctx.data.get("generation", 0))),
            # the creator is this control plane: EKS gives it cluster-admin from the first second
            accessConfig={"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True})

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        plan = ctx.request
        cluster = self._ours(plan)
        replacing = self._replacing(ctx)
        if cluster is None:
            if replacing is None:
                raise Permanent(f"EKS cluster {plan.names.eks_cluster} vanished while it was being created")
            self._create(ctx)  # the FAILED one is gone: the next attempt, with its own token
            return Wait(CREATE_POLL_SECONDS, f"EKS control plane {plan.names.eks_cluster} created again (AWS takes "
                                             f"8-15 minutes){self._previous(ctx)}")
        status = cluster.get("status")
        if status == "DELETING" and replacing is not None:
            return Wait(DELETE_POLL_SECONDS, f"deleting the FAILED EKS cluster {plan.names.eks_cluster} to create "
                                             f"it again ({replacing['issues']})")
        if status == "FAILED":
            raise Permanent(f"EKS cluster {plan.names.eks_cluster} FAILED: {_issues(cluster)}; retry the operation "
                            "(operations_retry) to delete this control plane and create it again",
                            details={"eks_arn": cluster.get("arn"), "issues": _issues(cluster)})
        if status != "ACTIVE":
            return Wait(CREATE_POLL_SECONDS, f"EKS control plane {plan.names.eks_cluster} is {status} "
                                             f"(AWS takes 8-15 minutes){self._previous(ctx)}")
        self._oidc_provider(plan, cluster)
        self._access_entries(plan)
        self._register(plan, cluster)
        return Done()

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        plan = ctx.request
        cluster = self._ours(plan) or {}
        issuer = str(cluster.get("identity", {}).get("oidc", {}).get("issuer", ""))
        return EksResult(eks_arn=cluster.get("arn", ""), endpoint=cluster.get("endpoint", ""), oidc_issuer=issuer,
                         oidc_provider_arn=provider_arn(plan.account, plan.region, issuer) if issuer else None,
                         cluster_security_group=cluster.get("resourcesVpcConfig", {}).get("clusterSecurityGroupId"),
                         replaced_failure=(self._replacing(ctx) or {}).get("issues")).model_dump()

    # ----- what follows ACTIVE, each observed before it is made --------------------------------------------

    def _admins(self, plan: ClusterCreatePlan) -> list[str]:
        return list(dict.fromkeys([plan.control_plane_principal, *plan.admin_principals]))

    def _follow_ups_missing(self, plan: ClusterCreatePlan, cluster: dict[str, Any]) -> bool:
        issuer = cluster.get("identity", {}).get("oidc", {}).get("issuer")
        if issuer and not self._provider_exists(provider_arn(plan.account, plan.region, issuer)):
            return True
        admins = self._entries(plan, admin_policy_arn(plan.region))
        if any(p not in admins for p in self._admins(plan)):
            return True
        record = self.deps.registry.find(plan.name)
        return record is None or record.eks_arn != cluster.get("arn")

    def _provider_exists(self, arn: str) -> bool:
        try:
            self.deps.aws.client("iam").get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
        except NotFound:
            return False
        return True

    def _oidc_provider(self, plan: ClusterCreatePlan, cluster: dict[str, Any]) -> None:
        """The cluster's IAM OIDC provider (IAM roles for service accounts), tagged in its create call. One that
        exists for this issuer already is used as it is (and, without our tags, never deleted)."""
        issuer = cluster.get("identity", {}).get("oidc", {}).get("issuer")
        if not issuer or self._provider_exists(provider_arn(plan.account, plan.region, issuer)):
            return
        self.deps.aws.client("iam").create_open_id_connect_provider(
            Url=issuer, ClientIDList=[OIDC_AUDIENCE], Tags=tag_list(plan.tags))

    def _access_entries(self, plan: ClusterCreatePlan) -> None:
        """Cluster-admin access entries for this control plane (unless the creator's entry is it) and each of
        the plan's admin principals; an entry that exists already only gets the admin policy if it lacks it."""
        eks = self.deps.aws.client("eks", plan.region)
        policy = admin_policy_arn(plan.region)
        existing, admins = self._entries(plan), self._entries(plan, policy)
        for principal in self._admins(plan):
            if principal not in existing:
                eks.create_access_entry(clusterName=plan.names.eks_cluster, principalArn=principal, type="STANDARD",
                                        tags=plan.tags)
            if principal not in admins:  # also an entry made before a crash that came before its policy
                eks.associate_access_policy(clusterName=plan.names.eks_cluster, principalArn=principal,
                                            policyArn=policy, accessScope={"type": "cluster"})

    def _entries(self, plan: ClusterCreatePlan, policy: str | None = None) -> set[str]:
        """Principals with an access entry on the cluster (with ``policy`` associated, if given)."""
        filters = {"associatedPolicyArn": policy} if policy else {}
        return set(self.deps.aws.client("eks", plan.region).all_pages(
            "list_access_entries", "accessEntries", clusterName=plan.names.eks_cluster, **filters))

    def _register(self, plan: ClusterCreatePlan, cluster: dict[str, Any]) -> None:
        """The registry row (it also registers the cluster's Kubernetes client): written once."""
        record = self.deps.registry.find(plan.name)
        if record is not None and record.eks_arn == cluster["arn"]:
            return
        self.deps.registry.add(ClusterRecord(
            name=plan.name, region=plan.region, eks_name=plan.names.eks_cluster, eks_arn=cluster["arn"],
            hyperpod_name=plan.names.hyperpod_cluster, hyperpod_arn=None, ownership=Ownership.MANAGED,
            created_at="", created_by=plan.requested_by), self.deps.clock.now())


class EksTeardown(DeleteStage):
    """Delete the cluster's OIDC provider (ours by tag) and the EKS cluster (only if tagged ours), wait until EKS
    has removed it, then remove the registry row and stop its informers. Access entries go with the cluster. An
    EKS cluster of that name without our tags is not this cluster's: left alone, said in the stage's message."""

    name = "eks"
    expected_seconds = 420.0

    def _cluster(self, plan: ClusterDeletePlan) -> tuple[dict[str, Any] | None, str | None]:
        """(the EKS cluster of that name if it is ours, the ARN of one of that name that is not ours)."""
        try:
            cluster: dict[str, Any] = self.deps.aws.client("eks", plan.region).describe_cluster(
                name=plan.eks_cluster)["cluster"]
        except NotFound:
            return None, None
        if not owned(cluster.get("tags"), plan.name):
            return None, str(cluster.get("arn"))
        return cluster, None

    def _provider(self, plan: ClusterDeletePlan, ctx: StageContext[ClusterDeletePlan],
                  cluster: dict[str, Any] | None) -> str | None:
        """The cluster's OIDC provider ARN if it still exists and is ours (the issuer is kept in ``ctx.data``,
        since the cluster that names it goes first; without one, the providers of EKS issuers are read)."""
        iam = self.deps.aws.client("iam")
        issuer = (cluster or {}).get("identity", {}).get("oidc", {}).get("issuer") or ctx.data.get("issuer")
        if issuer:
            ctx.data["issuer"] = issuer
            candidates = [provider_arn(plan.account, plan.region, issuer)]
        else:  # the cluster went before we saw it (deleted outside): look for a provider tagged as its
            prefix = f"oidc-provider/oidc.eks.{plan.region}."
            candidates = [p["Arn"] for p in iam.list_open_id_connect_providers()["OpenIDConnectProviderList"]
                          if prefix in p["Arn"]]
        for arn in candidates:
            try:
                found = iam.get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
            except NotFound:
                continue
            if owned(found.get("Tags"), plan.name):
                return str(arn)
        return None

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        plan = ctx.request
        cluster, foreign = self._cluster(plan)
        if cluster is None and foreign is None and self._provider(plan, ctx, None) is None \
                and self.deps.registry.find(plan.name) is None:
            return Observed.DONE
        return Observed.ABSENT  # a foreign one too: poll says it was left alone

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        self._next(ctx)

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        return self._next(ctx)

    def _next(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        """The next deletion step for what is left: provider, cluster (once it may be deleted), registry row."""
        plan = ctx.request
        cluster, foreign = self._cluster(plan)
        provider = self._provider(plan, ctx, cluster)
        if provider is not None:
            self.deps.aws.client("iam").delete_open_id_connect_provider(OpenIDConnectProviderArn=provider)
        if cluster is not None:
            status = cluster.get("status")
            if status in ("CREATING", "UPDATING"):  # EKS refuses to delete a cluster while it changes
                return Wait(DELETE_POLL_SECONDS, f"EKS cluster {plan.eks_cluster} is {status}; it is deleted once "
                                                 "that finishes")
            if status != "DELETING":
                self.deps.aws.client("eks", plan.region).delete_cluster(name=plan.eks_cluster)
            return Wait(DELETE_POLL_SECONDS, f"EKS cluster {plan.eks_cluster} is DELETING (AWS takes 5-10 minutes)")
        self.deps.registry.remove(plan.name)
        self.deps.informers.forget(plan.name)
        if foreign is not None:
            return Done(f"EKS cluster {plan.eks_cluster} ({foreign}) lacks the instantstart tags of {plan.name}: it "
                        "is not this cluster's and was left untouched; nothing of ours to delete here")
        return Done()

    def result(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any]:
        return {"eks_cluster": ctx.request.eks_cluster, "deleted": True}
