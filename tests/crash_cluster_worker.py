"""A separate product process for the imported-cluster crash test:

    python -m tests.crash_cluster_worker DATA_DIR AWS_PORT KUBE_PORT [submit CLUSTER]

It runs the product's services against a running sandbox with a test kind that writes through the
sandbox's AWS endpoint (tags the EKS cluster) and its Kubernetes API (labels a node), with a pause between
the two that lasts until ``DATA_DIR/release`` exists — where the test kills it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kubernetes import client as k8s

from app.bootstrap import Services, build_services
from services.auth import Principal, Role
from services.models import RequestModel
from services.settings import Settings
from services.stages import Done, Observed, OperationKind, Stage, StageContext, Wait
from tests.support import until_terminated

KIND = "test.cluster.touch"
LABEL = "instantstart.test/touched"


class Touch(RequestModel):
    cluster: str


class TagCluster(Stage[Touch]):
    name = "tag"

    def __init__(self, services: Services) -> None:
        self.services = services

    def _eks(self, ctx: StageContext[Touch]) -> tuple[object, str]:
        record = self.services.clusters.registry.get(ctx.request.cluster)
        return self.services.aws.for_stages().client("eks", record.region), record.eks_arn

    def observe(self, ctx: StageContext[Touch]) -> Observed:
        eks, arn = self._eks(ctx)
        tags = eks.list_tags_for_resource(resourceArn=arn).get("tags", {})  # type: ignore[attr-defined]
        return Observed.DONE if tags.get("instantstart:touched-by") == ctx.operation_id else Observed.ABSENT

    def act(self, ctx: StageContext[Touch]) -> None:
        eks, arn = self._eks(ctx)
        eks.tag_resource(resourceArn=arn, tags={"instantstart:touched-by": ctx.operation_id})  # type: ignore[attr-defined]


class Pause(Stage[Touch]):
    name = "pause"

    def __init__(self, release: Path) -> None:
        self.release = release

    def observe(self, ctx: StageContext[Touch]) -> Observed:
        return Observed.DONE if self.release.exists() else Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[Touch]) -> Done | Wait:
        return Done() if self.release.exists() else Wait(0.2, "waiting for the release file")


class LabelNode(Stage[Touch]):
    name = "label"

    def __init__(self, services: Services) -> None:
        self.services = services

    def _node(self, ctx: StageContext[Touch]) -> tuple[k8s.CoreV1Api, k8s.V1Node]:
        core = k8s.CoreV1Api(self.services.kube.api_client(ctx.request.cluster))
        return core, sorted(core.list_node().items, key=lambda n: n.metadata.name)[0]

    def observe(self, ctx: StageContext[Touch]) -> Observed:
        _core, node = self._node(ctx)
        return Observed.DONE if (node.metadata.labels or {}).get(LABEL) == ctx.operation_id else Observed.ABSENT

    def act(self, ctx: StageContext[Touch]) -> None:
        core, node = self._node(ctx)
        core.patch_node(node.metadata.name, {"metadata": {"labels": {LABEL: ctx.operation_id}}})


def main() -> None:
    data, aws_port, kube_port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    services = build_services(Settings(data_dir=data, sandbox=True, sandbox_aws_port=aws_port,
                                       sandbox_kube_port=kube_port, workers=1, engine_pace=0.05))
    services.engine.register(OperationKind(KIND, Touch, (TagCluster(services), Pause(data / "release"),
                                                         LabelNode(services)),
                                           target=lambda r: f"cluster/{r.cluster}"))
    services.start()  # resumes what a killed process left
    if len(sys.argv) > 5 and sys.argv[4] == "submit":
        op, _ = services.engine.submit(KIND, Touch(cluster=sys.argv[5]), Principal("crash", Role.OPERATOR))
        print(op.id, flush=True)
    until_terminated(services.stop)


if __name__ == "__main__":
    main()
