"""The Nodes pane rendered without a browser against a product installation with a sandbox cluster imported:
the grid coloured by health follows a node fault live (watch events, no refresh asked), actions ask for a
confirmation that says what they do before anything happens, the destructive ones are greyed out for an
operator, and a confirmed replace submits the operation through the verbs."""

from __future__ import annotations

import asyncio
import html
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import panel as pn
import pytest
from kubernetes import client as k8s

from app.bootstrap import Services
from panels.nodes import NodesPane, NodesState
from services.auth import Principal, Role
from services.nodes.models import NodeItem, NodeQuery, NodeSelection
from services.operations import OperationQuery
from tests.node_support import kube, node_cluster
from tests.sandbox_support import SeededServer
from tests.support import silence, wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("pane-admin", Role.ADMIN, "t-adm", "api")
OPERATOR = Principal("pane-operator", Role.OPERATOR, "t-op", "api")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeededServer, Services]]:
    with node_cluster(tmp_path_factory.mktemp("nodes-pane"), 2) as seeded, \
            seeded.imported(tmp_path_factory.mktemp("product") / "data", "hp-eks", ADMIN) as services:
        yield seeded, services


def grid(pane: NodesPane) -> str:
    return html.unescape(pane.grid.object)


def test_the_grid_follows_a_fault_live_and_actions_are_confirmed(world: tuple[SeededServer, Services]) -> None:
    seeded, services = world
    pane = NodesPane(services.nodes, services.clusters, services.bus, ADMIN)
    pn.panel(pane).get_root()  # renders alone, as in a notebook
    wait_until(lambda: grid(pane).count("data-health='Schedulable'") == 2, 60, "both nodes in the grid")
    assert pane.picker.value == "hp-eks" and len(pane.table.value) == 2
    sick: Any = pane.state.nodes[0]
    fault = seeded.live.post("/api/v1/sandbox/faults", {"kind": "node_persistent_fault", "target": {
        "cluster": "hp-eks", "node": sick.instance_id}})
    assert fault.status_code == 201, fault.text

    def red() -> bool:
        services.bus.drain()
        return f"data-node='{sick.name}' data-health='UnschedulablePendingReplacement'" in grid(pane)

    wait_until(red, 60, "the grid to show the fault from watch events alone")
    assert "NvidiaGpuXidError" in grid(pane)

    # the pane has no loop: each heartbeat re-reads it on the bus's thread, and a read that began before the
    # click below writes back the selection it saw (none); the rest of the test is about the actions
    silence(pane._kube)
    pane.table.selection = [0]
    assert pane.state.selected == [sick.name]
    pane.buttons["replace"].clicks += 1  # first click: only the confirmation
    assert pane.state.pending == "replace" and pane.confirm_button.visible
    assert "DESTROYS root and secondary volumes" in pane.state.message
    pane.cancel_button.clicks += 1
    assert pane.state.pending == "" and "nothing was done" in pane.state.message
    assert services.engine.list(OperationQuery(kind="node.replace")) == []

    pane.buttons["replace"].clicks += 1
    assigned: list[int] = []
    pane.state.param.watch(lambda _e: assigned.append(threading.get_ident()), ["message", "pending", "busy"])
    asyncio.run(pane.state.confirm())  # what Confirm runs: the verb in a worker thread
    (replace,) = services.engine.list(OperationQuery(kind="node.replace"))
    assert replace.target == f"cluster/hp-eks/node/{sick.name}" and replace.id in pane.state.message
    assert assigned and set(assigned) == {threading.get_ident()}, "params assigned on the loop, not in the worker"

    operator_pane = NodesPane(services.nodes, services.clusters, services.bus, OPERATOR)
    assert operator_pane.buttons["replace"].disabled and operator_pane.buttons["delete"].disabled
    assert not operator_pane.buttons["reboot"].disabled and not operator_pane.buttons["drain"].disabled


def test_the_drain_confirmation_shows_its_pods_jobs_and_blocking_budgets(world: tuple[SeededServer, Services],
                                                                         tmp_path: Path) -> None:
    seeded, services = world
    pane = NodesPane(services.nodes, services.clusters, services.bus, ADMIN)
    wait_until(lambda: len(pane.state.nodes) == 2, 60, "both nodes listed")
    node = pane.state.nodes[1].name
    api = kube(seeded, tmp_path)
    apps, policy, core = k8s.AppsV1Api(api), k8s.PolicyV1Api(api), k8s.CoreV1Api(api)
    labels = {"app": "pane-trainer"}
    apps.create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "pane-trainer"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                                     "containers": [{"name": "c", "image": "busybox"}]}}}})
    policy.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pane-pdb"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})
    wait_until(lambda: [p for p in core.list_namespaced_pod("default", label_selector="app=pane-trainer").items
                        if p.status.phase == "Running"], 60, "the trainer running")
    wait_until(lambda: policy.read_namespaced_pod_disruption_budget("pane-pdb", "default").status.expected_pods
               == 1, 60, "the budget's status")
    wait_until(lambda: services.nodes.plan_drain(ADMIN, "hp-eks", NodeSelection(nodes=[node])).blocked_by, 60,
               "the product's caches to see the budget")
    silence(pane._kube)  # a heartbeat's re-read would write back the selection it saw before the next line
    pane.state.selected = [node]
    asyncio.run(pane.state.ask_drain())  # what the Drain button runs
    message = pane.state.message
    assert pane.state.pending == "drain" and "default/pane-trainer-" in message
    assert "ReplicaSet/default/pane-trainer-" in message
    assert "default/pane-pdb" in message and "waits for them" in message
    assert services.engine.list(OperationQuery(kind="node.drain")) == [], "nothing before the confirmation"


class HeldNodes(NodesState):
    """The pane's state whose first read, once it has read the verbs, waits for ``release`` before answering
    (the order of two overlapping reads, made deterministic; the reading itself is the product's)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read_once, self.release = threading.Event(), threading.Event()

    def fetch(self) -> tuple[list[str], str, list[NodeItem], str]:
        read = super().fetch()
        if not self.read_once.is_set():
            self.read_once.set()
            assert self.release.wait(60), "the first read was never released"
        return read


def test_an_older_read_that_finishes_last_does_not_put_back_what_it_saw(world: tuple[SeededServer, Services],
                                                                        tmp_path: Path) -> None:
    seeded, services = world
    state = HeldNodes(services.nodes, services.clusters, ADMIN)
    first = threading.Thread(target=state.reload, name="older-read")  # the no-loop path: a bus thread's read
    first.start()
    assert state.read_once.wait(60), "the first read never read"
    node = next(n.name for n in services.nodes.list_nodes(ADMIN, "hp-eks", NodeQuery()).nodes if not n.cordoned)
    core = k8s.CoreV1Api(kube(seeded, tmp_path))
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        wait_until(lambda: any(n.name == node and n.cordoned
                               for n in services.nodes.list_nodes(ADMIN, "hp-eks", NodeQuery()).nodes),
                   60, "the product's cache to see the cordon")
        state.reload()  # the newer read, here
        assert any(n.name == node and n.cordoned for n in state.nodes)
        state.release.set()
        first.join(60)
        assert not first.is_alive()
        assert any(n.name == node and n.cordoned for n in state.nodes), "the older answer overwrote the newer one"
    finally:
        state.release.set()
        core.patch_node(node, {"spec": {"unschedulable": False}})
