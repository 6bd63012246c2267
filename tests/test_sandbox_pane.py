"""The Sandbox dashboard pane over the real sandbox control (the object the REST routes use)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import panel as pn
import pytest

from app.bootstrap import Services
from panels.sandbox import SandboxPane, info_markdown, parse_target
from services.audit import AuditQuery
from services.auth import Principal, Role
from services.sandbox_control import SandboxControl
from tests.sandbox_support import eks_cluster, sandbox_settings, start_sandbox
from tests.support import wait_until

ADMIN = Principal("ada", Role.ADMIN, "t-admin", "ui")
VIEWER = Principal("vic", Role.VIEWER, "t-view", "ui")


@pytest.fixture
def control(services: Services, tmp_path: Path) -> Iterator[SandboxControl]:
    sandbox = start_sandbox(sandbox_settings(tmp_path / "sbx"))  # the child process serve runs
    yield SandboxControl(sandbox, services.audit, services.bus)
    sandbox.stop()


def test_admin_injects_and_clears_and_every_pane_follows(control: SandboxControl, services: Services) -> None:
    pane = SandboxPane(control=control, bus=services.bus, principal=ADMIN)
    watcher = SandboxPane(control=control, bus=services.bus, principal=VIEWER)
    pn.panel(pane).get_root()
    assert "node_unhealthy" in pane.state.param.kind.objects
    pane.state.kind = "throttle"
    pane.state.target = "service=eks, operation=ListClusters"
    pane.state.count = 3
    asyncio.run(pane.state.inject())
    services.bus.drain()  # delivery is off the publisher's thread
    assert pane.state.message == "injected"
    assert [(f["kind"], f["remaining"]) for f in watcher.state.faults] == [("throttle", 3)]  # via the bus
    assert list(watcher.table.value["target"]) == ["operation=ListClusters, service=eks"]
    assert services.audit.list(AuditQuery(action="sandbox.fault.inject"))[0].face == "ui"
    asyncio.run(pane.state.clear_all())
    services.bus.drain()  # delivery is off the publisher's thread
    assert watcher.state.faults == [] and control.faults(ADMIN) == []


def test_viewer_and_bad_targets_are_refused_by_the_control(control: SandboxControl, services: Services) -> None:
    viewer = SandboxPane(control=control, bus=services.bus, principal=VIEWER)
    assert viewer.inject_button.disabled
    viewer.state.kind = "quota_exhausted"
    viewer.state.target = "instance_type=ml.p5.48xlarge"
    asyncio.run(viewer.state.inject())
    services.bus.drain()  # delivery is off the publisher's thread
    assert viewer.state.message.startswith("refused (forbidden)") and control.faults(ADMIN) == []
    admin = SandboxPane(control=control, bus=services.bus, principal=ADMIN)
    admin.state.kind = "node_unhealthy"
    assert admin.target_input.placeholder == "cluster=hp-eks, node=i-0123456789abcdef0"
    admin.state.kind = "throttle"
    assert admin.target_input.placeholder == "service=eks", "the placeholder follows the kind"
    admin.state.kind = "node_unhealthy"
    admin.state.target = ""
    asyncio.run(admin.state.inject())
    services.bus.drain()  # delivery is off the publisher's thread
    assert admin.state.message == ("node_unhealthy needs a target with cluster, node: for example "
                                   "cluster=hp-eks, node=i-0123456789abcdef0") and control.faults(ADMIN) == []
    admin.state.target = "cluster=hp, node=i-0123456789abcdef0, color=red"
    asyncio.run(admin.state.inject())
    services.bus.drain()  # delivery is off the publisher's thread
    assert "refused (invalid)" in admin.state.message and "color" in admin.state.message
    assert viewer.role_hint.visible and "needs the admin role" in viewer.role_hint.object
    assert not admin.role_hint.visible
    admin.state.target = "cluster"
    asyncio.run(admin.state.inject())
    services.bus.drain()  # delivery is off the publisher's thread
    assert "key=value" in admin.state.message


def test_parse_target() -> None:
    assert parse_target(" a=1,b = 2 \n c=x=y ") == {"a": "1", "b": "2", "c": "x=y"}
    assert parse_target("") == {}
    with pytest.raises(ValueError):
        parse_target("=1")


def test_a_revoked_admin_token_cannot_inject_from_an_open_page(control: SandboxControl, services: Services) -> None:
    from services.auth import TokenCreate

    made = services.tokens.create(TokenCreate(name="sbx-admin", role=Role.ADMIN), created_by="test")
    principal = services.tokens.principal(made.id, "ui")
    pane = SandboxPane(control=control, bus=services.bus, principal=principal,
                       current_principal=lambda: services.tokens.principal(made.id, "ui"))
    services.tokens.revoke(made.id, Principal("root", Role.ADMIN, "other", "rest"))
    pane.state.kind = "quota_exhausted"
    pane.state.target = "instance_type=ml.p5.48xlarge"
    asyncio.run(pane.state.inject())
    services.bus.drain()  # delivery is off the publisher's thread
    assert pane.state.message.startswith("refused (unauthorized)") and control.faults(ADMIN) == []


def test_the_kubeconfig_list_follows_new_clusters(control: SandboxControl, services: Services) -> None:
    pane = SandboxPane(control=control, bus=services.bus, principal=VIEWER)
    assert "No clusters yet" in info_markdown(pane.state.info)
    eks_cluster(control.sandbox.settings, "late")  # the sandbox's emulator makes the cluster as it turns ACTIVE

    def listed() -> bool:
        services.bus.drain()  # delivery is off the publisher's thread
        return "`late`" in info_markdown(pane.state.info)

    wait_until(listed, 30, "the pane listing the new cluster (the server follows the sandbox's cluster feed)")
    assert "No clusters yet" not in info_markdown(pane.state.info)
    path = pane.state.info.kubeconfigs["late"]
    assert Path(path).is_file(), "the kubeconfig the pane lists exists"
    assert "late" not in services.kube.clusters(), "the product reaches a cluster once registered, as in AWS"
