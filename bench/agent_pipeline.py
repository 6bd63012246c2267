"""Agent tool calls and tool-output tokens to drive "create a cluster" end to end, next to the incumbent's
polling playbook, through a real MCP client against a real ``instantstart serve`` in sandbox mode.

A (ours, ``skills/create-cluster-pipeline.md``): whoami -> clusters_options -> clusters_list -> clusters_plan
(the dry run) -> clusters_create -> operations_wait with a long timeout (up to 30 AWS minutes a call; the
bridge long-polls and sends progress notifications meanwhile) until the operation has ended -> clusters_get
-> clusters_kubeconfig (where the server offers it).
B (the incumbent's pattern, on the same operation at the same time, over its own MCP session): the same
calls before and after the wait, then a ``wait_seconds`` sleep call and a status call (operations_get, no wait) every
``--interval`` AWS seconds until the operation has ended, then clusters_get. B's sleep tool is not ours:
it is counted as one call whose output is the incumbent's ``{"waited_seconds": N}``.

The sandbox runs at ``--speed``; every wait is given in AWS seconds and divided by the same factor (the
sandbox clock scaled back), so a 30-minute AWS wait costs seconds here, and the pipeline's duration is
reported in AWS seconds (its real duration times the speed). Tokens are estimated as characters / 4 of
the text content every tool result carries (what the agent reads into its context).

``--pipeline import`` measures the same machinery on ``cluster.import`` of a seeded cluster, for servers
without the create route. Without ``POST /api/v1/clusters`` (tool ``clusters_create``) ``--pipeline
create`` refuses with exit code 2.

    python bench/agent_pipeline.py [--speed 300] [--pipeline create|import] [--interval 90] [--wait 1800]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import boto3
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.sandbox import SANDBOX_ACCESS_KEY  # noqa: E402
from bench.world import ADMIN_POLICY, INSTANCE_TYPE, cli, sandbox_env  # noqa: E402
from sandbox.seed import iam_principal  # noqa: E402
from tests.support import LiveServer, clean_env, free_port, start_server  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled")
CHARS_PER_TOKEN = 4


class Refused(Exception):
    pass


def refusal(exc: BaseException) -> Refused | None:
    """The refusal inside ``exc`` (the MCP client's task groups wrap what a session's body raised)."""
    if isinstance(exc, Refused):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((r for r in map(refusal, exc.exceptions) if r is not None), None)
    return None


@dataclass
class Tally:
    """Tool calls and the characters of their results, per phase."""

    calls: int = 0
    chars: int = 0
    progress: int = 0
    by_tool: dict[str, int] = field(default_factory=dict)

    def add(self, tool: str, text: str) -> None:
        self.calls += 1
        self.chars += len(text)
        self.by_tool[tool] = self.by_tool.get(tool, 0) + 1

    @property
    def tokens(self) -> int:
        return self.chars // CHARS_PER_TOKEN

    def plus(self, other: Tally) -> Tally:
        merged = dict(self.by_tool)
        for k, v in other.by_tool.items():
            merged[k] = merged.get(k, 0) + v
        return Tally(self.calls + other.calls, self.chars + other.chars, self.progress + other.progress, merged)


@asynccontextmanager
async def session(live: LiveServer) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", live.url],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": live.admin_token}, cwd=str(ROOT))
    async with Client(params) as client:
        yield client


async def call(client: Client, tally: Tally, tool: str, arguments: dict[str, Any], **kw: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments, **kw)
    text = "".join(getattr(c, "text", "") for c in result.content)
    tally.add(tool, text)
    if result.is_error:
        raise RuntimeError(f"{tool} {json.dumps(arguments)} failed: {text[:1000]}")
    return dict(result.structured_content or {})


def choose(options: dict[str, Any], count: int) -> tuple[str, str]:
    """The decisions an agent takes from the options read: a type with quota for ``count``, a zone offering it."""
    fits = [t for t in options.get("instance_types", []) if t.get("zones")
            and (t.get("quota") is None or t["quota"] - t.get("in_use", 0) >= count)]
    if not fits:
        raise Refused(f"clusters_options offers no instance type with quota for {count} nodes")
    pick = next((t for t in fits if t["instance_type"] == INSTANCE_TYPE), fits[0])
    return str(pick["zones"][0]), str(pick["instance_type"])


def served_tools(live: LiveServer) -> set[str]:
    """The tool names the server's route table carries (what the bridge will offer)."""
    document = live.get("/api/v1/openapi.json").json()
    return {op["x-mcp-tool"]["name"] for methods in document["paths"].values() for op in methods.values()
            if isinstance(op, dict) and "x-mcp-tool" in op}


async def start_create(client: Client, tools: set[str], tally: Tally, name: str, count: int) -> str:
    """Steps 1-4 of the playbook: whoami, clusters_options, clusters_list, the plan, clusters_create."""
    await call(client, tally, "whoami", {})
    options = await call(client, tally, "clusters_options", {})
    await call(client, tally, "clusters_list", {})
    zone, instance_type = choose(options, count)
    decisions = {"name": name, "zone": zone, "instance_type": instance_type, "count": count}
    if "clusters_plan" in tools:
        plan = await call(client, tally, "clusters_plan", decisions)
    else:
        plan = await call(client, tally, "clusters_create", {**decisions, "dry_run": True})
    if not plan.get("stages"):
        raise Refused("this server's cluster.create has no stages yet (the plan lists none): the operation would "
                      "end at once and create nothing; --pipeline import measures the same machinery")
    made = await call(client, tally, "clusters_create", decisions)
    return str(made["operation"]["id"])


async def start_import(client: Client, tally: Tally, name: str) -> str:
    await call(client, tally, "whoami", {})
    made = await call(client, tally, "clusters_import", {"eks_cluster": name, "hyperpod_cluster": name})
    return str(made["operation"]["id"])


async def follow_ours(client: Client, tally: Tally, op_id: str, wait_aws: float, speed: float) -> dict[str, Any]:
    async def progress(value: float, total: float | None, message: str | None) -> None:
        tally.progress += 1

    while True:
        view = await call(client, tally, "operations_wait", {"id": op_id, "timeout": round(wait_aws / speed, 3)},
                          progress_callback=progress)
        if view["status"] in TERMINAL:
            return view


async def follow_incumbent(client: Client, tally: Tally, op_id: str, interval_aws: float,
                           speed: float) -> dict[str, Any]:
    while True:
        await anyio.sleep(interval_aws / speed)  # the incumbent's wait_seconds tool, scaled to the sandbox
        tally.add("wait_seconds", json.dumps({"waited_seconds": interval_aws}))
        view = await call(client, tally, "operations_get", {"id": op_id})
        if view["status"] in TERMINAL:
            return view


async def finish(client: Client, tools: set[str], tally: Tally, name: str) -> None:
    """The playbook's last step: the cluster's detail, and a kubeconfig for kubectl where the tool exists."""
    await call(client, tally, "clusters_get", {"cluster": name})
    if "clusters_kubeconfig" in tools:
        await call(client, tally, "clusters_kubeconfig", {"cluster": name})


def aws_seconds(view: dict[str, Any], speed: float) -> float:
    took = datetime.fromisoformat(view["updated_at"]) - datetime.fromisoformat(view["created_at"])
    return took.total_seconds() * speed


async def drive(live: LiveServer, a: argparse.Namespace) -> tuple[Tally, Tally, Tally, dict[str, Any]]:
    prefix, ours, theirs = Tally(), Tally(), Tally()
    async with session(live) as agent, session(live) as incumbent:
        tools = {t.name for t in (await agent.list_tools()).tools}
        if a.pipeline == "create":
            op_id = await start_create(agent, tools, prefix, a.name, a.count)
        else:
            op_id = await start_import(agent, prefix, a.name)
        views: dict[str, dict[str, Any]] = {}

        async def run_ours() -> None:
            views["ours"] = await follow_ours(agent, ours, op_id, a.wait, a.speed)
            if views["ours"]["status"] != "succeeded":  # a pipeline that did not finish measures nothing
                raise RuntimeError(f"{op_id} ended {views['ours']['status']}: {json.dumps(views['ours']['error'])}")
            await finish(agent, tools, ours, a.name)

        async def run_theirs() -> None:
            views["theirs"] = await follow_incumbent(incumbent, theirs, op_id, a.interval, a.speed)
            await finish(incumbent, tools, theirs, a.name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_ours)
            tg.start_soon(run_theirs)
    return prefix, ours, theirs, views["ours"]


def seed(live: LiveServer, name: str) -> None:
    """A seeded cluster our principal may reach (what ``--pipeline import`` imports)."""
    env = sandbox_env(live)
    cli(live, "sandbox", "seed", "--name", name, "--nodes", "1", "--instance-type", INSTANCE_TYPE)

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],  # type: ignore[call-overload]
                            aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])

    principal = iam_principal(client("sts").get_caller_identity()["Arn"])
    eks = client("eks")
    if principal not in eks.list_access_entries(clusterName=name)["accessEntries"]:
        eks.create_access_entry(clusterName=name, principalArn=principal)
        eks.associate_access_policy(clusterName=name, principalArn=principal, policyArn=ADMIN_POLICY,
                                    accessScope={"type": "cluster"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", type=float, default=300, help="sandbox clock speed (AWS seconds per second)")
    parser.add_argument("--pipeline", choices=("create", "import"), default="create")
    parser.add_argument("--name", default="bench-agent")
    parser.add_argument("--count", type=int, default=2, help="nodes in the first instance group")
    parser.add_argument("--wait", type=float, default=1800, help="ours: AWS seconds one operations_wait may last")
    parser.add_argument("--interval", type=float, default=90, help="incumbent: AWS seconds between status polls")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        live = start_server(Path(tmp) / "data", env={"INSTANTSTART_SANDBOX_SPEED": str(a.speed),
                                                     "INSTANTSTART_SANDBOX_AWS_PORT": str(free_port()),
                                                     "INSTANTSTART_SANDBOX_KUBE_PORT": str(free_port())})
        try:
            if a.pipeline == "create" and "clusters_create" not in served_tools(live):
                raise Refused("this server has no cluster.create route (POST /api/v1/clusters, MCP tool "
                              "clusters_create): nothing to drive; --pipeline import measures the same machinery "
                              "on cluster.import")
            if a.pipeline == "import":
                seed(live, a.name)
            prefix, ours, theirs, view = anyio.run(drive, live, a)
        except BaseException as exc:
            refused = refusal(exc)
            if refused is None:
                raise
            print(f"refused: {refused}", file=sys.stderr)
            return 2
        finally:
            live.stop()
    took = aws_seconds(view, a.speed)
    mine, incumbent = prefix.plus(ours), prefix.plus(theirs)
    print(f"pipeline {view['kind']} {view['status']}: {took:.0f} AWS s ({took / 60:.1f} min; "
          f"{took / a.speed:.1f} s here at sandbox speed {a.speed:g}); tokens = characters / {CHARS_PER_TOKEN}")
    print(f"A ours (operations_wait up to {a.wait:g} AWS s + progress): {mine.calls} calls, {mine.tokens} tokens, "
          f"{ours.progress} progress notifications; {json.dumps(mine.by_tool, sort_keys=True)}")
    print(f"B incumbent (wait_seconds + status every {a.interval:g} AWS s): {incumbent.calls} calls, "
          f"{incumbent.tokens} tokens; {json.dumps(incumbent.by_tool, sort_keys=True)}")
    print(f"ratio B/A: calls {incumbent.calls / mine.calls:.1f}x, tokens {incumbent.tokens / max(1, mine.tokens):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
