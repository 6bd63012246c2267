"""FSx for Lustre file systems with their real lifecycle, which moto has only thinly.

moto returns no ``Lifecycle``, no ``MountName`` and no ``VpcId``, accepts any ``StorageCapacity`` and deletes
at once. The product mounts Lustre through the FSx CSI driver with ``DNSName`` and ``MountName`` and must
wait for ``AVAILABLE``, so this simulator owns Create/Describe/Delete: ``CREATING -> AVAILABLE`` and
``DELETING -> gone`` on the clock, the storage-capacity steps and per-unit throughputs each deployment type
allows (AWS FSx for Lustre user guide), and errors with the codes FSx uses (``BadRequest``,
``InvalidPerUnitStorageThroughput``, ``FileSystemNotFound``, ``InvalidNetworkSettings``). Only ``LUSTRE``
is simulated; other file-system types are refused with ``BadRequest``.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from .base import AwsError, Call, FaultRegistry, SimClock

if TYPE_CHECKING:
    from .facts import MotoFacts

CREATE_SECONDS = 360.0
DELETE_SECONDS = 120.0
# deployment type (and storage type) -> (first allowed sizes, step after them), in GiB
_CAPACITY: dict[str, tuple[tuple[int, ...], int]] = {
    "SCRATCH_1": ((1200, 2400), 3600),
    "SCRATCH_2": ((1200,), 2400),
    "PERSISTENT_1": ((1200,), 2400),
    "PERSISTENT_2": ((1200,), 2400),
}
_THROUGHPUT = {"PERSISTENT_1": (50, 100, 200), "PERSISTENT_2": (125, 250, 500, 1000)}
_HDD_THROUGHPUT_STEP = {12: 6000, 40: 1800}  # PERSISTENT_1 on HDD: MB/s/TiB -> capacity step in GiB
LUSTRE_PORT = 988
FAILED_MESSAGE = "The file system could not be created (the sandbox's file_system_failed fault)."
PORT_MESSAGE = ("The file system cannot be created because the default security group in the subnet provided or the "
                "provided security groups do not permit Lustre LNET network traffic on port 988")


def _lustre_version(deployment: str, lustre: dict[str, Any], asked: str | None) -> str:
    """The Lustre version, checked against the deployment type as the FSx API reference states it:
    2.10 only for Scratch and PERSISTENT_1, 2.12 not for PERSISTENT_2 with a metadata configuration; the
    default is 2.10, or 2.12 (2.15 with a metadata configuration) for PERSISTENT_2."""
    metadata = bool(lustre.get("MetadataConfiguration"))
    if asked is None:
        return ("2.15" if metadata else "2.12") if deployment == "PERSISTENT_2" else "2.10"
    if asked == "2.10" and deployment == "PERSISTENT_2":
        raise AwsError("BadRequest", "Lustre version 2.10 is supported only by the SCRATCH_1, SCRATCH_2 and "
                                     "PERSISTENT_1 deployment types; PERSISTENT_2 needs 2.12 or 2.15.")
    if asked == "2.12" and deployment == "PERSISTENT_2" and metadata:
        raise AwsError("BadRequest", "Lustre version 2.12 does not support PERSISTENT_2 with a metadata "
                                     "configuration; use 2.15.")
    return asked


def _capacity_error(deployment: str, storage_type: str, capacity: int, throughput: int | None) -> str | None:
    if storage_type == "HDD":
        step = _HDD_THROUGHPUT_STEP.get(throughput or 0)
        if deployment != "PERSISTENT_1" or step is None:
            return "HDD storage is supported only with PERSISTENT_1 and a PerUnitStorageThroughput of 12 or 40."
        if capacity <= 0 or capacity % step:
            return (f"StorageCapacity {capacity} is not valid for PERSISTENT_1 HDD with {throughput} MB/s/TiB; "
                    f"it must be a multiple of {step} GiB.")
        return None
    firsts, step = _CAPACITY[deployment]
    if capacity in firsts or (capacity > 0 and capacity % step == 0):
        return None
    listed = ", ".join(f"{f} GiB" for f in firsts)
    return f"StorageCapacity {capacity} is not valid for {deployment}; use {listed} or a multiple of {step} GiB."


class FsxSimulator:
    """``fsx`` CreateFileSystem / DescribeFileSystems / DeleteFileSystem for Lustre."""

    service = "fsx"
    operations = frozenset({"CreateFileSystem", "DescribeFileSystems", "DeleteFileSystem"})

    def __init__(self, clock: SimClock, *, region: str = "us-west-2", account: str = "123456789012",
                 facts: MotoFacts | None = None, faults: FaultRegistry | None = None) -> None:
        self.clock = clock
        self.faults = faults  # ``file_system_failed``: a create ends FAILED
        self.region = region
        self.account = account
        self.facts = facts  # EC2 as FSx reads it (None: the simulator alone checks no network)
        self._systems: dict[str, dict[str, Any]] = {}  # id -> FileSystem (botocore member names)
        self._due: dict[str, float] = {}  # id -> when the current transition ends
        self._tokens: dict[str, str] = {}  # ClientRequestToken -> id

    def to_state(self) -> dict[str, Any]:
        return {"systems": self._systems, "due": self._due, "tokens": self._tokens}

    def load_state(self, state: dict[str, Any]) -> None:
        self._systems = dict(state.get("systems", {}))
        self._due = {k: float(v) for k, v in state.get("due", {}).items()}
        self._tokens = dict(state.get("tokens", {}))

    def tick(self, now: float) -> None:
        for fs_id, due in list(self._due.items()):
            if due > now:
                continue
            del self._due[fs_id]
            fs = self._systems[fs_id]
            if fs["Lifecycle"] == "CREATING" and self._fails(fs):
                fs["Lifecycle"] = "FAILED"
                fs["FailureDetails"] = {"Message": FAILED_MESSAGE}
            elif fs["Lifecycle"] == "CREATING":
                fs["Lifecycle"] = "AVAILABLE"
            elif fs["Lifecycle"] == "DELETING":
                del self._systems[fs_id]

    def _fails(self, fs: dict[str, Any]) -> bool:
        """Whether a ``file_system_failed`` fault takes this create (one without a count is used up by it)."""
        if self.faults is None:
            return False
        fault = self.faults.take("file_system_failed", subnet=fs["SubnetIds"][0])
        if fault is not None and fault.remaining is None:
            self.faults.clear(fault.id)
        return fault is not None

    def handle(self, call: Call) -> dict[str, Any]:
        if call.operation == "CreateFileSystem":
            return self._create(call.params)
        if call.operation == "DescribeFileSystems":
            return self._describe(call.params)
        return self._delete(call.params)

    def _create(self, p: dict[str, Any]) -> dict[str, Any]:
        token = p.get("ClientRequestToken")
        if token and token in self._tokens and self._tokens[token] in self._systems:
            return {"FileSystem": self._systems[self._tokens[token]]}
        if p["FileSystemType"] != "LUSTRE":
            raise AwsError("BadRequest", f"The sandbox simulates only LUSTRE file systems, not {p['FileSystemType']}.")
        lustre = dict(p.get("LustreConfiguration") or {})
        deployment = lustre.get("DeploymentType", "SCRATCH_1")
        storage_type = p.get("StorageType", "SSD")
        throughput = lustre.get("PerUnitStorageThroughput")
        if "StorageCapacity" not in p:
            raise AwsError("BadRequest", "StorageCapacity is required for Lustre file systems.")
        if deployment.startswith("PERSISTENT") and throughput is None:
            raise AwsError("BadRequest", f"PerUnitStorageThroughput is required for {deployment} deployment types.")
        if deployment.startswith("SCRATCH") and throughput is not None:
            raise AwsError("BadRequest", f"PerUnitStorageThroughput is not supported for {deployment}.")
        if storage_type == "SSD" and throughput is not None and throughput not in _THROUGHPUT[deployment]:
            allowed = ", ".join(str(t) for t in _THROUGHPUT[deployment])
            raise AwsError("InvalidPerUnitStorageThroughput", f"PerUnitStorageThroughput {throughput} is not valid "
                                                              f"for {deployment}; use one of {allowed}.")
        error = _capacity_error(deployment, storage_type, int(p["StorageCapacity"]), throughput)
        if error:
            raise AwsError("BadRequest", error)
        version = _lustre_version(deployment, lustre, p.get("FileSystemTypeVersion"))
        subnets = list(p["SubnetIds"])
        if len(subnets) != 1:
            raise AwsError("InvalidNetworkSettings", "Lustre file systems take exactly one subnet ID.")
        vpc_id = self._check_network(subnets[0], list(p.get("SecurityGroupIds") or []))
        fs_id = "fs-" + secrets.token_hex(9)[:17]
        lustre_out: dict[str, Any] = {
            "DeploymentType": deployment,
            "MountName": "fsx" if deployment == "SCRATCH_1" else secrets.token_hex(4)[:8],
            "WeeklyMaintenanceStartTime": lustre.get("WeeklyMaintenanceStartTime", "1:05:00"),
            "DataCompressionType": lustre.get("DataCompressionType", "NONE"),
            "LogConfiguration": {"Level": "DISABLED"},
            "CopyTagsToBackups": bool(lustre.get("CopyTagsToBackups", False)),
        }
        for key in ("PerUnitStorageThroughput", "DriveCacheType", "AutomaticBackupRetentionDays",
                    "DailyAutomaticBackupStartTime", "EfaEnabled", "MetadataConfiguration", "RootSquashConfiguration"):
            if key in lustre:
                lustre_out[key] = lustre[key]
        fs: dict[str, Any] = {
            "OwnerId": self.account, "CreationTime": self.clock.now(), "FileSystemId": fs_id,
            "FileSystemType": "LUSTRE", "Lifecycle": "CREATING", "StorageCapacity": int(p["StorageCapacity"]),
            "StorageType": storage_type, "SubnetIds": subnets,
            "NetworkInterfaceIds": ["eni-" + secrets.token_hex(9)[:17]],
            "DNSName": f"{fs_id}.fsx.{self.region}.amazonaws.com",
            "ResourceARN": f"arn:aws:fsx:{self.region}:{self.account}:file-system/{fs_id}",
            "Tags": list(p.get("Tags") or []), "LustreConfiguration": lustre_out,
            "FileSystemTypeVersion": version,
            "NetworkType": p.get("NetworkType", "IPV4"),
        }
        if vpc_id is not None:
            fs["VpcId"] = vpc_id
        if p.get("KmsKeyId"):
            fs["KmsKeyId"] = p["KmsKeyId"]
        self._systems[fs_id] = fs
        self._due[fs_id] = self.clock.now() + CREATE_SECONDS
        if token:
            self._tokens[token] = fs_id
        return {"FileSystem": fs}

    def _check_network(self, subnet_id: str, group_ids: list[str]) -> str | None:
        """The subnet's VPC, once the subnet exists and the security groups (the VPC's default one when the
        request names none) exist in that VPC and let Lustre's LNET traffic in (TCP 988)."""
        if self.facts is None:
            return None
        subnet = self.facts.subnet(subnet_id)
        if subnet is None:
            raise AwsError("InvalidNetworkSettings", f"The subnet ID '{subnet_id}' does not exist")
        groups = []
        for group_id in group_ids:
            group = self.facts.security_group(group_id)
            if group is None:
                raise AwsError("InvalidNetworkSettings", f"The security group ID '{group_id}' does not exist")
            if group.vpc != subnet.vpc:
                raise AwsError("InvalidNetworkSettings", f"The security group '{group_id}' is not in the VPC "
                                                         f"{subnet.vpc} of subnet {subnet_id}")
            groups.append(group)
        if not group_ids:
            default = self.facts.default_security_group(subnet.vpc)
            groups = [default] if default is not None else []
        if not any(group.allows(LUSTRE_PORT) for group in groups):
            raise AwsError("InvalidNetworkSettings", PORT_MESSAGE)
        return subnet.vpc

    def _describe(self, p: dict[str, Any]) -> dict[str, Any]:
        ids = p.get("FileSystemIds")
        if ids:
            missing = [i for i in ids if i not in self._systems]
            if missing:
                raise AwsError("FileSystemNotFound", f"File system '{missing[0]}' does not exist.")
            systems = [self._systems[i] for i in ids]
        else:
            systems = sorted(self._systems.values(), key=lambda fs: (fs["CreationTime"], fs["FileSystemId"]))
        start = int(p.get("NextToken") or 0)
        size = int(p.get("MaxResults") or 2147483647)
        result: dict[str, Any] = {"FileSystems": systems[start:start + size]}
        if start + size < len(systems):
            result["NextToken"] = str(start + size)
        return result

    def _delete(self, p: dict[str, Any]) -> dict[str, Any]:
        fs = self._systems.get(p["FileSystemId"])
        if fs is None:
            raise AwsError("FileSystemNotFound", f"File system '{p['FileSystemId']}' does not exist.")
        if fs["Lifecycle"] not in ("AVAILABLE", "DELETING", "FAILED", "MISCONFIGURED"):
            raise AwsError("BadRequest", f"Cannot delete file system {fs['FileSystemId']} while it is "
                                         f"{fs['Lifecycle']}.")
        if fs["Lifecycle"] != "DELETING":
            fs["Lifecycle"] = "DELETING"
            self._due[fs["FileSystemId"]] = self.clock.now() + DELETE_SECONDS
        lustre = p.get("LustreConfiguration") or {}
        response: dict[str, Any] = {}
        if not lustre.get("SkipFinalBackup", True) and fs["LustreConfiguration"]["DeploymentType"].startswith("PERS"):
            response["FinalBackupId"] = "backup-" + secrets.token_hex(9)[:17]
        return {"FileSystemId": fs["FileSystemId"], "Lifecycle": "DELETING", "LustreResponse": response}
