"""``instantstart sandbox seed``: a ready EKS + HyperPod cluster, made the way a user's own would be.

Everything goes through the running sandbox's AWS endpoint with boto3, as the AWS console or a user's
Terraform would: a VPC with two public subnets (EKS wants two Availability Zones) and a private /20 for
HyperPod's nodes, a security group that admits itself (EFA needs that), the EKS cluster role and the
HyperPod execution role with their trust principals and AWS managed policies, a ``sagemaker-`` lifecycle
script bucket (the instance-role policy reads only ``sagemaker-*`` buckets), an EKS cluster with API
authentication, the device plugin DaemonSets a HyperPod cluster needs before its nodes come (through the
Kubernetes API, as ``kubectl apply`` would; the sandbox's nodes advertise GPUs and EFA only where those
run), and a HyperPod cluster with automatic node recovery. Nothing is tagged as InstantStart's: to the
product it is a pre-existing cluster, to import, not to own.

Re-running with the same name finds what exists and makes only what is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import ClientError
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sandbox.kube.devices import plugin_daemonsets

LIFECYCLE_SCRIPT = """#!/bin/bash
# on_create.sh: run by HyperPod on each new node (the sandbox records it; real nodes execute it)
set -euo pipefail
echo "node $(hostname) ready"
"""


@dataclass(frozen=True)
class SeedRequest:
    name: str = "hp-eks"
    nodes: int = 2
    instance_type: str = "ml.g5.8xlarge"
    timeout: float = 600.0


@dataclass(frozen=True)
class Seeded:
    eks_arn: str
    hyperpod_arn: str
    vpc_id: str
    nodes: list[str]
    created: list[str]


class SeedFailed(Exception):
    """A step could not be done; the message says which and why."""


def iam_principal(caller_arn: str) -> str:
    """The IAM principal an EKS access entry names for an STS caller ARN (sessions map to their role)."""
    parts = caller_arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts":
        kind, _, rest = parts[5].partition("/")
        name = rest.split("/", 1)[0] if kind == "assumed-role" else rest
        return f"arn:{parts[1]}:iam::{parts[4]}:{'role' if kind == 'assumed-role' else kind}/{name}"
    return caller_arn


def _trust(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


class Seeder:
    """``kube``: the cluster's Kubernetes ``ApiClient`` by name (the device plugins are installed through it);
    None leaves them out."""

    def __init__(self, session: boto3.Session, endpoint_url: str, say: Callable[[str], None],
                 kube: Callable[[str], Any] | None = None) -> None:
        self.session = session
        self.endpoint_url = endpoint_url
        self.say = say
        self.kube = kube
        self.created: list[str] = []

    def run(self, req: SeedRequest) -> Seeded:
        ec2, iam, s3 = self._client("ec2"), self._client("iam"), self._client("s3")
        eks, sagemaker = self._client("eks"), self._client("sagemaker")
        account = self._client("sts").get_caller_identity()["Account"]
        vpc_id, public, private, sg = self._network(ec2, req.name)
        cluster_role = self._role(iam, f"{req.name}-eks-cluster-role", "eks.amazonaws.com", "AmazonEKSClusterPolicy")
        exec_role = self._role(iam, f"{req.name}-hyperpod-exec-role", "sagemaker.amazonaws.com",
                               "AmazonSageMakerClusterInstanceRolePolicy")
        bucket = self._bucket(s3, f"sagemaker-{req.name}-lifecycle-{account}")
        eks_arn = self._eks(eks, req, cluster_role, public, sg)
        self._creator_access(eks, req.name, self._client("sts").get_caller_identity()["Arn"])
        apps = self._device_plugins(req.name) if self.kube is not None else None
        hp_arn = self._hyperpod(sagemaker, req, eks_arn, exec_role, bucket, private, sg)
        nodes = self._nodes(sagemaker, req)
        if apps is not None:
            self._plugins_ready(apps, req, len(nodes))
        return Seeded(eks_arn, hp_arn, vpc_id, nodes, list(self.created))

    # ----- steps -----------------------------------------------------------------------------------

    def _network(self, ec2: Any, name: str) -> tuple[str, list[str], str, str]:
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [f"{name}-vpc"]}])["Vpcs"]
        if vpcs:
            vpc_id = vpcs[0]["VpcId"]
        else:
            vpc_id = ec2.create_vpc(CidrBlock="10.192.0.0/16", TagSpecifications=[
                {"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": f"{name}-vpc"}]}])["Vpc"]["VpcId"]
            self._made(f"VPC {vpc_id} (10.192.0.0/16)")
        zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
        if len(zones) < 2:
            raise SeedFailed("the region has fewer than two Availability Zones; EKS needs two")
        existing = {s["CidrBlock"]: s["SubnetId"]
                    for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["Subnets"]}
        wanted = [("10.192.0.0/20", zones[0], "public-a"), ("10.192.16.0/20", zones[1], "public-b"),
                  ("10.192.128.0/20", zones[0], "private-a")]
        ids: list[str] = []
        for cidr, zone, label in wanted:
            if cidr not in existing:
                existing[cidr] = ec2.create_subnet(VpcId=vpc_id, CidrBlock=cidr, AvailabilityZone=zone,
                                                   TagSpecifications=[{"ResourceType": "subnet", "Tags": [
                                                       {"Key": "Name", "Value": f"{name}-{label}"}]}],
                                                   )["Subnet"]["SubnetId"]
                self._made(f"subnet {existing[cidr]} ({cidr}, {zone})")
            ids.append(existing[cidr])
        groups = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                                       {"Name": "group-name", "Values": [f"{name}-nodes"]}])
        if groups["SecurityGroups"]:
            sg = groups["SecurityGroups"][0]["GroupId"]
        else:
            sg = ec2.create_security_group(GroupName=f"{name}-nodes", VpcId=vpc_id,
                                           Description="HyperPod nodes: all traffic within the group (EFA)")["GroupId"]
            rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}]
            ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=rule)
            ec2.authorize_security_group_egress(GroupId=sg, IpPermissions=rule)
            self._made(f"security group {sg}")
        return vpc_id, ids[:2], ids[2], sg

    def _role(self, iam: Any, name: str, service: str, policy: str) -> str:
        try:
            return str(iam.get_role(RoleName=name)["Role"]["Arn"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchEntity":
                raise
        arn = str(iam.create_role(RoleName=name, AssumeRolePolicyDocument=_trust(service))["Role"]["Arn"])
        iam.attach_role_policy(RoleName=name, PolicyArn=f"arn:aws:iam::aws:policy/{policy}")
        self._made(f"IAM role {name} (trusts {service}; {policy})")
        return arn

    def _bucket(self, s3: Any, name: str) -> str:
        try:
            s3.head_bucket(Bucket=name)
        except ClientError:
            region = s3.meta.region_name
            extra = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            s3.create_bucket(Bucket=name, **extra)
            s3.put_object(Bucket=name, Key="lifecycle/on_create.sh", Body=LIFECYCLE_SCRIPT.encode())
            self._made(f"S3 bucket {name} with lifecycle/on_create.sh")
        return name

    def _eks(self, eks: Any, req: SeedRequest, role: str, subnets: list[str], sg: str) -> str:
        try:
            cluster = eks.describe_cluster(name=req.name)["cluster"]
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ResourceNotFoundException":
                raise
            cluster = eks.create_cluster(
                name=req.name, roleArn=role,
                resourcesVpcConfig={"subnetIds": subnets, "securityGroupIds": [sg]},
                accessConfig={"authenticationMode": "API_AND_CONFIG_MAP",
                              "bootstrapClusterCreatorAdminPermissions": True})["cluster"]
            self._made(f"EKS cluster {req.name} (Kubernetes {cluster['version']})")
        self._wait(req, f"EKS cluster {req.name}", lambda: eks.describe_cluster(name=req.name)["cluster"]["status"],
                   "ACTIVE", {"FAILED", "DELETING"})
        return str(cluster["arn"])

    def _creator_access(self, eks: Any, name: str, caller_arn: str) -> None:
        """The access entry EKS gives the cluster's creator (bootstrapClusterCreatorAdminPermissions): made for
        the caller's IAM principal when missing (an assumed-role session is named by its role)."""
        principal = iam_principal(caller_arn)
        if principal in eks.list_access_entries(clusterName=name).get("accessEntries", []):
            return
        eks.create_access_entry(clusterName=name, principalArn=principal)
        eks.associate_access_policy(clusterName=name, principalArn=principal, accessScope={"type": "cluster"},
                                    policyArn="arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy")
        self._made(f"EKS access entry for {principal} (cluster admin, as for the cluster's creator)")

    def _hyperpod(self, sagemaker: Any, req: SeedRequest, eks_arn: str, role: str, bucket: str, subnet: str,
                  sg: str) -> str:
        try:
            arn = sagemaker.describe_cluster(ClusterName=req.name)["ClusterArn"]
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("ResourceNotFound", "ValidationException"):
                raise
            arn = sagemaker.create_cluster(
                ClusterName=req.name, Orchestrator={"Eks": {"ClusterArn": eks_arn}}, NodeRecovery="Automatic",
                VpcConfig={"SecurityGroupIds": [sg], "Subnets": [subnet]},
                InstanceGroups=[{
                    "InstanceGroupName": "workers", "InstanceType": req.instance_type,
                    "InstanceCount": req.nodes, "ExecutionRole": role, "ThreadsPerCore": 1,
                    "LifeCycleConfig": {"SourceS3Uri": f"s3://{bucket}/lifecycle/", "OnCreate": "on_create.sh"},
                }])["ClusterArn"]
            self._made(f"HyperPod cluster {req.name} ({req.nodes} x {req.instance_type}, node recovery Automatic)")
        self._wait(req, f"HyperPod cluster {req.name}",
                   lambda: sagemaker.describe_cluster(ClusterName=req.name)["ClusterStatus"],
                   "InService", {"Failed", "Deleting", "RollingBack"})
        return str(arn)

    def _device_plugins(self, name: str) -> Any:
        assert self.kube is not None
        apps = k8s.AppsV1Api(self.kube(name))
        for daemonset in plugin_daemonsets():
            meta = daemonset["metadata"]
            try:
                apps.read_namespaced_daemon_set(meta["name"], meta["namespace"])
            except ApiException as exc:
                if exc.status != 404:
                    raise
                apps.create_namespaced_daemon_set(meta["namespace"], daemonset)  # type: ignore[arg-type]
                self._made(f"DaemonSet {meta['namespace']}/{meta['name']}")
        return apps

    def _plugins_ready(self, apps: Any, req: SeedRequest, nodes: int) -> None:
        names = [d["metadata"]["name"] for d in plugin_daemonsets()]

        def ready() -> str:
            counts = [apps.read_namespaced_daemon_set_status(n, "kube-system").status for n in names]
            done = all((c.number_ready or 0) >= nodes for c in counts)
            return "ready" if done else f"{min(c.number_ready or 0 for c in counts)}/{nodes} nodes"

        self._wait(req, "device plugins", ready, "ready", set())

    def _nodes(self, sagemaker: Any, req: SeedRequest) -> list[str]:
        def statuses() -> list[tuple[str, str]]:
            pages = sagemaker.get_paginator("list_cluster_nodes").paginate(ClusterName=req.name)
            return [(n["InstanceId"], n["InstanceStatus"]["Status"]) for page in pages
                    for n in page["ClusterNodeSummaries"]]

        self._wait(req, "HyperPod nodes", lambda: "Running" if all(s == "Running" for _, s in statuses())
                   else "starting", "Running", set())
        return [node for node, _ in statuses()]

    # ----- helpers ---------------------------------------------------------------------------------

    def _client(self, service: str) -> Any:
        return self.session.client(service, endpoint_url=self.endpoint_url)  # type: ignore[call-overload]

    def _made(self, what: str) -> None:
        self.created.append(what)
        self.say(f"created {what}")

    def _wait(self, req: SeedRequest, what: str, status: Callable[[], str], done: str, failed: set[str]) -> None:
        deadline = time.monotonic() + req.timeout
        last = ""
        while True:
            now = status()
            if now != last:
                self.say(f"{what}: {now}")
                last = now
            if now == done:
                return
            if now in failed:
                raise SeedFailed(f"{what} is {now}")
            if time.monotonic() > deadline:
                raise SeedFailed(f"{what} is still {now} after {req.timeout:.0f} s")
            time.sleep(0.5)  # polling a remote status, as a user's script would
