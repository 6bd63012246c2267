"""Panes without a browser: render to Bokeh models, drive the engine, watch the pane follow the event bus."""

from __future__ import annotations

import asyncio
import html
import threading
from collections.abc import Iterator
from typing import Any

import panel as pn
import pytest
from bokeh.model import Model

from app.bootstrap import Services
from panels.audit import AuditPane
from panels.clusters import ClustersPane
from panels.operations import OperationsPane
from services.audit import AuditQuery
from services.auth import Principal, Role
from services.clock import FakeClock
from services.clusters.models import ClusterImport
from services.events import Event
from services.operations import Engine, OperationView, Status
from tests.kinds import ThingRequest, World
from tests.sandbox_support import seeded_server
from tests.support import silence, wait_until

OPERATOR = Principal("olga", Role.OPERATOR, "t-op", "ui")
VIEWER = Principal("vic", Role.VIEWER, "t-view", "ui")


def submit(engine: Engine, name: str) -> OperationView:
    view, created = engine.submit("thing.create", ThingRequest(name=name), OPERATOR.via("rest"))
    engine.bus.drain()  # delivery is off the publisher's thread
    assert created
    return view


def failed_op(engine: Engine, world: World, name: str = "f") -> OperationView:
    world.update(faults=["permanent"])
    view = engine.run_until_idle(submit(engine, name).id)
    engine.bus.drain()  # delivery is off the publisher's thread
    assert view.status == Status.FAILED
    return view


def models_with_class(root: Model, css: str) -> list[Model]:
    return [m for m in root.references() if css in (getattr(m, "css_classes", None) or [])]


def tabulator_column(root: Model, css: str, column: str) -> list[Any]:
    (table,) = models_with_class(root, css)
    return list(table.source.data[column])


def rows(pane: OperationsPane) -> dict[str, str]:
    return dict(zip(pane.table.value["id"], pane.table.value["status"], strict=True))


def test_operations_pane_renders_alone_with_the_list(services: Services, engine: Engine) -> None:
    op = submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    root = pn.panel(pane).get_root()
    assert tabulator_column(root, "operations-table", "id") == [op.id]
    assert tabulator_column(root, "operations-table", "status") == ["pending"]
    assert tabulator_column(root, "op-stages", "stage") == ["create", "label"]
    assert "Accepted" in tabulator_column(root, "op-conditions", "type")
    (header,) = models_with_class(root, "op-header")
    assert op.id in header.text
    assert len(models_with_class(root, "op-retry")) == 1 and len(models_with_class(root, "op-cancel")) == 1


def test_list_follows_the_bus_in_place(services: Services, engine: Engine, clock: FakeClock) -> None:
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    root = pn.panel(pane).get_root()
    table = pane.table
    (model,) = models_with_class(root, "operations-table")
    assert pane.state.operations == []

    a = submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {a.id: "pending"}
    assert pane.state.selected == a.id  # the first operation to appear is shown
    engine.run_until_idle(a.id)
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {a.id: "waiting"}
    assert tabulator_column(root, "operations-table", "status") == ["waiting"]  # the model followed
    assert tabulator_column(root, "op-stages", "phase")[0] == "waiting"

    clock.advance(10)
    engine.run_until_idle(a.id)
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {a.id: "succeeded"}
    assert tabulator_column(root, "operations-table", "status") == ["succeeded"]
    assert tabulator_column(root, "op-stages", "status") == ["succeeded", "succeeded"]
    assert pane.table is table and models_with_class(root, "operations-table") == [model]  # in place


def test_events_alone_update_the_pane(services: Services, engine: Engine) -> None:
    """The pane takes the view an event carries; an older version never overwrites a newer one."""
    a = submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    newer = a.model_copy(update={"status": Status.WAITING, "version": a.version + 5})
    services.bus.publish(Event("operation", "updated", newer.model_dump(mode="json")))
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {a.id: "waiting"}  # the database still says pending: this came from the event
    services.bus.publish(Event("operation", "updated", a.model_dump(mode="json")))
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {a.id: "waiting"}
    services.bus.publish(Event("operation", "updated", {"not": "an operation"}))
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {a.id: "waiting"}


def test_selection_is_kept_by_id_when_rows_move(services: Services, engine: Engine, clock: FakeClock) -> None:
    a = submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    clock.advance(1)
    b = submit(engine, "b")
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    root = pn.panel(pane).get_root()
    assert list(pane.table.value["id"]) == [b.id, a.id]  # newest first

    pane.table.selection = [1]  # what a click in the browser sends
    assert pane.state.selected == a.id
    assert pane.state.current is not None and pane.state.current.id == a.id
    (header,) = models_with_class(root, "op-header")
    assert a.id in header.text

    clock.advance(1)
    c = submit(engine, "c")  # lands on top: a moves from row 1 to row 2
    services.bus.drain()  # delivery is off the publisher's thread
    assert list(pane.table.value["id"]) == [c.id, b.id, a.id]
    assert pane.table.selection == [2]
    assert pane.state.selected == a.id
    engine.run_until_idle(a.id)
    services.bus.drain()  # delivery is off the publisher's thread
    assert pane.table.selection == [2] and pane.state.current is not None
    assert pane.state.current.status == Status.WAITING
    assert tabulator_column(root, "op-stages", "phase")[0] == "waiting"


def test_status_filter_lists_and_follows(services: Services, engine: Engine, clock: FakeClock) -> None:
    a = submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    b = submit(engine, "b")
    services.bus.drain()  # delivery is off the publisher's thread
    engine.run_until_idle(b.id)
    services.bus.drain()  # delivery is off the publisher's thread
    clock.advance(10)
    engine.run_until_idle(b.id)
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    pane.state.status_filter = "active"
    assert rows(pane) == {a.id: "pending"}
    engine.run_until_idle(a.id)
    services.bus.drain()  # delivery is off the publisher's thread
    clock.advance(10)
    engine.run_until_idle(a.id)  # succeeds, so it leaves the active list
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {}
    pane.state.status_filter = "succeeded"
    assert set(rows(pane)) == {a.id, b.id}


def test_operator_retries_and_cancels_through_the_pane(services: Services, engine: Engine, world: World) -> None:
    op = failed_op(engine, world)
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=OPERATOR)
    pn.panel(pane).get_root()
    assert pane.state.selected == op.id
    assert pane.state.can_retry and pane.state.can_cancel
    assert not pane.retry_button.disabled and not pane.cancel_button.disabled

    asyncio.run(pane.state.retry())
    services.bus.drain()  # delivery is off the publisher's thread
    assert "retry of" in pane.state.message and "requested" in pane.state.message
    assert rows(pane) == {op.id: "pending"}  # arrived as an event
    assert not pane.state.can_retry and pane.retry_button.disabled and not pane.cancel_button.disabled
    retry_rows = services.audit.list(AuditQuery(action="operation.retry"))
    assert [(r.actor, r.face, r.outcome) for r in retry_rows] == [("olga", "ui", "accepted")]

    asyncio.run(pane.state.cancel())
    services.bus.drain()  # delivery is off the publisher's thread
    assert rows(pane) == {op.id: "cancelled"}
    assert engine.get(op.id).status == Status.CANCELLED
    assert pane.retry_button.disabled and pane.cancel_button.disabled
    assert not pane.state.busy


def test_viewer_is_refused_by_the_service_not_only_the_button(services: Services, engine: Engine,
                                                              world: World) -> None:
    op = failed_op(engine, world)
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    pn.panel(pane).get_root()
    assert pane.state.current is not None and pane.state.current.id == op.id
    assert not pane.state.can_retry and not pane.state.can_cancel
    assert pane.retry_button.disabled and pane.cancel_button.disabled
    # greyed buttons say why: the role they need
    assert pane.role_hint.visible and "needs the operator role" in pane.role_hint.object
    assert pane.retry_button.description == "needs the operator role"
    assert not OperationsPane(operations=services.operations, bus=services.bus, principal=OPERATOR).role_hint.visible

    before = engine.get(op.id)
    asyncio.run(pane.state.retry())
    services.bus.drain()  # delivery is off the publisher's thread
    assert "forbidden" in pane.state.message and "operator" in pane.state.message
    # a click that gets past a disabled button (a crafted websocket message) meets the same check
    pane.state.message = ""
    pane.cancel_button.clicks += 1
    services.bus.drain()  # delivery is off the publisher's thread
    assert "forbidden" in pane.state.message
    after = engine.get(op.id)
    assert (after.status, after.version) == (before.status, before.version) == (Status.FAILED, before.version)
    assert services.audit.list(AuditQuery(action="operation.retry")) == []
    assert services.audit.list(AuditQuery(action="operation.cancel")) == []


def test_conflicting_cancel_shows_the_service_error(services: Services, engine: Engine, clock: FakeClock) -> None:
    a = submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=OPERATOR)
    engine.run_until_idle(a.id)
    services.bus.drain()  # delivery is off the publisher's thread
    clock.advance(10)
    engine.run_until_idle(a.id)
    services.bus.drain()  # delivery is off the publisher's thread
    assert not pane.state.can_cancel  # succeeded: nothing to cancel
    asyncio.run(pane.state.cancel())
    services.bus.drain()  # delivery is off the publisher's thread
    assert "conflict" in pane.state.message
    assert engine.get(a.id).status == Status.SUCCEEDED


def test_pane_stops_listening_when_closed(services: Services, engine: Engine) -> None:
    before = services.bus.subscriber_count()
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=VIEWER)
    assert services.bus.subscriber_count() == before + 1
    pane._live.close()
    assert services.bus.subscriber_count() == before
    submit(engine, "a")
    services.bus.drain()  # delivery is off the publisher's thread
    assert pane.state.operations == []


def test_audit_pane_follows_the_bus_and_filters(services: Services, engine: Engine, world: World) -> None:
    pane = AuditPane(audit=services.audit, bus=services.bus, principal=VIEWER)
    root = pn.panel(pane).get_root()
    assert pane.state.entries == []
    op = failed_op(engine, world)
    services.bus.drain()  # delivery is off the publisher's thread
    actions = tabulator_column(root, "audit-table", "action")
    assert actions == ["thing.create", "thing.create"]  # accepted, then failed: newest first
    assert tabulator_column(root, "audit-table", "outcome") == ["failed", "accepted"]

    asyncio.run(OperationsPane(operations=services.operations, bus=services.bus, principal=OPERATOR).state.retry())
    services.bus.drain()  # delivery is off the publisher's thread
    assert tabulator_column(root, "audit-table", "action")[0] == "operation.retry"
    assert tabulator_column(root, "audit-table", "operation")[0] == op.id

    pane.state.face = "ui"
    assert tabulator_column(root, "audit-table", "actor") == ["olga"]
    pane.state.face = "all"
    pane.state.actor = "nobody"
    assert tabulator_column(root, "audit-table", "action") == []


def test_read_only_table_drops_browser_data_echoes_that_race_a_replacement() -> None:
    """A plain Tabulator raises when a stale echo from the browser meets a newer, longer value."""
    import pandas as pd

    from panels.tables import ReadOnlyTable

    table = ReadOnlyTable(pd.DataFrame({"id": ["a", "b", "c"]}))
    table.value = pd.DataFrame({"id": ["a", "b", "c", "d"]})
    table._process_events({"data": {"id": ["a", "b", "c"]}})
    assert list(table.value["id"]) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError):
        plain = pn.widgets.Tabulator(pd.DataFrame({"id": ["a", "b", "c"]}), disabled=True)
        plain.value = pd.DataFrame({"id": ["a", "b", "c", "d"]})
        plain._process_events({"data": {"id": ["a", "b", "c"]}})


def test_a_token_revoked_while_the_page_is_open_acts_no_more(services: Services, engine: Engine,
                                                              world: World) -> None:
    from services.auth import TokenCreate
    from services.errors import Unauthorized

    op = failed_op(engine, world)
    services.bus.drain()  # delivery is off the publisher's thread
    created = services.tokens.create(TokenCreate(name="ops-ui", role=Role.OPERATOR), created_by="test")
    principal = services.tokens.principal(created.id, "ui")
    pane = OperationsPane(operations=services.operations, bus=services.bus, principal=principal,
                          current_principal=lambda: services.tokens.principal(created.id, "ui"))
    pn.panel(pane).get_root()
    services.tokens.revoke(created.id, Principal("root", Role.ADMIN, "other", "rest"))
    asyncio.run(pane.state.retry())
    services.bus.drain()  # delivery is off the publisher's thread
    assert f"refused ({Unauthorized.code})" in pane.state.message
    assert engine.get(op.id).status == Status.FAILED


def test_operation_text_is_escaped_not_rendered_as_html(services: Services, engine: Engine, world: World) -> None:
    from panels.operations import header_markdown

    op = failed_op(engine, world)
    services.bus.drain()  # delivery is off the publisher's thread
    hostile = op.model_copy(update={"error": {"message": "<img src=x onerror=alert(1)>"}, "actor": "<b>eve</b>"})
    text = header_markdown(hostile)
    assert "<img" not in text and "<b>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """A product installation with one cluster imported from a sandbox (`sandbox seed`, two nodes)."""
    admin = Principal("pane-admin", Role.ADMIN, "t-adm", "api")
    with seeded_server(tmp_path_factory.mktemp("clusters-pane"), "pane", nodes=2) as seeded:
        services = seeded.product(tmp_path_factory.mktemp("product") / "data")
        try:
            view, _ = services.clusters.import_cluster(admin, ClusterImport(eks_cluster="pane",
                                                                            hyperpod_cluster="pane"))
            wait_until(lambda: services.engine.run_until_idle(view.id).status == "succeeded", 60,
                       "the import to connect (its node list synced)")
            yield services
        finally:
            services.stop()


async def loaded(pane: ClustersPane, what: str) -> None:
    """Let the loop run until the pane's read has landed (a condition, with a generous bound)."""
    for _ in range(6_000):
        if pane.state.loaded and not pane.state.reading:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def quiet(pane: ClustersPane) -> None:
    """Wait until no task but this one runs on the loop and no read is in flight, ten looks in a row (a
    callback queued from a delivery thread creates its task a loop turn later)."""
    calm = 0
    for _ in range(6_000):
        idle = asyncio.all_tasks() == {asyncio.current_task()} and not pane.state.reading
        calm = calm + 1 if idle else 0
        if calm == 10:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the pane's reads never settled")


@pytest.mark.slow
def test_clusters_pane_renders_at_once_and_reads_off_the_loop(imported: Services) -> None:
    """Made on a running loop (a served session, a notebook kernel) the pane reads nothing while it is built:
    it shows the 'reading' hint, the verbs run in a worker thread and the answer is assigned on the loop."""
    loop_thread = threading.get_ident()

    async def main() -> None:
        pane = ClustersPane(imported.clusters, imported.bus, VIEWER, operations=imported.operations)
        assert pane.state.clusters == [] and pane.state.detail is None, "the page build read the clusters"
        assert not pane.state.loaded and pane.reading_hint.visible
        root = pn.panel(pane).get_root()
        (hint,) = models_with_class(root, "cluster-reading")
        assert "Reading" in hint.text
        assigned: list[int] = []
        pane.state.param.watch(lambda _e: assigned.append(threading.get_ident()), ["clusters", "selected", "detail"],
                               onlychanged=False)
        await loaded(pane, "the first read")
        assert tabulator_column(root, "clusters-table", "name") == ["pane"]
        assert tabulator_column(root, "cluster-groups", "group") == ["workers"]
        (overview,) = models_with_class(root, "cluster-overview")
        text = html.unescape(overview.text)  # the model carries the pane's HTML escaped
        assert text.count("class='node-chip'") == 2 and text.count("data-health='Schedulable'") == 2, text
        assert not pane.reading_hint.visible

        assigned.clear()
        await pane.state.refresh()  # what a watch event asks for
        assert assigned and set(assigned) == {loop_thread}, "assigned off the loop, in the executor"

        # the sandbox's heartbeats keep publishing kube events, each of which spawns a read of its own: stop
        # them and let the reads already spawned land, so the only read in flight below is the stale one
        silence(pane._kube, pane._ops)
        await quiet(pane)
        shown = pane.state.detail
        stale = asyncio.ensure_future(pane.state.refresh())
        await asyncio.sleep(0)  # the task's first step: it asks, then waits on its worker
        assert pane.state.reading, "the stale read was not asked before the selection changed"
        pane.state.selected = "elsewhere"  # the user picked another cluster meanwhile
        await stale
        assert pane.state.selected == "elsewhere" and pane.state.detail is shown, "a stale answer landed"

    asyncio.run(main())

    # no loop (a script): read at once, here
    sync = ClustersPane(imported.clusters, imported.bus, VIEWER, operations=imported.operations)
    silence(sync._kube, sync._ops)  # no heartbeat's re-read (on the bus's thread) replaces it between the lines below
    detail = sync.state.detail
    assert sync.state.loaded and [c.name for c in sync.state.clusters] == ["pane"]
    assert detail is not None and sum(len(n) for n in detail.nodes_by_group.values()) == 2
