"""Unit tests: request models, the error taxonomy, settings precedence, the event bus."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from kubernetes.client.exceptions import ApiException
from pydantic import Field

from services.aws import from_aws
from services.errors import Conflict, Forbidden, Invalid, NotFound, Permanent, Transient
from services.events import Event, EventBus
from services.kube import from_kube
from services.models import RequestModel, parse
from services.settings import Settings
from tests.support import wait_until


class Inner(RequestModel):
    instance_type: str
    count: int = Field(1, ge=1)


class Outer(RequestModel):
    cluster_name: str
    groups: list[Inner] = []


def test_unknown_fields_get_a_suggestion_at_any_depth() -> None:
    with pytest.raises(Invalid) as caught:
        parse(Outer, {"clustername": "a", "groups": [{"instancetype": "ml.g5.xlarge", "count": 0}]})
    fields = {f["field"]: f["message"] for f in caught.value.details["fields"]}
    assert "Did you mean 'cluster_name'?" in fields["clustername"]
    assert "Did you mean 'instance_type'?" in fields["groups.0.instancetype"]
    assert "groups.0.count" in fields and "cluster_name" in fields  # all errors, not the first one
    assert caught.value.http_status == 422


def test_parse_accepts_valid_and_none_means_empty() -> None:
    class Empty(RequestModel):
        flag: bool = False

    assert parse(Empty, None).flag is False
    assert parse(Outer, {"cluster_name": "x"}).groups == []


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "Op")


@pytest.mark.parametrize(("code", "status", "kind"), [
    ("ValidationException", 400, Invalid), ("ResourceNotFound", 400, NotFound), ("ResourceInUse", 400, Conflict),
    ("ThrottlingException", 400, Transient), ("AccessDeniedException", 403, Forbidden),
    ("ResourceLimitExceeded", 400, Permanent), ("SomethingNew", 503, Transient), ("SomethingNew", 400, Permanent),
])
def test_aws_errors_classified_by_code(code: str, status: int, kind: type) -> None:
    err = from_aws(client_error(code, status))
    assert type(err) is kind and err.details["aws_code"] == code


def test_aws_connection_errors_are_transient() -> None:
    assert isinstance(from_aws(EndpointConnectionError(endpoint_url="http://x")), Transient)


@pytest.mark.parametrize(("status", "kind"), [(404, NotFound), (409, Conflict), (422, Invalid), (403, Forbidden),
                                              (500, Transient), (429, Transient), (0, Transient), (418, Permanent)])
def test_kube_errors_classified_by_status(status: int, kind: type) -> None:
    assert type(from_kube(ApiException(status=status, reason="r"))) is kind


def test_settings_precedence_env_over_file_over_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "is.yaml"
    config.write_text(f"port: 4000\nregion: eu-west-1\ndata_dir: {tmp_path / 'from-file'}\n")
    monkeypatch.setenv("INSTANTSTART_CONFIG", str(config))
    monkeypatch.setenv("INSTANTSTART_PORT", "5000")
    s = Settings()
    assert (s.port, s.region, s.data_dir) == (5000, "eu-west-1", tmp_path / "from-file")
    assert Settings(port=6000).port == 6000
    config.write_text("prot: 1\n")
    with pytest.raises(ValueError, match="prot"):
        Settings()
    monkeypatch.setenv("INSTANTSTART_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(Invalid):
        Settings()


def test_toml_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "is.toml"
    config.write_text('region = "ap-south-1"\nworkers = 8\n')
    monkeypatch.delenv("INSTANTSTART_PORT", raising=False)
    s = Settings(config=config)
    assert (s.region, s.workers) == ("ap-south-1", 8)


def test_dev_no_auth_only_on_loopback(tmp_path: Path) -> None:
    Settings(data_dir=tmp_path, dev_no_auth=True, host="127.0.0.1").check_bind()
    with pytest.raises(Invalid):
        Settings(data_dir=tmp_path, dev_no_auth=True, host="0.0.0.0").check_bind()


def test_event_bus_isolates_failing_subscribers() -> None:
    bus = EventBus()
    got: list[str] = []

    def broken(_e: Event) -> None:
        raise RuntimeError("boom")

    bus.subscribe(broken)
    unsubscribe = bus.subscribe(lambda e: got.append(e.kind), topic="operation")
    bus.subscribe(lambda e: got.append("all:" + e.kind))
    bus.publish(Event("operation", "updated"))
    bus.publish(Event("node", "changed"))
    assert bus.drain()
    assert sorted(got) == ["all:changed", "all:updated", "updated"]
    unsubscribe()
    bus.publish(Event("operation", "again"))
    assert bus.drain()
    assert got[-1] == "all:again" and bus.subscriber_count() == 2


def test_a_blocked_subscriber_delays_no_publisher_and_counts_what_it_drops() -> None:
    bus = EventBus()
    release = threading.Event()
    got: list[int] = []
    blocked = bus.subscribe(lambda _e: release.wait(60), topic="operation", bound=5)
    bus.subscribe(lambda e: got.append(e.data["n"]), topic="operation")
    published = threading.Event()

    def publisher() -> None:  # an engine worker
        for n in range(50):
            bus.publish(Event("operation", "updated", {"n": n}))
        published.set()

    threading.Thread(target=publisher).start()
    assert published.wait(30), "publishing never waits for a blocked subscriber"
    wait_until(lambda: len(got) == 50, timeout=30, message="the other subscriber gets every event")
    assert got == list(range(50))
    assert blocked.dropped == 50 - 5 and blocked.stats().pending == 5
    release.set()
    assert bus.drain()
    assert blocked.delivered == 5


def test_subscriptions_filter_by_data_fields() -> None:
    bus = EventBus()
    mine: list[str] = []
    bus.subscribe(lambda e: mine.append(e.data["id"]), topic="operation", where={"id": "op-1"})
    for op in ("op-1", "op-2", "op-1"):
        bus.publish(Event("operation", "updated", {"id": op}))
    bus.publish(Event("node", "changed", {"id": "op-1"}))
    assert bus.drain()
    assert mine == ["op-1", "op-1"]


