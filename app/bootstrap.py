"""``build_services``: the one composition root (no module singletons anywhere else)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.sandbox import aws_endpoint, aws_session, register_clusters, sandbox_enabled, stored_clusters
from services.audit import AuditLog
from services.auth import TokenStore
from services.aws import AwsClients
from services.backups import Backups
from services.clock import Clock
from services.db import Database
from services.events import EventBus
from services.kube import KubeClients
from services.operations import Engine
from services.settings import Settings

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

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()
        self.db.close()


def build_services(settings: Settings, clock: Clock | None = None) -> Services:
    data = settings.ensure_data_dir()
    clock = clock or Clock()
    db = Database(data / "state.db")
    bus = EventBus()
    audit = AuditLog(db, clock)
    engine = Engine(db, bus, audit, clock, workers=settings.workers, lock_path=data / "engine.lock")
    sandboxed = sandbox_enabled(settings)
    if sandboxed and settings.aws_endpoint_url is None:
        aws = AwsClients(settings.region, aws_endpoint(settings), session=aws_session(settings))
    else:
        aws = AwsClients(settings.region, settings.aws_endpoint_url)
    backups = Backups(db, data / "backups")
    engine.register(backups.kind())
    kube = KubeClients(aws, clock, ca_dir=data / "ca")
    if sandboxed:
        register_clusters(settings, kube, stored_clusters(settings))
    return Services(
        settings=settings, clock=clock, db=db, bus=bus, audit=audit, tokens=TokenStore(db, clock),
        engine=engine, aws=aws, kube=kube, backups=backups,
    )
