"""A planted secret appears in no store, log or response: the verb puts it in a Kubernetes Secret of the
target cluster, the operation carries only a reference, and the stage reads it from there. Against a live
sandbox (a seeded, imported cluster); every file of both data directories is searched for the value."""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from pydantic import SecretStr

from app.bootstrap import Services
from services.audit import AuditQuery
from services.auth import Principal, Role
from services.clusters.models import ClusterImport
from services.errors import Permanent
from services.models import RequestModel
from services.operation_views import OperationQuery
from services.secrets import SecretRef, read, secret_values, stash
from services.stages import Done, Observed, OperationKind, Stage, StageContext
from tests.sandbox_support import seeded_server
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("secret-tester", Role.ADMIN, "t-sec", "api")


class UseToken(RequestModel):
    cluster: str
    token: SecretStr


class Credentials(RequestModel):
    user: str
    password: SecretStr


class CarelessNested(RequestModel):
    """Secrets one level down: a nested model, a map of them, a list of models (all must be refused)."""

    cluster: str
    mlflow: Credentials | None = None
    env: dict[str, SecretStr] = {}
    mounts: list[Credentials] = []
    pair: tuple[str, SecretStr] | None = None


class UseTokenPlan(RequestModel):
    cluster: str
    token_ref: SecretRef


class WriteProof(Stage[UseTokenPlan]):
    """What a real stage does with a secret: hands it to the workload (here, proves it read it)."""

    name = "use"

    def __init__(self, services: Services) -> None:
        self.services = services

    def observe(self, ctx: StageContext[UseTokenPlan]) -> Observed:
        return Observed.ABSENT

    def act(self, ctx: StageContext[UseTokenPlan]) -> None:
        value = read(self.services.kube, ctx.request.token_ref)
        core = k8s.CoreV1Api(self.services.kube.api_client(ctx.request.cluster))
        core.create_namespaced_config_map("default", k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name="token-proof"),
            data={"sha256": hashlib.sha256(value.encode()).hexdigest()}))

    def poll(self, ctx: StageContext[UseTokenPlan]) -> Done:
        return Done()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Services, Path]]:
    with seeded_server(tmp_path_factory.mktemp("secrets"), "sec") as seeded:
        mine = tmp_path_factory.mktemp("product") / "data"
        services = seeded.product(mine)  # a second installation of the product against the same sandbox
        try:
            view, _ = services.clusters.import_cluster(ADMIN, ClusterImport(eks_cluster="sec",
                                                                            hyperpod_cluster="sec"))
            wait_until(lambda: services.engine.run_until_idle(view.id).status == "succeeded", 60,
                       "the import to connect (its node list synced)")
            yield seeded.live, services, mine
        finally:
            services.stop()


def use_token(services: Services, request: UseToken) -> Any:
    """The verb: the value goes to a Kubernetes Secret, the operation gets its reference."""
    refs = stash(services.kube, request.cluster, "default", "instantstart-token", secret_values(request))
    return services.engine.submit("test.token.use", UseTokenPlan(cluster=request.cluster, token_ref=refs["token"]),
                                  ADMIN)


def test_a_planted_secret_is_in_no_store_log_or_response(world: tuple[LiveServer, Services, Path],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    live, services, mine = world
    services.engine.register(OperationKind("test.token.use", UseTokenPlan, (WriteProof(services),),
                                           target=lambda plan: f"cluster/{plan.cluster}"))
    planted = "hf_" + secrets.token_urlsafe(24)
    request = UseToken(cluster="sec", token=SecretStr(planted))
    # a careless kind that takes the secret itself: the engine refuses to store the request
    services.engine.register(OperationKind("test.token.careless", UseToken, (),
                                           target=lambda r: f"cluster/{r.cluster}"))
    with pytest.raises(Permanent, match="still holds secret fields"):
        services.engine.submit("test.token.careless", request, ADMIN)
    services.engine.register(OperationKind("test.token.nested", CarelessNested, (),
                                           target=lambda r: f"cluster/{r.cluster}"))
    secret = SecretStr(planted)
    for nested, field in [(CarelessNested(cluster="sec", mlflow=Credentials(user="u", password=secret)),
                          "mlflow.password"),
                         (CarelessNested(cluster="sec", env={"HF_TOKEN": secret}), "env.HF_TOKEN"),
                         (CarelessNested(cluster="sec", mounts=[Credentials(user="u", password=secret)]),
                          "mounts.0.password"),
                         (CarelessNested(cluster="sec", pair=("hf", secret)), "pair.1")]:
        with pytest.raises(Permanent, match=f"still holds secret fields \\['{field}'\\]"):
            services.engine.submit("test.token.nested", nested, ADMIN)
    assert services.engine.list(OperationQuery(kind="test.token.nested")) == [], "none was stored"

    caplog.set_level(logging.DEBUG)
    view, _ = use_token(services, request)
    done = services.engine.run_until_idle(view.id)
    assert done.status == "succeeded", done.error
    core = k8s.CoreV1Api(services.kube.api_client("sec"))
    proof = core.read_namespaced_config_map("token-proof", "default").data["sha256"]
    assert proof == hashlib.sha256(planted.encode()).hexdigest(), "the stage used the real value"

    responses = [done.model_dump_json(), *(e.model_dump_json() for e in services.audit.list(AuditQuery(limit=500)))]
    for text in responses:
        assert planted not in text
    assert planted not in caplog.text and planted not in live.log()
    # a value in a Kubernetes Secret body is base64: a record that copied one would hold that form (the
    # emulator's own store is the target cluster, where the Secret rightly holds it)
    encoded = base64.b64encode(planted.encode())
    cluster_store = live.data_dir / "sandbox" / "kube"
    for folder in (mine, live.data_dir):  # state.db and its WAL, the ledger, request logs, the emulator's store
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert planted.encode() not in data, f"the secret leaked into {path}"
                if not path.is_relative_to(cluster_store):
                    assert encoded not in data, f"the secret leaked (base64) into {path}"
