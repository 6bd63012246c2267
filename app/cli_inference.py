"""``instantstart inference …``: self-managed inference deployments over the running server's REST API (the same
validation and roles as the dashboard and the MCP tools), as text for a terminal and ``--json`` for scripts:
list a cluster's deployments, describe one, send it one test request, and get, set or remove its KEDA
autoscaling (``inference scaling get|set|remove``; ``--wait`` follows the operation)."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from app import cli_inference_paths
from app.cli_clusters import finish
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


def scaling_text(v: dict[str, Any]) -> str:
    if not v["enabled"]:
        return f"{v['namespace']}/{v['name']}: not autoscaled ({v['replicas']} replicas)"
    ready = {True: "Ready", False: "not Ready", None: "not checked yet"}[v.get("ready")]
    lines = [f"{v['namespace']}/{v['name']}: KEDA {v['min_replicas']}-{v['max_replicas']} replicas, {ready} "
             f"(desired {v.get('desired_replicas')}, current {v.get('current_replicas')}) {v.get('message') or ''}"]
    lines += [f"  trigger {t['kind']}: {t['query']} per replica {t['threshold']:g}" for t in v["triggers"]]
    lines += [f"  metric {m}" for m in v.get("metrics") or []]
    lines += [f"  component {c['name']} {c['version']} {c['status']}" for c in v["components"]]
    return "\n".join(lines)


def cmd_scaling_get(args: argparse.Namespace) -> int:
    view = rest(args, "GET", _path(args, "/scaling"))
    print(json.dumps(view, indent=2) if args.json else scaling_text(view))
    return 0


def cmd_scaling_set(args: argparse.Namespace) -> int:
    body = {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas, "request_rate": args.request_rate,
            "queue_depth": args.queue_depth, "polling_interval": args.polling_interval,
            "cooldown_period": args.cooldown_period}
    accepted = rest(args, "PUT", _path(args, "/scaling"), {k: v for k, v in body.items() if v is not None})
    return finish(args, accepted, f"{args.name} autoscaled ({{id}} succeeded)")


def cmd_scaling_remove(args: argparse.Namespace) -> int:
    accepted = rest(args, "DELETE", _path(args, "/scaling"))
    return finish(args, accepted, f"autoscaling of {args.name} removed ({{id}} succeeded)")


def _scaling_parsers(isub: Any) -> None:
    scaling = isub.add_parser("scaling", help="KEDA autoscaling of a deployment on its engine's metrics: get, set, "
                                              "remove (REST)")
    ssub = scaling.add_subparsers(dest="scaling_command", required=True)
    get = ssub.add_parser("get", help="the ScaledObject's bounds, triggers and Ready, the HPA, KEDA and Prometheus")
    put = ssub.add_parser("set", help="autoscale (installs KEDA and Prometheus on first use); again: new settings")
    remove = ssub.add_parser("remove", help="stop autoscaling (the replicas stay as they are)")
    put.add_argument("--max-replicas", type=int, required=True, help="the most replicas KEDA may run")
    put.add_argument("--min-replicas", type=int, help="replicas kept when idle (default 1)")
    put.add_argument("--request-rate", type=float, help="completed requests per second one replica should serve")
    put.add_argument("--queue-depth", type=float, help="waiting requests per replica")
    put.add_argument("--polling-interval", type=int, help="seconds between KEDA's evaluations (default 30)")
    put.add_argument("--cooldown-period", type=int, help="seconds before scaling down after activity (default 300)")
    for parser, func in ((get, cmd_scaling_get), (put, cmd_scaling_set), (remove, cmd_scaling_remove)):
        parser.add_argument("cluster")
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true", help="the REST answer as JSON")
        if parser is not get:
            parser.add_argument("--wait", action="store_true", help="follow the operation until it ends")
        rest_flags(parser)
        parser.set_defaults(func=func)


def add_parsers(sub: Any) -> None:
    inference = sub.add_parser("inference", help="self-managed vLLM / SGLang deployments: list, describe, test, "
                                                 "scaling (REST)")
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
    _scaling_parsers(isub)
