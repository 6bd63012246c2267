"""``instantstart inference endpoints|routers list|describe``: the managed endpoints (the inference operator's
InferenceEndpointConfig / JumpStartModel) and the SGLang routers of a cluster, over the running server's REST API,
as text for a terminal and ``--json`` for scripts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from app.cli_support import rest, rest_flags


def _path(args: argparse.Namespace, noun: str) -> str:
    base = f"/api/v1/clusters/{quote(args.cluster)}/inference/{noun}"
    name = getattr(args, "name", None)
    return base + (f"/{quote(name)}" if name else "")


def endpoint_line(e: dict[str, Any]) -> str:
    scaled = "" if e.get("scaled_to") is None else f", scaled to {e['scaled_to']}"  # what the autoscaler chose
    return (f"{e['namespace']}/{e['name']:<24} {e['kind']:<24} {e.get('state') or '-':<22} "
            f"{e['available']}/{e['desired']} available{scaled}  {','.join(e['instance_types']) or '-'}  "
            f"{e.get('service') or 'no service'}  {e.get('model') or ''}")


def endpoint_text(e: dict[str, Any]) -> str:
    bounds = e.get("autoscaling")
    scaling = f"{bounds['min_replicas']}-{bounds['max_replicas']} replicas" if bounds else "off"
    lines = [endpoint_line(e), f"  source {e.get('source') or '-'}, routing {e.get('routing') or 'none'}, "
             f"KV cache {e.get('kv_cache') or 'none'}, autoscaling {scaling}: {e['message']}"]
    lines += [f"  condition {c['type']}={c['status']} {c.get('reason') or ''} {c.get('message') or ''}".rstrip()
              for c in e["conditions"]]
    return "\n".join(lines)


def router_line(r: dict[str, Any]) -> str:
    policy = (r.get("knobs") or {}).get("policy") or "-"
    running = sum(1 for w in r["workers"] if w.get("phase") == "Running")
    if r["phase"] == "Orphaned":
        return f"{r['namespace']}/{r['name']:<24} {policy:<12} Orphaned     left: {', '.join(r.get('left') or [])}"
    workers = f"{r['deployment']}/{r['pool_service']}" if r.get("pool_service") else r["deployment"]
    return (f"{r['namespace']}/{r['name']:<24} {policy:<12} {r['phase']:<12} for {workers} "
            f"({running}/{len(r['workers'])} workers running)")


def router_text(r: dict[str, Any]) -> str:
    lines = [router_line(r), f"  {r['message']}"]
    if r.get("requests_total") is not None:
        lines.append(f"  {r['requests_total']} requests, cache hits {r['cache_hits']}, misses {r['cache_misses']}")
    elif r.get("metrics_error"):
        lines.append(f"  metrics: {r['metrics_error']}")
    lines += [f"  worker {w['pod']:<40} {w.get('phase') or '-':<10} "
              f"{'ready' if w.get('ready') else 'not ready'}  {w.get('requests') or 0} requests" for w in r["workers"]]
    return "\n".join(lines)


def _lister(noun: str, line: Callable[[dict[str, Any]], str]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        listed = rest(args, "GET", _path(args, noun))
        print(json.dumps(listed, indent=2) if args.json
              else "\n".join(line(item) for item in listed[noun]) or f"no {noun} in {args.cluster}")
        return 0
    return run


def _describer(noun: str, text: Callable[[dict[str, Any]], str]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        view = rest(args, "GET", _path(args, noun))
        print(json.dumps(view, indent=2) if args.json else text(view))
        return 0
    return run


def add_parsers(isub: Any) -> None:
    """``endpoints`` and ``routers`` under ``instantstart inference``."""
    for noun, what, line, text in (
            ("endpoints", "managed endpoints (the inference operator's resources)", endpoint_line,
             endpoint_text),
            ("routers", "SGLang routers in front of self-managed deployments", router_line, router_text)):
        parser = isub.add_parser(noun, help=f"{what}: list, describe (REST)")
        nsub = parser.add_subparsers(dest=f"{noun}_command", required=True)
        listing = nsub.add_parser("list", help=f"a cluster's {what}")
        listing.add_argument("cluster")
        describe = nsub.add_parser("describe", help=f"one of the {noun}, with its "
                                   + ("conditions" if noun == "endpoints" else "workers and request counts"))
        describe.add_argument("cluster")
        describe.add_argument("name")
        for sub, func in ((listing, _lister(noun, line)), (describe, _describer(noun, text))):
            sub.add_argument("--json", action="store_true", help="the REST answer as JSON")
            rest_flags(sub)
            sub.set_defaults(func=func)
