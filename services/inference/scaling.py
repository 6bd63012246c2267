"""KEDA autoscaling of self-managed inference deployments: the ``inference`` noun's scaling verbs.

``preview_scaling`` renders the ScaledObject and says what the operation would install; ``set_scaling``
prechecks synchronously — the deployment is ours, bounds and at least one trigger, an SGLang engine that
exports metrics (``--enable-metrics``), no other KEDA on the cluster (the inference operator add-on's bundled copy
switched on, or a KEDA someone else installed) — before any operation row exists, then submits
``inference.scaling.set`` on the deployment's target (so it conflicts with its deploy, update and delete):
KEDA and Prometheus from the component registry on first use, then the ScaledObject. ``describe_scaling``
reads the ScaledObject's conditions, KEDA's HPA and the components; ``remove_scaling`` deletes the ScaledObject
(the Deployment keeps its replicas). While a ScaledObject scales a deployment, ``update_deployment`` refuses a
manual replicas change (409): KEDA owns the replica count, and the bounds are changed here.
"""

from __future__ import annotations

import shlex
from typing import Any

from kubernetes import client as k8s

from services.audit import AuditLog
from services.auth import Principal, Role
from services.aws import AwsClients
from services.clusters.create_base import FIELD_MANAGER
from services.clusters.registry import ClusterRegistry
from services.components import Target, kubeapi
from services.components.families import KEDA, ON_USE
from services.errors import Conflict, Invalid, NotFound
from services.inference import Inference, checks, inference_target, keda_install, manifest, scaledobject
from services.inference.keda_install import ComponentsStage
from services.inference.scaling_models import (
    ComponentView,
    ScalingPlan,
    ScalingPreview,
    ScalingRef,
    ScalingRequest,
    ScalingView,
)
from services.inference.scaling_stages import (
    ReadyStage,
    RemoveStage,
    ScaledObjectStage,
    ScalingDeps,
)
from services.kube import KubeClients
from services.operations import Engine, OperationKind, OperationView
from services.verbs import verb

SET_KIND = "inference.scaling.set"
REMOVE_KIND = "inference.scaling.remove"


class InferenceScaling:
    """Scaling verbs of the inference noun (built once by the composition root)."""

    noun = "inference"

    def __init__(self, inference: Inference, registry: ClusterRegistry, aws: AwsClients, kube: KubeClients,
                 engine: Engine, audit: AuditLog) -> None:
        self.inference = inference
        self.registry = registry
        self.aws = aws
        self.kube = kube
        self.audit = audit
        self._engine = engine
        self.deps = ScalingDeps(aws=aws.for_stages(), kube=kube)

    def kinds(self) -> list[OperationKind[Any]]:
        d = self.deps
        return [
            OperationKind(SET_KIND, ScalingPlan,
                          (ComponentsStage(d.target, ON_USE), ScaledObjectStage(d), ReadyStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="autoscale a self-managed inference deployment with KEDA (installs KEDA and "
                                      "Prometheus on first use)"),
            OperationKind(REMOVE_KIND, ScalingRef, (RemoveStage(d),),
                          target=lambda r: inference_target(r.cluster, r.name), role=Role.OPERATOR,
                          description="stop autoscaling a self-managed inference deployment"),
        ]

    # ----- facts ---------------------------------------------------------------------------------------------

    def _target(self, cluster: str) -> Target:
        return keda_install.cluster_target(self.registry, self.aws, self.kube, cluster)

    def _plan(self, principal: Principal, cluster: str, name: str,
              request: ScalingRequest) -> tuple[ScalingPlan, list[str]]:
        """Every precheck, then the plan and the components the operation would install: request-only checks
        before the cluster is asked anything."""
        if request.request_rate is None and request.queue_depth is None:
            raise Invalid("give at least one trigger: request_rate (requests per second per replica) or "
                          "queue_depth (waiting requests per replica)",
                          details={"fields": ["request_rate", "queue_depth"]})
        if request.min_replicas > request.max_replicas:
            raise Invalid(f"min_replicas {request.min_replicas} is above max_replicas {request.max_replicas}",
                          details={"field": "min_replicas"})
        self.registry.get(cluster)
        if checks.pool_named(self.inference.items(cluster, "deployments"), name) is not None:
            raise Conflict(f"{name} is a model pool: KEDA would scale it below the pods its services hold, which the "
                           "pool refuses (a ScaledObject would fight that guard); scale a pool with "
                           "inference_pool_scale", details={"pool": name})
        dep = self.inference.live_deployment(cluster, name)
        meta = dep.get("metadata") or {}
        namespace, engine = str(meta.get("namespace")), str((meta.get("labels") or {}).get(manifest.ENGINE_LABEL))
        containers = (dep.get("spec") or {}).get("containers") or []  # the watch cache's slim Deployment
        command = next((c.get("command") or [] for c in containers if c.get("name") == manifest.CONTAINER), [])
        if engine not in scaledobject.METRICS:
            raise Conflict(f"{name} names no engine InstantStart knows ({manifest.ENGINE_LABEL}={engine}): deploy it "
                           "again with inference_deploy", details={"engine": engine})
        if engine == "sglang" and "--enable-metrics" not in command:
            raise Conflict(f"{name} runs SGLang without --enable-metrics, so it exports no metrics to scale on: add "
                           f"the flag with inference_update (command: {shlex.join(command)} --enable-metrics), then "
                           "set autoscaling", details={"missing_flag": "--enable-metrics"})
        target = self._target(cluster)
        keda_install.check_no_other_keda(target)
        theirs = scaledobject.live(self.kube.api_client(cluster), namespace, name)
        if theirs is not None and not scaledobject.ours(theirs, name):
            raise Conflict(f"a ScaledObject {namespace}/{name} that InstantStart did not make already exists: delete "
                           "it first (two ScaledObjects cannot scale one Deployment)",
                           details={"scaled_object": f"{namespace}/{name}"})
        obj = scaledobject.render(name=name, namespace=namespace, engine=engine, deployment_uid=str(meta.get("uid")),
                                  request=request)
        plan = ScalingPlan(cluster=cluster, eks_cluster=target.eks_cluster, region=target.region,
                           account=target.account, name=name, namespace=namespace, scaled_object=obj,
                           requested_by=principal.name)
        return plan, keda_install.missing(target, ON_USE)

    def _dry_run(self, plan: ScalingPlan) -> bool:
        """The API server validates the ScaledObject against KEDA's CRD and stores nothing (a 422 names the
        field); False when KEDA's CRDs are not installed yet (the operation installs them first)."""
        api = self.kube.api_client(plan.cluster)
        if not kubeapi.served(api, scaledobject.API_VERSION):
            return False
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
            scaledobject.GROUP, scaledobject.VERSION, plan.namespace, scaledobject.PLURAL, plan.name,
            plan.scaled_object, field_manager=FIELD_MANAGER, force=True, dry_run="All",
            _content_type="application/apply-patch+yaml")
        return True

    # ----- verbs ---------------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def preview_scaling(self, principal: Principal, cluster: str, name: str,
                        request: ScalingRequest) -> ScalingPreview:
        """The ScaledObject a set would apply and the components it would install first; nothing is created."""
        plan, install = self._plan(principal, cluster, name, request)
        warnings = []
        if not self._dry_run(plan):
            warnings.append("KEDA's CRDs are not installed yet: the API server checks the ScaledObject when the "
                            "operation applies it, after installing KEDA")
        if install:
            warnings.append(f"first installs {', '.join(install)} on {cluster} (KEDA {KEDA.version})")
        return ScalingPreview(scaled_object=plan.scaled_object, install=install, warnings=warnings)

    @verb(Role.OPERATOR)
    def set_scaling(self, principal: Principal, cluster: str, name: str, request: ScalingRequest,
                    idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Autoscale the deployment (prechecked; then ``inference.scaling.set``: components → scaled_object →
        ready). Setting it again replaces the bounds and triggers."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(SET_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        plan, _ = self._plan(principal, cluster, name, request)
        self._dry_run(plan)
        return self._engine.submit(SET_KIND, plan, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def remove_scaling(self, principal: Principal, cluster: str, name: str,
                       idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Stop autoscaling (``inference.scaling.remove``): the ScaledObject and its HPA go, the replicas stay."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(REMOVE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        meta = self.inference.live_deployment(cluster, name).get("metadata") or {}
        namespace = str(meta.get("namespace"))
        live = scaledobject.read(self.kube.api_client(cluster), namespace, name)
        if live is None:
            raise NotFound(f"{name} is not autoscaled; inference_scaling_get shows a deployment's autoscaling")
        ref = ScalingRef(cluster=cluster, name=name, namespace=namespace, uid=str(live["metadata"].get("uid")),
                         requested_by=principal.name)
        return self._engine.submit(REMOVE_KIND, ref, principal, idempotency_key)

    @verb(Role.VIEWER)
    def describe_scaling(self, principal: Principal, cluster: str, name: str) -> ScalingView:
        """The deployment's ScaledObject (bounds, triggers, KEDA's Ready and Active), its HPA's replicas and
        metrics, and the KEDA and Prometheus components."""
        dep = self.inference.live_deployment(cluster, name)
        meta = dep.get("metadata") or {}
        namespace = str(meta.get("namespace"))
        spec_replicas = (dep.get("spec") or {}).get("replicas")
        replicas = 1 if spec_replicas is None else int(spec_replicas)
        target = self._target(cluster)
        components = [ComponentView(name=c.name, version=obs.version or c.version, status=obs.status,
                                    healthy=obs.healthy, detail=obs.detail)
                      for c, obs in ((c, c.observe(target)) for c in ON_USE)]
        api = self.kube.api_client(cluster)
        live = scaledobject.read(api, namespace, name)
        if live is None:
            return ScalingView(cluster=cluster, name=name, namespace=namespace, enabled=False, replicas=replicas,
                               components=components)
        spec = live.get("spec") or {}
        ready, active = scaledobject.condition(live, "Ready"), scaledobject.condition(live, "Active")
        view = ScalingView(
            cluster=cluster, name=name, namespace=namespace, enabled=True, replicas=replicas,
            min_replicas=spec.get("minReplicaCount"), max_replicas=spec.get("maxReplicaCount"),
            polling_interval=spec.get("pollingInterval"), cooldown_period=spec.get("cooldownPeriod"),
            triggers=scaledobject.triggers_of(live),
            ready=None if ready is None else ready.get("status") == "True",
            active=None if active is None else active.get("status") == "True",
            message=str((ready or {}).get("message") or ""), components=components)
        hpa_name = str((live.get("status") or {}).get("hpaName") or f"keda-hpa-{name}")
        try:
            hpa: Any = k8s.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(hpa_name, namespace)
        except NotFound:
            return view
        status = hpa.status
        view.desired_replicas, view.current_replicas = status.desired_replicas, status.current_replicas
        view.metrics = [f"{m.external.metric.name}: {m.external.current.average_value}"
                        for m in status.current_metrics or [] if m.external is not None]
        return view
