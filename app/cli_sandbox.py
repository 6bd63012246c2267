"""``instantstart sandbox …`` and ``instantstart kubeconfig``: the sandbox of the server that really runs.

Every command here finds that server through its runtime file (``app/runtime.py``), so ports chosen at
start-up, or by another instance's collision, are the ones used; with no server running, nothing here
rewrites the files the last server left in the data directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from app.cli_support import RestFailed, data_dir_flags, located, rest, rest_flags, say
from app.runtime import Location

FAULT_KINDS = ["node_unhealthy", "insufficient_capacity", "addon_degraded", "quota_exhausted", "throttle",
               "access_denied", "deep_health_check_failed", "spot_reclaimed", "eks_create_failed",
               "file_system_failed", "hold_response", "node_persistent_fault", "autoscaling_failed"]


def _sandbox_or_refuse(where: Location) -> None:
    from app.sandbox import sandbox_mode

    sandboxed = where.runtime.sandbox if where.runtime else sandbox_mode(where.settings)[0]
    if not sandboxed:
        raise RestFailed("this server runs against AWS, not the sandbox: use 'aws eks update-kubeconfig' and your "
                         "own AWS configuration")


def _running_sandbox(where: Location) -> str:
    """The running sandbox's AWS endpoint, or a clear refusal."""
    _sandbox_or_refuse(where)
    if where.runtime is None or not where.runtime.aws_endpoint_url:
        raise RestFailed(f"no sandbox is running on {where.settings.data_dir}: start 'instantstart serve' first")
    return where.runtime.aws_endpoint_url


def cmd_info(args: argparse.Namespace) -> int:
    from app.sandbox import describe, stored_clusters

    if args.url:
        info = rest(args, "GET", "/api/v1/sandbox")
    else:  # from the data directory and runtime file: works whether or not serve is running
        where = located(args)
        _sandbox_or_refuse(where)
        info = describe(where.settings, stored_clusters(where.settings), write=where.runtime is not None)
        info["server"] = where.runtime.url if where.runtime else None
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    running = "" if info.get("server", True) else "  (not running: serve will use these ports if they are free)"
    print(f"AWS endpoint {info['aws_endpoint_url']} (account {info['account_id']}, region {info['region']}){running}")
    print(f"Kubernetes   {info['kubernetes_url']}")
    if not info["kubeconfigs"]:
        print("no clusters yet: 'instantstart sandbox seed' makes a ready EKS + HyperPod cluster")
    for name, path in sorted(info["kubeconfigs"].items()):
        print(f"  {name}: kubectl --kubeconfig {path} get nodes")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from app.sandbox import SANDBOX_ACCESS_KEY, sandbox_secret_key

    where = located(args)
    endpoint = _running_sandbox(where)
    region = where.settings.region
    exports = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": region, "AWS_DEFAULT_REGION": region,
               "AWS_ACCESS_KEY_ID": SANDBOX_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": sandbox_secret_key(where.settings),
               "AWS_PAGER": ""}
    print(f"# the sandbox of {where.runtime.url if where.runtime else '?'} (data directory {where.settings.data_dir});"
          " use: eval \"$(instantstart sandbox env)\"")
    print("unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE")
    for key, value in exports.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def cmd_seed(args: argparse.Namespace) -> int:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
    from kubernetes import config as kube_config

    from app.sandbox import SANDBOX_ACCESS_KEY, sandbox_secret_key, write_kubeconfig
    from sandbox.seed import Seeder, SeedFailed, SeedRequest

    where = located(args)
    endpoint = _running_sandbox(where)
    session = boto3.Session(aws_access_key_id=SANDBOX_ACCESS_KEY,
                            aws_secret_access_key=sandbox_secret_key(where.settings),
                            region_name=where.settings.region)
    request = SeedRequest(name=args.name, nodes=args.nodes, instance_type=args.instance_type)
    say(f"seeding {request.name}: VPC, IAM roles, lifecycle bucket, EKS, then HyperPod with {request.nodes} x "
        f"{request.instance_type} through {endpoint} (a minute or two at sandbox speed)")
    try:
        seeded = Seeder(session, endpoint, say, kube=lambda name: kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(write_kubeconfig(where.settings, name)))).run(request)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise RestFailed(f"AWS refused {exc.operation_name}: {error.get('Code')}: {error.get('Message')}") from None
    except (SeedFailed, BotoCoreError) as exc:
        raise RestFailed(str(exc)) from None
    verb = "seeded" if seeded.created else "already there:"
    print(f"{verb} {request.name}: EKS {seeded.eks_arn}, HyperPod {seeded.hyperpod_arn}, "
          f"{len(seeded.nodes)} nodes Running (VPC {seeded.vpc_id})")
    print(f"next: instantstart kubeconfig {request.name} -o {request.name}.yaml")
    return 0


def cmd_faults(args: argparse.Namespace) -> int:
    faults = rest(args, "GET", "/api/v1/sandbox/faults")
    if not faults:
        print("no faults injected: 'instantstart sandbox inject KIND --target KEY=VALUE' adds one")
    for fault in faults:
        left = "" if fault["remaining"] is None else f" ({fault['remaining']} left)"
        target = " ".join(f"{k}={v}" for k, v in sorted(fault["target"].items()))
        print(f"{fault['id']}  {fault['kind']}  {target}{left}")
    return 0


def cmd_inject(args: argparse.Namespace) -> int:
    bad = [pair for pair in args.target if "=" not in pair]
    if bad:
        raise RestFailed(f"--target takes KEY=VALUE, not {bad[0]!r}")
    target = dict(pair.split("=", 1) for pair in args.target)
    fault = rest(args, "POST", "/api/v1/sandbox/faults", {"kind": args.kind, "target": target, "count": args.count})
    print(f"injected {fault['id']} ({fault['kind']})")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    rest(args, "DELETE", f"/api/v1/sandbox/faults/{args.id}")
    print(f"cleared {args.id}")
    return 0


def cmd_calls(args: argparse.Namespace) -> int:
    """The call ledger: from the data directory's file (fsync'd as calls happen, so current whether or not
    serve runs; no token needed), or through ``GET /api/v1/sandbox/calls`` with ``--url``."""
    limit = args.limit or 200
    if args.url:
        from urllib.parse import urlencode

        filters = {"service": args.service, "operation": args.operation, "verb": args.verb, "cluster": args.cluster,
                   "since": args.since, "limit": limit,
                   "write": None if args.writes is None else str(args.writes).lower()}
        query = urlencode({k: v for k, v in filters.items() if v is not None})
        calls = rest(args, "GET", f"/api/v1/sandbox/calls?{query}")
    else:
        from app.sandbox import ledger_path
        from sandbox.ledger import matches, read_entries

        where = located(args)
        _sandbox_or_refuse(where)
        since = args.since or 0
        calls = [e for e in read_entries(ledger_path(where.settings)) if e.get("seq", 0) > since
                 and matches(e, args.service, args.operation, args.verb, args.writes, args.cluster)][-limit:]
    if args.json:
        print(json.dumps(calls, indent=2))
        return 0
    if not calls:
        print("no calls match")
    for call in calls:
        when = time.strftime("%H:%M:%S", time.localtime(call["time"]))
        who = call["caller"].get("access_key") or call["caller"].get("identity") or "-"
        mark = "W" if call["write"] else " "
        if call["kind"] == "aws":
            what = f"{call['service']}:{call.get('operation') or '?'} {call.get('target') or ''}"
            result = f"{call['status']}" + (f" {call['error']}" if call.get("error") else "")
        else:
            place = "/".join(p for p in (call.get("namespace"), call.get("name")) if p)
            what = f"k8s {call['cluster']} {call['verb']} {call['resource']} {place}".rstrip()
            result = str(call["status"])
        print(f"{call['seq']:>6} {when} {mark} {what}  {result}  ({who})")
    return 0


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    from app.sandbox import kubeconfig_path, kubeconfig_text, stored_clusters, write_kubeconfig

    where = located(args)
    _sandbox_or_refuse(where)
    settings = where.settings
    known = stored_clusters(settings)
    if args.cluster not in known:
        hint = ", ".join(known) if known else "none yet ('instantstart sandbox seed' makes one)"
        print(f"error: no sandbox cluster named {args.cluster!r}; known: {hint}", file=sys.stderr)
        return 2
    if where.runtime is not None:
        text = write_kubeconfig(settings, args.cluster).read_text()
    else:
        say(f"no server is running: this kubeconfig points at port {settings.sandbox_kube_port}, which serve "
            "uses when it is free")
        text = kubeconfig_text(settings, args.cluster)
    if args.output:
        target = Path(args.output)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds a token: never readable
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        target.chmod(0o600)  # an existing file keeps its mode through O_CREAT
        print(f"wrote {target} (kubectl --kubeconfig {target} get nodes)")
    else:
        print(text, end="")
        if where.runtime is not None:
            say(f"also at {kubeconfig_path(settings, args.cluster)}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = sub.add_parser("sandbox", help="the running sandbox: endpoints, seed cluster, fault injection")
    ssub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    info = ssub.add_parser("info", help="account, region, AWS endpoint, kubeconfigs (from the data dir, or --url)")
    info.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    rest_flags(info)
    info.set_defaults(func=cmd_info)
    env = ssub.add_parser("env", help="shell exports for aws and boto3: eval \"$(instantstart sandbox env)\"")
    data_dir_flags(env)
    env.set_defaults(func=cmd_env)
    seed = ssub.add_parser("seed", help="make a ready EKS + HyperPod cluster, as a user's own would look")
    seed.add_argument("--name", default="hp-eks", help="EKS and HyperPod cluster name (default hp-eks)")
    seed.add_argument("--nodes", type=int, default=2, help="HyperPod worker nodes (default 2)")
    seed.add_argument("--instance-type", default="ml.g5.8xlarge", help="worker type (default ml.g5.8xlarge)")
    data_dir_flags(seed)
    seed.set_defaults(func=cmd_seed)
    faults = ssub.add_parser("faults", help="list injected faults")
    rest_flags(faults)
    faults.set_defaults(func=cmd_faults)
    inject = ssub.add_parser("inject", help="inject a fault (admin token)")
    inject.add_argument("kind", choices=FAULT_KINDS)
    inject.add_argument("--target", action="append", default=[], metavar="KEY=VALUE",
                        help="e.g. --target cluster=hp --target node=i-0123456789abcdef0")
    inject.add_argument("--count", type=int, help="throttle: calls to fail; others: uses before it clears")
    rest_flags(inject)
    inject.set_defaults(func=cmd_inject)
    clear = ssub.add_parser("clear", help="clear a fault by id, or 'all'")
    clear.add_argument("id")
    rest_flags(clear)
    clear.set_defaults(func=cmd_clear)

    calls = ssub.add_parser("calls", help="the call ledger: every AWS call and Kubernetes request the sandbox got "
                                          "(from the data directory; --url: through the server's REST API)")
    calls.add_argument("--service", help="AWS service (eks, sagemaker, ec2, ...) or kubernetes")
    calls.add_argument("--operation", help="AWS API operation, e.g. UpdateCluster")
    calls.add_argument("--verb", help="Kubernetes verb: get, list, watch, create, update, patch, delete")
    calls.add_argument("--cluster", help="Kubernetes requests to this cluster only")
    writes = calls.add_mutually_exclusive_group()
    writes.add_argument("--writes", dest="writes", action="store_const", const=True, default=None,
                        help="only calls that change state")
    writes.add_argument("--reads", dest="writes", action="store_const", const=False, help="only reads")
    calls.add_argument("--since", type=int, help="only entries after this seq")
    calls.add_argument("--limit", type=int, help="at most this many (the newest; default 200)")
    calls.add_argument("--json", action="store_true", help="the entries as JSON, for scripts")
    rest_flags(calls)
    calls.set_defaults(func=cmd_calls)

    kubeconfig = sub.add_parser("kubeconfig", help="print (or write) a kubeconfig for a sandbox cluster")
    kubeconfig.add_argument("cluster")
    kubeconfig.add_argument("--output", "-o", help="write to this file (0600) instead of printing")
    data_dir_flags(kubeconfig)
    kubeconfig.set_defaults(func=cmd_kubeconfig)

