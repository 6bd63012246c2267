"""The ``storage`` stage of ``cluster.create`` and its teardown: shared storage as PersistentVolumeClaims.

Create applies (server-side, field manager ``instantstart``) a static Mountpoint for Amazon S3 CSI volume
(driver ``s3.csi.aws.com``) of the shared bucket, limited to this cluster's prefix with Mountpoint's
``prefix`` mount option, and its claim ``shared-s3`` in ``default``; optionally FSx for Lustre: a new file
system (tagged in the call, in the compute subnet and the cluster's security group, with a client token
fixed per operation) or an existing one (refused when it is in another VPC), mounted through a static
``fsx.csi.aws.com`` volume and the claim ``fsx`` once it is AVAILABLE.

Teardown deletes our claims and volumes (only objects carrying our managed-by label) and a file system
only when it carries this cluster's tags — an existing file system, and the bucket, are never deleted.
A new file system of ours that ends FAILED or MISCONFIGURED stops the stage with FSx's reason; a retry of the
stage deletes it, waits until it is gone and makes a new one (the reason stays in the stage's message).
"""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import (
    FIELD_MANAGER,
    ClusterDeletePlan,
    CreateStage,
    DeleteStage,
    owned,
    result_of,
    tag_list,
)
from services.clusters.create_models import ClusterCreatePlan, FsxChoice, NetworkResult, PlannedResource, StorageResult
from services.errors import Invalid, NotFound, Permanent
from services.stages import Done, Observed, StageContext, Wait

NAMESPACE = "default"  # where a user's workloads land unless they choose; claims are namespaced
S3_CLAIM = "shared-s3"
FSX_CLAIM = "fsx"
S3_DRIVER = "s3.csi.aws.com"
FSX_DRIVER = "fsx.csi.aws.com"
MANAGED_LABEL = {"app.kubernetes.io/managed-by": "instantstart"}
APPLY = "application/apply-patch+yaml"
S3_NOMINAL = "1200Gi"  # S3 has no size: the driver ignores it, Kubernetes requires one
FSX_POLL = 30.0
FSX_CREATE_SECONDS = 600.0  # a new Lustre file system: CREATING to AVAILABLE in about ten minutes


def s3_prefix(cluster: str) -> str:
    """The shared bucket's key prefix this cluster's claim sees (Mountpoint's ``prefix`` mount option)."""
    return f"instantstart/{cluster}/data/"


def volume_name(cluster: str, claim: str) -> str:
    """PersistentVolumes are cluster-scoped: named after the InstantStart cluster and the claim."""
    return f"instantstart-{cluster}-{claim}"


def _meta(name: str, cluster: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**MANAGED_LABEL, "instantstart/cluster": cluster}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _static_pair(cluster: str, claim: str, size: str, csi: dict[str, Any],
                 mount_options: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A static PV bound to exactly one claim (``claimRef`` and ``volumeName``), and that claim."""
    pv_name = volume_name(cluster, claim)
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": _meta(pv_name, cluster),
          "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "volumeMode": "Filesystem",
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "claimRef": {"namespace": NAMESPACE, "name": claim}, "mountOptions": mount_options, "csi": csi}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(claim, cluster, NAMESPACE),
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                    "resources": {"requests": {"storage": size}}}}
    return pv, pvc


def s3_volume(plan: ClusterCreatePlan) -> tuple[dict[str, Any], dict[str, Any]]:
    csi = {"driver": S3_DRIVER, "volumeHandle": f"instantstart-{plan.name}-s3",
           "volumeAttributes": {"bucketName": plan.bucket}}
    return _static_pair(plan.name, S3_CLAIM, S3_NOMINAL, csi,
                        ["allow-delete", "allow-other", f"region {plan.region}", f"prefix {s3_prefix(plan.name)}"])


def fsx_volume(cluster: str, fs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    lustre = fs.get("LustreConfiguration") or {}
    csi = {"driver": FSX_DRIVER, "volumeHandle": fs["FileSystemId"],
           "volumeAttributes": {"dnsname": fs["DNSName"], "mountname": lustre.get("MountName", "")}}
    return _static_pair(cluster, FSX_CLAIM, f"{int(fs['StorageCapacity'])}Gi", csi, ["flock"])


def _client_token(operation_id: str) -> str:
    """FSx's idempotency token: one per operation, so a retry after a crash finds the same file system."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in f"instantstart-{operation_id}")[:63]


def describe_file_system(fsx: Any, fs_id: str) -> dict[str, Any] | None:
    """One file system, or None when FSx says ``FileSystemNotFound`` (classified by its code)."""
    try:
        found = fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"]
    except (NotFound, Permanent) as exc:
        if isinstance(exc, Permanent) and (exc.details or {}).get("aws_code") != "FileSystemNotFound":
            raise
        return None
    return dict(found[0]) if found else None


def _file_systems(fsx: Any) -> list[dict[str, Any]]:
    return list(fsx.all_pages("describe_file_systems", "FileSystems"))


def _tagged_file_system(fsx: Any, cluster: str) -> dict[str, Any] | None:
    return next((fs for fs in _file_systems(fsx) if owned(fs.get("Tags"), cluster)
                 and fs.get("Lifecycle") not in ("DELETING",)), None)


class StorageStage(CreateStage):
    name = "storage"
    expected_seconds = 60.0  # AWS: a minute for the claims (and for mounting an existing file system)

    def expected_for(self, request: ClusterCreatePlan) -> float | None:
        """A new FSx for Lustre file system adds its creation (about ten minutes in AWS) to the claims."""
        new_fsx = request.fsx is not None and request.fsx.mode == "new"
        return (self.expected_seconds or 0.0) + FSX_CREATE_SECONDS if new_fsx else self.expected_seconds

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        made = [PlannedResource(stage=self.name, type="Kubernetes PersistentVolume",
                                name=volume_name(plan.name, S3_CLAIM), action="apply",
                                detail=f"{S3_DRIVER}: s3://{plan.bucket}/{s3_prefix(plan.name)}"),
                PlannedResource(stage=self.name, type="Kubernetes PersistentVolumeClaim",
                                name=f"{NAMESPACE}/{S3_CLAIM}", action="apply")]
        if plan.fsx is not None:
            if plan.fsx.mode == "new":
                made.append(PlannedResource(stage=self.name, type="AWS::FSx::FileSystem",
                                            name=plan.names.fsx or f"{plan.name}-fsx",
                                            detail=f"Lustre PERSISTENT_2, {plan.fsx.storage_capacity_gib} GiB"))
            else:
                made.append(PlannedResource(stage=self.name, type="AWS::FSx::FileSystem", action="reuse",
                                            name=str(plan.fsx.file_system_id)))
            made += [PlannedResource(stage=self.name, type="Kubernetes PersistentVolume", action="apply",
                                     name=volume_name(plan.name, FSX_CLAIM), detail=FSX_DRIVER),
                     PlannedResource(stage=self.name, type="Kubernetes PersistentVolumeClaim", action="apply",
                                     name=f"{NAMESPACE}/{FSX_CLAIM}")]
        return made

    # ----- observe / act / poll -------------------------------------------------------------------------

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        plan = ctx.request
        core = self._core(plan)
        if _read_claim(core, S3_CLAIM) is None:
            return Observed.ABSENT
        if plan.fsx is None:
            return Observed.DONE
        claim = _read_claim(core, FSX_CLAIM)
        if claim is None:
            return Observed.ABSENT
        ctx.data["fsx_id"] = _read_volume_handle(core, volume_name(plan.name, FSX_CLAIM))
        return Observed.DONE

    def act(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        plan = ctx.request
        ctx.data.pop("fsx_replacing", None)
        if plan.fsx is not None:  # first: an existing file system that will not do is refused before anything
            ctx.data["fsx_id"] = self._file_system(ctx, plan.fsx)
        self._apply(plan, *s3_volume(plan))

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        plan = ctx.request
        if plan.fsx is None:
            return Done()
        if ctx.data.get("fsx_replacing"):
            return self._replace(ctx, plan.fsx)
        fs_id = str(ctx.data["fsx_id"])
        fs = describe_file_system(self._fsx(plan), fs_id)
        if fs is None:
            raise Permanent(f"FSx file system {fs_id} is gone (deleted by someone else?)")
        state = fs.get("Lifecycle")
        if state in _GONE_OR_FAILED:
            again = "; retry the stage to delete it and make a new one" if plan.fsx.mode == "new" else ""
            raise Permanent(f"FSx file system {fs_id} is {state}: {_why(fs)}{again}")
        if state != "AVAILABLE":
            replaced = ctx.data.get("fsx_replaced")
            instead = (f" (replaces {replaced['file_system_id']}, which was {replaced['reason']})"
                       if replaced else "")
            return Wait(FSX_POLL, f"FSx file system {fs_id} is {state}{instead}")
        self._apply(plan, *fsx_volume(plan.name, fs))
        return Done()

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        claims = [f"{NAMESPACE}/{S3_CLAIM}"] + ([f"{NAMESPACE}/{FSX_CLAIM}"] if ctx.request.fsx is not None else [])
        return StorageResult(claims=claims, fsx_file_system_id=ctx.data.get("fsx_id")).model_dump()

    # ----- helpers --------------------------------------------------------------------------------------

    def _core(self, plan: ClusterCreatePlan) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.deps.kube.api_client(plan.name))

    def _fsx(self, plan: ClusterCreatePlan) -> Any:
        return self.deps.aws.client("fsx", plan.region)

    def _apply(self, plan: ClusterCreatePlan, pv: dict[str, Any], pvc: dict[str, Any]) -> None:
        core = self._core(plan)
        core.patch_persistent_volume(pv["metadata"]["name"], pv, field_manager=FIELD_MANAGER, force=True,
                                     _content_type=APPLY)
        core.patch_namespaced_persistent_volume_claim(pvc["metadata"]["name"], NAMESPACE, pvc,
                                                      field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)

    def _file_system(self, ctx: StageContext[ClusterCreatePlan], choice: FsxChoice) -> str:
        """The file system's id: an existing one checked, or ours (found by tags, else created once)."""
        plan, fsx = ctx.request, self._fsx(ctx.request)
        network = result_of(ctx, "network", NetworkResult)
        if choice.mode == "existing":
            fs_id = str(choice.file_system_id)
            fs = describe_file_system(fsx, fs_id)
            if fs is None:
                raise Invalid(f"FSx file system {fs_id} does not exist in {plan.region}")
            if fs.get("FileSystemType") != "LUSTRE":
                raise Invalid(f"FSx file system {fs_id} is {fs.get('FileSystemType')}, not Lustre")
            if fs.get("VpcId") != network.vpc_id:
                raise Invalid(f"FSx file system {fs_id} is in {fs.get('VpcId')}, not in the cluster's VPC "
                              f"{network.vpc_id}: its nodes could not reach it")
            return fs_id
        ours = [fs for fs in _file_systems(fsx) if owned(fs.get("Tags"), plan.name)]
        live = [fs for fs in ours if fs.get("Lifecycle") not in _GONE_OR_FAILED]
        if live:
            return str(live[0]["FileSystemId"])
        failed = [fs for fs in ours if fs.get("Lifecycle") in _GONE_OR_FAILED]
        if failed:  # ours, failed in an earlier attempt: deleted first, poll makes a new one once it is gone
            old = failed[0]
            fs_id, state = str(old["FileSystemId"]), old.get("Lifecycle")
            if state != "DELETING":
                fsx.delete_file_system(FileSystemId=fs_id, ClientRequestToken=_client_token(
                    f"{ctx.operation_id}-d{ctx.data.get('fsx_generation', 0)}"))
            ctx.data["fsx_replacing"] = {"file_system_id": fs_id, "reason": f"{state}: {_why(old)}"}
            return fs_id
        return self._create_file_system(ctx, choice)

    def _create_file_system(self, ctx: StageContext[ClusterCreatePlan], choice: FsxChoice) -> str:
        """CreateFileSystem once per generation: a replacement gets its own client token (the first one's
        would answer the failed file system again)."""
        plan, fsx = ctx.request, self._fsx(ctx.request)
        network = result_of(ctx, "network", NetworkResult)
        generation = int(ctx.data.get("fsx_generation", 0))
        token = _client_token(ctx.operation_id if generation == 0 else f"{ctx.operation_id}-r{generation}")
        name = plan.names.fsx or f"{plan.name}-fsx"
        made = fsx.create_file_system(
            ClientRequestToken=token, FileSystemType="LUSTRE",
            FileSystemTypeVersion="2.15", StorageCapacity=choice.storage_capacity_gib,
            SubnetIds=[network.compute_subnet], SecurityGroupIds=[network.security_group],
            LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250,
                                 "DataCompressionType": "LZ4"},
            Tags=tag_list({**plan.tags, "Name": name}))
        return str(made["FileSystem"]["FileSystemId"])

    def _replace(self, ctx: StageContext[ClusterCreatePlan], choice: FsxChoice) -> Wait:
        """Waits until our failed file system is gone, then makes the new one (the failure stays in the
        message)."""
        replacing = ctx.data["fsx_replacing"]
        evidence = f"replacing FSx file system {replacing['file_system_id']}, which is {replacing['reason']}"
        old = describe_file_system(self._fsx(ctx.request), replacing["file_system_id"])
        if old is not None:
            return Wait(FSX_POLL, f"{evidence}; it is {old.get('Lifecycle')}")
        ctx.data["fsx_generation"] = int(ctx.data.get("fsx_generation", 0)) + 1
        ctx.data["fsx_replaced"] = ctx.data.pop("fsx_replacing")
        ctx.data["fsx_id"] = self._create_file_system(ctx, choice)
        return Wait(FSX_POLL, f"{evidence}; made {ctx.data['fsx_id']} instead")


_GONE_OR_FAILED = ("FAILED", "MISCONFIGURED", "DELETING")


def _why(fs: dict[str, Any]) -> str:
    return str((fs.get("FailureDetails") or {}).get("Message") or "no reason given")


def _read_claim(core: k8s.CoreV1Api, name: str) -> Any:
    try:
        return core.read_namespaced_persistent_volume_claim(name, NAMESPACE)
    except NotFound:
        return None


def _read_volume_handle(core: k8s.CoreV1Api, name: str) -> str | None:
    try:
        pv = core.read_persistent_volume(name)
    except NotFound:
        return None
    return str(pv.spec.csi.volume_handle) if pv.spec and pv.spec.csi else None


class StorageTeardown(DeleteStage):
    """Deletes our claims, then our volumes, then a file system tagged as this cluster's; waits until it is
    gone. The shared bucket and an existing (untagged) file system are never touched."""

    name = "storage"
    expected_seconds = 120.0

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        plan = ctx.request
        left: list[str] = []
        core = self._core(plan)
        if core is not None:
            left += [c for c in (S3_CLAIM, FSX_CLAIM) if _ours(_read_claim(core, c))]
            left += [v for v in (volume_name(plan.name, S3_CLAIM), volume_name(plan.name, FSX_CLAIM))
                     if _ours(_read_volume(core, v))]
        fs = _tagged_file_system(self._fsx(plan), plan.name)
        if fs is not None:
            ctx.data["fsx_id"] = fs["FileSystemId"]
        return Observed.ABSENT if left or fs is not None else Observed.DONE

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        plan = ctx.request
        core = self._core(plan)
        if core is None:
            return
        for claim in (S3_CLAIM, FSX_CLAIM):
            if _ours(_read_claim(core, claim)):
                _ignore_missing(core.delete_namespaced_persistent_volume_claim, claim, NAMESPACE)
        for claim in (S3_CLAIM, FSX_CLAIM):
            name = volume_name(plan.name, claim)
            if _ours(_read_volume(core, name)):
                _ignore_missing(core.delete_persistent_volume, name)

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        """Converges the file system to gone: waits out a create in flight (FSx refuses to delete it), then
        deletes it once (a DELETING one is only waited for)."""
        fs_id = ctx.data.get("fsx_id")
        if not fs_id:
            return Done()
        fsx = self._fsx(ctx.request)
        fs = describe_file_system(fsx, fs_id)
        if fs is None:
            return Done()
        state = fs.get("Lifecycle")
        if state in ("AVAILABLE", "FAILED", "MISCONFIGURED") and owned(fs.get("Tags"), ctx.request.name):
            fsx.delete_file_system(FileSystemId=fs_id, ClientRequestToken=_client_token(ctx.operation_id))
            state = "DELETING"
        return Wait(FSX_POLL, f"FSx file system {fs_id} is {state}")

    def _core(self, plan: ClusterDeletePlan) -> k8s.CoreV1Api | None:
        """The cluster's Kubernetes API; None when there is none to reach (its EKS cluster was never made, or
        is gone): then no claim or volume of ours can be left in it."""
        try:
            return k8s.CoreV1Api(self.deps.kube.api_client(plan.name))
        except NotFound:
            return None

    def _fsx(self, plan: ClusterDeletePlan) -> Any:
        return self.deps.aws.client("fsx", plan.region)


def _read_volume(core: k8s.CoreV1Api, name: str) -> Any:
    try:
        return core.read_persistent_volume(name)
    except NotFound:
        return None


def _ours(obj: Any) -> bool:
    labels = (obj.metadata.labels or {}) if obj is not None and obj.metadata is not None else {}
    return all(labels.get(k) == v for k, v in MANAGED_LABEL.items()) if obj is not None else False


def _ignore_missing(delete: Any, *args: Any) -> None:
    with contextlib.suppress(NotFound):
        delete(*args)


def namespace_volume(default_pv: dict[str, Any], cluster: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job namespace's static Mountpoint volume and its claim ``shared-s3``: the same bucket and mount options
    (the cluster's prefix) as the cluster's volume in ``default`` (``default_pv``, as the API serves it), with
    its own name and volumeHandle."""
    spec = default_pv.get("spec") or {}
    csi = spec.get("csi") or {}
    pv_name = volume_name(cluster, f"{namespace}-{S3_CLAIM}")
    labels = {**MANAGED_LABEL, "instantstart/cluster": cluster}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name, "labels": labels},
          "spec": {"capacity": {"storage": S3_NOMINAL}, "accessModes": ["ReadWriteMany"], "volumeMode": "Filesystem",
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "claimRef": {"namespace": namespace, "name": S3_CLAIM},
                   "mountOptions": list(spec.get("mountOptions") or []),
                   "csi": {"driver": S3_DRIVER, "volumeHandle": f"instantstart-{cluster}-{namespace}-s3",
                           "volumeAttributes": dict(csi.get("volumeAttributes") or {})}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": S3_CLAIM, "namespace": namespace, "labels": labels},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                    "resources": {"requests": {"storage": S3_NOMINAL}}}}
    return pv, pvc
