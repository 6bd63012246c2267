"""A stage's expected duration follows the plan: the storage stage of ``cluster.create`` expects a minute for
its claims, plus FSx for Lustre's creation (about ten minutes in AWS) only when the plan makes a new file
system. The operation's stage views (what REST, MCP and the dashboard show next to the elapsed time) carry
the planned figure, scaled by the engine's pace like every wait."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from app.bootstrap import Services
from services.clusters.create_models import FsxChoice
from services.clusters.storage_stage import FSX_CREATE_SECONDS, StorageStage
from services.models import RequestModel
from services.stages import Observed, OperationKind, Stage, StageContext
from tests.conftest import ADMIN
from tests.create_support import make_plan


def _expected(services: Services, name: str, **overrides: object) -> dict[str, float | None]:
    view, created = services.engine.submit("cluster.create", make_plan(name, **overrides), ADMIN)
    assert created
    return {s.name: s.expected_seconds for s in view.stages}


def test_a_new_file_system_adds_its_creation_time_to_the_storage_stage(services: Services) -> None:
    stage = StorageStage(services.clusters.deps)
    assert stage.expected_for(make_plan("plain")) == 60.0
    existing = FsxChoice(mode="existing", file_system_id="fs-0123456789abcdef0")
    assert stage.expected_for(make_plan("existing", fsx=existing)) == 60.0
    assert stage.expected_for(make_plan("new", fsx=FsxChoice(mode="new"))) == 60.0 + FSX_CREATE_SECONDS


def test_the_operation_shows_the_planned_duration_of_each_stage(services: Services) -> None:
    plain = _expected(services, "dur-plain")  # the engine is not started: the stages only wait
    new = _expected(services, "dur-fsx", fsx=FsxChoice(mode="new"))
    assert list(plain) == ["network", "iam", "eks", "dependencies", "hyperpod", "storage", "verify"]
    assert {k: v for k, v in new.items() if k != "storage"} == {k: v for k, v in plain.items() if k != "storage"}
    assert plain["storage"] is not None and new["storage"] is not None
    assert plain["eks"] is not None
    pace = plain["eks"] / 600.0  # the eks stage's AWS duration, scaled by this world's pace
    assert abs(plain["storage"] - 60.0 * pace) < 1e-3
    assert abs(new["storage"] - (60.0 + FSX_CREATE_SECONDS) * pace) < 1e-3


VALIDATED: list[str] = []  # the names the counted request model was validated for


class Counted(RequestModel):
    name: str
    size: int

    @model_validator(mode="after")
    def _count(self) -> Counted:
        VALIDATED.append(self.name)
        return self


class Sized(Stage[Counted]):
    name = "sized"

    def expected_for(self, request: Counted) -> float | None:
        return 10.0 * request.size

    def observe(self, ctx: StageContext[Counted]) -> Observed:
        return Observed.DONE


def test_a_stage_duration_is_computed_once_per_operation_not_per_view(services: Services) -> None:
    services.engine.register(OperationKind("test.sized", Counted, (Sized(),), target=lambda r: f"test/{r.name}"))
    view, created = services.engine.submit("test.sized", Counted(name="dur-once", size=3), ADMIN)
    assert created
    first = services.engine.get(view.id).stages[0].expected_seconds
    assert first is not None and first > 0
    before = VALIDATED.count("dur-once")
    views: list[Any] = [services.engine.get(view.id) for _ in range(5)]
    assert [v.stages[0].expected_seconds for v in views] == [first] * 5
    assert VALIDATED.count("dur-once") == before, "a view reads the stored duration, it never re-validates the request"
