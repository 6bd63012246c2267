"""A sandbox world for the tiered-checkpointing and managed-Karpenter features: an EKS cluster with its IAM OIDC
provider (as the eks stage makes it), a continuous-provisioning HyperPod cluster on it with the groups a test
asks for, the shared bucket, and the :class:`~services.components.base.Target` the features reconcile on; plus
a driver that runs a component the way the features capability does (observe → apply until settled; leftover
→ delete until gone), with no sleeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.clusters.create_base import cluster_tags
from services.components.base import Component, Observation, Target
from tests.create_support import SandboxProduct, sandbox_product
from tests.ledger import CallLedger
from tests.support import wait_until

ACCOUNT = "123456789012"
BUCKET = "instantstart-shared-123456789012-us-west-2"


def trust(*services: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": list(services)}, "Action": "sts:AssumeRole"}]})


@dataclass
class ScaleWorld:
    product: SandboxProduct
    name: str
    ledger: CallLedger
    role: str  # the instance groups' execution role
    subnet: str
    security_group: str

    def target(self) -> Target:
        s = self.product.services
        return Target(self.name, self.name, "us-west-2", ACCOUNT, cluster_tags(self.name), s.aws.for_stages(),
                      kube=s.kube.api_client(self.name), bucket=BUCKET, hyperpod_cluster=self.name)

    def group(self, name: str, count: int = 0, instance_type: str = "ml.g5.8xlarge",
              **extra: Any) -> dict[str, Any]:
        return {"InstanceGroupName": name, "InstanceType": instance_type, "InstanceCount": count,
                "ExecutionRole": self.role, "ThreadsPerCore": 1,
                "LifeCycleConfig": {"SourceS3Uri": f"s3://{BUCKET}/lifecycle/", "OnCreate": "on_create.sh"}, **extra}

    def describe(self) -> dict[str, Any]:
        return dict(self.product.client("sagemaker").describe_cluster(ClusterName=self.name))


@contextmanager
def scale_world(folder: Path, name: str, groups: list[tuple[str, int, dict[str, Any]]] | None = None, *,
                speed: float = 3000.0, node_recovery: str = "Automatic",
                continuous: bool = True) -> Iterator[ScaleWorld]:
    """The world, with a HyperPod cluster ``name`` InService; ``groups``: (name, InstanceCount, other spec
    fields) each, one empty ``workers`` group by default."""
    with sandbox_product(folder, speed=speed) as product:
        ec2, iam, s3, eks, sm = (product.client(s) for s in ("ec2", "iam", "s3", "eks", "sagemaker"))
        vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
        subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{16 * i}.0/20", AvailabilityZone=f"us-west-2{z}")
                   ["Subnet"]["SubnetId"] for i, z in enumerate("ab")]
        sg = ec2.create_security_group(GroupName="nodes", VpcId=vpc, Description="nodes")["GroupId"]
        eks_role = iam.create_role(RoleName="scale-eks", AssumeRolePolicyDocument=trust("eks.amazonaws.com"))
        exec_role = iam.create_role(RoleName="scale-exec", AssumeRolePolicyDocument=trust("sagemaker.amazonaws.com"))
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        s3.put_object(Bucket=BUCKET, Key="lifecycle/on_create.sh", Body=b"#!/bin/bash\n")
        eks.create_cluster(name=name, version="1.32", roleArn=eks_role["Role"]["Arn"],
                           resourcesVpcConfig={"subnetIds": subnets, "securityGroupIds": [sg]},
                           accessConfig={"authenticationMode": "API"}, tags=cluster_tags(name))
        cluster = wait_until(lambda: (c := eks.describe_cluster(name=name)["cluster"])["status"] == "ACTIVE" and c,
                             60, "EKS ACTIVE")
        iam.create_open_id_connect_provider(Url=cluster["identity"]["oidc"]["issuer"],
                                            ClientIDList=["sts.amazonaws.com"], Tags=[])
        product.services.kube.register_eks(name)
        world = ScaleWorld(product, name, CallLedger(product.live), exec_role["Role"]["Arn"], subnets[0], sg)
        specs = [world.group(g, count, **extra) for g, count, extra in (groups or [("workers", 0, {})])]
        sm.create_cluster(ClusterName=name, Orchestrator={"Eks": {"ClusterArn": cluster["arn"]}},
                          NodeRecovery=node_recovery, InstanceGroups=specs,
                          VpcConfig={"SecurityGroupIds": [sg], "Subnets": [subnets[0]]},
                          **({"NodeProvisioningMode": "Continuous"} if continuous else {}))
        wait_until(lambda: world.describe()["ClusterStatus"] == "InService", 120, "HyperPod InService")
        yield world


def settle(component: Component, target: Target, timeout: float = 120) -> Observation:
    """Observe → apply until the component is settled; its last observation."""
    def step() -> Observation | None:
        observed = component.observe(target)
        assert observed.failed is None, observed.failed
        if observed.settled:
            return observed
        if component.diff(observed):
            component.apply(target, observed)  # what is blocked (``blocked``) waits for a later round
        return None
    return wait_until(step, timeout, f"{component.name} settled")


def remove(component: Component, target: Target, timeout: float = 120) -> None:
    """Leftover → delete until nothing of the component is left."""
    def step() -> bool:
        left = component.leftover(target)
        if left.gone:
            return True
        if left.to_delete:
            component.delete(target, left)
        return False
    wait_until(step, timeout, f"{component.name} gone")
