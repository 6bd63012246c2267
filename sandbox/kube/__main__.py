"""``python -m sandbox.kube --port N --data-dir D [--cluster NAME ...]``: run the emulator alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from .server import serve


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m sandbox.kube", description=__doc__)
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--data-dir", type=Path, default=None, help="persist state here (default: memory only)")
    ap.add_argument("--cluster", action="append", default=None, help="cluster to serve (repeatable)")
    ap.add_argument("--token", default=None, help="require this bearer token")
    args = ap.parse_args()
    serve(args.port, args.data_dir, args.cluster or ["sandbox"], args.host, args.token)


if __name__ == "__main__":
    main()
