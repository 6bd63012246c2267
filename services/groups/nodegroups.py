"""An EKS managed node group's side of the ``instance_groups`` noun: its Kubernetes labels and taints as EKS
spells them (botocore eks 2017-11-01: ``UpdateNodegroupConfig``'s ``labels`` {``addOrUpdateLabels``,
``removeLabels``} and ``taints`` {``addOrUpdateTaints``, ``removeTaints``}, taint effects ``NO_SCHEDULE`` /
``NO_EXECUTE`` / ``PREFER_NO_SCHEDULE``, keys and values at most 63 characters), and the one function from a
node group as DescribeNodegroup shows it plus what the caller asked to the ``UpdateNodegroupConfig`` parameters
that get it there — empty when it already is, so a re-sent state writes nothing.

The caller gives whole sets (the same contract as a HyperPod group's ``labels`` / ``taints``); EKS takes
changes, so the sets are diffed here against the node group's actual ones. Nothing here reads or writes AWS.
"""

from __future__ import annotations

from typing import Any

from services.errors import Invalid

#: Kubernetes taint effect -> EKS's spelling
EFFECTS = {"NoSchedule": "NO_SCHEDULE", "NoExecute": "NO_EXECUTE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}
KUBE_EFFECTS = {v: k for k, v in EFFECTS.items()}
MAX_LENGTH = 63  # EKS labelKey, labelValue, taintKey, taintValue


def eks_taints(taints: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Request taints (``key``, ``value``, ``effect`` in Kubernetes' spelling) as EKS takes them."""
    return [{"key": t["key"], **({"value": t["value"]} if t.get("value") else {}), "effect": EFFECTS[t["effect"]]}
            for t in taints]


def view_taints(group: dict[str, Any]) -> list[dict[str, str]]:
    """A node group's taints in the shape a HyperPod group's view shows (``Key``, ``Value``, ``Effect``)."""
    return [{"Key": t["key"], **({"Value": t["value"]} if t.get("value") else {}),
             "Effect": KUBE_EFFECTS.get(t["effect"], t["effect"])} for t in group.get("taints") or []]


def check_lengths(name: str, labels: dict[str, str] | None, taints: list[dict[str, Any]] | None) -> None:
    """EKS's limits on label and taint keys and values, refused before anything is sent."""
    long = [k for k, v in (labels or {}).items() if len(k) > MAX_LENGTH or len(v) > MAX_LENGTH]
    long += [t["key"] for t in taints or [] if len(t["key"]) > MAX_LENGTH or len(t.get("value") or "") > MAX_LENGTH]
    if long:
        raise Invalid(f"{name} is an EKS managed node group: its label and taint keys and values are at most "
                      f"{MAX_LENGTH} characters; too long: {', '.join(long)}", details={"too_long": long})


def nodegroup_update(group: dict[str, Any], scaling: dict[str, int] | None, labels: dict[str, str] | None,
                     taints: list[dict[str, str]] | None) -> dict[str, Any]:
    """``UpdateNodegroupConfig``'s parameters (besides the names) that bring ``group`` (DescribeNodegroup's) to
    the asked ``scaling``, ``labels`` and ``taints`` (whole sets, EKS's spelling; None: untouched)."""
    out: dict[str, Any] = {}
    if scaling and any((group.get("scalingConfig") or {}).get(k) != v for k, v in scaling.items()):
        out["scalingConfig"] = dict(scaling)
    if labels is not None:
        current = dict(group.get("labels") or {})
        add = {k: v for k, v in labels.items() if current.get(k) != v}
        remove = sorted(k for k in current if k not in labels)
        payload: dict[str, Any] = {**({"addOrUpdateLabels": add} if add else {}),
                                   **({"removeLabels": remove} if remove else {})}
        if payload:
            out["labels"] = payload

    def key(t: dict[str, Any]) -> tuple[str, str, str]:
        return t["key"], t.get("value") or "", t["effect"]

    if taints is not None:
        # a taint is its key and effect, as in Kubernetes (the API's docs say only "added or updated"):
        # addOrUpdateTaints replaces the value of the same key and effect, so that one is not also removed
        current_taints = list(group.get("taints") or [])
        have, wanted = {key(t) for t in current_taints}, {(t["key"], t["effect"]) for t in taints}
        add_taints = [t for t in taints if key(t) not in have]
        remove_taints = [{"key": t["key"], **({"value": t["value"]} if t.get("value") else {}), "effect": t["effect"]}
                         for t in current_taints if (t["key"], t["effect"]) not in wanted]
        payload = {**({"addOrUpdateTaints": add_taints} if add_taints else {}),
                   **({"removeTaints": remove_taints} if remove_taints else {})}
        if payload:
            out["taints"] = payload
    return out
