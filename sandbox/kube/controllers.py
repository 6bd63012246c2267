"""The control loops of an emulated cluster: what kube-controller-manager, kube-scheduler and the kubelets
do to a real one, so that a Deployment gets its ReplicaSet and pods, a pod gets a node and runs, a Job
completes, a DaemonSet covers its nodes and every namespace has its ``default`` ServiceAccount.

One thread per cluster, driven by the store's watch events only (no polling): the store hands each change
to :meth:`Controllers._on_event` under its lock, which only queues it; the thread drains every queued
change at once, so a burst (a thousand nodes joining) costs one pass, not a thousand. Each pass works out
what the changes touch (the owner of a changed pod, every DaemonSet on a node change, the pending pods
when capacity changed) and reconciles exactly that, writing through the cluster's own API like any
client, so watchers and ``kubectl`` see ordinary updates. Reconcilers are level-based and their writes
converge: a write that changes nothing stores nothing and raises no event, so the loop goes quiet.

The workload controllers are in :mod:`.workloads`, the scheduler and the kubelet in :mod:`.scheduler`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from . import (
    aggregator,
    disruption,
    hpto,
    inference_engines,  # noqa: F401  (registers the simulated vLLM and SGLang servers with the kubelet)
    inference_operator,
    keda,
    keda_certs,  # noqa: F401  (registers the simulated KEDA operator's certificate rotation with the kubelet)
    kubeflow,
    kuberay,
    load_balancers,
    processes,
    scheduler,
    sglang_router,  # noqa: F401  (registers the simulated SGLang router with the kubelet)
    training_workload,  # noqa: F401  (registers the simulated trainer with the kubelet)
    volumes,
    workloads,
)
from .admission import ensure_default_service_account
from .cluster import Cluster
from .devices import plugin_resources
from .errors import ApiError
from .resources import NAMESPACE_KEY, POD_KEY
from .store import Key, Loc, Obj, WatchEvent

log = logging.getLogger(__name__)

NODE_KEY: Key = ("", "nodes")
SA_KEY: Key = ("", "serviceaccounts")
# Workload kinds: storage key -> reconciler.
RECONCILERS: dict[Key, Callable[[Cluster, Loc], None]] = {
    ("apps", "deployments"): workloads.reconcile_deployment,
    ("apps", "replicasets"): workloads.reconcile_replicaset,
    ("batch", "jobs"): workloads.reconcile_job,
    ("apps", "daemonsets"): workloads.reconcile_daemonset,
    ("apps", "statefulsets"): workloads.reconcile_statefulset,
    # Training operators: their kinds exist only once their CRDs are installed (the add-ons' components).
    hpto.KEY: hpto.reconcile,
    kubeflow.KEY: kubeflow.reconcile,
    kuberay.KEY: kuberay.reconcile_rayjob,
    kuberay.CLUSTER_KEY: kuberay.reconcile_raycluster,
    inference_operator.KEY: inference_operator.reconcile,
    inference_operator.JUMPSTART_KEY: inference_operator.reconcile_jumpstart,
    keda.KEY: keda.reconcile,
    load_balancers.KEY: load_balancers.reconcile,  # the AWS Load Balancer Controller's, where it runs
    aggregator.KEY: aggregator.reconcile,  # kube-aggregator's availability of APIServices
}
# Kinds whose operators react to node health (a node fault restarts their jobs).
NODE_WATCHERS: tuple[Key, ...] = (hpto.KEY, kubeflow.KEY)
_KIND_KEYS: dict[str, Key] = {"Deployment": ("apps", "deployments"), "ReplicaSet": ("apps", "replicasets"),
                              "Job": ("batch", "jobs"), "DaemonSet": ("apps", "daemonsets"),
                              "StatefulSet": ("apps", "statefulsets"), hpto.KIND: hpto.KEY,
                              kubeflow.KIND: kubeflow.KEY, kuberay.KIND: kuberay.KEY,
                              kuberay.CLUSTER_KIND: kuberay.CLUSTER_KEY,
                              inference_operator.KIND: inference_operator.KEY,
                              inference_operator.JUMPSTART_KIND: inference_operator.JUMPSTART_KEY, keda.KIND: keda.KEY}


@dataclass
class Work:
    """What one pass has to reconcile."""

    objects: set[tuple[Key, Loc]] = field(default_factory=set)
    pods: set[Loc] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    removed_nodes: set[str] = field(default_factory=set)
    retry: set[str] = field(default_factory=set)  # namespaces whose workloads to reconcile again
    budgets: set[str] = field(default_factory=set)  # namespaces whose disruption budgets to recount
    claims: bool = False
    plugin_pods: list[tuple[Obj, bool]] = field(default_factory=list)  # (pod, deleted) for the device gate
    schedule: bool = False
    daemonsets: bool = False


class Controllers:
    """The control loops of one cluster; :meth:`start` runs them on a daemon thread until :meth:`stop`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._events: list[WatchEvent] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._working = False
        self._thread: threading.Thread | None = None
        self.passes = 0  # reconcile passes run (benchmarks read it)

    def start(self) -> Controllers:
        self.cluster.store.subscribe(None, self._on_event)
        self._resync()
        self._thread = threading.Thread(target=self._run, name=f"kube-controllers-{self.cluster.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.cluster.store.unsubscribe(self._on_event)
        processes.stop_cluster(self.cluster)
        keda.stop_cluster(self.cluster)
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _on_event(self, event: WatchEvent) -> None:
        with self._cond:  # called under the store lock: only queue
            self._events.append(event)
            self._cond.notify()

    def _resync(self) -> None:
        """Everything, once: at start (a restored snapshot has objects no event will announce)."""
        store = self.cluster.store
        work = Work(schedule=True, daemonsets=True, claims=True)
        work.namespaces = {loc[1] for loc, _ in store.items(NAMESPACE_KEY)}
        for key in RECONCILERS:
            work.objects |= {(key, loc) for loc, _ in store.items(key)}
        work.pods = {loc for loc, _ in store.items(POD_KEY)}
        work.plugin_pods = [(pod, False) for _, pod in store.items(POD_KEY) if plugin_resources(pod)]
        work.budgets = {loc[0] for loc, _ in store.items(disruption.PDB_KEY)}
        self._pass(work)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._events and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                events, self._events = self._events, []
                self._working = True
            try:
                self._pass(self._plan(events))
            except Exception:  # a controller bug must not stop the cluster's other loops for good
                log.exception("controller pass failed in cluster %s", self.cluster.name)
            finally:
                with self._cond:
                    self._working = False

    def busy(self) -> bool:
        """Whether a change is queued or being reconciled (False: the loops are quiet)."""
        with self._cond:
            return self._working or bool(self._events)

    def _plan(self, events: list[WatchEvent]) -> Work:
        work = Work()
        for event in events:
            meta = event.obj["metadata"]
            loc: Loc = (meta.get("namespace", ""), meta["name"])
            if event.key == POD_KEY:
                work.pods.add(loc)
                if self.cluster.devices is not None and plugin_resources(event.obj):
                    work.plugin_pods.append((event.obj, event.type == "DELETED"))
                work.budgets.add(loc[0])
                self._owner_work(work, event)
                spec = event.obj.get("spec") or {}
                if event.type == "DELETED" or not spec.get("nodeName") or \
                        (event.obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    work.schedule = True  # a new pending pod, or capacity freed
            elif event.key == NODE_KEY:
                work.schedule = work.daemonsets = True
                for key in NODE_WATCHERS:
                    work.objects |= {(key, loc) for loc, _ in self.cluster.store.items(key)}
                if event.type == "DELETED":
                    work.removed_nodes.add(meta["name"])
            elif event.key in RECONCILERS:
                work.objects.add((event.key, loc))
                work.objects |= load_balancers.woken_by(self.cluster, event)
                work.objects |= aggregator.woken_by(self.cluster, event)
                self._owner_work(work, event)
            elif event.key in (volumes.PVC_KEY, volumes.PV_KEY, volumes.SC_KEY, volumes.CSI_KEY):
                work.claims = True
                work.schedule |= event.key == volumes.PVC_KEY  # a bound claim lets its pods schedule
            elif event.key in (volumes.CONFIGMAP_KEY, ("", "secrets")) and event.type != "DELETED":
                work.objects |= aggregator.woken_by(self.cluster, event)  # a server's certificate changed
                # a bound pod waiting to mount it (or for a Secret its env names) starts now
                work.pods |= {p for p, pod in self.cluster.store.items(POD_KEY, loc[0])
                              if (pod.get("spec") or {}).get("nodeName")
                              and (pod.get("status") or {}).get("phase", "Pending") == "Pending"}
            elif event.key == disruption.PDB_KEY:
                work.budgets.add(loc[0])
            elif event.key == NAMESPACE_KEY and event.type != "DELETED":
                work.namespaces.add(meta["name"])
            elif event.key == SA_KEY and event.type == "DELETED" and meta["name"] == "default":
                work.namespaces.add(loc[0])
            elif event.key == SA_KEY and event.type == "ADDED":
                work.retry.add(loc[0])  # pods refused for want of this account can be created now
        return work

    @staticmethod
    def _owner_work(work: Work, event: WatchEvent) -> None:
        for obj in (event.obj, event.old):
            for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or ():
                key = _KIND_KEYS.get(ref.get("kind", ""))
                if key is not None and ref.get("controller"):
                    work.objects.add((key, (event.obj["metadata"].get("namespace", ""), ref.get("name", ""))))

    def _pass(self, work: Work) -> None:
        self.passes += 1
        cluster = self.cluster
        for namespace in sorted(work.namespaces):
            ensure_default_service_account(cluster, namespace)
        if work.removed_nodes:
            scheduler.collect_pods_of_removed_nodes(cluster, work.removed_nodes)
        for key in RECONCILERS:
            work.objects |= {(key, loc) for loc, _ in cluster.store.items(key) if loc[0] in work.retry}
        if work.daemonsets:
            work.objects |= {(("apps", "daemonsets"), loc) for loc, _ in cluster.store.items(("apps", "daemonsets"))}
        for key in RECONCILERS:  # owners before what they own: a Deployment's ReplicaSet in the same pass
            for k, loc in sorted(o for o in work.objects if o[0] == key):
                _guarded(RECONCILERS[k], cluster, loc)
        if work.claims:
            volumes.reconcile_claims(cluster)
        if work.schedule:
            scheduler.schedule_pending(cluster)
        for loc in sorted(work.pods):
            _guarded(scheduler.run_pod, cluster, loc)
        if cluster.devices is not None:
            for pod, deleted in work.plugin_pods:
                cluster.devices.observe(cluster, pod, deleted)
        for namespace in sorted(work.budgets):
            if cluster.store.items(disruption.PDB_KEY, namespace):
                disruption.reconcile_budgets(cluster, namespace)


def _guarded(reconcile: Callable[[Cluster, Loc], None], cluster: Cluster, loc: Loc) -> None:
    """One reconcile; an API refusal (a conflicting concurrent write, an object deleted meanwhile) is retried
    on the event that change raised."""
    try:
        reconcile(cluster, loc)
    except ApiError as exc:
        log.debug("reconcile of %s in %s deferred: %s", loc, cluster.name, exc)
