"""The ``iam`` stage of ``cluster.create`` and of ``cluster.delete``: the two IAM roles a cluster owns (the EKS
cluster role, the HyperPod execution role of its nodes) and the shared bucket they read and write.

Roles are created with their tags in ``CreateRole`` itself and found again by name; a role of that name
without our tags is someone else's and is refused, never adopted or changed. The execution role's inline
policy grants what HyperPod nodes need (aws-facts.md §5: ENI management, ECR pull, EKS pod identity on this
cluster only) and S3 on the shared bucket alone, never ``s3:*`` on ``*``. The shared bucket is created when
missing and is never deleted: the teardown removes the cluster's roles and the customer managed policies tagged
as the cluster's (the managed features make them, e.g. tiered checkpointing's bucket policy); a role of one of
the cluster's names without its tags is left alone, and the stage says so.

IAM is eventually consistent: after it creates a role the stage waits once before it is done. That the wait
is owed is written in ``ctx.data`` by ``observe`` (which the engine saves before ``act``), so a crash between
CreateRole and the end of ``act`` still waits on resume.
"""

from __future__ import annotations

import json
from typing import Any

from services.clusters.create import derive_names, role_names
from services.clusters.create_base import ClusterDeletePlan, CreateStage, DeleteStage, owned, tag_list
from services.clusters.create_models import ClusterCreatePlan, IamResult, PlannedResource
from services.errors import Forbidden, NotFound, Permanent, ServiceError
from services.stages import Done, Observed, StageContext, Wait

EKS_TRUST = "eks.amazonaws.com"
EXECUTION_TRUST = "sagemaker.amazonaws.com"
EKS_MANAGED_POLICY = "AmazonEKSClusterPolicy"
EXECUTION_MANAGED_POLICY = "AmazonSageMakerClusterInstanceRolePolicy"
INLINE_POLICY = "instantstart-hyperpod-nodes"
#: IAM is eventually consistent: a role EKS or HyperPod is handed seconds after CreateRole may not be
#: assumable yet, so the stage waits this long after creating one before it reports done
PROPAGATION_SECONDS = 10.0

#: what HyperPod's nodes do to their network interfaces (aws-facts.md §5, the execution role's ENI policy)
ENI_ACTIONS = (
    "ec2:AssignPrivateIpAddresses", "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission", "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
    "ec2:DetachNetworkInterface", "ec2:ModifyNetworkInterfaceAttribute", "ec2:UnassignPrivateIpAddresses",
)
ECR_PULL = ("ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetAuthorizationToken",
            "ecr:GetDownloadUrlForLayer")
BUCKET_ACTIONS = ("s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads")
OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                  "s3:ListMultipartUploadParts")


def partition(region: str) -> str:
    """The ARN partition of ``region`` (``aws``, ``aws-cn``, ``aws-us-gov``)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def trust_policy(service: str) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


def execution_policy(plan: ClusterCreatePlan) -> dict[str, Any]:
    """The execution role's inline policy: the nodes' ENIs, image pulls, pod identity on this cluster, and the
    shared bucket (lifecycle scripts read, shared storage read/write), nothing else in S3."""
    arn = partition(plan.region)
    bucket = f"arn:{arn}:s3:::{plan.bucket}"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "NodeNetworkInterfaces", "Effect": "Allow", "Action": list(ENI_ACTIONS), "Resource": "*"},
        {"Sid": "TagNodeNetworkInterfaces", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": f"arn:{arn}:ec2:*:*:network-interface/*"},
        {"Sid": "PullImages", "Effect": "Allow", "Action": list(ECR_PULL), "Resource": "*"},
        {"Sid": "PodIdentity", "Effect": "Allow", "Action": "eks-auth:AssumeRoleForPodIdentity",
         "Resource": f"arn:{arn}:eks:{plan.region}:{plan.account}:cluster/{plan.names.eks_cluster}"},
        {"Sid": "SharedBucket", "Effect": "Allow", "Action": list(BUCKET_ACTIONS), "Resource": bucket},
        {"Sid": "SharedBucketObjects", "Effect": "Allow", "Action": list(OBJECT_ACTIONS), "Resource": f"{bucket}/*"},
    ]}


def _aws_code(exc: ServiceError) -> str:
    return str((exc.details or {}).get("aws_code", ""))


class IamStage(CreateStage):
    """Ensure the cluster's two roles (tagged in CreateRole, observed by name) and the shared bucket."""

    name = "iam"
    expected_seconds = 30.0
    # its time is our own IAM and S3 calls (and one short wait), not AWS's clock: real seconds, never scaled
    deadline = 300.0
    real_time_deadline = True

    def _roles(self, plan: ClusterCreatePlan) -> list[tuple[str, str, str, dict[str, Any] | None]]:
        """(role name, trusted service, managed policy, inline policy) of each role the cluster needs."""
        return [(plan.names.eks_role, EKS_TRUST, EKS_MANAGED_POLICY, None),
                (plan.names.execution_role, EXECUTION_TRUST, EXECUTION_MANAGED_POLICY, execution_policy(plan))]

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        rows = [PlannedResource(stage=self.name, type="AWS::IAM::Role", name=role,
                                detail=f"trusts {service}; {managed}" + (f" + {INLINE_POLICY}" if inline else ""))
                for role, service, managed, inline in self._roles(plan)]
        rows.append(PlannedResource(stage=self.name, type="AWS::S3::Bucket", name=plan.bucket, action="reuse",
                                    detail="the shared bucket: created if missing, never deleted"))
        return rows

    # ----- observe ------------------------------------------------------------------------------------

    def _role(self, plan: ClusterCreatePlan, role: str) -> dict[str, Any] | None:
        """The role named ``role`` if it exists; Permanent if it exists without our tags for this cluster."""
        try:
            found: dict[str, Any] = self.deps.aws.client("iam").get_role(RoleName=role)["Role"]
        except NotFound:
            return None
        if not owned(found.get("Tags"), plan.name):
            raise Permanent(f"an IAM role named {role} already exists and is not this cluster's (it lacks the "
                            f"instantstart tags of {plan.name}); it is left untouched: delete or rename it, or "
                            "choose another cluster name", details={"role": role, "arn": found.get("Arn")})
        return found

    def _missing(self, plan: ClusterCreatePlan, role: str, service: str, managed: str,
                 inline: dict[str, Any] | None) -> list[str]:
        """What of ``role`` is not as planned: ``role``, ``trust``, ``managed``, ``inline``."""
        iam = self.deps.aws.client("iam")
        found = self._role(plan, role)
        if found is None:
            return ["role", "managed"] + (["inline"] if inline else [])
        missing = []
        if found.get("AssumeRolePolicyDocument") != trust_policy(service):
            missing.append("trust")
        attached = iam.all_pages("list_attached_role_policies", "AttachedPolicies", RoleName=role)
        if not any(p["PolicyArn"] == self._managed_arn(plan, managed) for p in attached):
            missing.append("managed")
        if inline is not None:
            try:
                document = iam.get_role_policy(RoleName=role, PolicyName=INLINE_POLICY)["PolicyDocument"]
            except NotFound:
                document = None
            if document != inline:
                missing.append("inline")
        return missing

    @staticmethod
    def _managed_arn(plan: ClusterCreatePlan, managed: str) -> str:
        return f"arn:{partition(plan.region)}:iam::aws:policy/{managed}"

    def _bucket_exists(self, plan: ClusterCreatePlan) -> bool:
        try:
            self.deps.aws.client("s3", plan.region).get_bucket_location(Bucket=plan.bucket)
        except NotFound:
            return False
        except Forbidden as exc:
            raise Permanent(f"the shared bucket {plan.bucket} exists but this control plane cannot use it "
                            f"({exc.message}); set shared_bucket to a bucket of this account",
                            details={"bucket": plan.bucket}) from exc
        return True

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        plan = ctx.request
        missing = [m for spec in self._roles(plan) for m in self._missing(plan, *spec)]
        if "role" in missing:  # act creates one: the wait is owed from now on, saved before act runs
            ctx.data["propagation"] = "pending"
        if missing or not self._bucket_exists(plan):
            return Observed.ABSENT
        # all there, yet a role made by this stage has not had its wait (a crash came after CreateRole)
        return Observed.IN_PROGRESS if ctx.data.get("propagation") == "pending" else Observed.DONE

    # ----- act ------------------------------------------------------------------------------------------

    def act(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        plan = ctx.request
        iam = self.deps.aws.client("iam")
        for role, service, managed, inline in self._roles(plan):
            missing = self._missing(plan, role, service, managed, inline)
            if "role" in missing:
                what = "EKS cluster" if service == EKS_TRUST else "HyperPod execution"
                iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust_policy(service)),
                                Description=f"InstantStart: the {what} role of cluster {plan.name}",
                                Tags=tag_list(plan.tags))
            if "trust" in missing:
                iam.update_assume_role_policy(RoleName=role, PolicyDocument=json.dumps(trust_policy(service)))
            if "managed" in missing:
                iam.attach_role_policy(RoleName=role, PolicyArn=self._managed_arn(plan, managed))
            if "inline" in missing and inline is not None:
                iam.put_role_policy(RoleName=role, PolicyName=INLINE_POLICY, PolicyDocument=json.dumps(inline))
        if not self._bucket_exists(plan):
            self._create_bucket(plan)

    def _create_bucket(self, plan: ClusterCreatePlan) -> None:
        extra: dict[str, Any] = {}
        if plan.region != "us-east-1":  # S3 refuses a LocationConstraint of us-east-1, and needs one elsewhere
            extra["CreateBucketConfiguration"] = {"LocationConstraint": plan.region}
        try:
            self.deps.aws.client("s3", plan.region).create_bucket(Bucket=plan.bucket, **extra)
        except ServiceError as exc:
            if _aws_code(exc) == "BucketAlreadyOwnedByYou":  # made meanwhile by this account: ours to use
                return
            if _aws_code(exc) == "BucketAlreadyExists":
                raise Permanent(f"the shared bucket name {plan.bucket} is taken by another AWS account; set "
                                "shared_bucket to another name", details={"bucket": plan.bucket}) from exc
            raise

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        if ctx.data.get("propagation") == "pending":  # one wait, on the engine's (scaled) clock
            ctx.data["propagation"] = "waited"
            return Wait(PROPAGATION_SECONDS, "waiting for IAM to propagate the new roles before EKS and HyperPod "
                                             "use them")
        return Done()

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        plan = ctx.request
        iam = self.deps.aws.client("iam")
        arns = [iam.get_role(RoleName=role)["Role"]["Arn"] for role in (plan.names.eks_role, plan.names.execution_role)]
        return IamResult(eks_role_arn=arns[0], execution_role_arn=arns[1], bucket=plan.bucket).model_dump()


class IamTeardown(DeleteStage):
    """Delete the roles tagged as this cluster's (policies detached, inline policies and instance profiles
    removed first), then the customer managed policies tagged as this cluster's (detached from whatever still
    has them); roles and policies without our tags, and the shared bucket, are never touched: a role of one of
    the cluster's names without its tags (a create refused because the name was taken) is named in the
    message."""

    name = "iam"
    expected_seconds = 15.0
    deadline = 300.0  # IAM deletes are immediate: the time is our own calls
    real_time_deadline = True

    def _owned_roles(self, plan: ClusterDeletePlan) -> list[str]:
        """Names of the roles left that carry this cluster's tags. Every role the cluster owns is named from the
        cluster's name, so only those names are read for their tags (ListRoles answers no tags)."""
        iam = self.deps.aws.client("iam")
        names = [r["RoleName"] for r in iam.all_pages("list_roles", "Roles")
                 if str(r["RoleName"]).startswith(f"{plan.name}-")]
        left = []
        for role in names:
            try:
                tags = iam.get_role(RoleName=role)["Role"].get("Tags")
            except NotFound:  # deleted meanwhile
                continue
            if owned(tags, plan.name):
                left.append(role)
        return left

    def _owned_policies(self, plan: ClusterDeletePlan) -> list[str]:
        """ARNs of the customer managed policies left that carry this cluster's tags (named from the cluster's
        name, like its roles: only those are read for their tags)."""
        iam = self.deps.aws.client("iam")
        arns = [str(p["Arn"]) for p in iam.all_pages("list_policies", "Policies", Scope="Local")
                if str(p["PolicyName"]).startswith(f"{plan.name}-")]
        left = []
        for arn in arns:
            try:
                tags = iam.list_policy_tags(PolicyArn=arn).get("Tags")
            except NotFound:  # deleted meanwhile
                continue
            if owned(tags, plan.name):
                left.append(arn)
        return left

    def _delete_policy(self, arn: str) -> None:
        iam = self.deps.aws.client("iam")
        try:
            entities = iam.list_entities_for_policy(PolicyArn=arn)
            for role in entities.get("PolicyRoles", []):
                iam.detach_role_policy(RoleName=role["RoleName"], PolicyArn=arn)
            for user in entities.get("PolicyUsers", []):
                iam.detach_user_policy(UserName=user["UserName"], PolicyArn=arn)
            for group in entities.get("PolicyGroups", []):
                iam.detach_group_policy(GroupName=group["GroupName"], PolicyArn=arn)
            for version in iam.list_policy_versions(PolicyArn=arn).get("Versions", []):
                if not version.get("IsDefaultVersion"):
                    iam.delete_policy_version(PolicyArn=arn, VersionId=version["VersionId"])
            iam.delete_policy(PolicyArn=arn)
        except NotFound:  # deleted meanwhile
            return

    def _foreign_roles(self, plan: ClusterDeletePlan) -> list[str]:
        """The roles of the names a create of this cluster gives that exist without this cluster's tags."""
        iam = self.deps.aws.client("iam")
        foreign = []
        for role in role_names(plan.name, derive_names(plan.name)):
            try:
                tags = iam.get_role(RoleName=role)["Role"].get("Tags")
            except NotFound:
                continue
            if not owned(tags, plan.name):
                foreign.append(role)
        return foreign

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        roles = self._owned_roles(ctx.request)
        policies = self._owned_policies(ctx.request)
        ctx.data["roles"] = roles
        ctx.data["policies"] = policies
        # foreign roles too: nothing is done to them, but poll says they were left alone
        return Observed.ABSENT if roles or policies or self._foreign_roles(ctx.request) else Observed.DONE

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        for role in self._owned_roles(ctx.request):
            self._delete_role(ctx.request, role)
        for arn in self._owned_policies(ctx.request):
            self._delete_policy(arn)

    def _delete_role(self, plan: ClusterDeletePlan, role: str) -> None:
        iam = self.deps.aws.client("iam")
        try:
            for attached in iam.all_pages("list_attached_role_policies", "AttachedPolicies", RoleName=role):
                iam.detach_role_policy(RoleName=role, PolicyArn=attached["PolicyArn"])
            for policy in iam.all_pages("list_role_policies", "PolicyNames", RoleName=role):
                iam.delete_role_policy(RoleName=role, PolicyName=policy)
            for profile in iam.all_pages("list_instance_profiles_for_role", "InstanceProfiles", RoleName=role):
                iam.remove_role_from_instance_profile(InstanceProfileName=profile["InstanceProfileName"], RoleName=role)
                if owned(profile.get("Tags"), plan.name):
                    iam.delete_instance_profile(InstanceProfileName=profile["InstanceProfileName"])
            iam.delete_role(RoleName=role)
        except NotFound:  # deleted meanwhile (a retried step): what is left is observed again
            return

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        left = self._owned_roles(ctx.request)
        if left:
            return Wait(5.0, f"IAM roles still present: {', '.join(left)}")
        policies = self._owned_policies(ctx.request)
        if policies:
            return Wait(5.0, f"IAM policies still present: {', '.join(policies)}")
        foreign = self._foreign_roles(ctx.request)
        if foreign:
            return Done(f"IAM role(s) {', '.join(foreign)} lack the instantstart tags of {ctx.request.name}: not this "
                        "cluster's, left untouched")
        return Done()

    def result(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any]:
        return {"deleted_roles": list(ctx.data.get("roles", [])),
                "deleted_policies": list(ctx.data.get("policies", [])), "bucket_kept": ctx.request.bucket}
