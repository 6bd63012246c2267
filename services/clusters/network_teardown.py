"""The ``network`` stage of ``cluster.delete``: everything carrying the cluster's two tags goes, in the order
AWS allows, and nothing else does (a VPC the user gave stays; only our security group and subnet in it go).

Each step observes what is left, so a crash or a retry resumes where it was. Deletes AWS finishes later
(NAT gateways, VPC endpoints) and dependencies that clear by themselves (network interfaces of a deleted
HyperPod cluster or load balancer still detaching) are waits with their reason, never failures. The only
untagged things touched are load balancers' and the VPC CNI's network interfaces left ``available`` in our
subnets (they would keep the subnet from being deleted), the CIDR blocks we added to a user's VPC (named
by a compute subnet's tag, or recorded in the installation's intents before the call, so a crash before the
subnet was made leaves none behind: :mod:`services.clusters.intents`), and what the AWS Load Balancer
Controller made for the cluster's EKS cluster in our VPCs (load balancers, target groups and security groups
tagged ``elbv2.k8s.aws/cluster=<EKS cluster>``): it goes first, since its network interfaces and groups
would keep our subnets and VPC from going.
"""

from __future__ import annotations

from typing import Any

from services.clusters.create_base import ClusterDeletePlan, DeleteStage, ec2_cluster_filters, owned
from services.clusters.intents import CIDR_BLOCK, ResourceIntents
from services.clusters.network import CIDR_TAG
from services.errors import NotFound, ServiceError
from services.stages import Done, Observed, StageContext, Wait

#: descriptions of network interfaces left behind by load balancers and the VPC CNI (safe to delete)
LEFTOVER_ENI_PREFIXES = ("ELB ", "aws-K8S")
#: the tag the AWS Load Balancer Controller puts on what it makes, valued with the EKS cluster's name
LBC_TAG = "elbv2.k8s.aws/cluster"
DELETE_WAIT = 10.0
NAT_DELETE_WAIT = 15.0  # AWS deletes a NAT gateway in about a minute


def _dependency(exc: ServiceError) -> bool:
    """Whether AWS refused a delete because something still depends on the resource (it may clear)."""
    details = exc.details if isinstance(exc.details, dict) else {}
    return details.get("aws_code") in ("DependencyViolation", "InvalidIPAddress.InUse", "ResourceInUse")


class _Teardown:
    """One pass of the teardown: answers a Wait while something is still going, None once nothing is left."""

    def __init__(self, ec2: Any, elb: Any, plan: ClusterDeletePlan, data: dict[str, Any],
                 intents: ResourceIntents) -> None:
        self.ec2 = ec2
        self.elb = elb
        self.intents = intents
        self.cluster = plan.name
        self.eks_cluster = plan.eks_cluster
        self.data = data
        self.filters = ec2_cluster_filters(plan.name)

    def ours(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [i for i in items if owned(i.get("Tags"), self.cluster)]

    def vpcs(self) -> list[str]:
        return [v["VpcId"] for v in self.ours(self.ec2.describe_vpcs(Filters=self.filters)["Vpcs"])]

    def subnets(self) -> list[dict[str, Any]]:
        return self.ours(self.ec2.all_pages("describe_subnets", "Subnets", Filters=self.filters))

    def record_cidrs(self, subnets: list[dict[str, Any]]) -> None:
        """Remember (in the stage's data, saved before any subnet goes) the CIDR blocks we added: named by our
        subnets' tags, or recorded as intents before their call (also when no subnet was made after it)."""
        cidrs: dict[str, str] = self.data.setdefault("cidrs", {})
        for subnet in subnets:
            tag = next((t["Value"] for t in subnet.get("Tags", []) if t["Key"] == CIDR_TAG), None)
            if tag:
                cidrs[tag] = subnet["VpcId"]
        cidrs.update(self.intended_blocks())

    def intended_blocks(self) -> dict[str, str]:
        """The live associations (id: VPC) of the CIDR blocks recorded as the cluster's before their call (one
        never made, already gone, or gone with its VPC has none)."""
        found: dict[str, str] = {}
        for intent in self.intents.recorded(self.cluster, CIDR_BLOCK):
            try:
                vpcs = self.ec2.describe_vpcs(VpcIds=[intent.scope])["Vpcs"]
            except NotFound:
                vpcs = []
            live = [a for v in vpcs for a in v.get("CidrBlockAssociationSet", []) if a["CidrBlock"] == intent.key
                    and a["CidrBlockState"]["State"] in ("associated", "associating")]
            if live:
                found[str(live[0]["AssociationId"])] = intent.scope
        return found

    def scope(self) -> None:
        """Remember (in the stage's data) the VPCs we have anything in, ours or a user's: the load balancer
        controller's leftovers are looked for there, also once our subnets and groups are gone."""
        vpcs = set(self.data.get("vpcs", [])) | set(self.vpcs()) | {s["VpcId"] for s in self.subnets()}
        self.data["vpcs"] = sorted(vpcs | {g["VpcId"] for g in self.security_groups()})

    def leftovers(self) -> list[str]:
        """What of ours is still there (AWS is only read)."""
        self.scope()
        left = [f"VPC {v}" for v in self.vpcs()]
        left += [f"subnet {s['SubnetId']}" for s in self.subnets()]
        left += [f"internet gateway {g['InternetGatewayId']}" for g in self.ours(
            self.ec2.describe_internet_gateways(Filters=self.filters)["InternetGateways"])]
        left += [f"NAT gateway {n['NatGatewayId']}" for n in self.nat_gateways() if n["State"] != "failed"]
        left += [f"Elastic IP {a['AllocationId']}" for a in self.addresses()]
        left += [f"VPC endpoint {e['VpcEndpointId']}" for e in self.endpoints()]
        left += [f"route table {t['RouteTableId']}" for t in self.route_tables()]
        left += [f"security group {g['GroupId']}" for g in self.security_groups()]
        left += [f"load balancer {b['LoadBalancerName']}" for b in self.load_balancers()]
        left += [f"target group {g['TargetGroupName']}" for g in self.target_groups()]
        left += [f"load balancer controller's security group {g['GroupId']}" for g in self.controller_groups()]
        left += [f"CIDR block association {a}" for a in {**self.data.get("cidrs", {}), **self.intended_blocks()}]
        return left

    def dead_nat_interfaces(self) -> set[str]:
        """The network interfaces of our deleted NAT gateways (AWS removes them with the gateway; moto
        keeps them ``available``)."""
        return {str(a["NetworkInterfaceId"]) for n in self.ours(self.ec2.describe_nat_gateways(
            Filter=self.filters)["NatGateways"]) if n["State"] == "deleted"
            for a in n.get("NatGatewayAddresses", []) if a.get("NetworkInterfaceId")}

    def nat_gateways(self) -> list[dict[str, Any]]:
        return [n for n in self.ours(self.ec2.describe_nat_gateways(Filter=self.filters)["NatGateways"])
                if n["State"] != "deleted"]

    def addresses(self) -> list[dict[str, Any]]:
        return self.ours(self.ec2.describe_addresses(Filters=self.filters)["Addresses"])

    def endpoints(self) -> list[dict[str, Any]]:
        return [e for e in self.ours(self.ec2.describe_vpc_endpoints(Filters=self.filters)["VpcEndpoints"])
                if str(e.get("State", "")).lower() != "deleted"]

    def route_tables(self) -> list[dict[str, Any]]:
        return [t for t in self.ours(self.ec2.describe_route_tables(Filters=self.filters)["RouteTables"])
                if not any(a.get("Main") for a in t.get("Associations", []))]

    def security_groups(self) -> list[dict[str, Any]]:
        return self.ours(self.ec2.describe_security_groups(Filters=self.filters)["SecurityGroups"])

    def _controllers(self, items: list[dict[str, Any]], arn_key: str) -> list[dict[str, Any]]:
        """Those of ``items`` (ELBv2 resources in our VPCs) tagged for our EKS cluster by the controller."""
        arns = [str(i[arn_key]) for i in items]
        tagged: set[str] = set()
        for start in range(0, len(arns), 20):  # DescribeTags takes 20 ARNs a call
            for described in self.elb.describe_tags(ResourceArns=arns[start:start + 20])["TagDescriptions"]:
                if {"Key": LBC_TAG, "Value": self.eks_cluster} in described.get("Tags", []):
                    tagged.add(str(described["ResourceArn"]))
        return [i for i in items if i[arn_key] in tagged]

    def load_balancers(self) -> list[dict[str, Any]]:
        vpcs = set(self.data.get("vpcs", []))
        return self._controllers([b for b in self.elb.all_pages("describe_load_balancers", "LoadBalancers")
                                  if b.get("VpcId") in vpcs], "LoadBalancerArn")

    def target_groups(self) -> list[dict[str, Any]]:
        vpcs = set(self.data.get("vpcs", []))
        return self._controllers([g for g in self.elb.all_pages("describe_target_groups", "TargetGroups")
                                  if g.get("VpcId") in vpcs], "TargetGroupArn")

    def controller_groups(self) -> list[dict[str, Any]]:
        vpcs = sorted(self.data.get("vpcs", []))
        if not vpcs:
            return []
        found = self.ec2.describe_security_groups(Filters=[{"Name": f"tag:{LBC_TAG}", "Values": [self.eks_cluster]},
                                                           {"Name": "vpc-id", "Values": vpcs}])["SecurityGroups"]
        return [g for g in found if g.get("VpcId") in vpcs
                and {"Key": LBC_TAG, "Value": self.eks_cluster} in g.get("Tags", [])]

    # ----- the pass ----------------------------------------------------------------------------------

    def run(self) -> Wait | None:
        self.scope()
        subnets = self.subnets()
        self.record_cidrs(subnets)
        subnet_ids = [s["SubnetId"] for s in subnets]
        for step in (self.delete_load_balancers, self.delete_endpoints, self.delete_nat_gateways,
                     self.release_addresses, self.delete_internet_gateways):
            waiting = step()
            if waiting is not None:
                return waiting
        blocking = self.interfaces(subnet_ids)
        self.disassociate(subnet_ids)
        if blocking:
            return Wait(DELETE_WAIT, f"{len(blocking)} network interface(s) still in subnets of cluster "
                                     f"{self.cluster}: {', '.join(blocking[:5])}; the subnets go once they do")
        for subnet_id in subnet_ids:
            waiting = self.delete(f"subnet {subnet_id}", self.ec2.delete_subnet, SubnetId=subnet_id)
            if waiting is not None:
                return waiting
        for table in self.route_tables():
            waiting = self.delete(f"route table {table['RouteTableId']}", self.ec2.delete_route_table,
                                  RouteTableId=table["RouteTableId"])
            if waiting is not None:
                return waiting
        waiting = self.delete_security_groups()
        if waiting is not None:
            return waiting
        waiting = self.remove_cidrs()
        if waiting is not None:
            return waiting
        for vpc_id in self.vpcs():
            waiting = self.delete(f"VPC {vpc_id}", self.ec2.delete_vpc, VpcId=vpc_id)
            if waiting is not None:
                return waiting
        for intent in self.intents.recorded(self.cluster, CIDR_BLOCK):  # their blocks are gone, with the VPCs too
            self.intents.forget(intent.cluster, intent.kind, intent.scope, intent.key)
        return None

    def delete(self, what: str, call: Any, **params: Any) -> Wait | None:
        """One delete; a dependency AWS still sees is a wait that names it, not a failure."""
        try:
            call(**params)
        except ServiceError as exc:
            if not _dependency(exc):
                raise
            return Wait(DELETE_WAIT, f"{what} still has dependencies: {exc.message}")
        return None

    def interfaces(self, subnet_ids: list[str]) -> list[str]:
        """Delete load balancers' and the VPC CNI's leftover interfaces in our subnets; answer the others."""
        if not subnet_ids:
            return []
        blocking: list[str] = []
        dead = self.dead_nat_interfaces()
        for eni in self.ec2.all_pages("describe_network_interfaces", "NetworkInterfaces",
                                      Filters=[{"Name": "subnet-id", "Values": subnet_ids}]):
            description = str(eni.get("Description", ""))
            if eni.get("Status") == "available" and (description.startswith(LEFTOVER_ENI_PREFIXES)
                                                     or eni["NetworkInterfaceId"] in dead):
                self.ec2.delete_network_interface(NetworkInterfaceId=eni["NetworkInterfaceId"])
            else:
                blocking.append(f"{eni['NetworkInterfaceId']} ({eni.get('Status')}: {description or 'no description'})")
        return blocking

    def delete_load_balancers(self) -> Wait | None:
        """The controller's load balancers (AWS removes their network interfaces after them), then its
        target groups (refused while a load balancer still uses them). Its security groups go with ours."""
        balancers = self.load_balancers()
        for balancer in balancers:
            self.elb.delete_load_balancer(LoadBalancerArn=balancer["LoadBalancerArn"])  # gone already: succeeds
        going = [b["LoadBalancerName"] for b in self.load_balancers()] if balancers else []
        if going:
            return Wait(DELETE_WAIT, f"load balancer(s) {', '.join(going)} of the AWS Load Balancer Controller "
                                     "deleting; their network interfaces go after them")
        for group in self.target_groups():
            waiting = self.delete(f"target group {group['TargetGroupName']}", self.elb.delete_target_group,
                                  TargetGroupArn=group["TargetGroupArn"])
            if waiting is not None:
                return waiting
        return None

    def delete_endpoints(self) -> Wait | None:
        endpoints = self.endpoints()
        going = [e["VpcEndpointId"] for e in endpoints if str(e.get("State", "")).lower() != "deleting"]
        if going:
            self.ec2.delete_vpc_endpoints(VpcEndpointIds=going)
        if any(str(e.get("State", "")).lower() == "deleting" for e in self.endpoints()):
            return Wait(DELETE_WAIT, "VPC endpoint(s) deleting")
        return None

    def delete_nat_gateways(self) -> Wait | None:
        for nat in self.nat_gateways():
            if nat["State"] in ("pending", "available"):
                self.ec2.delete_nat_gateway(NatGatewayId=nat["NatGatewayId"])
        going = [n["NatGatewayId"] for n in self.nat_gateways() if n["State"] not in ("deleted", "failed")]
        if going:
            return Wait(NAT_DELETE_WAIT, f"NAT gateway {', '.join(going)} deleting (about a minute in AWS); its "
                                         "Elastic IP is released after")
        return None

    def release_addresses(self) -> Wait | None:
        """Our Elastic IPs, once free. One still shown on a deleted NAT gateway of ours is free too (AWS
        frees it with the gateway; the sandbox's moto keeps the association, which release then drops)."""
        gone = self.dead_nat_interfaces()
        for address in self.addresses():
            if address.get("AssociationId") and address.get("NetworkInterfaceId") not in gone:
                return Wait(DELETE_WAIT, f"Elastic IP {address.get('PublicIp')} is still associated "
                                         f"({address['AssociationId']})")
            waiting = self.delete(f"Elastic IP {address.get('PublicIp')}", self.ec2.release_address,
                                  AllocationId=address["AllocationId"])
            if waiting is not None:
                return waiting
        return None

    def delete_internet_gateways(self) -> Wait | None:
        for gateway in self.ours(self.ec2.describe_internet_gateways(Filters=self.filters)["InternetGateways"]):
            igw = gateway["InternetGatewayId"]
            for attachment in gateway.get("Attachments", []):
                waiting = self.delete(f"internet gateway {igw}", self.ec2.detach_internet_gateway,
                                      InternetGatewayId=igw, VpcId=attachment["VpcId"])
                if waiting is not None:
                    return waiting
            waiting = self.delete(f"internet gateway {igw}", self.ec2.delete_internet_gateway, InternetGatewayId=igw)
            if waiting is not None:
                return waiting
        return None

    def disassociate(self, subnet_ids: list[str]) -> None:
        """Our route tables' associations, and our subnets' associations with anyone's route table."""
        tables = self.route_tables()
        ours = {t["RouteTableId"] for t in tables}
        if subnet_ids:
            tables += self.ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id",
                                                               "Values": subnet_ids}])["RouteTables"]
        done: set[str] = set()
        for table in tables:
            for association in table.get("Associations", []):
                if association.get("Main") or association["RouteTableAssociationId"] in done:
                    continue
                if table["RouteTableId"] in ours or association.get("SubnetId") in subnet_ids:
                    self.ec2.disassociate_route_table(AssociationId=association["RouteTableAssociationId"])
                    done.add(association["RouteTableAssociationId"])

    def delete_security_groups(self) -> Wait | None:
        """Ours and the load balancer controller's, once no network interface uses them; the rules that
        name a group go first (EFA's self-reference; the controller's rules naming its backend group)."""
        groups = self.security_groups() + self.controller_groups()
        if not groups:
            return None
        ids = [g["GroupId"] for g in groups]
        using = self.ec2.all_pages("describe_network_interfaces", "NetworkInterfaces",
                                   Filters=[{"Name": "group-id", "Values": ids}])
        if using:
            return Wait(DELETE_WAIT, f"security group(s) {', '.join(ids)} still used by "
                                     + ", ".join(e["NetworkInterfaceId"] for e in using[:5]))
        for group in groups:
            ingress = [r for r in group.get("IpPermissions", []) if r.get("UserIdGroupPairs")]
            egress = [r for r in group.get("IpPermissionsEgress", []) if r.get("UserIdGroupPairs")]
            if ingress:
                self.ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=_pairs_only(ingress))
            if egress:
                self.ec2.revoke_security_group_egress(GroupId=group["GroupId"], IpPermissions=_pairs_only(egress))
        for group_id in ids:
            waiting = self.delete(f"security group {group_id}", self.ec2.delete_security_group, GroupId=group_id)
            if waiting is not None:
                return waiting
        return None

    def remove_cidrs(self) -> Wait | None:
        """Disassociate the CIDR blocks we added to VPCs that are not ours (ours go with the VPC)."""
        cidrs: dict[str, str] = self.data.get("cidrs", {})
        own = set(self.vpcs())
        for association_id, vpc_id in sorted(cidrs.items()):
            if vpc_id in own:
                del cidrs[association_id]
                continue
            try:
                found = self.ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"]
            except NotFound:  # the VPC is gone, and its blocks with it
                found = []
            blocks = [a for v in found for a in v.get("CidrBlockAssociationSet", [])
                      if a["AssociationId"] == association_id]
            state = blocks[0]["CidrBlockState"]["State"] if blocks else "disassociated"
            if state in ("associated", "associating"):
                waiting = self.delete(f"CIDR block {blocks[0]['CidrBlock']} of VPC {vpc_id}",
                                      self.ec2.disassociate_vpc_cidr_block, AssociationId=association_id)
                if waiting is not None:
                    return waiting
                state = "disassociating"
            if state == "disassociating":
                return Wait(DELETE_WAIT, f"CIDR block {association_id} of VPC {vpc_id} disassociating")
            del cidrs[association_id]
        return None


def _pairs_only(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group-referencing part of each rule, as Revoke* takes it."""
    return [{"IpProtocol": r["IpProtocol"],
             **({"FromPort": r["FromPort"], "ToPort": r["ToPort"]} if "FromPort" in r else {}),
             "UserIdGroupPairs": [{"GroupId": p["GroupId"]} for p in r["UserIdGroupPairs"]]} for r in rules]


class NetworkTeardown(DeleteStage):
    """``network`` of ``cluster.delete``: observe what of ours is left; act records the CIDR blocks we added
    (saved before any subnet goes); each poll deletes what it can and waits for what AWS is still doing."""

    name = "network"
    expected_seconds = 120.0

    def _pass(self, ctx: StageContext[ClusterDeletePlan]) -> _Teardown:
        region = ctx.request.region
        return _Teardown(self.deps.aws.client("ec2", region), self.deps.aws.client("elbv2", region), ctx.request,
                         ctx.data, ResourceIntents(self.deps.registry.db, self.deps.clock))

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        return Observed.ABSENT if self._pass(ctx).leftovers() else Observed.DONE

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        teardown = self._pass(ctx)
        teardown.record_cidrs(teardown.subnets())

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        waiting = self._pass(ctx).run()
        return Done() if waiting is None else waiting

    def result(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any]:
        return {}
