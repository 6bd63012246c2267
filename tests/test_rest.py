"""REST end to end against a real `instantstart serve`: auth and roles, envelopes, idempotency, OpenAPI,
sessions with XSRF, the events WebSocket and tokens."""

from __future__ import annotations

import json
import re

import httpx2
import pytest
import websocket
from openapi_spec_validator import validate

from tests.support import LiveServer

pytestmark = pytest.mark.slow


def error(r: httpx2.Response) -> dict[str, object]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    return dict(body["error"])


def test_health_and_readiness(server: LiveServer) -> None:
    assert httpx2.get(server.url + "/healthz").json()["status"] == "ok"
    ready = httpx2.get(server.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "engine": "ok"}


def test_no_token_is_401_viewer_mutation_is_403_operator_is_accepted(server: LiveServer) -> None:
    r = httpx2.get(server.url + "/api/v1/operations")
    assert r.status_code == 401 and error(r)["code"] == "unauthorized"
    r = httpx2.get(server.url + "/api/v1/operations", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    r = server.get("/api/v1/operations", token="ist_deadbeef_nope")
    assert r.status_code == 401 and str(error(r)["message"]).startswith("unknown token")

    viewer = server.make_token("viewer", "rest-viewer")
    assert server.get("/api/v1/operations", token=viewer).status_code == 200
    r = server.post("/api/v1/backups", {"label": "by-viewer"}, token=viewer)
    assert r.status_code == 403 and error(r)["details"] == {"required_role": "operator", "role": "viewer"}
    denied = server.get("/api/v1/audit?actor=rest-viewer").json()
    assert denied[0]["outcome"] == "denied" and denied[0]["action"] == "backups_create"

    operator = server.make_token("operator", "rest-operator")
    server.no_backup_running()
    r = server.post("/api/v1/backups", {"label": "by-operator"}, token=operator)
    assert r.status_code == 202, r.text
    body = r.json()
    assert r.headers["Location"] == body["status_url"] == f"/api/v1/operations/{body['operation']['id']}"
    assert body["status_tool"] == "operations_get" and body["created"] is True
    assert server.get("/api/v1/tokens", token=operator).status_code == 403


def test_same_idempotency_key_yields_one_operation(server: LiveServer) -> None:
    headers = {"Idempotency-Key": "nightly-2026-11-30"}
    server.no_backup_running()
    first = server.post("/api/v1/backups", {"label": "nightly"}, headers=headers)
    second = server.post("/api/v1/backups", {"label": "nightly"}, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json()["operation"]["id"] == second.json()["operation"]["id"]
    assert second.json()["created"] is False
    ops = server.get("/api/v1/operations?kind=backup.create&limit=500").json()
    assert sum(op["request"] == {"label": "nightly"} for op in ops) == 1
    clash = server.post("/api/v1/backups", {"label": "other"}, headers=headers)
    assert clash.status_code == 409 and error(clash)["code"] == "conflict"


def test_validation_errors_list_fields_with_suggestions(server: LiveServer) -> None:
    r = server.post("/api/v1/backups", {"lable": "x", "label": "Bad Label"})
    assert r.status_code == 422
    fields = {f["field"]: f["message"] for f in error(r)["details"]["fields"]}  # type: ignore[index]
    assert "Did you mean 'label'?" in fields["lable"]
    assert "label" in fields
    r = server.get("/api/v1/operations?limt=5")
    assert r.status_code == 422 and "Did you mean 'limit'?" in str(error(r)["message"])
    assert server.get("/api/v1/operations?limit=0").status_code == 422
    r = httpx2.post(server.url + "/api/v1/backups", content=b"{not json", headers=server.headers())
    assert r.status_code == 422 and "not valid JSON" in str(error(r)["message"])


def test_unknown_route_and_method_use_the_envelope(server: LiveServer) -> None:
    r = server.get("/api/v1/nothing-here")
    assert r.status_code == 404 and error(r)["code"] == "not_found"
    r = httpx2.delete(server.url + "/api/v1/operations", headers=server.headers())
    assert r.status_code == 405 and error(r)["code"] == "method_not_allowed" and "GET" in r.headers["Allow"]
    r = server.get("/api/v1/operations/op-missing")
    assert r.status_code == 404 and error(r)["code"] == "not_found"


def test_openapi_is_valid_and_generated_from_the_route_table(server: LiveServer) -> None:
    from app.routes import ROUTES

    document = httpx2.get(server.url + "/api/v1/openapi.json").json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    operations = {op["operationId"]: op for path in document["paths"].values() for op in path.values()}
    core = {r.name for r in ROUTES}
    assert core <= set(operations)
    assert all(name.startswith("sandbox_") for name in set(operations) - core)  # mounted in sandbox mode
    backup = operations["backups_create"]
    assert backup["x-required-role"] == "operator"
    assert backup["x-mcp-tool"]["readOnlyHint"] is False
    schema = document["components"]["schemas"]["BackupCreate"]
    assert schema["additionalProperties"] is False and "pattern" in schema["properties"]["label"]


def test_long_poll_returns_when_an_operation_ends(server: LiveServer) -> None:
    op = server.post("/api/v1/backups", {"label": "longpoll"}).json()["operation"]
    view = op
    while view["status"] not in ("succeeded", "failed", "cancelled"):
        # wait=60 is the longest long-poll; the client gives up well before it, so a server that answered
        # at its timeout instead of on the change fails here (and each answer must be a newer version)
        reply = httpx2.get(f"{server.url}/api/v1/operations/{op['id']}?wait=60", headers=server.headers(),
                           timeout=45)
        assert reply.status_code == 200, reply.text
        assert reply.json()["version"] > view["version"], "long-poll answered without a change"
        view = reply.json()
    assert view["status"] == "succeeded"
    assert server.get(f"/api/v1/operations/{op['id']}?wait=61").status_code == 422


def test_events_websocket_pushes_operation_transitions(server: LiveServer) -> None:
    ws_url = server.url.replace("http://", "ws://") + "/api/v1/events"
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(ws_url, timeout=5)
    assert refused.value.status_code == 401
    ws = websocket.create_connection(ws_url, header=[f"Authorization: Bearer {server.admin_token}"], timeout=10)
    try:
        op_id = server.post("/api/v1/backups", {"label": "ws"}).json()["operation"]["id"]
        statuses = []
        while "succeeded" not in statuses:
            event = json.loads(ws.recv())
            if event["topic"] == "operation" and event["data"]["id"] == op_id:
                statuses.append(event["data"]["status"])
    finally:
        ws.close()
    assert statuses[0] == "pending" and "running" in statuses


def login(server: LiveServer, token: str) -> httpx2.Client:
    client = httpx2.Client(base_url=server.url, follow_redirects=False, timeout=10)
    page = client.get("/login")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert xsrf, page.text
    r = client.post("/login", data={"token": token, "_xsrf": xsrf.group(1)})
    assert r.status_code == 302, r.text
    return client


def test_dashboard_session_cookie_needs_xsrf_for_mutations(server: LiveServer) -> None:
    client = login(server, server.admin_token)
    cookie = next(c for c in client.cookies.jar if c.name == "instantstart_session")
    assert cookie.has_nonstandard_attr("HttpOnly") and cookie.secure
    # httpx keeps Secure cookies for https; browsers also send them to loopback, so send it by hand
    xsrf_token = next(c for c in client.cookies.jar if c.name == "instantstart_xsrf").value  # the session's own
    session = {"Cookie": f"instantstart_session={cookie.value}; _xsrf={client.cookies['_xsrf']}"}
    who = httpx2.get(server.url + "/api/v1/whoami", headers=session).json()
    assert who["face"] == "ui" and who["role"] == "admin"
    r = httpx2.post(server.url + "/api/v1/backups", json={"label": "from-ui"}, headers=session)
    assert r.status_code == 403 and "XSRF" in error(r)["message"]  # type: ignore[operator]
    r = httpx2.post(server.url + "/api/v1/backups", json={"label": "from-ui"},
                    headers={**session, "X-XSRFToken": xsrf_token})
    assert r.status_code == 202 and r.json()["operation"]["face"] == "ui"
    # a wrong token on the form is refused with a message, and no cookie
    fresh = httpx2.Client(base_url=server.url, timeout=10)
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', fresh.get("/login").text)
    assert xsrf
    r = fresh.post("/login", data={"token": "ist_00000000_wrong", "_xsrf": xsrf.group(1)})
    assert r.status_code == 401 and "unknown token" in r.text and "instantstart_session" not in fresh.cookies
    # without the XSRF field the form itself is refused
    assert fresh.post("/login", data={"token": server.admin_token}).status_code == 403


def test_tokens_create_list_revoke(server: LiveServer) -> None:
    created = server.post("/api/v1/tokens", {"name": "ci-bot", "role": "operator"})
    assert created.status_code == 201
    secret, token_id = created.json()["token"], created.json()["id"]
    assert server.get("/api/v1/whoami", token=secret).json()["name"] == "ci-bot"
    listed = server.get("/api/v1/tokens").json()
    assert all("token" not in t and "hash" not in t for t in listed)
    assert server.post("/api/v1/tokens", {"name": "ci-bot", "role": "viewer"}).status_code == 409
    assert server.post("/api/v1/tokens", {"name": "x", "role": "root"}).status_code == 422
    revoked = httpx2.delete(f"{server.url}/api/v1/tokens/{token_id}", headers=server.headers())
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    r = server.get("/api/v1/whoami", token=secret)
    assert r.status_code == 401 and "revoked" in str(error(r)["message"])
    me = server.get("/api/v1/whoami").json()["token_id"]
    assert httpx2.delete(f"{server.url}/api/v1/tokens/{me}", headers=server.headers()).status_code == 409
    actions = {e["action"] for e in server.get("/api/v1/audit?actor=admin&limit=500").json()}
    assert {"token.create", "token.revoke", "backup.create"} <= actions


def test_operations_retry_and_cancel_routes_check_state(server: LiveServer) -> None:
    op = server.post("/api/v1/backups", {"label": "ctl"}).json()["operation"]
    done = server.get(f"/api/v1/operations/{op['id']}/wait?timeout=120").json()
    assert done["status"] == "succeeded"
    r = server.post(f"/api/v1/operations/{op['id']}/retry")
    assert r.status_code == 409 and error(r)["code"] == "conflict"
    r = server.post(f"/api/v1/operations/{op['id']}/cancel")
    assert r.status_code == 409


def test_status_summary(server: LiveServer) -> None:
    status = server.get("/api/v1/status").json()
    assert status["operations"].get("succeeded", 0) >= 1
    assert {"version", "active", "recent_failures", "clusters"} <= set(status)
