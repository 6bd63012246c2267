"""Per-installation secrets kept in the data directory (cookie secret, sandbox tokens and keys)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def secret_file(path: Path, nbytes: int = 32) -> str:
    """The secret stored at ``path``, made on first use.

    The value is written and synced to a private temporary file first and then hard-linked into place, so
    the secret file never exists empty or half-written (not after a crash, not to a process racing this
    one), is never readable by others, and two processes starting together agree on one value."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(nbytes))
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileExistsError):  # another process won: use its value
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    value = path.read_text().strip()
    if not value:
        raise RuntimeError(f"{path} is empty; delete it to make a new secret")
    return value
