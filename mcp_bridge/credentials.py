"""Where the bridge's token comes from: a file (``--token-file``) or the user's ``INSTANTSTART_TOKEN``.

A token on the command line (``--token``) is visible to every local user through ``ps`` and
``/proc/<pid>/cmdline``; it still works, with a warning. A token file readable by others gets a warning too.
"""

from __future__ import annotations

import stat
from pathlib import Path

from mcp_bridge.server import BridgeError

FLAG_WARNING = ("warning: --token puts the secret on the command line, where other users of this machine can "
                "read it (ps, /proc); use --token-file FILE or the INSTANTSTART_TOKEN variable instead")


def bridge_token(flag: str | None, token_file: str | None, env: dict[str, str]) -> tuple[str, list[str]]:
    """(token, warnings), from the first of: --token-file, --token, INSTANTSTART_TOKEN."""
    warnings: list[str] = []
    if token_file:
        path = Path(token_file).expanduser()
        try:
            token = path.read_text().strip()
            mode = path.stat().st_mode
        except OSError as exc:
            raise BridgeError(f"cannot read the token file {path}: {exc.strerror}") from None
        if not token:
            raise BridgeError(f"the token file {path} is empty")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            warnings.append(f"warning: {path} is readable by other users (mode {stat.S_IMODE(mode):o}); "
                            f"chmod 600 {path}")
        return token, warnings
    if flag:
        return flag, [FLAG_WARNING]
    token = env.get("INSTANTSTART_TOKEN", "").strip()
    if not token:
        raise BridgeError("the MCP bridge needs a token: --token-file FILE or the INSTANTSTART_TOKEN variable")
    return token, warnings
