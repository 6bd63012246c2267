"""Test-only operation kinds over a tiny fake 'outside world' (a JSON file, so other processes see it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from services.aws import AwsClients
from services.errors import Permanent, Transient
from services.models import RequestModel
from services.operations import Done, Observed, OperationKind, Stage, StageContext, Wait


class ThingRequest(RequestModel):
    name: str = Field(..., pattern=r"^[a-z0-9-]+$")
    size: int = Field(1, ge=1, le=10)


class World:
    """The outside system a stage changes: resources, an act counter and injected faults."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            self.save({"things": {}, "acts": 0, "faults": [], "polls": 0})

    def load(self) -> dict[str, Any]:
        return dict(json.loads(self.path.read_text()))

    def save(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)

    def update(self, **changes: Any) -> None:
        state = self.load()
        state.update(changes)
        self.save(state)

    @property
    def acts(self) -> int:
        return int(self.load()["acts"])


class CreateThing(Stage[ThingRequest]):
    """Creates a thing, which becomes ready after ``ready_polls`` polls (or once a release file exists)."""

    name = "create"

    def __init__(self, world: World, ready_polls: int = 1, poll_seconds: float = 10.0,
                 release: Path | None = None, block_after_act: Path | None = None) -> None:
        self.world = world
        self.ready_polls = ready_polls
        self.poll_seconds = poll_seconds
        self.release = release
        self.block_after_act = block_after_act

    def observe(self, ctx: StageContext[ThingRequest]) -> Observed:
        thing = self.world.load()["things"].get(ctx.request.name)
        if thing is None:
            return Observed.ABSENT
        return Observed.DONE if thing["ready"] else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ThingRequest]) -> None:
        state = self.world.load()
        faults = list(state["faults"])
        if faults:
            fault = faults.pop(0)
            self.world.update(faults=faults)
            if fault == "transient":
                raise Transient("throttled", delay=5)
            raise Permanent("quota exhausted")
        state["things"][ctx.request.name] = {"ready": False, "size": ctx.request.size}
        state["acts"] += 1
        self.world.save(state)
        ctx.data["created_at_attempt"] = ctx.attempt
        if self.block_after_act is not None and not self.block_after_act.exists():
            time.sleep(3600)  # the crash test kills the process here, after the side effect

    def poll(self, ctx: StageContext[ThingRequest]) -> Done | Wait:
        state = self.world.load()
        state["polls"] += 1
        self.world.save(state)
        released = self.release.exists() if self.release is not None else state["polls"] >= self.ready_polls
        if not released:
            return Wait(self.poll_seconds, f"{ctx.request.name} is starting")
        state["things"][ctx.request.name]["ready"] = True
        self.world.save(state)
        return Done()

    def result(self, ctx: StageContext[ThingRequest]) -> dict[str, Any]:
        return {"thing": ctx.request.name}


class Label(Stage[ThingRequest]):
    name = "label"

    def __init__(self, world: World) -> None:
        self.world = world

    def observe(self, ctx: StageContext[ThingRequest]) -> Observed:
        thing = self.world.load()["things"][ctx.request.name]
        return Observed.DONE if thing.get("label") else Observed.ABSENT

    def act(self, ctx: StageContext[ThingRequest]) -> None:
        state = self.world.load()
        state["things"][ctx.request.name]["label"] = ctx.results["create"]["thing"]
        self.world.save(state)


def thing_kind(world: World, **create: Any) -> OperationKind[ThingRequest]:
    return OperationKind(name="thing.create", request_model=ThingRequest,
                         stages=(CreateThing(world, **create), Label(world)),
                         target=lambda r: f"thing/{r.name}")


# ----- kinds that write through the sandbox's AWS endpoint (tests/test_engine_sandbox.py) ----------------------

class TagRequest(RequestModel):
    """Tag an EKS cluster, at the cluster's target or at one of its (instance) groups'."""

    cluster: str = Field(..., pattern=r"^[a-z0-9-]+$")
    group: str | None = Field(None, pattern=r"^[a-z0-9-]+$")
    value: str = "on"
    wait_for: str | None = Field(None, description="a tag key that must appear before the stage is done")
    misread: bool = Field(False, description="read a key the DescribeCluster response does not have (a bug)")

    @property
    def key(self) -> str:
        return f"group-{self.group}" if self.group else "cluster"


def tag_target(request: TagRequest) -> str:
    return f"cluster/{request.cluster}" + (f"/group/{request.group}" if request.group else "")


class TagCluster(Stage[TagRequest]):
    """Observe the cluster's tags, tag it with TagResource, then wait for ``wait_for`` if asked."""

    name = "tag"

    def __init__(self, aws: AwsClients) -> None:
        self.eks = aws.for_stages().client("eks")

    def _arn(self, ctx: StageContext[TagRequest]) -> str:
        if ctx.request.misread:  # a KeyError raised inside the client call (a response handler misreads): a bug
            def misread(parsed: dict[str, Any], **_: Any) -> None:
                parsed["noSuchField"]

            self.eks.meta.events.register("after-call.eks.DescribeCluster", misread)
            try:
                self.eks.describe_cluster(name=ctx.request.cluster)
            finally:
                self.eks.meta.events.unregister("after-call.eks.DescribeCluster", misread)
        return str(self.eks.describe_cluster(name=ctx.request.cluster)["cluster"]["arn"])

    def _tags(self, ctx: StageContext[TagRequest]) -> dict[str, str]:
        return dict(self.eks.list_tags_for_resource(resourceArn=self._arn(ctx))["tags"])

    def observe(self, ctx: StageContext[TagRequest]) -> Observed:
        return Observed.DONE if self._tags(ctx).get(ctx.request.key) == ctx.request.value else Observed.ABSENT

    def act(self, ctx: StageContext[TagRequest]) -> None:
        self.eks.tag_resource(resourceArn=self._arn(ctx), tags={ctx.request.key: ctx.request.value})

    def poll(self, ctx: StageContext[TagRequest]) -> Done | Wait:
        if ctx.request.wait_for and ctx.request.wait_for not in self._tags(ctx):
            return Wait(30, f"tag {ctx.request.wait_for} on EKS cluster {ctx.request.cluster}")
        return Done()

    def result(self, ctx: StageContext[TagRequest]) -> dict[str, Any]:
        return {"tagged": {ctx.request.key: ctx.request.value}}


def tag_kind(aws: AwsClients, deadline: float | None = 600) -> OperationKind[TagRequest]:
    stage = TagCluster(aws)
    stage.deadline = deadline
    return OperationKind(name="test.eks.tag", request_model=TagRequest, stages=(stage,), target=tag_target)
