"""EKS ``UpdateNodegroupConfig``'s Kubernetes labels and taints, as EKS applies them: the node group's own
``labels`` / ``taints`` change (``addOrUpdate*`` then ``remove*``), and so do those of the group's Kubernetes
Nodes that joined the emulator (EKS labels every node of a managed node group ``eks.amazonaws.com/nodegroup``);
a label or taint the node group does not set is left alone. A taint is its key and effect, as in Kubernetes
(``kubectl taint``: the same key and effect replaces the value). The checks are EKS's for the payloads: a label
key or a taint both added and removed, or a taint effect outside the API's enum, is an
``InvalidParameterException``.
"""

from __future__ import annotations

from typing import Any

from sandbox.kube.cluster import Cluster, WriteOptions

from .base import AwsError

NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
MANAGER = "eks-nodegroup"
EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def _invalid(message: str) -> AwsError:
    return AwsError("InvalidParameterException", message, 400)


def node_config(group: dict[str, Any], p: dict[str, Any]) -> list[dict[str, str]]:
    """Apply the request's ``labels`` / ``taints`` payloads to ``group``; the update's params (EKS's
    ``LabelsToAdd``, ``LabelsToRemove``, ``TaintsToAdd``, ``TaintsToRemove``)."""
    params: list[dict[str, str]] = []
    labels_payload, taints_payload = p.get("labels") or {}, p.get("taints") or {}
    add, remove = dict(labels_payload.get("addOrUpdateLabels") or {}), list(labels_payload.get("removeLabels") or [])
    if set(add) & set(remove):
        raise _invalid(f"The label keys {sorted(set(add) & set(remove))} cannot be both added and removed")
    if add or remove:
        labels = {k: v for k, v in {**(group.get("labels") or {}), **add}.items() if k not in remove}
        group["labels"] = labels
        params += [{"type": "LabelsToAdd", "value": str(add)}] if add else []
        params += [{"type": "LabelsToRemove", "value": str(remove)}] if remove else []
    t_add, t_remove = list(taints_payload.get("addOrUpdateTaints") or []), list(taints_payload.get("removeTaints")
                                                                                 or [])
    for taint in t_add + t_remove:
        if taint.get("effect") not in EFFECTS:
            raise _invalid(f"Taint effect {taint.get('effect')!r} is not one of {', '.join(EFFECTS)}")
    if {(t["key"], t["effect"]) for t in t_add} & {(t["key"], t["effect"]) for t in t_remove}:
        raise _invalid("A taint cannot be both added and removed")
    if t_add or t_remove:  # a taint is its key and effect (Kubernetes'): an added one replaces that one's value
        gone = {(t["key"], t["effect"]) for t in t_remove} | {(t["key"], t["effect"]) for t in t_add}
        kept = [t for t in group.get("taints") or [] if (t["key"], t["effect"]) not in gone]
        group["taints"] = kept + [{k: v for k, v in t.items() if k in ("key", "value", "effect")} for t in t_add]
        params += [{"type": "TaintsToAdd", "value": str(t_add)}] if t_add else []
        params += [{"type": "TaintsToRemove", "value": str(t_remove)}] if t_remove else []
    return params


def relabel_nodes(cluster: Cluster, group: dict[str, Any], before: dict[str, Any]) -> None:
    """Bring the group's Nodes in line with its labels and taints: what it dropped since ``before`` (its labels
    and taints then) goes, what it sets now is set; anything else on a node stays."""
    rt = cluster.builtin("", "nodes")
    labels = dict(group.get("labels") or {})
    dropped = {k: None for k in before.get("labels") or {} if k not in labels}
    taints = [{k: v for k, v in (("key", t["key"]), ("value", t.get("value")), ("effect", EFFECTS[t["effect"]]))
               if v} for t in group.get("taints") or []]
    owned = {(t["key"], EFFECTS[t["effect"]]) for t in before.get("taints") or []} | {(t["key"], t["effect"])
                                                                                     for t in taints}
    for node in cluster.list(rt, None, label_selector=f"{NODEGROUP_LABEL}={group['nodegroupName']}").items:
        kept = [t for t in (node.get("spec") or {}).get("taints") or [] if (t.get("key"), t.get("effect")) not in owned]
        cluster.patch(rt, None, node["metadata"]["name"], "merge", {
            "metadata": {"labels": {**dropped, **labels}}, "spec": {"taints": kept + taints}},
            WriteOptions(manager=MANAGER))
