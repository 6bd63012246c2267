"""Draining nodes: cordon, then evict every pod through the eviction subresource, so PodDisruptionBudgets
are honoured (the standard drain that leaves DaemonSets alone). DaemonSet pods and mirror pods stay; pods
that ended are not touched.

The plan (:func:`drain_plan`, the dry run and the precheck) lists the pods, the jobs and workloads they
belong to and the budgets covering them, live from the API server. The ``evict`` stage evicts, then waits:
a budget that allows no disruption answers 429, and the stage keeps waiting with that budget's name as its
reason (evicting again at each look, as the standard drain retries) until the pods are gone or its deadline.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s

from services.errors import NotFound, ServiceError
from services.nodes.facts import match_selector
from services.nodes.models import AffectedPod, DrainPlan, NodePlan
from services.nodes.stages import NodeDeps, NodeStage
from services.stages import Done, Observed, StageContext, Wait

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
RETRY_SECONDS = 5.0  # wall-clock seconds between eviction attempts of a pod a budget holds


def _json(response: Any) -> dict[str, Any]:
    return dict(json.loads(response.data))


def _owner(pod: dict[str, Any]) -> tuple[str, str] | None:
    refs = pod["metadata"].get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    return (str(ref["kind"]), str(ref["name"])) if ref else None


def drain_plan(deps: NodeDeps, cluster: str, nodes: list[str]) -> DrainPlan:
    """What draining ``nodes`` would evict, and which budgets would hold it up now (live reads)."""
    api_client = deps.kube.api_client(cluster)
    core, policy = k8s.CoreV1Api(api_client), k8s.PolicyV1Api(api_client)
    budgets = _json(policy.list_pod_disruption_budget_for_all_namespaces(_preload_content=False)).get("items", [])
    plan = DrainPlan(nodes=list(nodes))
    jobs: set[str] = set()
    blocked: set[str] = set()
    for node in nodes:
        listed = _json(core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                        _preload_content=False))
        for pod in sorted(listed.get("items", []), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
            meta = pod["metadata"]
            ident = f"{meta['namespace']}/{meta['name']}"
            owner = _owner(pod)
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if (owner and owner[0] == "DaemonSet") or MIRROR_ANNOTATION in (meta.get("annotations") or {}):
                plan.skipped.append(ident)
                continue
            covering = [b for b in budgets if b["metadata"]["namespace"] == meta["namespace"]
                        and match_selector((b.get("spec") or {}).get("selector"), meta.get("labels") or {})]
            names = [f"{b['metadata']['namespace']}/{b['metadata']['name']}" for b in covering]
            stuck = [n for n, b in zip(names, covering, strict=True)
                     if int((b.get("status") or {}).get("disruptionsAllowed") or 0) < 1]
            blocked.update(stuck)
            if owner:
                jobs.add(f"{owner[0]}/{meta['namespace']}/{owner[1]}")
            plan.pods.append(AffectedPod(namespace=meta["namespace"], name=meta["name"], node=node,
                                         phase=(pod.get("status") or {}).get("phase"),
                                         owner=f"{owner[0]}/{owner[1]}" if owner else None, budgets=names,
                                         blocked=bool(stuck)))
    plan.jobs, plan.blocked_by = sorted(jobs), sorted(blocked)
    return plan


class Evict(NodeStage):
    """Evict the plan's pods, then wait until they are gone from the nodes (read from the watch cache); pods a
    budget holds are asked again every :data:`RETRY_SECONDS` of wall-clock time, as the standard drain retries."""

    name = "evict"
    deadline = 1800.0  # past it the drain fails, naming the budget that held it up
    real_time_deadline = True  # a budget frees up when the workload's pods are ready: wall-clock time
    expected_seconds = 60.0

    def observe(self, ctx: StageContext[NodePlan]) -> Observed:
        if "pending" in ctx.data:
            return Observed.IN_PROGRESS
        plan = drain_plan(self.deps, ctx.request.cluster, [n.name for n in ctx.request.nodes])
        return Observed.ABSENT if plan.pods else Observed.DONE

    def act(self, ctx: StageContext[NodePlan]) -> None:
        plan = drain_plan(self.deps, ctx.request.cluster, [n.name for n in ctx.request.nodes])
        ctx.data["pending"] = {f"{p.namespace}/{p.name}": ", ".join(p.budgets) for p in plan.pods}
        ctx.data["evicted"] = []
        self._evict(ctx, list(ctx.data["pending"]))

    def _evict(self, ctx: StageContext[NodePlan], idents: list[str]) -> None:
        core = k8s.CoreV1Api(self.deps.kube.api_client(ctx.request.cluster))
        blocked: dict[str, str] = {}
        for ident in idents:
            namespace, name = ident.split("/", 1)
            try:
                core.create_namespaced_pod_eviction(name, namespace, k8s.V1Eviction(
                    metadata=k8s.V1ObjectMeta(name=name, namespace=namespace)))
            except NotFound:
                pass  # already gone
            except ServiceError as exc:
                if (exc.details or {}).get("http_status") not in (429, 500):
                    raise
                blocked[ident] = ctx.data["pending"].get(ident) or exc.message
                continue
            if ident not in ctx.data["evicted"]:
                ctx.data["evicted"].append(ident)
        ctx.data["blocked"], ctx.data["attempted_at"] = blocked, ctx.clock.now()

    def poll(self, ctx: StageContext[NodePlan]) -> Done | Wait:
        nodes = {n.name for n in ctx.request.nodes}
        informer = self.deps.informers.get(ctx.request.cluster, "pods")
        informer.wait_synced(20.0)
        present = {f"{p['metadata'].get('namespace')}/{p['metadata']['name']}" for p in informer.items()
                   if p["spec"].get("nodeName") in nodes and p["status"].get("phase") not in ("Succeeded", "Failed")}
        remaining = sorted(i for i in ctx.data["pending"] if i in present)
        if not remaining:
            return Done(f"evicted {len(ctx.data['pending'])} pod(s)")
        if ctx.clock.now() - float(ctx.data.get("attempted_at") or 0) >= RETRY_SECONDS:
            self._evict(ctx, [i for i in remaining if i in ctx.data["blocked"]])
        blocked = {i: b for i, b in ctx.data["blocked"].items() if i in remaining}
        if blocked:
            budgets = sorted(set(blocked.values()))
            return Wait(10.0, f"PodDisruptionBudget {', '.join(budgets)} allows no disruption now: "
                              f"{len(blocked)} pod(s) wait to be evicted ({', '.join(sorted(blocked)[:5])})")
        return Wait(5.0, f"{len(remaining)} evicted pod(s) still terminating")

    def result(self, ctx: StageContext[NodePlan]) -> dict[str, Any]:
        return {"evicted": ctx.data.get("evicted") or [], "blocked": ctx.data.get("blocked") or {}}
