"""The ``verify`` stage of ``cluster.create``: the cluster is usable, not merely created.

It only looks: the instance group's nodes are Ready and HyperPod calls them ``Schedulable``
(``sagemaker.amazonaws.com/node-health-status``), every installed component is healthy, and the storage
stage's claims are Bound. Until all hold it waits, saying what is missing, up to its deadline.

The group's nodes are the instances HyperPod lists for it (``ListClusterNodes``), found in the nodes
informer's watch cache (no node list per poll) by their instance id (:mod:`services.clusters.instances`),
never by the ``instance-group-name`` label alone: a node of another cluster or group that carries the label
is not counted.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import CreateStage, result_of
from services.clusters.create_models import ClusterCreatePlan, NetworkResult, StorageResult, VerifyResult
from services.clusters.dependencies_stage import components_health
from services.clusters.instances import group_instances, instance_id_of
from services.errors import NotFound
from services.stages import Done, Observed, StageContext, Wait

HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
SCHEDULABLE = "Schedulable"
HEALTHY = frozenset({"active", "healthy", "available", "ready"})
POLL_SECONDS = 15.0

class VerifyStage(CreateStage):
    name = "verify"
    read_only = True
    expected_seconds = 30.0
    deadline = 1800.0  # nodes that joined may still be finishing their deep health checks

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        return Observed.DONE if not self._missing(ctx) else Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        missing = self._missing(ctx)
        return Wait(POLL_SECONDS, "waiting for " + "; ".join(missing)) if missing else Done()

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        found = ctx.data.get("found", {})
        return VerifyResult(nodes_ready=found.get("nodes", 0), components_healthy=found.get("components", 0),
                            claims_bound=found.get("claims", 0)).model_dump()

    def report(self, ctx: StageContext[ClusterCreatePlan]) -> str:
        found = ctx.data.get("found", {})
        return (f"{found.get('nodes', 0)} nodes Ready and Schedulable, {found.get('components', 0)} components "
                f"healthy, {found.get('claims', 0)} claims Bound")

    # ----- the checks -----------------------------------------------------------------------------------

    def _missing(self, ctx: StageContext[ClusterCreatePlan]) -> list[str]:
        """What is not yet as it must be (empty: verified); counts what is, in ``ctx.data['found']``."""
        plan = ctx.request
        core = k8s.CoreV1Api(self.deps.kube.api_client(plan.name))
        missing: list[str] = []
        group = plan.names.instance_group
        informer = self.deps.informers.get(plan.name, "nodes")  # the watch cache: no node list per poll
        usable: list[dict[str, Any]] = []
        if not informer.synced.is_set():
            if informer.fatal is not None:  # access refused, or a failure nothing classified: waiting cures neither
                raise informer.fatal
            missing.append(f"the cluster's node list ({informer.error or 'listing'})")
        else:
            sagemaker = self.deps.aws.client("sagemaker", plan.region)
            instances = group_instances(sagemaker, plan.names.hyperpod_cluster, group)
            nodes = [n for n in informer.items() if _instance_of(n) in instances]
            usable = [n for n in nodes if _usable(n)]
            if len(usable) < plan.count:
                unusable = sorted(f"{n['metadata']['name']} ({_why_not(n)})" for n in nodes if not _usable(n))
                missing.append(f"{len(usable)}/{plan.count} nodes of {group} Ready and Schedulable"
                               + (f": {', '.join(unusable)}" if unusable else ""))
        components = components_health(self.deps, plan, result_of(ctx, "network", NetworkResult).vpc_id)
        healthy = [c for c in components if c.status.lower() in HEALTHY]
        missing += [f"component {c.name} {c.status}" + (f" ({c.detail})" if c.detail else "")
                    for c in components if c.status.lower() not in HEALTHY]
        bound = 0
        for claim in result_of(ctx, "storage", StorageResult).claims:
            namespace, _, name = claim.partition("/")
            phase = _claim_phase(core, namespace, name)
            if phase == "Bound":
                bound += 1
            else:
                missing.append(f"claim {claim} {phase}")
        ctx.data["found"] = {"nodes": len(usable), "components": len(healthy), "claims": bound}
        return missing


def _instance_of(node: dict[str, Any]) -> str:
    """The node's EC2 instance id ('' when neither its provider id nor its name carries one)."""
    return instance_id_of(str(node["metadata"]["name"]), (node.get("spec") or {}).get("providerID")) or ""


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _cordoned(node: dict[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _usable(node: dict[str, Any]) -> bool:
    return _ready(node) and _labels(node).get(HEALTH_LABEL) == SCHEDULABLE and not _cordoned(node)


def _why_not(node: dict[str, Any]) -> str:
    if not _ready(node):
        return "not Ready"
    if _cordoned(node):
        return "cordoned"
    return f"{HEALTH_LABEL}={_labels(node).get(HEALTH_LABEL, 'unset')}"


def _claim_phase(core: k8s.CoreV1Api, namespace: str, name: str) -> str:
    try:
        claim = core.read_namespaced_persistent_volume_claim(name, namespace)
    except NotFound:
        return "missing"
    return str(claim.status.phase if claim.status and claim.status.phase else "Pending")
