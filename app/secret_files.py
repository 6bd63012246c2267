"""Per-installation secrets kept in the data directory (cookie secret, sandbox tokens and keys)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def secret_file(path: Path, nbytes: int = 32) -> str:
    """The secret stored at ``path``, made on first use. Created 0600 in one step (never readable by others,
    not even for a moment), and with O_EXCL so two processes starting together agree on one value."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(nbytes))
    return path.read_text().strip()
