"""``instantstart jobs …``: training jobs over the running server's REST API (the same validation and roles as
the dashboard and the MCP tools), as text for a terminal and ``--json`` for scripts.

``jobs watch`` is the screenshot-free monitor: it polls the job's digest and prints a line whenever it changes
(phase, restarts used/budget, pods running, progress, the last log line), until the job ends; its exit status
says how it ended (0 Succeeded, 1 Failed).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any
from urllib.parse import quote, urlencode

from app.cli_support import rest, rest_flags

FINISHED = ("Succeeded", "Failed")


def _path(args: argparse.Namespace, suffix: str = "") -> str:
    base = f"/api/v1/clusters/{quote(args.cluster)}/jobs"
    if getattr(args, "job", None):
        base += f"/{quote(args.job)}{suffix}"
    namespace = getattr(args, "namespace", None)
    return base + (f"?{urlencode({'namespace': namespace})}" if namespace else "")


def cmd_list(args: argparse.Namespace) -> int:
    listed = rest(args, "GET", _path(args))
    if args.json:
        print(json.dumps(listed, indent=2))
        return 0
    lines = [f"{j['namespace']}/{j['name']:<28} {j['kind']:<19} {j['phase']:<10} restarts "
             f"{_budget(j['restarts'])}" + (f"  {j['reason']}" if j.get("reason") else "") for j in listed["jobs"]]
    kinds = ", ".join(listed["kinds_installed"]) or "none (no job CRD installed)"
    print("\n".join(lines) or f"no jobs in {args.cluster} (it runs: {kinds})")
    return 0


def _budget(restarts: dict[str, Any]) -> str:
    limit = restarts.get("limit")
    return f"{restarts.get('used', 0)}/{limit if limit is not None else '-'}"


def describe_text(d: dict[str, Any]) -> str:
    lines = [f"{d['namespace']}/{d['name']} ({d['kind']}, recipe {d['recipe']}): {d['phase']}, restarts "
             f"{_budget(d['restarts'])} ({d['restarts']['source']})"]
    if d.get("reason"):
        lines.append(f"  failed: {d['reason']}")
    lines += [f"  condition {c['type']}={c['status']} {c['reason']} {c['message']}".rstrip() for c in d["conditions"]]
    lines += [f"  pod {p['name']:<36} rank {p['rank'] if p['rank'] is not None else '-':<3} {p['phase'] or '-':<10} "
              f"node {p['node'] or '-'} restarts {p['restarts']}" + (f" ({p['reason']})" if p.get("reason") else "")
              for p in d["pods"]]
    lines += [f"  event {e['type'] or '-'} {e['reason'] or '-'} {e['object']}: {e['message'] or ''}"
              for e in d["events"]]
    return "\n".join(lines)


def cmd_describe(args: argparse.Namespace) -> int:
    detail = rest(args, "GET", _path(args))
    print(json.dumps(detail, indent=2) if args.json else describe_text(detail))
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """Print the digest line whenever it changes; end when the job does (or after --count lines)."""
    last: str | None = None
    printed = 0
    while True:
        digest = rest(args, "GET", _path(args, "/digest"))
        if digest["line"] != last:
            last = digest["line"]
            print(json.dumps(digest) if args.json else digest["line"], flush=True)
            printed += 1
        if digest["phase"] in FINISHED:
            return 0 if digest["phase"] == "Succeeded" else 1
        if args.count and printed >= args.count:
            return 0
        time.sleep(args.interval)


def status_jobs(summary_json: dict[str, Any], digests: dict[str, Any]) -> dict[str, Any]:
    """``instantstart status --json``: the summary with the job digests beside it."""
    return {**summary_json, "jobs": digests["jobs"], "job_errors": digests["errors"]}


def status_text(digests: dict[str, Any]) -> str:
    lines = [f"  {d['line']}" for d in digests["jobs"]]
    lines += [f"  {cluster}: jobs not read ({error})" for cluster, error in sorted(digests["errors"].items())]
    return "jobs:\n" + "\n".join(lines) if lines else "jobs: none"


def add_parsers(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="training jobs: list, describe, watch (REST)")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    listing = jsub.add_parser("list", help="a cluster's jobs with phase and restarts used/budget")
    listing.add_argument("cluster")
    listing.add_argument("--namespace", help="only this namespace")
    describe = jsub.add_parser("describe", help="one job: conditions, budget, pods with node and rank, events")
    watch = jsub.add_parser("watch", help="live text progress of one job until it ends (exit 0 Succeeded, 1 Failed)")
    for parser in (describe, watch):
        parser.add_argument("cluster")
        parser.add_argument("job")
        parser.add_argument("--namespace", help="the job's namespace (when two hold a job of that name)")
    watch.add_argument("--interval", type=float, default=5.0, help="seconds between reads (default 5)")
    watch.add_argument("--count", type=int, default=0, help="stop after this many lines (default: when it ends)")
    for parser, func in ((listing, cmd_list), (describe, cmd_describe), (watch, cmd_watch)):
        parser.add_argument("--json", action="store_true", help="JSON (watch: one digest object per line)")
        rest_flags(parser)
        parser.set_defaults(func=func)
