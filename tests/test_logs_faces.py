"""Job logs through the faces: the WebSocket (batches, exact resumption with the cursor, refusals), the text
route (tail, grep, since, the cap and the continuation hint) and the same text through a real MCP client."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import websocket
from mcp import Client, StdioServerParameters

from services.logs.models import TEXT_MAX_BYTES
from tests.logs_support import BASE_TS, CLUSTER, LogWorld, log_world, rest_server
from tests.support import ROOT, clean_env


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LogWorld, str, str]]:
    with log_world(tmp_path) as world, rest_server(world.services) as (url, token):
        yield world, url, token


def _ws(url: str, token: str, job: str, query: str = "") -> websocket.WebSocket:
    ws_url = url.replace("http://", "ws://") + f"/api/v1/clusters/{CLUSTER}/jobs/{job}/logs/ws{query}"
    return websocket.create_connection(ws_url, header=[f"Authorization: Bearer {token}"], timeout=30,
                                       suppress_origin=True)


def _frames(ws: websocket.WebSocket, count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Frames until ``count`` lines came; the lines (split out of the frames by their chunks) and the last
    frame's JSON line."""
    lines: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    while len(lines) < count:
        head, _, body = ws.recv().partition("\n")
        frame = json.loads(head)
        assert "error" not in frame, frame
        raw = body.split("\n")
        assert raw.pop() == "" and len(raw) == sum(chunk["lines"] for chunk in frame["chunks"])  # whole lines
        for chunk in frame["chunks"]:
            for _ in range(chunk["lines"]):
                ts, text = raw.pop(0).split(" ", 1)
                lines.append({"pod": chunk["pod"], "container": chunk["container"], "ts": ts, "text": text})
    return lines, frame


def test_websocket_batches_resume_exactly_with_the_cursor(served: tuple[LogWorld, str, str]) -> None:
    world, url, token = served
    world.pod("train-worker-0", "train")
    for i in range(4):
        world.log("train-worker-0", f"a{i}", BASE_TS + 0.5)  # one second, one timestamp
    ws = _ws(url, token, "train")
    try:
        lines, frame = _frames(ws, 4)
        assert [(line["pod"], line["text"]) for line in lines] == [("train-worker-0", f"a{i}") for i in range(4)]
        assert lines[0]["ts"].startswith("2026-01-01T00:00:00.5") and frame["dropped"] == 0
        world.log("train-worker-0", "a4", BASE_TS + 0.5)
        lines, frame = _frames(ws, 1)
        assert [line["text"] for line in lines] == ["a4"]
    finally:
        ws.close()
    for i in range(5, 8):  # written while no one is connected, in the same second
        world.log("train-worker-0", f"a{i}", BASE_TS + 0.9)
    ws = _ws(url, token, "train", f"?cursor={frame['cursor']}")
    try:
        lines, _ = _frames(ws, 3)
        assert [line["text"] for line in lines] == ["a5", "a6", "a7"]
    finally:
        ws.close()


def test_websocket_refusals_arrive_as_the_error_envelope(served: tuple[LogWorld, str, str]) -> None:
    _, url, token = served
    ws = _ws(url, token, "train", "?tail=-1")
    try:
        frame = json.loads(ws.recv())
        assert frame["error"]["code"] == "invalid" and "tail" in frame["error"]["message"]
    finally:
        ws.close()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        _ws(url, "not-a-token", "train")
    assert refused.value.status_code == 401


def _text(url: str, token: str, job: str, **params: Any) -> httpx2.Response:
    return httpx2.get(f"{url}/api/v1/clusters/{CLUSTER}/jobs/{job}/logs", params=params, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})


def test_text_route_tail_grep_since_and_continuation(served: tuple[LogWorld, str, str]) -> None:
    world, url, token = served
    world.pod("train-worker-0", "train")
    world.pod("train-worker-1", "train")
    for i in range(30):
        world.log(f"train-worker-{i % 2}", f"step {i} loss 1.{i:02d}" if i % 10 else f"NCCL INFO ring {i}",
                  BASE_TS + i)
    r = _text(url, token, "train", tail=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    body = r.text.splitlines()
    assert body[:5] == [f"2026-01-01T00:00:{i:02d}.000000000Z train-worker-{i % 2} step {i} loss 1.{i:02d}"
                        for i in range(25, 30)]
    assert body[5].startswith("# 5 line(s); 25 earlier matching line(s) not shown") and "cursor=" in body[5]
    assert r.headers["X-Log-Earlier"] == "25"
    grep = _text(url, token, "train", grep="nccl").text.splitlines()
    assert [line.split(" ", 2)[2] for line in grep[:-1]] == ["NCCL INFO ring 0", "NCCL INFO ring 10",
                                                             "NCCL INFO ring 20"]
    since = _text(url, token, "train", since="2026-01-01T00:00:28Z", pod="train-worker-1").text.splitlines()
    assert [line.split(" ", 2)[2] for line in since[:-1]] == ["step 29 loss 1.29"]
    cursor = r.headers["X-Log-Cursor"]
    world.log("train-worker-0", "new after the read", BASE_TS + 29)
    newer = _text(url, token, "train", cursor=cursor).text.splitlines()
    assert [line.split(" ", 2)[2] for line in newer[:-1]] == ["new after the read"]
    assert _text(url, token, "train", grep="(").status_code == 422
    assert _text(url, token, "nope").status_code == 404


def test_text_route_caps_bytes_and_keeps_the_newest_lines(served: tuple[LogWorld, str, str]) -> None:
    world, url, token = served
    world.pod("train-worker-0", "train")
    for i in range(400):
        world.log("train-worker-0", f"{i:04d} " + "x" * 1_000, BASE_TS + i * 0.01)
    r = _text(url, token, "train", tail=2_000)
    body = r.text.splitlines()
    assert len(r.content) <= TEXT_MAX_BYTES + 500
    assert body[-2].split(" ", 2)[2].startswith("0399 ")  # the newest line is kept
    assert "earlier matching line(s) not shown" in body[-1]


def test_the_text_reaches_an_agent_through_a_real_mcp_client(served: tuple[LogWorld, str, str]) -> None:
    world, url, token = served
    world.pod("train-worker-0", "train")
    world.log("train-worker-0", "Saving model checkpoint to /s3/jobs/train/checkpoints/checkpoint-50", BASE_TS)
    world.log("train-worker-0", "[rank0] step 50/100 | loss 2.3456", BASE_TS + 1)

    async def agent() -> tuple[list[str], str, bool]:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "app.cli", "mcp", "--url", url, "--toolsets", "jobs"],
                                       env={**clean_env(), "INSTANTSTART_TOKEN": token}, cwd=str(ROOT))
        async with Client(params) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool("jobs_logs", {"cluster": CLUSTER, "job": "train", "grep": "checkpoint"})
            text = "".join(getattr(c, "text", "") for c in result.content)
            return tools, text, bool(result.is_error)

    tools, text, failed = anyio.run(agent)
    assert "jobs_logs" in tools and not failed
    lines = text.splitlines()
    assert lines[0].endswith("train-worker-0 Saving model checkpoint to /s3/jobs/train/checkpoints/checkpoint-50")
    assert lines[1].startswith("# 1 line(s)") and len(lines) == 2
