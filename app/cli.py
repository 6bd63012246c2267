"""``instantstart``: serve, mcp, status, token, sandbox, kubeconfig.

Every flag also has an ``INSTANTSTART_*`` environment variable (and a config-file key); flags win.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from app import cli_clusters, cli_inference, cli_jobs, cli_sandbox
from app.cli_support import RestFailed, data_dir_flags, located, rest, rest_flags, server_url, settings_from
from app.runtime import Ambiguous, PortTaken, claim_ports
from services import __version__
from services.auth import SYSTEM, Role, TokenCreate
from services.errors import ServiceError


def _print_token(token: str) -> None:
    bar = "=" * 72
    print(f"{bar}\nFirst start: an admin token was created. It is shown once, now, and never again.\n"
          f"Store it safely:\n\n    {token}\n\n"
          f"Sign in to the dashboard with it, or use 'Authorization: Bearer <token>'.\n{bar}", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.bootstrap import build_services
    from app.sandbox import missing_sandbox_packages, sandbox_mode
    from app.server import serve

    settings = settings_from(args)
    settings.check_bind()
    sandboxed, reason = sandbox_mode(settings)
    missing = missing_sandbox_packages() if sandboxed else []
    if missing:
        print(f"error: {reason}, so serve would run the offline sandbox, but its packages are not installed "
              f"({', '.join(missing)}). Either install them: pip install 'instantstart[sandbox]', or configure "
              "AWS credentials (or pass --no-sandbox) to manage real AWS.", file=sys.stderr, flush=True)
        return 2
    settings, notes = claim_ports(settings, sandboxed)
    for note in notes:
        print(f"note: {note}", flush=True)
    services = build_services(settings, exclusive=True)  # the data directory's lock comes first
    print(f"instantstart {__version__} serving on http://{settings.host}:{settings.port} "
          f"(data directory {settings.data_dir})", flush=True)
    serve(services, show_token=_print_token, say=lambda line: print(line, flush=True), mode_reason=reason)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from app.bootstrap import build_services

    services = build_services(located(args).settings)
    try:
        if args.token_command == "create":
            request = TokenCreate(name=args.name or f"{args.role}-cli", role=Role(args.role))
            created = services.token_verbs.create_token(SYSTEM.via("cli"), request)
            print(f"created token {created.id} ({created.name}, {created.role.value}); it is not shown again:")
            print(created.token)
        elif args.token_command == "list":
            tokens = services.token_verbs.list_tokens(SYSTEM.via("cli"))
            if not tokens:
                print("no tokens yet: 'instantstart serve' makes the first admin token; "
                      "'instantstart token create --role viewer' makes more")
            for t in tokens:
                state = "revoked" if t.revoked else "active"
                print(f"{t.id}  {t.name:<20} {t.role.value:<8} {state}")
        else:
            info = services.token_verbs.revoke_token(SYSTEM.via("cli"), args.id)
            print(f"revoked {info.id} ({info.name})")
    finally:
        services.db.close()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from services.status import StatusSummary, render_text

    if args.url or os.environ.get("INSTANTSTART_URL"):
        summary = StatusSummary.model_validate(rest(args, "GET", "/api/v1/status"))
        jobs = rest(args, "GET", "/api/v1/jobs/digest")
    else:
        from app.bootstrap import build_services

        where = located(args)
        services = build_services(where.settings)
        try:
            summary = services.operations.summary(SYSTEM.via("cli"), wait=10)  # a one-off read may wait
            jobs = services.jobs.digests(SYSTEM.via("cli")).model_dump(mode="json")
        finally:
            services.informers.stop()
            services.db.close()
    if args.json:
        print(json.dumps(cli_jobs.status_jobs(summary.model_dump(mode="json"), jobs), indent=2))
    else:
        print(render_text(summary) + "\n" + cli_jobs.status_text(jobs))
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from mcp_bridge.credentials import bridge_token
    from mcp_bridge.server import BridgeError, run_bridge

    try:
        url = server_url(args)  # --url, INSTANTSTART_URL, else the running server's (never a guessed port)
        token, warnings = bridge_token(args.token, args.token_file, dict(os.environ))
        for warning in warnings:
            print(warning, file=sys.stderr)
        run_bridge(url, token, transport=args.transport, host=args.host, port=args.bridge_port,
                   toolsets=args.toolsets)
    except BridgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="instantstart", description=__doc__.splitlines()[0] if __doc__ else "")
    root.add_argument("--version", action="version", version=f"instantstart {__version__}")
    sub = root.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the dashboard, REST API and operation engine")
    data_dir_flags(serve)
    serve.add_argument("--host", help="bind address (INSTANTSTART_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (INSTANTSTART_PORT, default 3099; a free one if that is "
                                                "taken and not chosen explicitly)")
    mode = serve.add_mutually_exclusive_group()
    mode.add_argument("--sandbox", dest="sandbox", action="store_true", default=None,
                      help="run against the embedded offline sandbox (INSTANTSTART_SANDBOX=true)")
    mode.add_argument("--no-sandbox", dest="sandbox", action="store_false",
                      help="run against AWS with the configured credentials (INSTANTSTART_SANDBOX=false)")
    serve.add_argument("--sandbox-aws-port", type=int,
                       help="loopback port of the sandbox AWS endpoint (INSTANTSTART_SANDBOX_AWS_PORT, default 4566)")
    serve.add_argument("--sandbox-kube-port", type=int,
                       help="loopback HTTPS port of the sandbox Kubernetes emulator (INSTANTSTART_SANDBOX_KUBE_PORT, "
                            "default 3443)")
    serve.add_argument("--dev-no-auth", action="store_true",
                       help="no tokens; refuses any non-loopback host (INSTANTSTART_DEV_NO_AUTH)")
    serve.set_defaults(func=cmd_serve)

    mcp = sub.add_parser("mcp", help="run the MCP bridge (tools call the REST API)")
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    mcp.add_argument("--url", help="REST base URL (INSTANTSTART_URL; default: the running server's, from its "
                                   "runtime file)")
    mcp.add_argument("--token-file", help="file holding the API token (or set INSTANTSTART_TOKEN)")
    mcp.add_argument("--token", help="API token; visible to other users in ps: prefer --token-file")
    mcp.add_argument("--host", default="127.0.0.1", help="bind address for --transport http")
    mcp.add_argument("--port", dest="bridge_port", type=int, default=3100, help="port for --transport http")
    data_dir_flags(mcp)
    mcp.add_argument("--toolsets", help="tool groups by noun, comma separated, or 'all' (default: the everyday "
                                        "nouns; audit, sandbox and tokens on request)")
    mcp.set_defaults(func=cmd_mcp)

    status = sub.add_parser("status", help="a compact text summary of what is running")
    status.add_argument("--json", action="store_true", help="the same summary as JSON")
    rest_flags(status)
    status.set_defaults(func=cmd_status)

    cli_sandbox.add_parsers(sub)
    cli_clusters.add_parsers(sub)
    cli_jobs.add_parsers(sub)
    cli_inference.add_parsers(sub)

    token = sub.add_parser("token", help="manage API tokens (needs write access to the data dir)")
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="make a token; its secret is printed on the last line")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--name", help="label (default: <role>-cli)")
    data_dir_flags(create)
    tlist = tsub.add_parser("list", help="list tokens (never their secrets)")
    data_dir_flags(tlist)
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id")
    data_dir_flags(revoke)
    token.set_defaults(func=cmd_token)
    return root


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("INSTANTSTART_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):  # one INFO line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except (PortTaken, Ambiguous) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ServiceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except RestFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
