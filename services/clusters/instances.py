"""Which Kubernetes node is which HyperPod instance: the mapping every node read and the ``verify`` stage use.

HyperPod guarantees its own inventory (``ListClusterNodes``: instance id, group, status); the node labels it
writes (``instance-group-name`` above all) are documented only by third parties, and anyone may set them on
any node. So a node counts as a HyperPod instance only when its EC2 instance id (the tail of its
``spec.providerID``, else of its name, ``hyperpod-<instance id>``) is in that inventory.
"""

from __future__ import annotations

import re
from typing import Any

INSTANCE_ID = re.compile(r"(i-[0-9a-f]{8,17})$")


def instance_id_of(name: str, provider_id: str | None) -> str | None:
    """The EC2 instance id behind a Kubernetes node, from its provider id or its name; None if neither names one."""
    for text in (provider_id or "", name):
        found = INSTANCE_ID.search(text)
        if found:
            return found.group(1)
    return None


def group_instances(sagemaker: Any, cluster: str, group: str) -> dict[str, dict[str, Any]]:
    """``ListClusterNodes`` of one instance group (all pages), by instance id."""
    nodes = sagemaker.all_pages("list_cluster_nodes", "ClusterNodeSummaries", ClusterName=cluster,
                                InstanceGroupNameContains=group)
    return {n["InstanceId"]: n for n in nodes if n.get("InstanceGroupName") == group and n.get("InstanceId")}
