"""PodDisruptionBudgets: the disruption controller's status and the eviction subresource that honours it.

An eviction (``POST pods/<name>/eviction``, what ``kubectl drain`` and HyperPod's patching send) deletes a
pod only if no budget forbids it: a pod that is not running may always go; otherwise its one matching
budget must allow a disruption, or the answer is the API server's ``429 TooManyRequests``, "Cannot evict
pod as it would violate the pod's disruption budget.", with the ``DisruptionBudget`` cause. A pod
matched by more than one budget cannot be evicted (500), as on a real cluster. Budgets are evaluated on
the live pods (the emulator deletes an evicted pod at once, so there are no in-flight disruptions to
track); ``expectedPods`` counts the matching pods that are not terminal.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from . import deletion
from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .resources import POD_KEY, ResourceType
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Loc, Obj

PDB_KEY = ("policy", "poddisruptionbudgets")
MANAGER = WriteOptions(manager="kube-controller-manager")


def _matches(pdb: Obj, pod: Obj) -> bool:
    selector = (pdb.get("spec") or {}).get("selector")
    if not selector:
        return False  # policy/v1: a null selector selects nothing (an empty one selects every pod)
    try:
        requirements = parse_label_selector(label_selector_from_match(selector))
    except ApiError:
        return False
    return labels_match(requirements, pod["metadata"].get("labels") or {})


def _healthy(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return not pod["metadata"].get("deletionTimestamp") and status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1] or 0) * total / 100)
    return int(value or 0)


def budget(cluster: Cluster, pdb: Obj) -> dict[str, int]:
    """``currentHealthy``, ``desiredHealthy``, ``expectedPods`` and ``disruptionsAllowed`` of ``pdb`` now."""
    namespace = pdb["metadata"]["namespace"]
    pods = [p for _, p in cluster.store.items(POD_KEY, namespace) if _matches(pdb, p)
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    expected = len(pods)
    healthy = sum(1 for p in pods if _healthy(p))
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        desired = max(expected - _scaled(spec["maxUnavailable"], expected), 0)
    else:
        desired = _scaled(spec.get("minAvailable", 1), expected)
    return {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
            "disruptionsAllowed": max(healthy - desired, 0)}


def reconcile_budgets(cluster: Cluster, namespace: str) -> None:
    """Write the status of every budget in ``namespace`` (only when it changed)."""
    rt = cluster.builtin("policy", "poddisruptionbudgets")
    for _, pdb in cluster.store.items(PDB_KEY, namespace):
        if pdb["metadata"].get("deletionTimestamp"):
            continue
        counts = budget(cluster, pdb)
        allowed = counts["disruptionsAllowed"] > 0
        old = pdb.get("status") or {}
        old_cond: dict[str, Any] = next(
            (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), {})
        status_word = "True" if allowed else "False"
        now = cluster.now_iso()
        condition = {"type": "DisruptionAllowed", "status": status_word,
                     "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                     "observedGeneration": pdb["metadata"].get("generation", 1),
                     "lastTransitionTime": old_cond.get("lastTransitionTime", now)
                     if old_cond.get("status") == status_word else now}
        status = {**counts, "observedGeneration": pdb["metadata"].get("generation", 1), "conditions": [condition]}
        if old.get("disruptedPods"):
            status["disruptedPods"] = old["disruptedPods"]
        if status == old:
            continue
        meta = pdb["metadata"]
        with contextlib.suppress(ApiError):
            cluster.replace(rt, meta["namespace"], meta["name"], {**pdb, "status": status}, MANAGER, "status")


def evict(cluster: Cluster, rt: ResourceType, namespace: str | None, name: str, *, dry_run: bool = False) -> None:
    """The eviction subresource: delete the pod unless a disruption budget forbids it."""
    with cluster.store.lock:
        loc: Loc = (namespace or "default", name)
        pod = cluster.store.get(POD_KEY, loc)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        if (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
            budgets = [pdb for _, pdb in cluster.store.items(PDB_KEY, loc[0]) if _matches(pdb, pod)]
            if len(budgets) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                               "eviction subresource does not support.")
            if budgets:
                counts = budget(cluster, budgets[0])
                # A healthy pod needs an allowed disruption; an unhealthy one only a budget that holds
                # (unhealthyPodEvictionPolicy IfHealthyBudget, the default).
                refused = counts["disruptionsAllowed"] < 1 if _healthy(pod) else \
                    counts["currentHealthy"] < counts["desiredHealthy"]
                if refused:
                    raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                   "disruption budget.", {"causes": [{
                                       "reason": "DisruptionBudget",
                                       "message": f"The disruption budget {budgets[0]['metadata']['name']} needs "
                                                  f"{counts['desiredHealthy']} healthy pods and has "
                                                  f"{counts['currentHealthy']} currently"}]})
        deletion.delete(cluster, rt, loc[0], name, dry_run=dry_run)
