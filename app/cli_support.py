"""What every CLI command shares: settings from flags, where it acts (data directory and running server,
said on stderr), and REST calls to that server. Facts go to stderr so stdout stays parseable."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.runtime import Location, locate
from services.settings import Settings


class RestFailed(Exception):
    pass


def settings_from(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for name in ("config", "data_dir", "host", "port", "sandbox_kube_port", "sandbox_aws_port"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "dev_no_auth", False):
        overrides["dev_no_auth"] = True
    if getattr(args, "sandbox", None) is not None:
        overrides["sandbox"] = args.sandbox
    return Settings(**overrides)


def say(line: str) -> None:
    """Facts about where a command acts (data directory, server, mode): stderr, never stdout."""
    print(f"instantstart: {line}", file=sys.stderr, flush=True)


def located(args: argparse.Namespace, *, quiet: bool = False) -> Location:
    """The data directory (and running server) this command acts on, said on stderr unless ``quiet``."""
    where = locate(settings_from(args))
    if not quiet:
        say(where.describe())
    return where


def server_url(args: argparse.Namespace) -> str:
    """--url, else INSTANTSTART_URL, else the running server found through its runtime file."""
    explicit = getattr(args, "url", None) or os.environ.get("INSTANTSTART_URL")
    if explicit:
        return str(explicit)
    where = located(args)
    if where.runtime is None:
        raise RestFailed(f"no running server found for {where.settings.data_dir}: start 'instantstart serve', "
                         "or pass --url")
    return where.runtime.url


def rest(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """Call the running server's REST API with --url/--token (or INSTANTSTART_URL/INSTANTSTART_TOKEN)."""
    import httpx2

    url = server_url(args)
    token = getattr(args, "token", None) or os.environ.get("INSTANTSTART_TOKEN", "")
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
    if response.headers.get("content-type", "").startswith("text/"):  # a kubeconfig, the metrics
        return response.text
    return response.json()


def data_dir_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="state directory (INSTANTSTART_DATA_DIR; default: the running server's, "
                                      "else ~/.local/share/instantstart)")
    p.add_argument("--config", help="YAML or TOML settings file (INSTANTSTART_CONFIG)")


def rest_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="server URL (INSTANTSTART_URL; default: the running server's, from its runtime file)")
    p.add_argument("--token", help="API token (INSTANTSTART_TOKEN)")
    data_dir_flags(p)
