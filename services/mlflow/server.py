"""The stages of ``mlflow.create`` and ``mlflow.delete``: a cluster's SageMaker managed MLflow tracking server.

``mlflow.create`` ensures the server's IAM role ``<cluster>-mlflow`` (trusted by ``sagemaker.amazonaws.com``,
tagged in CreateRole, with an inline policy on the shared bucket's ``instantstart/<cluster>/mlflow/`` prefix,
its artifact store) and the shared bucket, waits out IAM's propagation, then calls
``CreateMlflowTrackingServer`` once (the name is the idempotency: a server of that name is observed, never
made twice) and polls until it is Created (SageMaker takes up to 25 minutes). ``CreateFailed`` fails the
stage with SageMaker's status. ``mlflow.delete`` deletes the server (waiting until it is gone), then the role
when it carries this cluster's tags.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from services.aws import AwsClients
from services.clusters.create_base import cluster_tags, owned, tag_list
from services.components.base import Target
from services.components.identity import INLINE_POLICY, find_role, role_tags
from services.errors import Conflict, NotFound, Permanent
from services.mlflow.models import TrackingPlan
from services.stages import Done, Observed, Stage, StageContext, Wait

SAGEMAKER_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
SERVING = ("Created", "Started", "Updated", "MaintenanceComplete")
BUSY = ("Creating", "Updating", "Starting", "Stopping", "MaintenanceInProgress")
FAILED = ("CreateFailed", "DeleteFailed", "UpdateFailed", "StartFailed", "StopFailed", "MaintenanceFailed")
CREATE_SECONDS = 1500.0  # AWS: "up to 25 minutes" (docs: mlflow-create-tracking-server-cli)
POLL_SECONDS = 60.0


def server_name(cluster: str) -> str:
    return f"{cluster}-mlflow"


def role_name(cluster: str) -> str:
    return f"{cluster}-mlflow"


def artifact_prefix(cluster: str) -> str:
    return f"instantstart/{cluster}/mlflow/"


def artifact_uri(plan: TrackingPlan) -> str:
    return f"s3://{plan.bucket}/{artifact_prefix(plan.cluster)}"


def role_policy(plan: TrackingPlan) -> dict[str, Any]:
    """What the tracking server may do with its artifact store: list the bucket's prefix, read and write in it."""
    bucket = f"arn:aws:s3:::{plan.bucket}"
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": bucket,
         "Condition": {"StringLike": {"s3:prefix": [f"{artifact_prefix(plan.cluster)}*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": f"{bucket}/{artifact_prefix(plan.cluster)}*"}]}


def describe_server(aws: AwsClients, region: str, name: str) -> dict[str, Any] | None:
    """SageMaker's DescribeMlflowTrackingServer of ``name``; None when there is none."""
    try:
        answer: dict[str, Any] = aws.client("sagemaker", region).describe_mlflow_tracking_server(
            TrackingServerName=name)
    except NotFound:
        return None
    return answer


def _target(aws: AwsClients, plan: TrackingPlan) -> Target:
    return Target(cluster=plan.cluster, eks_cluster="", region=plan.region, account=plan.account,
                  tags=cluster_tags(plan.cluster), aws=aws, bucket=plan.bucket)


class TrackingRoleStage(Stage[TrackingPlan]):
    """The tracking server's execution role and the shared bucket it stores artifacts in."""

    name = "mlflow_role"
    expected_seconds = 15.0
    deadline = 300.0
    real_time_deadline = True

    def __init__(self, aws: AwsClients) -> None:
        self.aws = aws

    def _missing(self, plan: TrackingPlan) -> list[str]:
        target = _target(self.aws, plan)
        out = [] if self._bucket_exists(plan) else ["bucket"]
        role = find_role(target, role_name(plan.cluster))
        if role is None:
            return [*out, "role", "policy"]
        if not owned(role_tags(target, role_name(plan.cluster)), plan.cluster):
            raise Permanent(f"the IAM role {role_name(plan.cluster)} exists and is not {plan.cluster}'s (no "
                            "instantstart tags): it is left alone; delete or rename it, then retry",
                            details={"role": role_name(plan.cluster)})
        names = target.client("iam").all_pages("list_role_policies", "PolicyNames", RoleName=role_name(plan.cluster))
        return out if INLINE_POLICY in names else [*out, "policy"]

    def _bucket_exists(self, plan: TrackingPlan) -> bool:
        try:
            self.aws.client("s3", plan.region).get_bucket_location(Bucket=plan.bucket)
        except NotFound:
            return False
        return True

    def observe(self, ctx: StageContext[TrackingPlan]) -> Observed:
        ctx.data["missing"] = self._missing(ctx.request)
        return Observed.ABSENT if ctx.data["missing"] else Observed.DONE

    def act(self, ctx: StageContext[TrackingPlan]) -> None:
        plan, missing = ctx.request, list(ctx.data.get("missing") or [])
        iam = self.aws.client("iam", plan.region)
        if "bucket" in missing:
            extra: dict[str, Any] = {}
            if plan.region != "us-east-1":
                extra["CreateBucketConfiguration"] = {"LocationConstraint": plan.region}
            with contextlib.suppress(Conflict):  # made meanwhile (BucketAlreadyOwnedByYou): ours to use
                self.aws.client("s3", plan.region).create_bucket(Bucket=plan.bucket, **extra)
        if "role" in missing:
            iam.create_role(RoleName=role_name(plan.cluster), AssumeRolePolicyDocument=json.dumps(SAGEMAKER_TRUST),
                            Tags=tag_list(cluster_tags(plan.cluster)),
                            Description=f"the SageMaker MLflow tracking server of {plan.cluster}")
        if "policy" in missing:
            iam.put_role_policy(RoleName=role_name(plan.cluster), PolicyName=INLINE_POLICY,
                                PolicyDocument=json.dumps(role_policy(plan)))

    def poll(self, ctx: StageContext[TrackingPlan]) -> Done | Wait:
        from services.clusters.iam_stage import PROPAGATION_SECONDS
        role = find_role(_target(self.aws, ctx.request), role_name(ctx.request.cluster))
        if role is None:
            return Wait(2.0, "waiting for IAM to show the new role")
        age = (datetime.now(UTC) - role["CreateDate"]).total_seconds()
        if age < PROPAGATION_SECONDS:  # SageMaker handed a younger role may not be able to assume it yet
            return Wait(PROPAGATION_SECONDS - age, f"waiting for IAM to propagate the role {role['RoleName']}")
        return Done()

    def result(self, ctx: StageContext[TrackingPlan]) -> dict[str, Any]:
        plan = ctx.request
        return {"role_arn": f"arn:aws:iam::{plan.account}:role/{role_name(plan.cluster)}",
                "artifact_store_uri": artifact_uri(plan)}


class TrackingServerStage(Stage[TrackingPlan]):
    """CreateMlflowTrackingServer once, then wait until SageMaker says Created."""

    name = "mlflow_server"
    expected_seconds = CREATE_SECONDS
    deadline = 3600.0

    def __init__(self, aws: AwsClients) -> None:
        self.aws = aws

    def _server(self, plan: TrackingPlan) -> dict[str, Any] | None:
        return describe_server(self.aws, plan.region, plan.name)

    def observe(self, ctx: StageContext[TrackingPlan]) -> Observed:
        server = self._server(ctx.request)
        if server is None:
            return Observed.ABSENT
        status = str(server.get("TrackingServerStatus"))
        if status in SERVING:
            return Observed.DONE
        if status == "Deleting":
            raise Conflict(f"the tracking server {ctx.request.name} is being deleted: create it again once it is "
                           "gone", details={"status": status})
        return Observed.IN_PROGRESS

    def act(self, ctx: StageContext[TrackingPlan]) -> None:
        plan = ctx.request
        # ResourceInUse: made meanwhile under this name (a retry after a lost answer): observed by the poll
        with contextlib.suppress(Conflict):
            self.aws.client("sagemaker", plan.region).create_mlflow_tracking_server(
                TrackingServerName=plan.name, ArtifactStoreUri=artifact_uri(plan), TrackingServerSize=plan.size.value,
                RoleArn=f"arn:aws:iam::{plan.account}:role/{role_name(plan.cluster)}",
                AutomaticModelRegistration=False, Tags=tag_list(cluster_tags(plan.cluster)))

    def poll(self, ctx: StageContext[TrackingPlan]) -> Done | Wait:
        server = self._server(ctx.request)
        if server is None:
            return Wait(10.0, "waiting for SageMaker to show the tracking server")
        status = str(server.get("TrackingServerStatus"))
        if status in SERVING:
            ctx.data["arn"] = server["TrackingServerArn"]
            ctx.data["url"] = server.get("TrackingServerUrl", "")
            return Done(f"{ctx.request.name} is {status}")
        if status in FAILED:
            raise Permanent(f"SageMaker could not make the tracking server {ctx.request.name}: it is {status}; "
                            "delete it (mlflow_delete) and create it again", details={"status": status})
        return Wait(POLL_SECONDS, f"SageMaker is making the tracking server {ctx.request.name} ({status}; it "
                                  "takes up to 25 minutes)")

    def result(self, ctx: StageContext[TrackingPlan]) -> dict[str, Any]:
        if "arn" not in ctx.data:
            server = self._server(ctx.request) or {}
            ctx.data["arn"] = server.get("TrackingServerArn", "")
            ctx.data["url"] = server.get("TrackingServerUrl", "")
        return {"arn": ctx.data["arn"], "url": ctx.data["url"], "name": ctx.request.name}


class TrackingDeleteStage(Stage[TrackingPlan]):
    """DeleteMlflowTrackingServer, then wait until it is gone; then our role (tagged for this cluster) goes."""

    name = "mlflow_delete"
    expected_seconds = 300.0
    deadline = 3600.0

    def __init__(self, aws: AwsClients) -> None:
        self.aws = aws

    def observe(self, ctx: StageContext[TrackingPlan]) -> Observed:
        server = describe_server(self.aws, ctx.request.region, ctx.request.name)
        if server is None:
            return Observed.DONE if not self._our_role(ctx.request) else Observed.ABSENT
        status = str(server.get("TrackingServerStatus"))
        if status in BUSY:
            return Observed.IN_PROGRESS  # SageMaker refuses a delete while it changes it: polled until it can
        return Observed.IN_PROGRESS if status == "Deleting" else Observed.ABSENT

    def _our_role(self, plan: TrackingPlan) -> bool:
        target = _target(self.aws, plan)
        return find_role(target, role_name(plan.cluster)) is not None and owned(
            role_tags(target, role_name(plan.cluster)), plan.cluster)

    def act(self, ctx: StageContext[TrackingPlan]) -> None:
        if describe_server(self.aws, ctx.request.region, ctx.request.name) is not None:
            self.aws.client("sagemaker", ctx.request.region).delete_mlflow_tracking_server(
                TrackingServerName=ctx.request.name)

    def poll(self, ctx: StageContext[TrackingPlan]) -> Done | Wait:
        plan = ctx.request
        server = describe_server(self.aws, plan.region, plan.name)
        if server is not None:
            status = str(server.get("TrackingServerStatus"))
            if status in BUSY:
                return Wait(POLL_SECONDS, f"{plan.name} is {status}: deleting it once SageMaker lets go")
            if status != "Deleting":
                self.act(ctx)
            return Wait(POLL_SECONDS / 2, f"SageMaker is deleting the tracking server {plan.name}")
        if self._our_role(plan):
            iam = self.aws.client("iam", plan.region)
            with contextlib.suppress(NotFound):
                iam.delete_role_policy(RoleName=role_name(plan.cluster), PolicyName=INLINE_POLICY)
            with contextlib.suppress(NotFound):
                iam.delete_role(RoleName=role_name(plan.cluster))
        return Done(f"{plan.name} and its role are gone")
