"""``instantstart clusters …``: the clusters noun over the running server's REST API (same validation as
the dashboard and the MCP tools). Text for people, ``--json`` for scripts."""

from __future__ import annotations

import argparse
import json
from typing import Any

from app.cli_support import RestFailed, rest, rest_flags


def _print(args: argparse.Namespace, value: Any, text: str) -> None:
    print(json.dumps(value, indent=2) if args.json else text)


def cmd_list(args: argparse.Namespace) -> int:
    clusters = rest(args, "GET", "/api/v1/clusters")
    lines = [f"{c['name']:<20} {c['ownership']:<9} EKS {c['eks_status'] or '?':<9} HyperPod "
             f"{c['hyperpod_status'] or '-':<10} {c['nodes']} nodes "
             + ", ".join(f"{k} {v}" for k, v in sorted(c["health"].items())) for c in clusters]
    _print(args, clusters, "\n".join(lines) or "no clusters registered: 'instantstart clusters import EKS_NAME'")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    d = rest(args, "GET", f"/api/v1/clusters/{args.cluster}")
    lines = [f"{d['name']} ({d['ownership']}, {d['region']}): EKS {d['eks_status']} (Kubernetes "
             f"{d['kubernetes_version']}), HyperPod {d['hyperpod_status'] or '-'}, node recovery "
             f"{d['node_recovery'] or '-'}"]
    lines += [f"  group {g['name']}: {g['instance_type']} {g['current_count']}/{g['target_count']} {g['status']}"
              for g in d["instance_groups"]]
    for group, nodes in sorted(d["nodes_by_group"].items()):
        for n in nodes:
            lines.append(f"  {group or '-':<12} {n['name']:<32} {n['health'] or '-':<32} "
                         f"{'Ready' if n['ready'] else 'NotReady':<8} {n['gpus']} GPU {n['pods']} pods")
    if d.get("error"):
        lines.append(f"  (partly read: {d['error']})")
    _print(args, d, "\n".join(lines))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    body = {"eks_cluster": args.eks_cluster, "hyperpod_cluster": args.hyperpod, "region": args.region,
            "name": args.name}
    accepted = rest(args, "POST", "/api/v1/clusters/import", {k: v for k, v in body.items() if v is not None})
    op = accepted["operation"]
    if args.no_wait:
        _print(args, accepted, accepted["message"])
        return 0
    done = rest(args, "GET", f"/api/v1/operations/{op['id']}/wait?timeout=120")
    if done["status"] != "succeeded":
        raise RestFailed(f"{op['id']} is {done['status']}: {(done.get('error') or {}).get('message', '')}")
    _print(args, done, f"imported {args.name or args.eks_cluster} ({op['id']} succeeded)")
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    record = rest(args, "DELETE", f"/api/v1/clusters/{args.cluster}/registration")
    _print(args, record, f"forgot {record['name']}; the cluster itself was not touched")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    clusters = sub.add_parser("clusters", help="registered clusters: list, get, import, forget (REST)")
    csub = clusters.add_subparsers(dest="clusters_command", required=True)
    listing = csub.add_parser("list", help="every registered cluster with node health")
    get = csub.add_parser("get", help="one cluster: instance groups and nodes by health")
    get.add_argument("cluster")
    imp = csub.add_parser("import", help="register an existing EKS (+ HyperPod) cluster; changes nothing in it")
    imp.add_argument("eks_cluster")
    imp.add_argument("--hyperpod", help="the HyperPod cluster orchestrated by it")
    imp.add_argument("--region", help="its region (default: the server's)")
    imp.add_argument("--name", help="name to know it by here (default: the EKS name)")
    imp.add_argument("--no-wait", action="store_true", help="return once the operation is accepted")
    forget = csub.add_parser("forget", help="forget an imported cluster's registration (it is not touched)")
    forget.add_argument("cluster")
    for parser, func in ((listing, cmd_list), (get, cmd_get), (imp, cmd_import), (forget, cmd_forget)):
        parser.add_argument("--json", action="store_true", help="print the REST answer as JSON")
        rest_flags(parser)
        parser.set_defaults(func=func)
