"""The ``hyperpod`` stage of ``cluster.create`` and its teardown: the HyperPod cluster on the new EKS cluster.

Create uploads the lifecycle scripts shipped pinned in this package (``lifecycle/``; never fetched from a
branch) to ``s3://<shared bucket>/<lifecycle prefix>`` — an object whose ETag already is the script's MD5 is
not sent again — then calls SageMaker CreateCluster once: EKS orchestration, automatic node recovery,
continuous provisioning, one instance group, tags in the call. CreateCluster has no client token, so the
cluster is observed by name first, and one of that name without our tags is refused, never adopted.

In continuous mode AWS declares the cluster InService while its group is still filling (a capacity
shortfall leaves it short and HyperPod retries): the stage keeps waiting until the group has its count of
Running nodes, or its deadline, and says AWS's reason meanwhile (the pending nodes' messages, else the
group's newest error event). A cluster of ours that Failed stops the stage with AWS's reason; a retry of
the stage deletes it, waits until it is gone and creates it again (the reason stays in the stage's
message). It must never delete or replace a cluster it did not tag.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

from services.clusters.create import derive_names
from services.clusters.create_base import (
    ClusterDeletePlan,
    CreateStage,
    DeleteStage,
    owned,
    result_of,
    tag_list,
)
from services.clusters.create_models import (
    CapacityType,
    ClusterCreatePlan,
    EksResult,
    HyperpodResult,
    IamResult,
    NetworkResult,
    PlannedResource,
)
from services.errors import NotFound, Permanent
from services.stages import Done, Observed, StageContext, Wait

ON_CREATE = "on_create.sh"
POLL_SECONDS = 30.0  # AWS's own pace: a cluster takes ~20 minutes, a node's boot ~15


def lifecycle_scripts() -> dict[str, bytes]:
    """The lifecycle scripts shipped in this package, by file name (what is uploaded, byte for byte)."""
    folder = resources.files("services.clusters").joinpath("lifecycle")
    return {entry.name: entry.read_bytes() for entry in folder.iterdir() if entry.name.endswith(".sh")}


def _etag(body: bytes) -> str:
    """S3's ETag of a single-part upload without SSE-KMS: the body's MD5, quoted."""
    return f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'


def _sagemaker_tags(sagemaker: Any, arn: str) -> list[dict[str, str]]:
    return list(sagemaker.all_pages("list_tags", "Tags", ResourceArn=arn))


def _describe(sagemaker: Any, name: str) -> dict[str, Any] | None:
    try:
        return dict(sagemaker.describe_cluster(ClusterName=name))
    except NotFound:
        return None


class HyperpodStage(CreateStage):
    name = "hyperpod"
    expected_seconds = 1200.0  # aws-facts: ~20 minutes; ~35 with deep health checks
    #: a continuous group short of capacity keeps retrying in AWS; we wait for it this long (AWS's own
    #: MinInstanceCount window is 3 hours) before failing with the reason AWS gave
    deadline = 4 * 3600.0

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        n = plan.names
        scripts = sorted(lifecycle_scripts())
        checks = f", deep health checks {'+'.join(plan.deep_health_checks)}" if plan.deep_health_checks else ""
        return [
            PlannedResource(stage=self.name, type="AWS::S3::Object", name=f"s3://{plan.bucket}/{n.lifecycle_prefix}",
                            action="apply", detail="lifecycle scripts " + ", ".join(scripts)),
            PlannedResource(stage=self.name, type="AWS::SageMaker::Cluster", name=n.hyperpod_cluster,
                            detail=f"instance group {n.instance_group}: {plan.count} x {plan.instance_type} "
                                   f"({plan.capacity_type.value}), {plan.ebs_volume_gib} GiB EBS{checks}; "
                                   "node recovery Automatic, provisioning Continuous"),
        ]

    # ----- observe / act / poll -------------------------------------------------------------------------

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        plan = ctx.request
        ctx.data.pop("replacing", None)
        cluster = _describe(self._sagemaker(plan), plan.names.hyperpod_cluster)
        if cluster is None:
            return Observed.ABSENT
        self._check_ours(plan, cluster)
        ctx.data["arn"] = cluster["ClusterArn"]
        self._register(plan, str(cluster["ClusterArn"]))
        if cluster["ClusterStatus"] == "Failed":  # ours, failed in an earlier attempt: this retry replaces it
            ctx.data["replacing"] = {"hyperpod_arn": cluster["ClusterArn"],
                                     "reason": str(cluster.get("FailureMessage") or "no reason given")}
            return Observed.ABSENT
        return Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        plan = ctx.request
        if ctx.data.get("replacing"):  # deleted first; poll makes the new one once it is gone
            self._sagemaker(plan).delete_cluster(ClusterName=plan.names.hyperpod_cluster)
            return
        self._create(ctx)

    def _create(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        plan = ctx.request
        self._upload_scripts(plan)
        sagemaker = self._sagemaker(plan)
        made = sagemaker.create_cluster(**self.create_request(ctx))
        ctx.data["arn"] = made["ClusterArn"]
        # recorded at once, not when the group is full: a create that fails later (a capacity shortfall past
        # the deadline) must still have its HyperPod cluster deleted with the cluster
        self._register(plan, str(made["ClusterArn"]))

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        plan = ctx.request
        sagemaker = self._sagemaker(plan)
        name, group = plan.names.hyperpod_cluster, plan.names.instance_group
        cluster = _describe(sagemaker, name)
        replacing = ctx.data.get("replacing")
        if replacing:
            evidence = f"replacing HyperPod cluster {replacing['hyperpod_arn']}, which failed: {replacing['reason']}"
            if cluster is not None:
                return Wait(POLL_SECONDS, f"{evidence}; it is {cluster['ClusterStatus']}")
            ctx.data["replaced"] = ctx.data.pop("replacing")
            self._create(ctx)
            return Wait(POLL_SECONDS, f"{evidence}; created it again")
        if cluster is None:
            raise Permanent(f"HyperPod cluster {name} disappeared while it was being created (deleted by someone "
                            "else?); run the create again")
        status = str(cluster["ClusterStatus"])
        ctx.data.update(arn=cluster["ClusterArn"], status=status)
        if status == "Failed":
            raise Permanent(f"HyperPod cluster {name} failed: {cluster.get('FailureMessage') or 'no reason given'}; "
                            "retry the stage to delete it and create it again")
        if status in ("Deleting", "RollingBack"):
            raise Permanent(f"HyperPod cluster {name} is {status} ({cluster.get('FailureMessage') or 'no reason'}) "
                            "instead of being created")
        nodes = self._group_nodes(sagemaker, name, group)
        running = sum(1 for n in nodes if n.get("InstanceStatus", {}).get("Status") == "Running")
        ctx.data["groups"] = {group: running}
        if status == "InService" and running >= plan.count:
            return Done()
        where = f"HyperPod cluster {name} is {status}; {running}/{plan.count} nodes of {group} Running"
        replaced = ctx.data.get("replaced")
        if replaced:
            where += f" (replaces {replaced['hyperpod_arn']}, which failed: {replaced['reason']})"
        reason = self._shortfall_reason(sagemaker, cluster, nodes, group)
        return Wait(POLL_SECONDS, f"{where}; AWS: {reason}" if reason else where)

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        return HyperpodResult(hyperpod_arn=ctx.data["arn"], status=ctx.data.get("status", "InService"),
                              groups=ctx.data.get("groups", {})).model_dump()

    # ----- the request ----------------------------------------------------------------------------------

    def create_request(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        """SageMaker CreateCluster's parameters for ``ctx``'s plan and the earlier stages' results."""
        plan, n = ctx.request, ctx.request.names
        network = result_of(ctx, "network", NetworkResult)
        iam = result_of(ctx, "iam", IamResult)
        eks = result_of(ctx, "eks", EksResult)
        group: dict[str, Any] = {
            "InstanceGroupName": n.instance_group, "InstanceType": plan.instance_type,
            "InstanceCount": plan.count, "ExecutionRole": iam.execution_role_arn,
            "LifeCycleConfig": {"SourceS3Uri": f"s3://{plan.bucket}/{n.lifecycle_prefix}", "OnCreate": ON_CREATE},
            "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": plan.ebs_volume_gib}}],
        }
        if plan.deep_health_checks:
            group["OnStartDeepHealthChecks"] = list(plan.deep_health_checks)
        if plan.capacity_type is CapacityType.TRAINING_PLAN:
            if not plan.training_plan_arn:
                raise Permanent("capacity type training-plan without a training plan ARN; the precheck should "
                                "have refused this (a bug)")
            group["TrainingPlanArn"] = plan.training_plan_arn
        else:
            group["CapacityRequirements"] = {"Spot": {}} if plan.capacity_type is CapacityType.SPOT \
                else {"OnDemand": {}}
        return {"ClusterName": n.hyperpod_cluster, "Orchestrator": {"Eks": {"ClusterArn": eks.eks_arn}},
                "NodeRecovery": "Automatic", "NodeProvisioningMode": "Continuous",
                "VpcConfig": {"SecurityGroupIds": [network.security_group], "Subnets": [network.compute_subnet]},
                "InstanceGroups": [group], "Tags": tag_list(plan.tags)}

    # ----- helpers --------------------------------------------------------------------------------------

    def _sagemaker(self, plan: ClusterCreatePlan) -> Any:
        return self.deps.aws.client("sagemaker", plan.region)

    def _check_ours(self, plan: ClusterCreatePlan, cluster: dict[str, Any]) -> None:
        if not owned(_sagemaker_tags(self._sagemaker(plan), str(cluster["ClusterArn"])), plan.name):
            raise Permanent(f"a HyperPod cluster named {plan.names.hyperpod_cluster} exists already "
                            f"({cluster['ClusterArn']}) and was not made by this control plane for {plan.name}; "
                            "choose another name, or import that cluster instead", details={
                                "hyperpod_arn": cluster["ClusterArn"]})

    def _upload_scripts(self, plan: ClusterCreatePlan) -> None:
        """PutObject each shipped script whose object is missing or differs (by ETag)."""
        s3 = self.deps.aws.client("s3", plan.region)
        prefix = plan.names.lifecycle_prefix
        present = {o["Key"]: o.get("ETag") for o in s3.all_pages("list_objects_v2", "Contents", Bucket=plan.bucket,
                                                                   Prefix=prefix)}
        for file, body in sorted(lifecycle_scripts().items()):
            key = prefix + file
            if present.get(key) != _etag(body):
                s3.put_object(Bucket=plan.bucket, Key=key, Body=body, ContentType="text/x-shellscript")

    def _group_nodes(self, sagemaker: Any, name: str, group: str) -> list[dict[str, Any]]:
        nodes = sagemaker.all_pages("list_cluster_nodes", "ClusterNodeSummaries", ClusterName=name,
                                    InstanceGroupNameContains=group, IncludeNodeLogicalIds=True)
        return [n for n in nodes if n.get("InstanceGroupName") == group]

    def _shortfall_reason(self, sagemaker: Any, cluster: dict[str, Any], nodes: list[dict[str, Any]],
                          group: str) -> str:
        """Why the group is short, in AWS's words: pending nodes' messages, else the newest error event."""
        messages = sorted({str(n["InstanceStatus"]["Message"]) for n in nodes
                           if n.get("InstanceStatus", {}).get("Status") != "Running"
                           and n.get("InstanceStatus", {}).get("Message")})
        if messages:
            return "; ".join(messages)
        if cluster.get("NodeProvisioningMode") != "Continuous":  # ListClusterEvents needs continuous mode
            return str(cluster.get("FailureMessage") or "")
        events = sagemaker.list_cluster_events(ClusterName=cluster["ClusterName"], InstanceGroupName=group,
                                               SortOrder="Descending", MaxResults=10).get("Events", [])
        latest = events[0] if events else None
        return str(latest["Description"]) if latest is not None and latest.get("EventLevel") == "Error" else ""

    def _register(self, plan: ClusterCreatePlan, arn: str) -> None:
        record = self.deps.registry.find(plan.name)
        if record is None:
            raise Permanent(f"cluster {plan.name} is not in the registry, yet the eks stage registers it before "
                            "this stage runs; this is a bug")
        if record.hyperpod_arn != arn or record.hyperpod_name != plan.names.hyperpod_cluster:
            self.deps.registry.set_hyperpod(plan.name, plan.names.hyperpod_cluster, arn)


class HyperpodTeardown(DeleteStage):
    """DeleteCluster of the HyperPod cluster, only when it carries our tags; waits until it is gone, then
    removes the shipped lifecycle scripts under the cluster's derived lifecycle prefix — also when no cluster
    was ever made (CreateCluster refused, the create cancelled after the upload). The bucket and anything else
    in it stay. A same-named cluster without our tags is not ours: it is left alone, noted in the result, and
    the teardown goes on."""

    name = "hyperpod"
    expected_seconds = 600.0

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        plan = ctx.request
        ctx.data.pop("arn", None)
        cluster = self._cluster(ctx)
        if cluster is not None:
            ctx.data["arn"] = cluster["ClusterArn"]
            return Observed.IN_PROGRESS if cluster["ClusterStatus"] == "Deleting" else Observed.ABSENT
        return Observed.ABSENT if self._scripts_left(plan, ctx) else Observed.DONE

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        if ctx.data.get("arn"):
            self._sagemaker(ctx.request).delete_cluster(ClusterName=ctx.request.hyperpod_cluster)

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        plan = ctx.request
        if ctx.data.get("arn") and plan.hyperpod_cluster:
            cluster = _describe(self._sagemaker(plan), plan.hyperpod_cluster)
            if cluster is not None:
                return Wait(POLL_SECONDS, f"HyperPod cluster {plan.hyperpod_cluster} is {cluster['ClusterStatus']}")
        ours = self._scripts_left(plan, ctx)
        if ours:
            self.deps.aws.client("s3", plan.region).delete_objects(
                Bucket=plan.bucket, Delete={"Objects": [{"Key": k} for k in ours], "Quiet": True})
            ctx.data["scripts_removed"] = ours
        return Done()

    def result(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any]:
        out: dict[str, Any] = {"scripts_removed": list(ctx.data.get("scripts_removed", []))}
        if ctx.data.get("not_ours"):
            out["not_ours"] = ctx.data["not_ours"]
        return out

    def _sagemaker(self, plan: ClusterDeletePlan) -> Any:
        return self.deps.aws.client("sagemaker", plan.region)

    def _cluster(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any] | None:
        """Our HyperPod cluster as it is now; None when there is none of ours (a same-named one without our
        tags is recorded in ``ctx.data['not_ours']`` and left alone)."""
        plan = ctx.request
        if not plan.hyperpod_cluster:
            return None
        sagemaker = self._sagemaker(plan)
        cluster = _describe(sagemaker, plan.hyperpod_cluster)
        if cluster is None:
            return None
        if not owned(_sagemaker_tags(sagemaker, str(cluster["ClusterArn"])), plan.name):
            uri = str((cluster.get("InstanceGroups") or [{}])[0].get("LifeCycleConfig", {}).get("SourceS3Uri", ""))
            ctx.data["not_ours"] = {
                "hyperpod_arn": cluster["ClusterArn"], "lifecycle": uri,
                "message": f"HyperPod cluster {plan.hyperpod_cluster} ({cluster['ClusterArn']}) does not carry this "
                           f"control plane's tags for {plan.name}: not ours, nothing to delete (left alone)"}
            return None
        return cluster

    def _scripts_left(self, plan: ClusterDeletePlan, ctx: StageContext[ClusterDeletePlan]) -> list[str]:
        """The keys of our shipped scripts still under the cluster's derived lifecycle prefix (never another
        key); none while a cluster that is not ours runs from that prefix."""
        prefix = derive_names(plan.name).lifecycle_prefix
        if (ctx.data.get("not_ours") or {}).get("lifecycle") == f"s3://{plan.bucket}/{prefix}":
            return []
        s3 = self.deps.aws.client("s3", plan.region)
        try:
            present = {o["Key"] for o in s3.all_pages("list_objects_v2", "Contents", Bucket=plan.bucket,
                                                       Prefix=prefix)}
        except NotFound:  # no shared bucket yet: the create never got as far as uploading
            return []
        return [prefix + f for f in sorted(lifecycle_scripts()) if prefix + f in present]
