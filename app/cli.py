"""``instantstart``: serve, mcp, status, token.

Every flag also has an ``INSTANTSTART_*`` environment variable (and a config-file key); flags win.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from services import __version__
from services.auth import SYSTEM, Role, TokenCreate
from services.errors import ServiceError
from services.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for name in ("config", "data_dir", "host", "port", "sandbox_kube_port", "sandbox_aws_port"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "dev_no_auth", False):
        overrides["dev_no_auth"] = True
    return Settings(**overrides)


def _print_token(token: str) -> None:
    bar = "=" * 72
    print(f"{bar}\nFirst start: an admin token was created. It is shown once, now, and never again.\n"
          f"Store it safely:\n\n    {token}\n\n"
          f"Sign in to the dashboard with it, or use 'Authorization: Bearer <token>'.\n{bar}", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.bootstrap import build_services
    from app.server import serve

    settings = _settings(args)
    settings.check_bind()
    services = build_services(settings)
    print(f"instantstart {__version__} serving on http://{settings.host}:{settings.port} "
          f"(data: {settings.data_dir})", flush=True)
    serve(services, show_token=_print_token, say=lambda line: print(line, flush=True))
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from app.bootstrap import build_services

    services = build_services(_settings(args))
    try:
        if args.token_command == "create":
            created = services.tokens.create(TokenCreate(name=args.name or f"{args.role}-cli", role=Role(args.role)),
                                             created_by="cli")
            services.audit.record(SYSTEM.via("cli"), "token.create", created.id,
                                  {"name": created.name, "role": created.role.value}, "succeeded")
            print(f"created token {created.id} ({created.name}, {created.role.value}); it is not shown again:")
            print(created.token)
        elif args.token_command == "list":
            for t in services.tokens.list():
                state = "revoked" if t.revoked else "active"
                print(f"{t.id}  {t.name:<20} {t.role.value:<8} {state}")
        else:
            info = services.tokens.revoke(args.id, SYSTEM.via("cli"))
            services.audit.record(SYSTEM.via("cli"), "token.revoke", info.id, {}, "succeeded")
            print(f"revoked {info.id} ({info.name})")
    finally:
        services.db.close()
    return 0


class RestFailed(Exception):
    pass


def _rest(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """Call the running server's REST API with --url/--token (or INSTANTSTART_URL/INSTANTSTART_TOKEN)."""
    import httpx2

    url = args.url or os.environ.get("INSTANTSTART_URL") or "http://127.0.0.1:3099"
    token = args.token or os.environ.get("INSTANTSTART_TOKEN", "")
    try:
        response = httpx2.request(method, url.rstrip("/") + path, json=body, timeout=30,
                                  headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx2.HTTPError as exc:
        raise RestFailed(f"cannot reach {url}: {exc}") from None
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise RestFailed(f"{response.status_code}: {message}")
    return response.json()


def _rest_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="server URL (INSTANTSTART_URL, default http://127.0.0.1:3099)")
    p.add_argument("--token", help="API token (INSTANTSTART_TOKEN)")


def cmd_sandbox(args: argparse.Namespace) -> int:
    if args.sandbox_command == "info":
        if args.url or os.environ.get("INSTANTSTART_URL"):
            info = _rest(args, "GET", "/api/v1/sandbox")
        else:  # from the data directory alone: works whether or not serve is running
            from app.sandbox import describe, stored_clusters

            settings = _settings(args)
            info = describe(settings, stored_clusters(settings))
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print(f"AWS endpoint {info['aws_endpoint_url']} (account {info['account_id']}, region {info['region']})")
            print(f"Kubernetes   {info['kubernetes_url']}")
            for name, path in sorted(info["kubeconfigs"].items()):
                print(f"  {name}: kubectl --kubeconfig {path} get nodes")
    elif args.sandbox_command == "faults":
        for fault in _rest(args, "GET", "/api/v1/sandbox/faults"):
            left = "" if fault["remaining"] is None else f" ({fault['remaining']} left)"
            target = " ".join(f"{k}={v}" for k, v in sorted(fault["target"].items()))
            print(f"{fault['id']}  {fault['kind']}  {target}{left}")
    elif args.sandbox_command == "inject":
        target = dict(pair.split("=", 1) for pair in args.target)
        fault = _rest(args, "POST", "/api/v1/sandbox/faults",
                      {"kind": args.kind, "target": target, "count": args.count})
        print(f"injected {fault['id']} ({fault['kind']})")
    else:
        _rest(args, "DELETE", f"/api/v1/sandbox/faults/{args.id}")
        print(f"cleared {args.id}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from services.status import StatusSummary, render_text

    if args.url or os.environ.get("INSTANTSTART_URL"):
        summary = StatusSummary.model_validate(_rest(args, "GET", "/api/v1/status"))
    else:
        from app.bootstrap import build_services
        from services.status import summarize

        services = build_services(_settings(args))
        try:
            summary = summarize(services.engine, services.kube.clusters())
        finally:
            services.db.close()
    print(summary.model_dump_json(indent=2) if args.json else render_text(summary))
    return 0


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    from app.sandbox import kubeconfig_path, sandbox_enabled, stored_clusters, write_kubeconfig

    settings = _settings(args)
    if not sandbox_enabled(settings):
        print("kubeconfig generation is for sandbox clusters; for EKS use 'aws eks update-kubeconfig'",
              file=sys.stderr)
        return 2
    known = stored_clusters(settings)
    if args.cluster not in known:
        print(f"error: no sandbox cluster named {args.cluster!r}; known: {', '.join(known) or 'none yet'}",
              file=sys.stderr)
        return 2
    path = write_kubeconfig(settings, args.cluster)
    if args.output:
        target = Path(args.output)
        target.write_text(path.read_text())
        target.chmod(0o600)
        print(f"wrote {target} (kubectl --kubeconfig {target} get nodes)")
    else:
        print(path.read_text(), end="")
        print(f"# also at {kubeconfig_path(settings, args.cluster)}", file=sys.stderr)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from mcp_bridge.credentials import bridge_token
    from mcp_bridge.server import BridgeError, run_bridge

    url = args.url or os.environ.get("INSTANTSTART_URL") or "http://127.0.0.1:3099"
    try:
        token, warnings = bridge_token(args.token, args.token_file, dict(os.environ))
        for warning in warnings:
            print(warning, file=sys.stderr)
        run_bridge(url, token, transport=args.transport, host=args.host, port=args.port)
    except BridgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _data_dir_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="state directory (INSTANTSTART_DATA_DIR)")
    p.add_argument("--config", help="YAML or TOML settings file (INSTANTSTART_CONFIG)")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="instantstart", description=__doc__.splitlines()[0] if __doc__ else "")
    root.add_argument("--version", action="version", version=f"instantstart {__version__}")
    sub = root.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the dashboard, REST API and operation engine")
    _data_dir_flags(serve)
    serve.add_argument("--host", help="bind address (INSTANTSTART_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (INSTANTSTART_PORT, default 3099)")
    serve.add_argument("--sandbox-kube-port", type=int,
                       help="loopback HTTPS port of the sandbox Kubernetes emulator (INSTANTSTART_SANDBOX_KUBE_PORT)")
    serve.add_argument("--dev-no-auth", action="store_true",
                       help="no tokens; refuses any non-loopback host (INSTANTSTART_DEV_NO_AUTH)")
    serve.set_defaults(func=cmd_serve)

    mcp = sub.add_parser("mcp", help="run the MCP bridge (tools call the REST API)")
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    mcp.add_argument("--url", help="REST base URL (INSTANTSTART_URL, default http://127.0.0.1:3099)")
    mcp.add_argument("--token-file", help="file holding the API token (or set INSTANTSTART_TOKEN)")
    mcp.add_argument("--token", help="API token; visible to other users in ps: prefer --token-file")
    mcp.add_argument("--host", default="127.0.0.1", help="bind address for --transport http")
    mcp.add_argument("--port", type=int, default=3100, help="port for --transport http")
    mcp.set_defaults(func=cmd_mcp)

    status = sub.add_parser("status", help="a compact text summary of what is running")
    _data_dir_flags(status)
    status.add_argument("--json", action="store_true", help="the same summary as JSON")
    status.add_argument("--url", help="ask a running server instead of reading the data dir (INSTANTSTART_URL)")
    status.add_argument("--token", help="token for --url (INSTANTSTART_TOKEN)")

    sandbox = sub.add_parser("sandbox", help="the running sandbox: endpoints and fault injection (REST)")
    ssub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    info = ssub.add_parser("info", help="account, region, AWS endpoint, kubeconfigs (from the data dir, or --url)")
    info.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    _data_dir_flags(info)
    for flag in ("--sandbox-kube-port", "--sandbox-aws-port"):
        info.add_argument(flag, type=int, help=f"as serve uses it (INSTANTSTART_{flag[2:].upper().replace('-', '_')})")
    _rest_flags(info)
    _rest_flags(ssub.add_parser("faults", help="list injected faults"))
    inject = ssub.add_parser("inject", help="inject a fault (admin token)")
    inject.add_argument("kind", choices=["node_unhealthy", "insufficient_capacity", "addon_degraded",
                                         "quota_exhausted", "throttle"])
    inject.add_argument("--target", action="append", default=[], metavar="KEY=VALUE",
                        help="e.g. --target cluster=hp --target node=i-0123456789abcdef0")
    inject.add_argument("--count", type=int, help="throttle: calls to fail; others: uses before it clears")
    _rest_flags(inject)
    clear = ssub.add_parser("clear", help="clear a fault by id, or 'all'")
    clear.add_argument("id")
    _rest_flags(clear)
    sandbox.set_defaults(func=cmd_sandbox)
    status.set_defaults(func=cmd_status)

    kubeconfig = sub.add_parser("kubeconfig", help="print (or write) a kubeconfig for a sandbox cluster")
    kubeconfig.add_argument("cluster")
    kubeconfig.add_argument("--output", "-o", help="write to this file (0600) instead of printing")
    kubeconfig.add_argument("--sandbox-kube-port", type=int,
                            help="the emulator port serve uses (INSTANTSTART_SANDBOX_KUBE_PORT, default 3443)")
    _data_dir_flags(kubeconfig)
    kubeconfig.set_defaults(func=cmd_kubeconfig)

    token = sub.add_parser("token", help="manage API tokens (needs write access to the data dir)")
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="make a token; its secret is printed on the last line")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--name", help="label (default: <role>-cli)")
    _data_dir_flags(create)
    tlist = tsub.add_parser("list", help="list tokens (never their secrets)")
    _data_dir_flags(tlist)
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id")
    _data_dir_flags(revoke)
    token.set_defaults(func=cmd_token)
    return root


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("INSTANTSTART_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ServiceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except RestFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
