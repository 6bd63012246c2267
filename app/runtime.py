"""Where a running server is: its data directory, its actual ports and endpoints, and why it chose its mode.

``instantstart serve`` may pick free ports (a default port that is taken) and decides between sandbox and
AWS mode, so no other command may guess either. Once it listens, serve writes ``runtime.json`` in its
data directory and a pointer to that directory in a per-user registry; every CLI command reads them, so
``kubeconfig``, ``sandbox info``/``env``/``seed``, ``status`` and the fault commands address the server that
really runs. Both files go away on a clean stop; a file whose process is gone is stale and ignored.

The registry is ``$INSTANTSTART_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/instantstart``, else
``~/.local/state/instantstart/servers``. It holds no secrets: endpoints, ports, pids and paths only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.settings import Settings

RUNTIME_FILE = "runtime.json"


@dataclass(frozen=True)
class Runtime:
    """What one running ``instantstart serve`` told the world about itself."""

    pid: int
    url: str
    data_dir: str
    sandbox: bool
    mode_reason: str
    aws_endpoint_url: str | None = None
    kube_url: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    region: str = ""

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def registry_dir() -> Path:
    explicit = os.environ.get("INSTANTSTART_RUNTIME_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "instantstart"
    return Path.home() / ".local" / "state" / "instantstart" / "servers"


def _pointer(data_dir: Path) -> Path:
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return registry_dir() / f"{digest}.json"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)


def write_runtime(runtime: Runtime) -> None:
    data_dir = Path(runtime.data_dir)
    text = json.dumps(asdict(runtime), indent=2, sort_keys=True) + "\n"
    _atomic_write(data_dir / RUNTIME_FILE, text)
    _atomic_write(_pointer(data_dir), json.dumps({"data_dir": runtime.data_dir, "pid": runtime.pid}) + "\n")


def remove_runtime(data_dir: Path) -> None:
    """On a clean stop; only this process's own files (a newer server may own them already)."""
    mine = read_runtime(data_dir, alive_only=False)
    if mine is not None and mine.pid == os.getpid():
        (data_dir / RUNTIME_FILE).unlink(missing_ok=True)
        _pointer(data_dir).unlink(missing_ok=True)


def read_runtime(data_dir: Path, *, alive_only: bool = True) -> Runtime | None:
    try:
        raw: dict[str, Any] = json.loads((data_dir / RUNTIME_FILE).read_text())
        runtime = Runtime(**raw)
    except (OSError, ValueError, TypeError):
        return None
    if alive_only and not runtime.alive:
        return None
    return runtime


def running_servers() -> list[Runtime]:
    """Every live server in this user's registry (stale pointers are removed on the way)."""
    found: list[Runtime] = []
    folder = registry_dir()
    if not folder.is_dir():
        return found
    for pointer in sorted(folder.glob("*.json")):
        try:
            data_dir = Path(json.loads(pointer.read_text())["data_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        runtime = read_runtime(data_dir)
        if runtime is None:
            with contextlib.suppress(OSError):
                pointer.unlink()
            continue
        found.append(runtime)
    return found


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now (port 0 always can: the kernel picks one)."""
    if port == 0:
        return True
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


# ----- serve: which ports, and where the CLI finds the server ----------------------------------------

_PORT_FLAGS = {"port": "--port", "sandbox_aws_port": "--sandbox-aws-port", "sandbox_kube_port": "--sandbox-kube-port"}


class PortTaken(Exception):
    """An explicitly chosen port is in use."""


def claim_ports(settings: Settings, sandboxed: bool) -> tuple[Settings, list[str]]:
    """The ports serve will bind: each as configured when free; a default one that is taken is replaced by a
    free port (and said so); an explicitly chosen one that is taken is an error naming its flag. A sandbox
    port of 0 becomes a free port now (the sandbox child, the product's clients and the kubeconfigs all
    need the same number)."""
    fields = ["port", *(["sandbox_aws_port", "sandbox_kube_port"] if sandboxed else [])]
    chosen: dict[str, int] = {}
    notes: list[str] = []
    for name in fields:
        value = int(getattr(settings, name))
        host = settings.host if name == "port" else "127.0.0.1"
        if value == 0 and name != "port":  # the sandbox's URLs are written before it binds: pick one now
            value = free_port(host)
            while value in chosen.values():
                value = free_port(host)
        if (value != 0 and value in chosen.values()) or not port_free(value, host):
            env = f"INSTANTSTART_{name.upper()}"
            if name in settings.model_fields_set:
                raise PortTaken(f"port {value} is already in use: choose another with {_PORT_FLAGS[name]} "
                                f"(or {env}), or stop what holds it")
            replacement = free_port(host)
            while replacement in chosen.values():
                replacement = free_port(host)
            notes.append(f"the default {_PORT_FLAGS[name][2:].replace('-', ' ')} {value} is in use (another "
                         f"instance?): using {replacement} instead; {_PORT_FLAGS[name]} chooses one")
            value = replacement
        if value == 0 and name != "port":  # the sandbox runs apart: its clients need the real port up front
            value = free_port(host)
            while value in chosen.values():
                value = free_port(host)
        chosen[name] = value
    return settings.model_copy(update={**chosen, "sandbox": sandboxed}), notes


def url_for(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


@dataclass(frozen=True)
class Location:
    """The data directory a CLI command uses, the server running on it (if any), and how it was chosen."""

    settings: Settings
    runtime: Runtime | None
    how: str

    def describe(self) -> str:
        server = (f"server running at {self.runtime.url} (pid {self.runtime.pid})" if self.runtime
                  else "no server running on it")
        return f"data directory {self.settings.data_dir} ({self.how}; {server})"


class Ambiguous(Exception):
    """Several servers run and nothing says which one is meant."""


def locate(settings: Settings) -> Location:
    """Pick the data directory: the configured one when given (flag, environment, config file); else the one
    live server in this user's registry; else the default. The server's actual ports replace the defaults."""
    if "data_dir" in settings.model_fields_set:
        how = "as given"
    else:
        servers = running_servers()
        if len(servers) > 1:
            listed = "\n".join(f"  --data-dir {s.data_dir}   ({s.url}, pid {s.pid})" for s in servers)
            raise Ambiguous(f"{len(servers)} instantstart servers are running; say which with --data-dir:\n{listed}")
        if servers:
            settings = settings.model_copy(update={"data_dir": Path(servers[0].data_dir)})
            how = "the running server's"
        else:
            how = "the default"
    runtime = read_runtime(settings.data_dir)
    if runtime is not None:
        update: dict[str, Any] = {name: port for name, port in runtime.ports.items()
                                  if name in _PORT_FLAGS and name not in settings.model_fields_set}
        update["sandbox"] = runtime.sandbox if settings.sandbox is None else settings.sandbox
        if runtime.region and "region" not in settings.model_fields_set:
            update["region"] = runtime.region  # sandbox env and seed act in the server's region
        settings = settings.model_copy(update=update)
    return Location(settings, runtime, how)
