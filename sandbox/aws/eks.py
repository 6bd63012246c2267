"""EKS as the product sees it: clusters with real status sequences whose endpoint is a Kubernetes emulator
cluster, node groups, add-ons that install what they install, access entries and pod identity.

moto's EKS makes clusters ``ACTIVE`` at once with a fake endpoint, a non-PEM certificate and no
``accessConfig``, and has no add-ons, access entries or pod identity at all, so this
simulator owns the whole EKS cluster API. A cluster is ``CREATING`` for ~10 simulated minutes, then
``ACTIVE`` with ``endpoint = <kube_base_url>/k8s/clusters/<name>`` (a new emulator cluster), a PEM CA and an
OIDC issuer; ``DELETING`` takes ~5 minutes and removes the emulator cluster. An add-on that becomes
``ACTIVE`` installs its CRDs (``sandbox.kube.components``), namespace and controller Deployment in the
emulator; an ``addon_degraded`` fault makes it ``DEGRADED`` (or ``CREATE_FAILED`` while creating); an
``eks_create_failed`` fault ends a cluster's creation ``FAILED`` with an ``Ec2SubnetNotFound`` health issue. Errors
use EKS's codes and wording. The add-on catalog and installation live in ``eks_addons.py``; access
entries, access policies and pod identity associations in ``eks_access.py``; what EKS checks about the IAM
roles, subnets, security groups and principals a request names (read from moto through ``facts``) in
``eks_checks.py``.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .base import AwsError, Call, FaultRegistry, SimClock
from .eks_access import AccessOperations, not_found, page
from .eks_addons import (
    ADDONS,
    DEGRADED_MESSAGE,
    HEALTHY,
    INSUFFICIENT,
    VERSIONS,
    addon_versions,
    check_configuration,
    describe_addon_versions,
    describe_configuration,
    install,
    uninstall,
    workload_health,
)
from .eks_checks import check_cluster_network, check_cluster_role
from .eks_nodegroups import node_config, relabel_nodes

_log = logging.getLogger("sandbox.aws.eks")

if TYPE_CHECKING:
    from sandbox.kube import Emulator

    from .facts import MotoFacts

CLUSTER_CREATE_SECONDS = 600.0
CLUSTER_DELETE_SECONDS = 300.0
NODEGROUP_SECONDS = 180.0
ADDON_SECONDS = 60.0
UPDATE_SECONDS = 120.0
DEFAULT_VERSION = "1.33"
PLATFORM = "eks.9"
CREATE_FAILED_MESSAGE = "One or more subnets could not be found while the control plane was created."


class EksSimulator(AccessOperations):
    """The ``eks`` service of the sandbox (see the module docstring)."""

    service = "eks"
    operations = frozenset({
        "CreateCluster", "DescribeCluster", "ListClusters", "DescribeClusterVersions", "DeleteCluster",
        "UpdateClusterConfig", "DescribeUpdate",
        "CreateNodegroup", "DescribeNodegroup", "ListNodegroups", "DeleteNodegroup", "UpdateNodegroupConfig",
        "DescribeAddonVersions", "DescribeAddonConfiguration", "CreateAddon", "DescribeAddon", "ListAddons",
        "UpdateAddon", "DeleteAddon",
        "CreateAccessEntry", "DescribeAccessEntry", "ListAccessEntries", "UpdateAccessEntry", "DeleteAccessEntry",
        "AssociateAccessPolicy", "DisassociateAccessPolicy", "ListAssociatedAccessPolicies", "ListAccessPolicies",
        "CreatePodIdentityAssociation", "DescribePodIdentityAssociation", "ListPodIdentityAssociations",
        "DeletePodIdentityAssociation", "TagResource", "UntagResource", "ListTagsForResource",
    })

    def __init__(self, clock: SimClock, faults: FaultRegistry, kube: Emulator | None, *,
                 kube_base_url: str, region: str = "us-west-2", account: str = "123456789012",
                 facts: MotoFacts | None = None, ca_pem: bytes) -> None:
        self.clock = clock
        self.ca_pem = ca_pem  # the CA that signs the emulator's TLS certificate
        self.ca_data = base64.b64encode(ca_pem).decode()
        self.faults = faults
        self.kube = kube
        self.kube_base_url = kube_base_url.rstrip("/")
        self.region = region
        self.account = account
        self.facts = facts  # IAM and EC2 as EKS reads them (None: the simulator alone checks nothing there)
        # name -> {"cluster", "nodegroups", "addons", "access", "pods", "updates", "due": {key: time}}
        self._clusters: dict[str, dict[str, Any]] = {}

    # --- persistence and time --------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {"clusters": self._clusters}

    def load_state(self, state: dict[str, Any]) -> None:
        self._clusters = dict(state.get("clusters", {}))

    def version_of(self, name: str) -> str | None:
        """The Kubernetes version of the EKS cluster ``name`` (None: no such cluster)."""
        rec = self._clusters.get(name)
        return str(rec["cluster"]["version"]) if rec is not None else None

    def active_cluster(self, arn: str) -> str | None:
        """The emulator cluster behind an EKS cluster ARN, if that cluster exists and is ACTIVE
        (what HyperPod's CreateCluster checks about its orchestrator)."""
        for name, rec in list(self._clusters.items()):
            if rec["cluster"]["arn"] == arn and rec["cluster"]["status"] == "ACTIVE":
                return name
        return None

    def tick(self, now: float) -> None:
        for name, rec in list(self._clusters.items()):
            cluster = rec["cluster"]
            for key, due in sorted(rec["due"].items(), key=lambda kv: kv[1]):
                if due <= now:
                    del rec["due"][key]
                    self._finish(name, rec, key)
            if name in self._clusters and cluster["status"] == "ACTIVE":
                self._check_addon_faults(name, rec)

    def _finish(self, name: str, rec: dict[str, Any], key: str) -> None:
        kind, _, item = key.partition(":")
        cluster = rec["cluster"]
        if kind == "cluster" and cluster["status"] == "CREATING":
            if self.faults.take("eks_create_failed", cluster=name) is not None:
                cluster["status"] = "FAILED"
                cluster["health"] = {"issues": [{"code": "Ec2SubnetNotFound", "message": CREATE_FAILED_MESSAGE,
                                                 "resourceIds": list(cluster["resourcesVpcConfig"]["subnetIds"])}]}
                return
            self._activate(name, cluster)
        elif kind == "cluster" and cluster["status"] == "DELETING":
            del self._clusters[name]
            if self.kube is not None:
                self.kube.delete_cluster(name)
        elif kind == "update":
            rec["updates"][item]["status"] = "Successful"
            if cluster["status"] == "UPDATING":
                cluster["status"] = "ACTIVE"
        elif kind == "nodegroup":
            group = rec["nodegroups"].get(item)
            if group is not None and group["status"] in ("CREATING", "UPDATING"):
                group["status"] = "ACTIVE"
                before = rec.get("relabel", {}).pop(item, None)
                if before is not None and self.kube is not None and name in self.kube.clusters:
                    relabel_nodes(self.kube.cluster(name), group, before)
            elif group is not None and group["status"] == "DELETING":
                del rec["nodegroups"][item]
        elif kind == "addon":
            self._finish_addon(name, rec, item)

    def _activate(self, name: str, cluster: dict[str, Any]) -> None:
        cluster["status"] = "ACTIVE"
        cluster["endpoint"] = f"{self.kube_base_url}/k8s/clusters/{name}"
        if self.kube is not None:
            self.kube.ensure_cluster(name)
            if self.kube.data_dir is not None:
                self.kube.write_kubeconfig(name, self.kube_base_url, ca_pem=self.ca_pem or None)

    def _finish_addon(self, cluster_name: str, rec: dict[str, Any], addon_name: str) -> None:
        addon = rec["addons"].get(addon_name)
        if addon is None:
            return
        if addon["status"] == "DELETING":
            del rec["addons"][addon_name]
            if not addon.get("_preserve"):
                uninstall(self.kube, cluster_name, addon_name)
            return
        if self._degraded(cluster_name, addon_name):
            failed = "CREATE_FAILED" if addon["status"] == "CREATING" else "UPDATE_FAILED"
            self._set_issue(addon, failed, "InsufficientNumberOfReplicas", DEGRADED_MESSAGE)
            return
        missing = [dep for dep in ADDONS[addon_name].requires
                   if dep not in rec["addons"] or rec["addons"][dep]["status"] == "DELETING"]
        if missing and addon["status"] == "CREATING":
            self._set_issue(addon, "CREATE_FAILED", "ConfigurationConflict",
                            f"{addon_name} requires the add-on(s) {', '.join(missing)}; install them first.")
            return
        try:
            install(self.kube, cluster_name, addon_name, self.region, addon.get("configurationValues"))
        except Exception as exc:  # e.g. its namespace is Terminating: the add-on fails, the world ticks on
            _log.exception("sandbox EKS: installing add-on %s on %s failed", addon_name, cluster_name)
            self._set_issue(addon, "CREATE_FAILED" if addon["status"] == "CREATING" else "UPDATE_FAILED",
                            "ConfigurationConflict", f"Installing {addon_name} failed: {exc}")
            return
        addon["modifiedAt"] = self.clock.now()
        self._follow_workloads(cluster_name, addon_name, addon)

    def _follow_workloads(self, cluster_name: str, addon_name: str, addon: dict[str, Any]) -> None:
        """An installed add-on's status from its workloads (and the ``addon_degraded`` fault)."""
        health = workload_health(self.kube, cluster_name, addon_name)
        if self._degraded(cluster_name, addon_name) or health == INSUFFICIENT:
            if addon["status"] != "DEGRADED":
                self._set_issue(addon, "DEGRADED", "InsufficientNumberOfReplicas", DEGRADED_MESSAGE)
        elif health == HEALTHY and addon["status"] != "ACTIVE":
            addon["status"] = "ACTIVE"
            addon["health"] = {"issues": []}

    @staticmethod
    def _set_issue(addon: dict[str, Any], status: str, code: str, message: str) -> None:
        addon["status"] = status
        addon["health"] = {"issues": [{"code": code, "message": message, "resourceIds": []}]}

    def _degraded(self, cluster_name: str, addon_name: str) -> bool:
        return any(f.kind == "addon_degraded" and f.target.get("cluster", cluster_name) == cluster_name
                   and f.target.get("addon", addon_name) == addon_name for f in self.faults.list())

    def _check_addon_faults(self, cluster_name: str, rec: dict[str, Any]) -> None:
        for addon_name, addon in rec["addons"].items():
            installed = addon["status"] in ("ACTIVE", "DEGRADED") or (
                addon["status"] in ("CREATING", "UPDATING") and "addon:" + addon_name not in rec["due"])
            if installed:
                self._follow_workloads(cluster_name, addon_name, addon)

    # --- dispatch ---------------------------------------------------------------------------------------

    def handle(self, call: Call) -> dict[str, Any]:
        method: Callable[[dict[str, Any]], dict[str, Any]] = getattr(self, "_op_" + call.operation)
        return method(call.params)

    def _arn(self, kind: str, *parts: str) -> str:
        return f"arn:aws:eks:{self.region}:{self.account}:{kind}/" + "/".join(parts)

    def _rec(self, name: str) -> dict[str, Any]:
        rec = self._clusters.get(name)
        if rec is None:
            raise not_found(f"No cluster found for name: {name}.")
        return rec

    def _active(self, name: str) -> dict[str, Any]:
        rec = self._rec(name)
        status = rec["cluster"]["status"]
        if status not in ("ACTIVE", "UPDATING"):
            raise AwsError("InvalidRequestException", f"Cluster '{name}' is in {status} status; it must be ACTIVE.")
        return rec

    @staticmethod
    def _public(obj: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in obj.items() if not k.startswith("_")}

    # --- clusters ------------------------------------------------------------------------------------

    def _op_CreateCluster(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p["name"]
        if name in self._clusters:
            raise AwsError("ResourceInUseException", f"Cluster already exists with name: {name}", 409)
        version = p.get("version", DEFAULT_VERSION)
        if version not in VERSIONS:
            raise AwsError("InvalidParameterException", f"unsupported Kubernetes version {version}")
        vpc = p["resourcesVpcConfig"]
        subnets = list(vpc.get("subnetIds") or [])
        if len(subnets) < 2:
            raise AwsError("InvalidParameterException",
                           "Subnets specified must be in at least two different AZs")
        groups = list(vpc.get("securityGroupIds") or [])
        vpc_id = "vpc-" + secrets.token_hex(8)[:17]
        if self.facts is not None:
            check_cluster_role(self.facts, p["roleArn"])
            vpc_id = check_cluster_network(self.facts, subnets, groups)
        access = dict(p.get("accessConfig") or {})
        mode = access.get("authenticationMode", "CONFIG_MAP")
        now = self.clock.now()
        oidc_id = secrets.token_hex(16).upper()
        cluster: dict[str, Any] = {
            "name": name, "arn": self._arn("cluster", name), "createdAt": now, "version": version,
            "roleArn": p["roleArn"], "status": "CREATING", "platformVersion": PLATFORM, "id": str(uuid.uuid4()),
            "resourcesVpcConfig": {
                "subnetIds": subnets, "securityGroupIds": groups,
                "clusterSecurityGroupId": "sg-" + secrets.token_hex(9)[:17], "vpcId": vpc_id,
                "endpointPublicAccess": vpc.get("endpointPublicAccess", True),
                "endpointPrivateAccess": vpc.get("endpointPrivateAccess", False),
                "publicAccessCidrs": list(vpc.get("publicAccessCidrs") or ["0.0.0.0/0"])},
            "kubernetesNetworkConfig": {"serviceIpv4Cidr": "10.100.0.0/16", "ipFamily": "ipv4",
                                        "elasticLoadBalancing": {"enabled": False},
                                        **(p.get("kubernetesNetworkConfig") or {})},
            "logging": p.get("logging") or {"clusterLogging": [{"types": ["api", "audit", "authenticator",
                                                                          "controllerManager", "scheduler"],
                                                                "enabled": False}]},
            "identity": {"oidc": {"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/{oidc_id}"}},
            "certificateAuthority": {"data": self.ca_data},
            "tags": dict(p.get("tags") or {}), "health": {"issues": []},
            "accessConfig": {"authenticationMode": mode,
                             "bootstrapClusterCreatorAdminPermissions":
                                 access.get("bootstrapClusterCreatorAdminPermissions", True)},
            "upgradePolicy": p.get("upgradePolicy") or {"supportType": "EXTENDED"},
            "deletionProtection": bool(p.get("deletionProtection", False)),
        }
        for key in ("clientRequestToken", "encryptionConfig", "zonalShiftConfig", "computeConfig",
                    "storageConfig", "remoteNetworkConfig"):
            if p.get(key) is not None:
                cluster[key] = p[key]
        rec: dict[str, Any] = {"cluster": cluster, "nodegroups": {}, "addons": {}, "access": {}, "pods": {},
                               "updates": {}, "due": {"cluster": now + CLUSTER_CREATE_SECONDS}}
        self._clusters[name] = rec
        if mode != "CONFIG_MAP" and cluster["accessConfig"]["bootstrapClusterCreatorAdminPermissions"]:
            self._bootstrap_creator_admin(name, rec, now)
        return {"cluster": self._cluster_out(cluster)}

    @staticmethod
    def _cluster_out(cluster: dict[str, Any]) -> dict[str, Any]:
        out = dict(cluster)
        if cluster["status"] == "CREATING":  # no endpoint or CA until the control plane is up
            out.pop("endpoint", None)
            out["certificateAuthority"] = {}
        return out

    def _op_DescribeCluster(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"cluster": self._cluster_out(self._rec(p["name"])["cluster"])}

    def _op_DescribeClusterVersions(self, p: dict[str, Any]) -> dict[str, Any]:
        """The versions CreateCluster accepts, newest first; the default is the one CreateCluster uses."""
        wanted = set(p.get("clusterVersions") or [])
        rows = [{"clusterVersion": v, "clusterType": "eks", "defaultPlatformVersion": PLATFORM,
                 "defaultVersion": v == DEFAULT_VERSION,
                 "versionStatus": "STANDARD_SUPPORT" if v >= "1.31" else "EXTENDED_SUPPORT",
                 "status": "STANDARD_SUPPORT" if v >= "1.31" else "EXTENDED_SUPPORT"}
                for v in VERSIONS if (not wanted or v in wanted)]
        if str(p.get("defaultOnly", "")).lower() == "true":
            rows = [r for r in rows if r["defaultVersion"]]
        return page(rows, p, "clusterVersions")

    def _op_ListClusters(self, p: dict[str, Any]) -> dict[str, Any]:
        return page(sorted(self._clusters), p, "clusters")

    def _op_DeleteCluster(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._rec(p["name"])
        cluster = rec["cluster"]
        if rec["nodegroups"]:
            raise AwsError("ResourceInUseException", "Cluster has nodegroups attached", 409)
        if cluster.get("deletionProtection"):
            raise AwsError("InvalidRequestException", "Cluster has deletion protection enabled.")
        if cluster["status"] in ("CREATING", "UPDATING"):
            raise AwsError("ResourceInUseException",
                           f"Cannot delete because cluster {p['name']} currently has an update in progress", 409)
        if cluster["status"] != "DELETING":
            cluster["status"] = "DELETING"
            rec["due"] = {"cluster": self.clock.now() + CLUSTER_DELETE_SECONDS}
            for addon in rec["addons"].values():
                addon["status"] = "DELETING"
        return {"cluster": self._cluster_out(cluster)}

    def _op_UpdateClusterConfig(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._active(p["name"])
        cluster = rec["cluster"]
        if any(u["status"] == "InProgress" for u in rec["updates"].values()):
            raise AwsError("ResourceInUseException", "An update is already in progress on this cluster", 409)
        params: list[dict[str, str]] = []
        kind = "ConfigUpdate"
        access = p.get("accessConfig") or {}
        if "authenticationMode" in access:
            current = cluster["accessConfig"]["authenticationMode"]
            new = access["authenticationMode"]
            if (current == "API" and new != "API") or (current == "API_AND_CONFIG_MAP" and new == "CONFIG_MAP"):
                raise AwsError("InvalidParameterException",
                               f"Unsupported authentication mode update from {current} to {new}")
            cluster["accessConfig"]["authenticationMode"] = new
            params.append({"type": "AuthenticationMode", "value": new})
            kind = "AccessConfigUpdate"
        for key in ("resourcesVpcConfig", "logging", "upgradePolicy", "zonalShiftConfig"):
            if p.get(key):
                target = cluster.setdefault(key, {})
                target.update(p[key])
                params.append({"type": key, "value": json.dumps(p[key])})
        if "deletionProtection" in p:
            cluster["deletionProtection"] = bool(p["deletionProtection"])
            params.append({"type": "DeletionProtection", "value": str(p["deletionProtection"]).lower()})
        if not params:
            raise AwsError("InvalidParameterException", "No changes needed")
        update: dict[str, Any] = {"id": str(uuid.uuid4()), "status": "InProgress", "type": kind,
                                  "params": params, "createdAt": self.clock.now(), "errors": []}
        rec["updates"][update["id"]] = update
        rec["due"]["update:" + update["id"]] = self.clock.now() + UPDATE_SECONDS
        cluster["status"] = "UPDATING"
        return {"update": update}

    def _op_DescribeUpdate(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._rec(p["name"])
        update = rec["updates"].get(p["updateId"])
        if update is None:
            raise not_found(f"No update found for ID: {p['updateId']}")
        return {"update": update}

    # --- node groups ---------------------------------------------------------------------------------------

    def _op_CreateNodegroup(self, p: dict[str, Any]) -> dict[str, Any]:
        name, group_name = p["clusterName"], p["nodegroupName"]
        rec = self._active(name)
        if group_name in rec["nodegroups"]:
            raise AwsError("ResourceInUseException", f"NodeGroup already exists with name {group_name} and cluster "
                                                     f"name {name}", 409)
        now = self.clock.now()
        group = {
            "nodegroupName": group_name, "clusterName": name, "version": rec["cluster"]["version"],
            "nodegroupArn": self._arn("nodegroup", name, group_name, str(uuid.uuid4())),
            "releaseVersion": f"{rec['cluster']['version']}.0-20260101", "createdAt": now, "modifiedAt": now,
            "status": "CREATING", "capacityType": p.get("capacityType", "ON_DEMAND"),
            "scalingConfig": p.get("scalingConfig") or {"minSize": 1, "maxSize": 2, "desiredSize": 2},
            "instanceTypes": p.get("instanceTypes") or ["t3.medium"], "subnets": p["subnets"],
            "amiType": p.get("amiType", "AL2023_x86_64_STANDARD"), "nodeRole": p["nodeRole"],
            "labels": p.get("labels") or {}, "taints": p.get("taints") or [], "diskSize": p.get("diskSize", 20),
            "health": {"issues": []}, "tags": p.get("tags") or {},
            "resources": {"autoScalingGroups": [{"name": f"eks-{group_name}-{uuid.uuid4()}"}]},
            "updateConfig": p.get("updateConfig") or {"maxUnavailable": 1},
        }
        rec["nodegroups"][group_name] = group
        rec["due"]["nodegroup:" + group_name] = now + NODEGROUP_SECONDS
        return {"nodegroup": group}

    def _nodegroup(self, p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rec = self._rec(p["clusterName"])
        group = rec["nodegroups"].get(p["nodegroupName"])
        if group is None:
            raise not_found(f"No node group found for name: {p['nodegroupName']}.")
        return rec, group

    def _op_DescribeNodegroup(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"nodegroup": self._nodegroup(p)[1]}

    def _op_ListNodegroups(self, p: dict[str, Any]) -> dict[str, Any]:
        return page(sorted(self._rec(p["clusterName"])["nodegroups"]), p, "nodegroups")

    def _op_DeleteNodegroup(self, p: dict[str, Any]) -> dict[str, Any]:
        rec, group = self._nodegroup(p)
        if group["status"] == "CREATING":
            raise AwsError("ResourceInUseException", f"Nodegroup {group['nodegroupName']} is currently CREATING", 409)
        group["status"] = "DELETING"
        rec["due"]["nodegroup:" + group["nodegroupName"]] = self.clock.now() + NODEGROUP_SECONDS
        return {"nodegroup": group}

    def _op_UpdateNodegroupConfig(self, p: dict[str, Any]) -> dict[str, Any]:
        """Scaling (the sizes must stay min <= desired <= max, as EKS checks) and Kubernetes labels and taints
        (:mod:`.eks_nodegroups`: the group's, then its Nodes' once the update ends)."""
        rec, group = self._nodegroup(p)
        if group["status"] != "ACTIVE":
            raise AwsError("ResourceInUseException", f"Nodegroup {group['nodegroupName']} is currently "
                                                     f"{group['status']}", 409)
        scaling = {**group["scalingConfig"], **(p.get("scalingConfig") or {})}
        if not scaling["minSize"] <= scaling["desiredSize"] <= scaling["maxSize"] or scaling["maxSize"] < 1:
            raise AwsError("InvalidParameterException", "Nodegroup scaling config requires minSize <= desiredSize "
                                                        "<= maxSize and maxSize >= 1", 400)
        before = {"labels": dict(group.get("labels") or {}), "taints": list(group.get("taints") or [])}
        params = [{"type": "DesiredSize", "value": str(scaling["desiredSize"])}] if p.get("scalingConfig") else []
        params += node_config(group, p)
        if not params:
            raise AwsError("InvalidParameterException", "No changes needed", 400)
        if p.get("labels") or p.get("taints"):
            rec.setdefault("relabel", {}).setdefault(group["nodegroupName"], before)
        now = self.clock.now()
        group.update(scalingConfig=scaling, status="UPDATING", modifiedAt=now)
        rec["due"]["nodegroup:" + group["nodegroupName"]] = now + NODEGROUP_SECONDS
        return {"update": {"id": str(uuid.uuid4()), "status": "InProgress", "type": "ConfigUpdate", "createdAt": now,
                           "params": params, "errors": []}}

    # --- add-ons ------------------------------------------------------------------------------------------

    def _op_DescribeAddonVersions(self, p: dict[str, Any]) -> dict[str, Any]:
        return page(describe_addon_versions(p), p, "addons")

    def _op_DescribeAddonConfiguration(self, p: dict[str, Any]) -> dict[str, Any]:
        return describe_configuration(p)

    def _op_CreateAddon(self, p: dict[str, Any]) -> dict[str, Any]:
        name, addon_name = p["clusterName"], p["addonName"]
        rec = self._active(name)
        spec = ADDONS.get(addon_name)
        if spec is None:
            raise not_found(f"Addon {addon_name} specified is not supported")
        if addon_name in rec["addons"]:
            raise AwsError("ResourceInUseException", f"Addon already exists: {addon_name}", 409)
        versions = addon_versions(addon_name, rec["cluster"]["version"])
        version = p.get("addonVersion") or versions[0]
        if version not in versions:
            raise AwsError("InvalidParameterException", f"Addon version specified is not supported for cluster "
                                                        f"version {rec['cluster']['version']}")
        check_configuration(addon_name, p.get("configurationValues"))
        now = self.clock.now()
        addon: dict[str, Any] = {
            "addonName": addon_name, "clusterName": name, "status": "CREATING", "addonVersion": version,
            "health": {"issues": []}, "addonArn": self._arn("addon", name, addon_name, str(uuid.uuid4())),
            "createdAt": now, "modifiedAt": now, "tags": p.get("tags") or {}, "owner": spec.owner,
            "publisher": spec.publisher, "namespaceConfig": {"namespace": (p.get("namespaceConfig") or {}).get(
                "namespace", spec.namespace)},
        }
        for key in ("serviceAccountRoleArn", "configurationValues"):
            if p.get(key):
                addon[key] = p[key]
        for assoc in p.get("podIdentityAssociations") or []:
            created = self._new_pod_identity(name, rec, {"namespace": spec.namespace, **assoc},
                                             owner=addon["addonArn"])
            addon.setdefault("podIdentityAssociations", []).append(created["associationArn"])
        rec["addons"][addon_name] = addon
        rec["due"]["addon:" + addon_name] = now + ADDON_SECONDS
        return {"addon": self._public(addon)}

    def _addon(self, p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rec = self._rec(p["clusterName"])
        addon = rec["addons"].get(p["addonName"])
        if addon is None:
            raise not_found(f"No addon: {p['addonName']} found in cluster: {p['clusterName']}")
        return rec, addon

    def _op_DescribeAddon(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"addon": self._public(self._addon(p)[1])}

    def _op_ListAddons(self, p: dict[str, Any]) -> dict[str, Any]:
        return page(sorted(self._rec(p["clusterName"])["addons"]), p, "addons")

    def _op_UpdateAddon(self, p: dict[str, Any]) -> dict[str, Any]:
        rec, addon = self._addon(p)
        if addon["status"] in ("CREATING", "DELETING", "UPDATING"):
            raise AwsError("ResourceInUseException", f"Addon {addon['addonName']} is currently {addon['status']}", 409)
        params: list[dict[str, str]] = []
        if p.get("addonVersion"):
            if p["addonVersion"] not in addon_versions(addon["addonName"], rec["cluster"]["version"]):
                raise AwsError("InvalidParameterException", "Addon version specified is not supported")
            addon["addonVersion"] = p["addonVersion"]
            params.append({"type": "AddonVersion", "value": p["addonVersion"]})
        if "configurationValues" in p:
            check_configuration(addon["addonName"], p["configurationValues"])
            addon["configurationValues"] = p["configurationValues"]
            params.append({"type": "ConfigurationValues", "value": p["configurationValues"]})
        if p.get("serviceAccountRoleArn"):
            addon["serviceAccountRoleArn"] = p["serviceAccountRoleArn"]
            params.append({"type": "ServiceAccountRoleArn", "value": p["serviceAccountRoleArn"]})
        if p.get("resolveConflicts"):
            params.append({"type": "ResolveConflicts", "value": p["resolveConflicts"]})
        now = self.clock.now()
        addon["status"] = "UPDATING"
        addon["modifiedAt"] = now
        rec["due"]["addon:" + addon["addonName"]] = now + ADDON_SECONDS
        update: dict[str, Any] = {"id": str(uuid.uuid4()), "status": "InProgress", "type": "AddonUpdate",
                                  "params": params, "createdAt": now, "errors": []}
        rec["updates"][update["id"]] = update
        rec["due"]["update:" + update["id"]] = now + ADDON_SECONDS
        return {"update": update}

    def _op_DeleteAddon(self, p: dict[str, Any]) -> dict[str, Any]:
        rec, addon = self._addon(p)
        addon["status"] = "DELETING"
        addon["_preserve"] = bool(p.get("preserve", False))
        rec["due"]["addon:" + addon["addonName"]] = self.clock.now() + ADDON_SECONDS / 2
        for arn in addon.get("podIdentityAssociations", []):
            rec["pods"].pop(arn.rsplit("/", 1)[-1], None)
        return {"addon": self._public(addon)}

    # --- tags -----------------------------------------------------------------------------------------------

    def _tagged(self, arn: str) -> dict[str, Any]:
        for rec in self._clusters.values():
            candidates: list[dict[str, Any]] = [rec["cluster"], *rec["nodegroups"].values(), *rec["addons"].values(),
                          *rec["access"].values(), *rec["pods"].values()]
            for obj in candidates:
                if arn in (obj.get("arn"), obj.get("nodegroupArn"), obj.get("addonArn"), obj.get("accessEntryArn"),
                           obj.get("associationArn")):
                    return obj
        raise not_found(f"Resource {quote(arn, safe=':/')} not found")

    def _op_TagResource(self, p: dict[str, Any]) -> dict[str, Any]:
        self._tagged(p["resourceArn"]).setdefault("tags", {}).update(p["tags"])
        return {}

    def _op_UntagResource(self, p: dict[str, Any]) -> dict[str, Any]:
        tags = self._tagged(p["resourceArn"]).setdefault("tags", {})
        for key in p["tagKeys"]:
            tags.pop(key, None)
        return {}

    def _op_ListTagsForResource(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"tags": self._tagged(p["resourceArn"]).get("tags", {})}
