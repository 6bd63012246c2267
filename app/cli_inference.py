"""``instantstart inference …``: self-managed inference deployments over the running server's REST API (the same
validation and roles as the dashboard and the MCP tools), as text for a terminal and ``--json`` for scripts:
list a cluster's deployments, describe one, and send it one test request."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from app import cli_inference_paths
from app.cli_support import rest, rest_flags


def _path(args: argparse.Namespace, suffix: str = "") -> str:
    base = f"/api/v1/clusters/{quote(args.cluster)}/inference/deployments"
    name = getattr(args, "name", None)
    return base + (f"/{quote(name)}{suffix}" if name else "")


def _service(d: dict[str, Any]) -> str:
    svc = d.get("service")
    if not svc:
        return "no service"
    return f"{svc['type']} {svc.get('address') or svc.get('cluster_ip') or '-'}:{svc['port']}"


def line(d: dict[str, Any]) -> str:
    return (f"{d['namespace']}/{d['name']:<24} {d.get('engine') or '-':<7} {d['phase']:<12} "
            f"{d['available']}/{d['replicas']} available  {d.get('gpus') or '-'} GPU  {_service(d)}  "
            f"{d.get('model') or ''}")


def cmd_list(args: argparse.Namespace) -> int:
    listed = rest(args, "GET", _path(args))
    if args.json:
        print(json.dumps(listed, indent=2))
        return 0
    print("\n".join(line(d) for d in listed["deployments"]) or f"no inference deployments in {args.cluster}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    d = rest(args, "GET", _path(args))
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    lines = [line(d), f"  image {d.get('image') or '-'}: {d['message']}"]
    lines += [f"  pod {p['name']:<40} {p['phase'] or '-':<10} node {p['node'] or '-'} restarts {p['restarts']}"
              for p in d["pods"]]
    print("\n".join(lines))
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    result = rest(args, "POST", _path(args, "/test"), {"prompt": args.prompt, "api": args.api,
                                                       "max_tokens": args.max_tokens})
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"HTTP {result['status']} in {result['elapsed_ms']} ms")
        print(result["text"] if result.get("text") is not None else json.dumps(result["answer"], indent=2))
    return 0 if 200 <= int(result["status"]) < 300 else 1


def add_parsers(sub: Any) -> None:
    inference = sub.add_parser("inference", help="self-managed vLLM / SGLang deployments: list, describe, test (REST)")
    isub = inference.add_subparsers(dest="inference_command", required=True)
    listing = isub.add_parser("list", help="a cluster's deployments: phase, replicas, GPUs, Service address")
    listing.add_argument("cluster")
    describe = isub.add_parser("describe", help="one deployment with its pods and nodes")
    test = isub.add_parser("test", help="one OpenAI-compatible request through the control plane (exit 1 unless 2xx)")
    for parser in (describe, test):
        parser.add_argument("cluster")
        parser.add_argument("name")
    test.add_argument("--prompt", default="Say hello in one short sentence.")
    test.add_argument("--api", choices=("chat", "completion"), default="chat")
    test.add_argument("--max-tokens", type=int, default=32)
    for parser, func in ((listing, cmd_list), (describe, cmd_describe), (test, cmd_test)):
        parser.add_argument("--json", action="store_true", help="the REST answer as JSON")
        rest_flags(parser)
        parser.set_defaults(func=func)
    cli_inference_paths.add_parsers(isub)
