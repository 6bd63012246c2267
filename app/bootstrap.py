"""``build_services``: the one composition root (no module singletons anywhere else)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.sandbox import aws_endpoint, aws_session, sandbox_enabled, use_sandbox_mlflow
from services.audit import AuditLog
from services.auth import TokenStore
from services.aws import AwsClients
from services.awscache import AwsCache
from services.backups import Backups
from services.clock import Clock
from services.clusters import Clusters
from services.clusters.events import ClusterTimeline
from services.clusters.registry import ClusterRegistry
from services.db import Database
from services.events import EventBus
from services.features import Features
from services.groups import InstanceGroups
from services.inference import Inference
from services.inference.managed import ManagedEndpoints
from services.inference.pool import Pools
from services.inference.router import Routers
from services.inference.scaling import InferenceScaling
from services.informers import Informers
from services.kube import KubeClients
from services.limits import Slots
from services.logs import JobLogs
from services.logs.archive_stage import ArchiveLogsStage
from services.metrics import Metrics
from services.mlflow import MlflowTracking
from services.mlflow.live import MetricsLive
from services.mlflow.metrics import RunReader, TrainingMetrics
from services.nodes import Nodes
from services.operation_verbs import Operations
from services.operations import Backoff, Engine, lock_data_dir
from services.sessions import SessionStore, SignInThrottle
from services.settings import Settings
from services.tokens import Tokens
from services.training import Jobs
from services.training.downloads import Downloads
from services.training.recipes.service import Recipes

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    clock: Clock
    db: Database
    bus: EventBus
    audit: AuditLog
    tokens: TokenStore
    engine: Engine
    aws: AwsClients
    kube: KubeClients
    backups: Backups
    sessions: SessionStore
    signin: SignInThrottle
    websockets: Slots
    longpolls: Slots
    informers: Informers
    clusters: Clusters
    token_verbs: Tokens
    operations: Operations
    timeline: ClusterTimeline
    features: Features
    nodes: Nodes
    recipes: Recipes
    groups: InstanceGroups
    jobs: Jobs
    logs: JobLogs
    downloads: Downloads
    inference: Inference
    pools: Pools
    inference_scaling: InferenceScaling
    managed_inference: ManagedEndpoints
    inference_routers: Routers
    mlflow: MlflowTracking
    training_metrics: TrainingMetrics
    metrics_live: MetricsLive

    def lock(self) -> None:
        """Take the data directory's lock (start-up order: lock, sandbox reachable, registry, resume)."""
        self.engine.acquire_lock()

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()
        self.logs.stop()
        self.metrics_live.stop()
        self.clusters.reader.close()  # no background AWS refresh starts after this
        self.informers.stop()
        self.bus.close()  # no subscriber (a pane's refresh) is mid-query when the connections close
        self.db.close()


def engine_pace(settings: Settings, sandboxed: bool) -> float:
    """The engine's pace: the setting, else the sandbox's clock speed (a 10 s poll is 10 simulated seconds),
    else 1 (real time against AWS). Decided here, by configuration: services never ask which world it is."""
    if settings.engine_pace is not None:
        return settings.engine_pace
    return 1.0 / settings.sandbox_speed if sandboxed else 1.0


def build_services(settings: Settings, clock: Clock | None = None, *, exclusive: bool = False) -> Services:
    """``exclusive`` (serve): take the data directory's lock first, before the database is opened or migrated
    and the registry loaded, so a second server refuses before touching anything."""
    data = settings.ensure_data_dir()
    lock = lock_data_dir(data / "engine.lock") if exclusive else None
    clock = clock or Clock()
    db = Database(data / "state.db")
    bus = EventBus()
    audit = AuditLog(db, clock)
    sandboxed = sandbox_enabled(settings)
    metrics = Metrics()
    engine = Engine(db, bus, audit, clock, workers=settings.workers, lock_path=data / "engine.lock",
                    metrics=metrics, pace=engine_pace(settings, sandboxed),
                    deadline_floor=settings.stage_deadline_floor,
                    backoff=Backoff(settings.retry_backoff_base, settings.retry_backoff_max))
    if lock is not None:
        engine.adopt_lock(lock)
    if sandboxed and settings.aws_endpoint_url is None:
        aws = AwsClients(settings.region, aws_endpoint(settings), session=aws_session(settings),
                         on_call=metrics.aws_call)
        use_sandbox_mlflow(settings)
    else:
        aws = AwsClients(settings.region, settings.aws_endpoint_url, on_call=metrics.aws_call)
    backups = Backups(db, data / "backups", engine, keep=settings.backup_keep,
                      reserve_bytes=settings.backup_reserve_bytes)
    kube = KubeClients(aws, clock, ca_dir=data / "ca")
    registry = ClusterRegistry(db, clock, kube)
    registry.load()  # the only clusters the product reaches: each as an EKS source, with or without the sandbox
    informers = Informers(kube, bus, on_list=metrics.informer_listed)
    metrics.track_informers(informers.ages)
    clusters = Clusters(settings, clock, aws, registry, informers, AwsCache(clock), engine, audit, bus, kube)
    for kind in clusters.kinds():
        engine.register(kind)
    features = Features(settings, aws, kube, registry, engine, clusters.cache)
    nodes = Nodes(registry, informers, aws, kube, clusters.cache, engine, audit)
    groups = InstanceGroups(clusters, aws, kube, clusters.cache, engine)
    recipes = Recipes(registry, informers, kube)
    logs = JobLogs(registry, kube, aws, settings.shared_bucket)
    mlflow = MlflowTracking(settings, aws, kube, registry, engine)
    mlflow_reader = RunReader(session=aws.session)
    training_metrics = TrainingMetrics(kube, mlflow_reader)
    jobs = Jobs(registry, informers, kube, engine, audit, renderer=recipes.render_job,
                submit_stages=mlflow.job_stages(), delete_stages=[ArchiveLogsStage(logs)],
                progress=training_metrics.progress)
    downloads = Downloads(registry, kube, engine, audit)
    inference = Inference(registry, informers, kube, engine, audit, logs)
    pools = Pools(inference, engine)
    inference_scaling = InferenceScaling(inference, registry, aws, kube, engine, audit)
    managed_inference = ManagedEndpoints(registry, informers, aws, kube, engine, audit)
    inference_routers = Routers(registry, informers, kube, engine, audit)
    for kind in [*features.kinds(), *nodes.kinds(), *groups.kinds(), *jobs.kinds(), *downloads.kinds(),
                 *inference.kinds(), *inference_scaling.kinds(), *managed_inference.kinds(),
                 *inference_routers.kinds(), *pools.kinds(), *mlflow.kinds()]:
        engine.register(kind)
    tokens = TokenStore(db, clock)
    return Services(
        settings=settings, clock=clock, db=db, bus=bus, audit=audit, tokens=tokens,
        engine=engine, aws=aws, kube=kube, backups=backups,
        sessions=SessionStore(db, clock, tokens, lifetime=settings.session_lifetime,
                              idle_timeout=settings.session_idle_timeout),
        signin=SignInThrottle(clock, base=settings.signin_delay_base, cap=settings.signin_delay_max),
        websockets=Slots("event WebSockets", settings.ws_per_principal),
        longpolls=Slots("long-polls", settings.longpolls_per_principal),
        informers=informers, clusters=clusters, token_verbs=Tokens(tokens, audit, bus),
        operations=Operations(engine, kube, clusters),
        timeline=ClusterTimeline(registry, aws, clusters.cache, informers),
        features=features,
        nodes=nodes, groups=groups, recipes=recipes, jobs=jobs, logs=logs, downloads=downloads, inference=inference,
        mlflow=mlflow, inference_scaling=inference_scaling, managed_inference=managed_inference,
        inference_routers=inference_routers, pools=pools,
        training_metrics=training_metrics, metrics_live=MetricsLive(mlflow_reader, bus),
    )
