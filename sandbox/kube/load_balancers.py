"""The AWS Load Balancer Controller's Service reconciler: a ``type: LoadBalancer`` Service becomes an ELBv2
network load balancer in the sandbox's AWS world, made through boto3 at its endpoint as the real controller
makes it through the AWS API.

It acts only where the controller runs: the Deployment ``kube-system/aws-load-balancer-controller`` has an
available replica (its ``--cluster-name`` argument names the EKS cluster whose subnets the load balancer goes
in), and the cluster's ``cloud`` is set (the sandbox's AWS world sets it on every cluster when it starts).
Elsewhere a LoadBalancer Service stays pending with no ingress. The controller's work for a Service:

* the finalizer ``service.k8s.aws/resources`` first, so deleting the Service deletes its AWS resources first;
* a frontend security group admitting each port from ``spec.loadBalancerSourceRanges`` (or the annotation
  ``service.beta.kubernetes.io/load-balancer-source-ranges``; default: anywhere when internet-facing, the
  VPC's CIDR block when internal);
* the load balancer, ``Type=network``, named ``k8s-<namespace>-<name>-<hash>`` as the controller names it,
  scheme ``internal`` unless the annotation ``service.beta.kubernetes.io/aws-load-balancer-scheme`` says
  ``internet-facing`` (a changed scheme replaces it), in the EKS cluster's subnets;
* a target group and a TCP (UDP) listener per Service port;
* every one tagged ``elbv2.k8s.aws/cluster=<EKS cluster>``, ``service.k8s.aws/stack=<namespace>/<name>`` and
  ``service.k8s.aws/resource`` (``LoadBalancer``, ``<namespace>/<name>:<port>``, ``ManagedLBSecurityGroup``);
* ``status.loadBalancer.ingress[0].hostname`` = the load balancer's DNS name.

A failed AWS call is a ``Warning`` event ``FailedDeployModel`` (or ``FailedCleanupModel``) on the Service, retried
on the Service's next change; an IPv6 source range on a load balancer that is not dual-stack is a
``FailedBuildModel`` ("unsupported v6 cidr … when lb is not dualstack", as the controller answers) and nothing is
made (dual-stack load balancers themselves are not modelled). Not modelled: the shared backend security group
and target registration (TargetGroupBindings), the load balancer's attributes and the other
``aws-load-balancer-*`` annotations, the
controller's mutating webhook (a Service with no ``loadBalancerClass`` is treated as the webhook would have
classed it ``service.k8s.aws/nlb``).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from typing import Any

from . import operator_support
from .cluster import Cluster, WriteOptions, clone
from .errors import ApiError
from .store import Key, Loc, Obj, WatchEvent

KEY: Key = ("", "services")
DEPLOY_KEY: Key = ("apps", "deployments")
CONTROLLER: Loc = ("kube-system", "aws-load-balancer-controller")
COMPONENT = "service"  # the source the controller's events name
MANAGER = WriteOptions(manager="aws-load-balancer-controller")
FINALIZER = "service.k8s.aws/resources"
NLB_CLASS = "service.k8s.aws/nlb"
SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
SOURCE_RANGES = "service.beta.kubernetes.io/load-balancer-source-ranges"
IP_ADDRESS_TYPE = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type"
CLUSTER_TAG = "elbv2.k8s.aws/cluster"
STACK_TAG = "service.k8s.aws/stack"
RESOURCE_TAG = "service.k8s.aws/resource"
# stand-in pod-identity credentials of the controller's pod (the sandbox's front does not check who signs)
_KEY_ID, _SECRET = "ASIALBCPODIDENTITY01", "sandbox-load-balancer-controller"
_CLIENTS: dict[tuple[str, str, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


def woken_by(cluster: Cluster, event: WatchEvent) -> set[tuple[Key, Loc]]:
    """The Services to reconcile again when the controller's Deployment changes (it came up or went away)."""
    meta = event.obj["metadata"]
    if event.key != DEPLOY_KEY or (meta.get("namespace", ""), meta["name"]) != CONTROLLER:
        return set()
    return {(KEY, loc) for loc, svc in cluster.store.items(KEY) if _handled(svc)}


def reconcile(cluster: Cluster, loc: Loc) -> None:
    svc = cluster.store.get(KEY, loc)
    if svc is None or not _handled(svc):
        return
    eks_cluster = _running_controller(cluster)
    if eks_cluster is None or cluster.cloud is None:
        return  # no controller: pending, and a finalizer it left holds the Service until it is back
    endpoint, region = cluster.cloud
    aws = _Aws(endpoint, region, eks_cluster, f"{loc[0]}/{loc[1]}")
    meta = svc["metadata"]
    if meta.get("deletionTimestamp") or (svc.get("spec") or {}).get("type") != "LoadBalancer":
        if FINALIZER in (meta.get("finalizers") or ()):
            try:
                aws.delete_all()
            except Exception as exc:  # an AWS refusal or the endpoint gone: retried on the next change
                operator_support.event(cluster, svc, "FailedCleanupModel", f"failed cleanup model: {exc}",
                                       COMPONENT, "Warning")
                return
            _set_finalizers(cluster, svc, [f for f in meta.get("finalizers") or () if f != FINALIZER])
            _write_ingress(cluster, svc, [])
        return
    if FINALIZER not in (meta.get("finalizers") or ()):
        svc = _set_finalizers(cluster, svc, [*(meta.get("finalizers") or ()), FINALIZER])
        if svc is None:
            return
    unsupported = unsupported_ranges(svc)
    if unsupported:
        operator_support.event(cluster, svc, "FailedBuildModel", f"Failed build model due to unsupported v6 cidr "
                               f"{unsupported[0]} when lb is not dualstack", COMPONENT, "Warning")
        return
    try:
        dns = aws.deploy(svc)
    except Exception as exc:
        operator_support.event(cluster, svc, "FailedDeployModel", f"Failed deploy model due to {exc}", COMPONENT,
                               "Warning")
        return
    if _write_ingress(cluster, svc, [{"hostname": dns}]):
        operator_support.event(cluster, svc, "SuccessfullyReconciled", "Successfully reconciled", COMPONENT)


# --- the Service's side ---------------------------------------------------------------------------------------


def _handled(svc: Obj) -> bool:
    """Whether the controller owns ``svc``: a LoadBalancer Service of its class, or one holding its finalizer."""
    spec = svc.get("spec") or {}
    if FINALIZER in (svc["metadata"].get("finalizers") or ()):
        return True
    return spec.get("type") == "LoadBalancer" and spec.get("loadBalancerClass") in (None, NLB_CLASS)


def _running_controller(cluster: Cluster) -> str | None:
    """The EKS cluster the load balancer controller serves (its ``--cluster-name``), if a replica is available."""
    deployment = cluster.store.get(DEPLOY_KEY, CONTROLLER)
    if deployment is None or not (deployment.get("status") or {}).get("availableReplicas"):
        return None
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    for container in containers:
        for arg in container.get("args") or ():
            if str(arg).startswith("--cluster-name="):
                return str(arg).split("=", 1)[1]
    return None


def _set_finalizers(cluster: Cluster, svc: Obj, finalizers: list[str]) -> Obj | None:
    rt = cluster.builtin(*KEY)
    meta = svc["metadata"]
    try:
        return cluster.patch(rt, meta["namespace"], meta["name"], "merge",
                             {"metadata": {"finalizers": finalizers or None,
                                           "resourceVersion": meta["resourceVersion"]}}, MANAGER).obj
    except ApiError:
        return None  # changed or gone meanwhile: its event brings it back


def _write_ingress(cluster: Cluster, svc: Obj, ingress: list[dict[str, str]]) -> bool:
    current = cluster.store.get(KEY, (svc["metadata"]["namespace"], svc["metadata"]["name"]))
    if current is None or ((current.get("status") or {}).get("loadBalancer") or {}).get("ingress", []) == ingress:
        return False
    body = clone(current)
    body["status"] = {**(body.get("status") or {}), "loadBalancer": {"ingress": ingress} if ingress else {}}
    with contextlib.suppress(ApiError):
        cluster.replace(cluster.builtin(*KEY), body["metadata"]["namespace"], body["metadata"]["name"], body,
                        MANAGER, "status")
        return True
    return False


def source_ranges(svc: Obj) -> list[str]:
    """The CIDR blocks the Service admits (none named: the controller's default for its scheme)."""
    ranges = list((svc.get("spec") or {}).get("loadBalancerSourceRanges") or ())
    annotation = (svc["metadata"].get("annotations") or {}).get(SOURCE_RANGES, "")
    return ranges or [r.strip() for r in annotation.split(",") if r.strip()]


def unsupported_ranges(svc: Obj) -> list[str]:
    """IPv6 source ranges of a load balancer that is not dual-stack: the controller builds no model for them."""
    dualstack = (svc["metadata"].get("annotations") or {}).get(IP_ADDRESS_TYPE) == "dualstack"
    return [] if dualstack else [cidr for cidr in source_ranges(svc) if ":" in cidr]


def scheme(svc: Obj) -> str:
    return str((svc["metadata"].get("annotations") or {}).get(SCHEME, "internal"))


def resource_name(cluster_name: str, namespace: str, name: str, *salt: str) -> str:
    """``k8s-<namespace:8>-<name:8>-<hash:10>``: how the controller names what it makes for a Service."""
    digest = hashlib.sha256("\0".join((cluster_name, namespace, name, *salt)).encode()).hexdigest()[:10]
    return f"k8s-{_NOT_ALNUM.sub('', namespace)[:8]}-{_NOT_ALNUM.sub('', name)[:8]}-{digest}"


# --- the AWS side ---------------------------------------------------------------------------------------------


def _client(endpoint: str, region: str, service: str) -> Any:
    with _CLIENTS_LOCK:
        key = (endpoint, region, service)
        if key not in _CLIENTS:
            import boto3
            from botocore.config import Config

            make: Any = boto3.client  # its overloads want a literal service name
            _CLIENTS[key] = make(service, endpoint_url=endpoint, region_name=region,
                                         aws_access_key_id=_KEY_ID, aws_secret_access_key=_SECRET,
                                         config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
        return _CLIENTS[key]


class _Aws:
    """What the controller makes for one Service (its stack), found again by its tags."""

    def __init__(self, endpoint: str, region: str, eks_cluster: str, stack: str) -> None:
        self.elb = _client(endpoint, region, "elbv2")
        self.ec2 = _client(endpoint, region, "ec2")
        self.eks = _client(endpoint, region, "eks")
        self.eks_cluster = eks_cluster
        self.stack = stack

    def tags(self, resource: str) -> list[dict[str, str]]:
        return [{"Key": CLUSTER_TAG, "Value": self.eks_cluster}, {"Key": STACK_TAG, "Value": self.stack},
                {"Key": RESOURCE_TAG, "Value": resource}]

    def _ours(self, items: list[dict[str, Any]], arn_key: str) -> list[dict[str, Any]]:
        arns = [str(i[arn_key]) for i in items]
        tagged: set[str] = set()
        for start in range(0, len(arns), 20):  # DescribeTags takes 20 ARNs a call
            for described in self.elb.describe_tags(ResourceArns=arns[start:start + 20])["TagDescriptions"]:
                tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
                if tags.get(CLUSTER_TAG) == self.eks_cluster and tags.get(STACK_TAG) == self.stack:
                    tagged.add(str(described["ResourceArn"]))
        return [i for i in items if i[arn_key] in tagged]

    def load_balancers(self) -> list[dict[str, Any]]:
        pages = self.elb.get_paginator("describe_load_balancers").paginate()
        return self._ours([b for page in pages for b in page["LoadBalancers"]], "LoadBalancerArn")

    def target_groups(self) -> list[dict[str, Any]]:
        pages = self.elb.get_paginator("describe_target_groups").paginate()
        return self._ours([g for page in pages for g in page["TargetGroups"]], "TargetGroupArn")

    def security_groups(self) -> list[dict[str, Any]]:
        found = self.ec2.describe_security_groups(Filters=[
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [self.eks_cluster]},
            {"Name": f"tag:{STACK_TAG}", "Values": [self.stack]}])["SecurityGroups"]
        return list(found)

    # --- deploy ---------------------------------------------------------------------------------------------

    def deploy(self, svc: Obj) -> str:
        """Make or update the Service's load balancer; its DNS name."""
        vpc = self.eks.describe_cluster(name=self.eks_cluster)["cluster"]["resourcesVpcConfig"]
        subnets, vpc_id = list(vpc["subnetIds"]), str(vpc["vpcId"])
        namespace, name = self.stack.split("/", 1)
        want_scheme = scheme(svc)
        lb_name = resource_name(self.eks_cluster, namespace, name, want_scheme)
        ports = [p for p in (svc.get("spec") or {}).get("ports") or () if p.get("port")]
        group_id = self.security_group(svc, vpc_id, namespace, name, ports, want_scheme)
        balancer = None
        for existing in self.load_balancers():
            if existing["LoadBalancerName"] == lb_name:
                balancer = existing
            else:  # the scheme changed: the controller replaces the load balancer
                self.delete_balancer(existing)
        if balancer is None:
            balancer = self.elb.create_load_balancer(
                Name=lb_name, Subnets=subnets, SecurityGroups=[group_id], Scheme=want_scheme, Type="network",
                IpAddressType="ipv4", Tags=self.tags("LoadBalancer"))["LoadBalancers"][0]
        self.listeners(balancer, ports, vpc_id, namespace, name, svc)
        return str(balancer["DNSName"])

    def security_group(self, svc: Obj, vpc_id: str, namespace: str, name: str, ports: list[dict[str, Any]],
                       want_scheme: str) -> str:
        groups = self.security_groups()
        if groups:
            group = groups[0]
        else:
            group_id = self.ec2.create_security_group(
                GroupName=resource_name(self.eks_cluster, namespace, name, "sg"), VpcId=vpc_id,
                Description="[k8s] Managed SecurityGroup for LoadBalancer",
                TagSpecifications=[{"ResourceType": "security-group",
                                    "Tags": self.tags("ManagedLBSecurityGroup")}])["GroupId"]
            group = self.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
        ranges = source_ranges(svc)
        if not ranges:
            ranges = ["0.0.0.0/0"] if want_scheme == "internet-facing" else [
                a["CidrBlock"] for a in self.ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]
                .get("CidrBlockAssociationSet", []) if a["CidrBlockState"]["State"] == "associated"]
        want = {(str(p.get("protocol", "TCP")).lower(), int(p["port"]), cidr) for p in ports for cidr in ranges}
        have = {(str(r["IpProtocol"]), int(r.get("FromPort", 0)), str(c["CidrIp"]))
                for r in group.get("IpPermissions", []) for c in r.get("IpRanges", [])}
        for revoke in sorted(have - want):
            self.ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[_rule(*revoke)])
        for grant in sorted(want - have):
            self.ec2.authorize_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[_rule(*grant)])
        return str(group["GroupId"])

    def listeners(self, balancer: dict[str, Any], ports: list[dict[str, Any]], vpc_id: str, namespace: str,
                  name: str, svc: Obj) -> None:
        """A target group and a listener per Service port; those of ports gone are deleted."""
        arn = balancer["LoadBalancerArn"]
        listeners = {int(li["Port"]): li for li in self.elb.describe_listeners(LoadBalancerArn=arn)["Listeners"]}
        groups = {g["TargetGroupName"]: g for g in self.target_groups()}
        wanted: set[str] = set()
        for port in ports:
            protocol = str(port.get("protocol", "TCP")).upper()
            group_name = resource_name(self.eks_cluster, namespace, name, str(port["port"]), protocol,
                                       svc["metadata"]["uid"])
            wanted.add(group_name)
            group = groups.get(group_name)
            if group is None:
                group = self.elb.create_target_group(  # instance targets: the nodes, at the Service's node port
                    Name=group_name, Protocol=protocol, Port=int(port.get("nodePort") or port["port"]),
                    VpcId=vpc_id, TargetType="instance",
                    Tags=self.tags(f"{self.stack}:{port['port']}"))["TargetGroups"][0]
            if int(port["port"]) not in listeners:
                self.elb.create_listener(LoadBalancerArn=arn, Protocol=protocol, Port=int(port["port"]),
                                         DefaultActions=[{"Type": "forward",
                                                          "TargetGroupArn": group["TargetGroupArn"]}])
        live_ports = {int(p["port"]) for p in ports}
        for port_number, listener in listeners.items():
            if port_number not in live_ports:
                self.elb.delete_listener(ListenerArn=listener["ListenerArn"])
        for group_name, group in groups.items():
            if group_name not in wanted:
                self.elb.delete_target_group(TargetGroupArn=group["TargetGroupArn"])

    # --- cleanup --------------------------------------------------------------------------------------------

    def delete_balancer(self, balancer: dict[str, Any]) -> None:
        self.elb.delete_load_balancer(LoadBalancerArn=balancer["LoadBalancerArn"])

    def delete_all(self) -> None:
        """The Service's load balancer, then its target groups (refused while it uses them), then its group."""
        for balancer in self.load_balancers():
            self.delete_balancer(balancer)
        for group in self.target_groups():
            self.elb.delete_target_group(TargetGroupArn=group["TargetGroupArn"])
        for security_group in self.security_groups():
            self.ec2.delete_security_group(GroupId=security_group["GroupId"])


def _rule(protocol: str, port: int, cidr: str) -> dict[str, Any]:
    return {"IpProtocol": protocol, "FromPort": port, "ToPort": port, "IpRanges": [{"CidrIp": cidr}]}
