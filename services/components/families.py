"""The registry: every component a created cluster may get, in install order (teardown runs it backwards), and
:func:`components_for`, which picks those a plan needs. A plain ordered tuple, so the managed-features
capability can list the same entries as toggles. Versions, names and images: ``deploy/components.md``.
"""

from __future__ import annotations

from typing import Any

from services.clusters.create_models import ClusterCreatePlan
from services.components.addons import Addon
from services.components.base import Component, Target
from services.components.hyperpod_addons import HYPERPOD_INFERENCE_OPERATOR, HYPERPOD_TRAINING_OPERATOR
from services.components.identity import PodRole
from services.components.manifests import Manifests
from services.errors import Permanent


def _s3_csi_policy(target: Target) -> dict[str, Any]:
    """Mountpoint for S3 on the shared bucket only (list the bucket; read, write and delete its objects)."""
    if not target.bucket:
        raise Permanent(f"the S3 CSI driver's role of {target.cluster} needs the shared bucket, and none is set")
    from services.clusters.iam_stage import partition  # at call time: iam_stage imports create, which imports us
    bucket = f"arn:{partition(target.region)}:s3:::{target.bucket}"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "MountpointFullBucketAccess", "Effect": "Allow", "Action": ["s3:ListBucket"],
         "Resource": [bucket]},
        {"Sid": "MountpointFullObjectAccess", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:DeleteObject"],
         "Resource": [f"{bucket}/*"]}]}


def _lbc_policy(target: Target) -> dict[str, Any]:
    """What the load balancer controller calls (the action families of its upstream ``iam_policy.json``)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["iam:CreateServiceLinkedRole"], "Resource": "*",
         "Condition": {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}}},
        {"Effect": "Allow", "Resource": "*", "Action": [
            "ec2:DescribeAccountAttributes", "ec2:DescribeAddresses", "ec2:DescribeAvailabilityZones",
            "ec2:DescribeInternetGateways", "ec2:DescribeVpcs", "ec2:DescribeVpcPeeringConnections",
            "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeInstances",
            "ec2:DescribeNetworkInterfaces", "ec2:DescribeTags", "ec2:GetCoipPoolUsage", "ec2:DescribeCoipPools",
            "ec2:GetSecurityGroupsForVpc", "ec2:DescribeIpamPools", "ec2:DescribeRouteTables",
            "elasticloadbalancing:Describe*", "acm:ListCertificates", "acm:DescribeCertificate",
            "iam:ListServerCertificates", "iam:GetServerCertificate", "cognito-idp:DescribeUserPoolClient",
            "waf-regional:GetWebACL", "waf-regional:GetWebACLForResource", "waf-regional:AssociateWebACL",
            "waf-regional:DisassociateWebACL", "wafv2:GetWebACL", "wafv2:GetWebACLForResource",
            "wafv2:AssociateWebACL", "wafv2:DisassociateWebACL", "shield:GetSubscriptionState",
            "shield:DescribeProtection", "shield:CreateProtection", "shield:DeleteProtection"]},
        {"Effect": "Allow", "Resource": "*", "Action": [
            "ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress", "ec2:CreateSecurityGroup",
            "ec2:DeleteSecurityGroup", "ec2:CreateTags", "ec2:DeleteTags"]},
        {"Effect": "Allow", "Resource": "*", "Action": [
            "elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:CreateTargetGroup",
            "elasticloadbalancing:CreateListener", "elasticloadbalancing:DeleteListener",
            "elasticloadbalancing:CreateRule", "elasticloadbalancing:DeleteRule",
            "elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags",
            "elasticloadbalancing:ModifyLoadBalancerAttributes", "elasticloadbalancing:SetIpAddressType",
            "elasticloadbalancing:SetSecurityGroups", "elasticloadbalancing:SetSubnets",
            "elasticloadbalancing:DeleteLoadBalancer", "elasticloadbalancing:ModifyTargetGroup",
            "elasticloadbalancing:ModifyTargetGroupAttributes", "elasticloadbalancing:DeleteTargetGroup",
            "elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets",
            "elasticloadbalancing:SetWebAcl", "elasticloadbalancing:ModifyListener",
            "elasticloadbalancing:AddListenerCertificates", "elasticloadbalancing:RemoveListenerCertificates",
            "elasticloadbalancing:ModifyRule", "elasticloadbalancing:ModifyListenerAttributes"]}]}


S3_CSI_ROLE = PodRole("s3-csi-role", "kube-system", "s3-csi-driver-sa", inline=_s3_csi_policy,
                      description="Mountpoint for Amazon S3 CSI driver (EKS Pod Identity)")
FSX_CSI_ROLE = PodRole("fsx-csi-role", "kube-system", "fsx-csi-controller-sa",
                       managed_policies=("AmazonFSxFullAccess",),
                       description="Amazon FSx for Lustre CSI driver (EKS Pod Identity)")
LBC_ROLE = PodRole("lbc-role", "kube-system", "aws-load-balancer-controller", inline=_lbc_policy, associate=True,
                   description="AWS Load Balancer Controller (EKS Pod Identity)")

VPC_CNI = Addon("vpc-cni")
KUBE_PROXY = Addon("kube-proxy")
COREDNS = Addon("coredns")
POD_IDENTITY_AGENT = Addon("eks-pod-identity-agent")
CERT_MANAGER = Addon("cert-manager")
METRICS_SERVER = Addon("metrics-server")
S3_CSI = Addon("aws-mountpoint-s3-csi-driver", identity=S3_CSI_ROLE)
FSX_CSI = Addon("aws-fsx-csi-driver", identity=FSX_CSI_ROLE)
HYPERPOD_RBAC = Manifests("hyperpod-rbac", "0.1.0", files=("hyperpod-rbac.yaml",),
                          resource_type="Kubernetes RBAC")
HEALTH_AGENT = Manifests("health-monitoring-agent", "0.1.0", files=("health-monitoring-agent.yaml",),
                         resource_type="Kubernetes DaemonSet")
NVIDIA_PLUGIN = Manifests("nvidia-device-plugin", "v0.16.1", files=("nvidia-device-plugin.yaml",),
                          resource_type="Kubernetes DaemonSet")
EFA_PLUGIN = Manifests("aws-efa-k8s-device-plugin", "v0.5.20", files=("efa-device-plugin.yaml",),
                       resource_type="Kubernetes DaemonSet")
NEURON_PLUGIN = Manifests("neuron-device-plugin", "2.19.16.0", files=("neuron-device-plugin.yaml",),
                          resource_type="Kubernetes DaemonSet")
TRAINING_OPERATOR = Manifests("kubeflow-training-operator", "v1-855e096", files=("training-operator.yaml",),
                              crds=("kubeflow.org_pytorchjobs.yaml",), resource_type="Kubernetes Deployment + CRD")
KUBERAY = Manifests("kuberay-operator", "v1.7.0", files=("kuberay-operator.yaml",),
                    crds=("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml"),
                    resource_type="Kubernetes Deployment + CRDs")
LOAD_BALANCER_CONTROLLER = Manifests("aws-load-balancer-controller", "v2.13.2",
                                     files=("aws-load-balancer-controller.yaml",),
                                     crds=("elbv2.k8s.aws_targetgroupbindings.yaml",
                                           "elbv2.k8s.aws_ingressclassparams.yaml"),
                                     resource_type="Kubernetes Deployment + CRDs + webhooks", identity=LBC_ROLE)

#: KEDA v2.17.1 (why this version: deploy/components.md) and the Prometheus its triggers query: installed by the
#: first autoscaling of a self-managed inference deployment (services/inference/scaling.py; KEDA alone also by the
#: first managed endpoint with metric triggers, managed_scaling.COMPONENTS), never at create
KEDA = Manifests("keda", "v2.17.1", files=("keda.yaml",),
                 crds=("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml"),
                 resource_type="Kubernetes Deployments + CRDs")
PROMETHEUS = Manifests("prometheus", "v3.5.0", files=("prometheus.yaml",),
                       resource_type="Kubernetes Deployment + ConfigMap + Service")
#: what self-managed inference autoscaling installs on first use
ON_USE: tuple[Manifests, ...] = (KEDA, PROMETHEUS)

#: the plugins through which nodes advertise their devices (nvidia.com/gpu, aws.amazon.com/neuron*,
#: vpc.amazonaws.com/efa)
DEVICE_PLUGINS: tuple[Manifests, ...] = (NVIDIA_PLUGIN, EFA_PLUGIN, NEURON_PLUGIN)

#: components a cluster gets only as managed features it asked for (services/features), never at create
OPTIONAL: tuple[Component, ...] = (HYPERPOD_TRAINING_OPERATOR, HYPERPOD_INFERENCE_OPERATOR)

#: every component, in install order (the cluster delete's teardown walks it backwards, optional ones too)
COMPONENTS: tuple[Component, ...] = (
    VPC_CNI, KUBE_PROXY, COREDNS, POD_IDENTITY_AGENT, CERT_MANAGER, METRICS_SERVER, S3_CSI, FSX_CSI,
    HYPERPOD_RBAC, HEALTH_AGENT, NVIDIA_PLUGIN, EFA_PLUGIN, NEURON_PLUGIN, TRAINING_OPERATOR, KUBERAY,
    LOAD_BALANCER_CONTROLLER, *ON_USE, *OPTIONAL,
)


def _nvidia(plan: ClusterCreatePlan) -> bool:
    return (plan.accelerator or "").upper().startswith("NVIDIA")


def _neuron(plan: ClusterCreatePlan) -> bool:
    text = (plan.accelerator or "").lower()
    return "trainium" in text or "inferentia" in text


def components_for(plan: ClusterCreatePlan) -> list[Component]:
    """The components ``plan``'s cluster gets, in install order: the FSx CSI driver only with FSx, the NVIDIA
    plugin on NVIDIA GPUs, the Neuron plugin on Trainium/Inferentia, the EFA plugin where the type has EFA, the
    health-monitoring agent on accelerated types; the :data:`OPTIONAL` ones never (they are features)."""
    wanted = {
        **{c.name: False for c in (*OPTIONAL, *ON_USE)},
        FSX_CSI.name: plan.fsx is not None,
        NVIDIA_PLUGIN.name: _nvidia(plan),
        NEURON_PLUGIN.name: _neuron(plan),
        EFA_PLUGIN.name: plan.efa,
        # the chart's agent DaemonSets select NVIDIA GPU and Neuron types only: no node of a CPU type runs it
        HEALTH_AGENT.name: _nvidia(plan) or _neuron(plan),
    }
    return [c for c in COMPONENTS if wanted.get(c.name, True)]
