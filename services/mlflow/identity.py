"""The identity of a job namespace's pods: the IAM role ``<cluster>-jobs-<namespace>`` trusted by EKS Pod Identity
(``pods.eks.amazonaws.com``), allowed ``sagemaker-mlflow:*`` on the cluster's tracking server and S3 on the
cluster's prefix of the shared bucket, and the pod identity association of (namespace, service account).

It is the add-ons' :class:`~services.components.identity.PodRole`, reused: every piece is observed before it
is made (a second call writes nothing), a role of that name without our tags is refused, and the association
waits until IAM has propagated the new role (the stage polls; the synchronous :func:`ensure_job_identity`
reports the association as pending).
"""

from __future__ import annotations

from typing import Any

from services.components.base import Target
from services.components.identity import PodRole
from services.mlflow.models import JobIdentityView
from services.models import TRAINING_SERVICE_ACCOUNT
from services.stages import Done, Observed, Stage, StageContext, Wait

DEFAULT_SERVICE_ACCOUNT = TRAINING_SERVICE_ACCOUNT


def job_role(namespace: str, service_account: str, tracking_arn: str, bucket: str, cluster: str) -> PodRole:
    def policy(target: Target) -> dict[str, Any]:
        prefix = f"instantstart/{cluster}/"
        statements: list[dict[str, Any]] = [
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}",
             "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}},
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                           "s3:AbortMultipartUpload"],
             "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"}]
        if tracking_arn:
            statements.append({"Effect": "Allow", "Action": ["sagemaker-mlflow:*"], "Resource": tracking_arn})
        return {"Version": "2012-10-17", "Statement": statements}

    return PodRole(suffix=f"jobs-{namespace}", namespace=namespace, service_account=service_account,
                   inline=policy, associate=True,
                   description=f"pods of {namespace}/{service_account}: MLflow tracking and the shared bucket")


def identity_view(role: PodRole, target: Target) -> JobIdentityView:
    association = role._association(target) if target.kube is not None else None
    return JobIdentityView(cluster=target.cluster, namespace=role.namespace, service_account=role.service_account,
                           role_name=role.role_name(target), role_arn=role.role_arn(target),
                           association_id=str((association or {}).get("associationId", "")))


def ensure_job_identity(role: PodRole, target: Target) -> JobIdentityView:
    """Make what is missing (the association only once IAM has propagated the role) and say what there is."""
    missing = role.missing(target)
    if missing:
        role.ensure(target, missing)
    return identity_view(role, target)


class JobIdentityStage(Stage[Any]):
    """The job namespace's pod identity as a stage of ``job.submit``: reads ``cluster`` and ``namespace`` (and
    ``service_account`` when the request has one) from the operation's request; ``resolve`` gives the role and
    the target for them. :meth:`result` is the :class:`JobIdentityView` dump."""

    name = "job_identity"
    expected_seconds = 15.0
    deadline = 600.0
    real_time_deadline = True

    def __init__(self, resolve: Any) -> None:
        self.resolve = resolve  # (cluster, namespace, service account) -> (PodRole, Target)

    def _pair(self, ctx: StageContext[Any]) -> tuple[PodRole, Target]:
        request = ctx.request
        sa = str(getattr(request, "service_account", None) or DEFAULT_SERVICE_ACCOUNT)
        pair: tuple[PodRole, Target] = self.resolve(str(request.cluster), str(request.namespace), sa)
        return pair

    def observe(self, ctx: StageContext[Any]) -> Observed:
        role, target = self._pair(ctx)
        ctx.data["missing"] = role.missing(target)
        return Observed.ABSENT if ctx.data["missing"] else Observed.DONE

    def act(self, ctx: StageContext[Any]) -> None:
        role, target = self._pair(ctx)
        role.ensure(target, list(ctx.data.get("missing") or []))

    def poll(self, ctx: StageContext[Any]) -> Done | Wait:
        role, target = self._pair(ctx)
        missing = role.missing(target)
        if not missing:
            return Done()
        if role.propagating(target):
            return Wait(3.0, f"waiting for IAM to propagate the role {role.role_name(target)}")
        role.ensure(target, missing)  # the association, now that IAM has the role
        return Wait(1.0, "waiting for the pod identity association")

    def result(self, ctx: StageContext[Any]) -> dict[str, Any]:
        role, target = self._pair(ctx)
        return identity_view(role, target).model_dump()
