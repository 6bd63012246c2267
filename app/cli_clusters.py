"""``instantstart clusters …``: the clusters noun over the running server's REST API (same validation as
the dashboard and the MCP tools). Text for people, ``--json`` for scripts.

``instantstart kube-token`` is the exec plugin of the kubeconfigs the server hands out: it prints an
ExecCredential minted from the caller's own AWS credentials (the sandbox's when the server runs on it),
so no kubeconfig ever carries a token.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.cli_support import RestFailed, data_dir_flags, located, rest, rest_flags, say
from services.kube import TOKEN_LIFETIME, TOKEN_REFRESH_MARGIN

TERMINAL = ("succeeded", "failed", "cancelled")
WAIT_STEP = 25  # seconds of one long-poll while --wait follows a create or delete (under rest()'s 30 s)


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


def _stages_line(op: dict[str, Any]) -> str:
    return " ".join(f"{s['name']}:{s['status']}" for s in op["stages"])


def _follow(args: argparse.Namespace, op: dict[str, Any]) -> dict[str, Any]:
    """Long-poll the operation until it ends, saying each change of its stages on stderr."""
    said = ""
    while op["status"] not in TERMINAL:
        line = _stages_line(op)
        if line != said:
            say(f"{op['id']} {op['status']}: {line}")
            said = line
        op = rest(args, "GET", f"/api/v1/operations/{quote(op['id'], safe='')}?wait={WAIT_STEP}")
    return op


def finish(args: argparse.Namespace, accepted: dict[str, Any], done_text: str) -> int:
    """Print the accepted operation, or with --wait follow it to its end (RestFailed unless it succeeded)."""
    op = accepted["operation"]
    if not args.wait:
        _print(args, accepted, accepted["message"])
        return 0
    done = _follow(args, op)
    if done["status"] != "succeeded":
        failed = next((s for s in done["stages"] if s["status"] == "failed"), None)
        where = f" at stage {failed['name']}" if failed else ""
        raise RestFailed(f"{done['id']} {done['status']}{where}: {(done.get('error') or {}).get('message', '')} "
                         f"(what was made stays; resume from that stage with POST {done['status_url']}/retry, "
                         "operations_retry, or the dashboard's Retry)")
    _print(args, done, done_text.format(id=done["id"]))
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "zone": args.zone, "instance_type": args.instance_type,
                            "count": args.count, "capacity_type": args.capacity_type}
    if args.region:
        body["region"] = args.region
    if args.training_plan_arn:
        body["training_plan_arn"] = args.training_plan_arn
    if args.dry_run:
        view = rest(args, "POST", "/api/v1/clusters?dry_run=true", body)
        names = view["plan"]["names"]
        lines = [f"plan for {args.name} ({view['plan']['region']}, {view['plan']['zone']}): "
                 f"{args.count} x {args.instance_type} {args.capacity_type}; nothing was made"]
        lines += [f"  {key:<18} {value}" for key, value in names.items() if value]
        lines += [f"  [{r['stage']}] {r['action']:<6} {r['type']} {r['name']}" + (f" ({r['detail']})" if r["detail"]
                                                                                 else "")
                  for r in view["resources"]]
        total = sum(view["expected_seconds"].values())
        lines.append(f"  expected: about {total / 60:.0f} minutes ("
                     + ", ".join(f"{s} {view['expected_seconds'].get(s, 0) / 60:.0f}m" for s in view["stages"]) + ")")
        lines += [f"  warning: {w}" for w in view["warnings"]]
        _print(args, view, "\n".join(lines))
        return 0
    accepted = rest(args, "POST", "/api/v1/clusters", body)
    return finish(args, accepted, f"created {args.name} ({{id}} succeeded): "
                                   f"instantstart clusters kubeconfig {args.name} -o {args.name}.yaml")


def cmd_delete(args: argparse.Namespace) -> int:
    if not args.yes:
        raise RestFailed(f"deleting {args.cluster} removes its HyperPod and EKS clusters, network and roles: "
                         "pass --yes to confirm")
    accepted = rest(args, "DELETE", f"/api/v1/clusters/{quote(args.cluster, safe='')}", {"confirm": args.cluster})
    return finish(args, accepted, f"deleted {args.cluster} ({{id}} succeeded)")


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    text = str(rest(args, "GET", f"/api/v1/clusters/{quote(args.cluster, safe='')}/kubeconfig"))
    if args.output:
        target = Path(args.output)
        target.write_text(text)
        print(f"wrote {target} (kubectl --kubeconfig {target} get nodes)")
    else:
        print(text, end="")
    return 0


def cmd_kube_token(args: argparse.Namespace) -> int:
    from app.sandbox import aws_session, sandbox_mode
    from services.aws import AwsClients
    from services.clusters.kubeconfig import exec_credential
    from services.kube import eks_token

    where = located(args, quiet=True)  # stdout is kubectl's; a word on stderr would show on every call
    settings = where.settings
    region = args.region or settings.region
    sandboxed = where.runtime.sandbox if where.runtime else sandbox_mode(settings)[0]
    if sandboxed:
        if where.runtime is None or not where.runtime.aws_endpoint_url:
            raise RestFailed(f"no sandbox is running on {settings.data_dir}: start 'instantstart serve' first")
        clients = AwsClients(region, where.runtime.aws_endpoint_url, session=aws_session(settings))
    else:
        clients = AwsClients(region, settings.aws_endpoint_url)  # None: boto3's own (AWS_ENDPOINT_URL included)
    token = eks_token(clients, args.cluster_name, region)
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=TOKEN_LIFETIME - TOKEN_REFRESH_MARGIN)
    json.dump(exec_credential(token, expires.strftime("%Y-%m-%dT%H:%M:%SZ")), sys.stdout)
    print()
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    clusters = sub.add_parser("clusters", help="clusters: list, get, create, delete, import, forget, kubeconfig "
                                               "(REST)")
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
    create = csub.add_parser("create", help="create a HyperPod cluster on a new EKS cluster (30-45 minutes)")
    create.add_argument("--name", required=True, help="names the cluster and everything it owns")
    create.add_argument("--zone", required=True, help="Availability Zone of the nodes (clusters options lists them)")
    create.add_argument("--instance-type", required=True, help="e.g. ml.g5.8xlarge (offered in that zone)")
    create.add_argument("--count", type=int, required=True, help="nodes in the first instance group")
    create.add_argument("--capacity-type", default="on-demand", choices=["on-demand", "spot", "training-plan"])
    create.add_argument("--training-plan-arn", help="with --capacity-type training-plan")
    create.add_argument("--region", help="AWS region (default: the server's)")
    create.add_argument("--dry-run", action="store_true", help="show the plan (names, resources); make nothing")
    create.add_argument("--wait", action="store_true", help="follow the operation until it ends")
    delete = csub.add_parser("delete", help="delete a cluster created here, and all it owns (admin)")
    delete.add_argument("cluster")
    delete.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    delete.add_argument("--wait", action="store_true", help="follow the operation until it ends")
    kubeconfig = csub.add_parser("kubeconfig", help="a kubeconfig for kubectl (exec plugin, no embedded token)")
    kubeconfig.add_argument("cluster")
    kubeconfig.add_argument("--output", "-o", help="write to this file instead of printing")
    for parser, func in ((listing, cmd_list), (get, cmd_get), (imp, cmd_import), (forget, cmd_forget),
                         (create, cmd_create), (delete, cmd_delete), (kubeconfig, cmd_kubeconfig)):
        parser.add_argument("--json", action="store_true", help="print the REST answer as JSON")
        rest_flags(parser)
        parser.set_defaults(func=func)

    token = sub.add_parser("kube-token", help="kubectl's exec plugin: an EKS token as an ExecCredential")
    token.add_argument("--cluster-name", required=True, help="the EKS cluster's name")
    token.add_argument("--region", help="its region (default: the server's)")
    data_dir_flags(token)
    token.set_defaults(func=cmd_kube_token)
