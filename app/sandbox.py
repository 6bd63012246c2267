"""The embedded sandbox, wired in by configuration only.

When no AWS credentials are configured (or ``sandbox: true``), ``instantstart serve`` runs, as its child
process (``python -m sandbox``, :mod:`sandbox.host`),

* the AWS world (``sandbox/aws``): one endpoint for every service at ``http://127.0.0.1:4566``, HyperPod,
  EKS, Service Quotas and FSx simulated, the rest served by moto;
* the Kubernetes API emulator on loopback HTTPS (``https://127.0.0.1:3443/k8s/clusters/<name>``, a private
  CA made once per data directory); it accepts its own bearer token (kubeconfigs) and EKS presigned tokens
  signed with the sandbox's credentials, exactly what the EKS client factory sends.

``services/`` never learns that it talks to the sandbox: the composition root hands it an AWS endpoint
URL with fixed fake credentials, and kubeconfigs. Loopback only: the sandbox's APIs are reached from the
host or container it runs in, like the data directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import botocore.session

from app.secret_files import secret_file
from services.errors import Conflict, Invalid, NotFound, ServiceError, Transient
from services.settings import Settings

log = logging.getLogger(__name__)


def sandbox_enabled(settings: Settings) -> bool:
    return sandbox_mode(settings)[0]


# What the ``sandbox`` extra brings (pyproject.toml): moto for the AWS world, the full mlflow (flask is
# what mlflow-skinny lacks to serve) for its MLflow tracking server.
SANDBOX_PACKAGES = {"moto": "moto", "flask": "mlflow (the full package)"}


def missing_sandbox_packages() -> list[str]:
    """The ``sandbox`` extra's packages this installation lacks (the production image leaves them out)."""
    def present(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:  # a broken or half-removed installation
            return False
    return [name for module, name in SANDBOX_PACKAGES.items() if not present(module)]


def sandbox_mode(settings: Settings) -> tuple[bool, str]:
    """Sandbox or AWS, and why, for the banner and the runtime file.

    The explicit setting wins. Otherwise the sandbox runs when no credentials are configured, or when the
    only credentials are this sandbox's own (a shell that ran ``eval "$(instantstart sandbox env)"``). Only
    configured sources count (environment, shared config and credential files, SSO, processes): the
    instance-metadata and container providers are skipped, because probing them sends traffic off the
    machine and waits on timeouts. On EC2 or ECS with a role, set ``sandbox: false``.
    """
    if settings.sandbox is not None:
        state = "true" if settings.sandbox else "false"
        return settings.sandbox, f"sandbox: {state} was set (--sandbox/--no-sandbox, INSTANTSTART_SANDBOX or config)"
    session = botocore.session.get_session()
    resolver = session.get_component("credential_provider")
    for provider in ("iam-role", "container-role"):
        resolver.remove(provider)
    credentials = resolver.load_credentials()
    if credentials is None:
        return True, "no AWS credentials are configured"
    if credentials.access_key == SANDBOX_ACCESS_KEY:
        return True, "the configured AWS credentials are the sandbox's own (instantstart sandbox env)"
    return False, (f"AWS credentials were found (source: {credentials.method}); "
                   "pass --sandbox to use the offline sandbox instead")


# The sandbox's AWS credentials: the AWS world accepts any, but the emulator accepts EKS tokens only when
# they are signed with this installation's secret key (made once, 0600 in the data directory).
SANDBOX_ACCESS_KEY = "AKIAINSTANTSTARTSBX1"


def sandbox_secret_key(settings: Settings) -> str:
    return secret_file(sandbox_dir(settings) / "aws-secret-key")


def aws_endpoint(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.sandbox_aws_port}"


def aws_session(settings: Settings) -> boto3.Session:
    return boto3.Session(aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=sandbox_secret_key(settings),
                         region_name=settings.region)


MLFLOW_ENDPOINT_ENV = "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT"


def mlflow_endpoint(settings: Settings) -> str:
    """Where the ``sagemaker-mlflow`` plugin sends the MLflow calls of a tracking server's ARN in the sandbox:
    the sandbox's SageMaker MLflow front on its AWS port (``sandbox/mlflow_proxy.py``)."""
    from sandbox.mlflow_proxy import endpoint

    return endpoint(aws_endpoint(settings))


def use_sandbox_mlflow(settings: Settings) -> None:
    """Point this process's ``sagemaker-mlflow`` plugin at the sandbox (the plugin reads only its environment
    variable): the product's MLflow code path stays the one it takes against AWS, the ARN as tracking URI."""
    os.environ[MLFLOW_ENDPOINT_ENV] = mlflow_endpoint(settings)


def sandbox_dir(settings: Settings) -> Path:
    return settings.data_dir / "sandbox"


def kube_url(settings: Settings) -> str:
    return f"https://127.0.0.1:{settings.sandbox_kube_port}"


def kube_token(settings: Settings) -> str:
    """The emulator's bearer token: made once per installation, kept 0600 in the data directory."""
    return secret_file(sandbox_dir(settings) / "kube-token")


def kubeconfig_path(settings: Settings, cluster: str) -> Path:
    return settings.data_dir / "kubeconfigs" / f"{cluster}.yaml"


def kubeconfig_text(settings: Settings, cluster: str) -> str:
    """The cluster's kubeconfig for the emulator at ``settings.sandbox_kube_port``."""
    from sandbox.kube import kubeconfig_yaml
    from sandbox.tls import ensure_tls

    tls = ensure_tls(sandbox_dir(settings) / "tls")
    return kubeconfig_yaml(cluster, kube_url(settings), kube_token(settings), ca_pem=tls.ca_pem)


def write_kubeconfig(settings: Settings, cluster: str) -> Path:
    """The cluster's kubeconfig under the data directory, rewritten only when its content would change
    (info requests and start-up call this for every cluster)."""
    from sandbox.kube import write_kubeconfig as write
    from sandbox.tls import ensure_tls

    path = kubeconfig_path(settings, cluster)
    if path.exists() and path.read_text() == kubeconfig_text(settings, cluster):
        return path
    tls = ensure_tls(sandbox_dir(settings) / "tls")
    return write(path, cluster, kube_url(settings), kube_token(settings), ca_pem=tls.ca_pem)


def stored_clusters(settings: Settings) -> list[str]:
    from sandbox.kube.persistence import stored_cluster_names

    return stored_cluster_names(sandbox_dir(settings) / "kube" / "state.sqlite3")


def describe(settings: Settings, clusters: list[str], *, write: bool = True) -> dict[str, Any]:
    """What the banner, ``instantstart sandbox info`` and ``GET /api/v1/sandbox`` report; writes each
    cluster's kubeconfig so the paths it lists exist (``write=False`` when no server runs: the files the last
    server wrote stay as they are, and only those that exist are listed)."""
    from sandbox.aws.front import ACCOUNT_ID

    if write:
        kubeconfigs = {name: str(write_kubeconfig(settings, name)) for name in clusters}
    else:
        kubeconfigs = {name: str(kubeconfig_path(settings, name)) for name in clusters
                       if kubeconfig_path(settings, name).exists()}
    return {
        "aws_endpoint_url": aws_endpoint(settings), "region": settings.region, "account_id": ACCOUNT_ID,
        "kubernetes_url": f"{kube_url(settings)}/k8s/clusters/<name>",
        "kubeconfigs": kubeconfigs,
        "kubeconfig_dir": str(kubeconfig_path(settings, "x").parent), "speed": settings.sandbox_speed,
        "credentials": {"aws_access_key_id": SANDBOX_ACCESS_KEY,
                        "note": "the AWS endpoint accepts any credentials; the product signs with its own"},
    }


def write_kubeconfigs(settings: Settings, names: list[str]) -> None:
    """Write a kubeconfig per emulated cluster, for users' ``kubectl`` (``instantstart kubeconfig``). The
    product itself never uses them: it reaches a cluster only once the registry knows it (imported or
    created), as an EKS source (endpoint and CA from DescribeCluster, an STS-presigned token), exactly as
    against AWS."""
    for name in names:
        write_kubeconfig(settings, name)


class Sandbox:
    """The sandbox world of ``instantstart serve``, run as its child process (``python -m sandbox``).

    :meth:`start` launches it with the sandbox folder of the data directory, the ports serve chose, the
    clock speed and the secrets (on its stdin), and returns once its control API answers (the readiness
    probe); a child that exits first fails the start with the reason from its log
    (``<data dir>/sandbox/sandbox.log``). A worker thread then follows the child's cluster feed: a cluster
    an EKS create (or ``sandbox seed``) makes gets its kubeconfig (for users' ``kubectl``) at once, and listeners
    (:meth:`on_clusters_changed`) hear of it; if the child dies, ``on_exit`` is told why. :meth:`stop`
    closes the child's stdin, which makes it save its state and exit.
    """

    READY_TIMEOUT = 90.0
    STOP_TIMEOUT = 20.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._listeners: list[Callable[[list[str]], None]] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._follower: threading.Thread | None = None
        self._clusters: list[str] = []
        self._simulated: dict[str, Any] = {}
        self.on_exit: Callable[[str], None] | None = None
        self.exit_reason: str | None = None

    # --- the child ------------------------------------------------------------------------------------

    @property
    def aws_endpoint_url(self) -> str:
        return aws_endpoint(self.settings)

    @property
    def kube_base_url(self) -> str:
        return kube_url(self.settings)

    @property
    def log_path(self) -> Path:
        return sandbox_dir(self.settings) / "sandbox.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _config(self) -> str:
        return json.dumps({
            "data_dir": str(sandbox_dir(self.settings)), "aws_port": self.settings.sandbox_aws_port,
            "kube_port": self.settings.sandbox_kube_port, "speed": self.settings.sandbox_speed,
            "region": self.settings.region, "access_keys": {SANDBOX_ACCESS_KEY: sandbox_secret_key(self.settings)},
            "kube_token": kube_token(self.settings), "control_token": control_token(self.settings)})

    def start(self) -> None:
        import sandbox as package

        folder = sandbox_dir(self.settings)
        folder.mkdir(parents=True, exist_ok=True)
        config = self._config()
        env = dict(os.environ)
        root = str(Path(package.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        env[MLFLOW_ENDPOINT_ENV] = mlflow_endpoint(self.settings)  # for the workloads the sandbox runs
        with self.log_path.open("wb") as log_file:
            self._process = subprocess.Popen([sys.executable, "-m", "sandbox"], stdin=subprocess.PIPE,
                                             stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)  # a Ctrl-C reaches serve only
        assert self._process.stdin is not None
        self._process.stdin.write(config.encode() + b"\n")
        self._process.stdin.flush()
        deadline = time.monotonic() + self.READY_TIMEOUT
        while True:
            code = self._process.poll()
            if code is not None:
                self._process = None
                raise Conflict(f"the sandbox did not start (exit code {code}): {self._log_tail()}") from None
            try:
                self._request("GET", "/_sandbox/health", timeout=2)
                break
            except ServiceError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise Conflict(f"the sandbox did not answer within {self.READY_TIMEOUT:.0f}s; its log: "
                                   f"{self._log_tail()}") from None
                time.sleep(0.05)
        info = self._request("GET", "/_sandbox/info")
        self._simulated = info["simulated"]
        self._clusters_changed(list(info["clusters"]), notify=False)
        self._follower = threading.Thread(target=self._follow, name="sandbox-clusters", daemon=True)
        self._follower.start()
        log.info("sandbox (pid %s): AWS at %s, Kubernetes at %s/k8s/clusters/<name>", self.pid,
                 self.aws_endpoint_url, self.kube_base_url)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        """One call to the child's control API; its errors as the product's."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.aws_endpoint_url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {control_token(self.settings)}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            message = _error_text(exc)
            if exc.code == 404:
                raise NotFound(message) from None
            if exc.code == 400:
                raise Invalid(message) from None
            raise Transient(f"the sandbox answered {exc.code}: {message}") from None
        except (OSError, ValueError) as exc:
            raise Transient(f"the sandbox is not reachable at {self.aws_endpoint_url}: {exc}") from None

    def _follow(self) -> None:
        """Follow the child's cluster feed until stopped; tell ``on_exit`` if the child died."""
        generation = 0
        while not self._stopping.is_set():
            try:
                answer = self._request("GET", f"/_sandbox/clusters?after={generation}&wait=25", timeout=40)
            except ServiceError as exc:
                if self._stopping.is_set():
                    return
                process = self._process
                code = process.poll() if process is not None else None
                if code is not None:
                    self.exit_reason = (f"the sandbox process (pid {process.pid if process else '?'}) exited with "
                                        f"code {code}: {self._log_tail()}")
                    log.error("%s", self.exit_reason)
                    if self.on_exit is not None:
                        self.on_exit(self.exit_reason)
                    return
                log.warning("following the sandbox's clusters: %s", exc.message)
                self._stopping.wait(1.0)
                continue
            if answer["generation"] != generation:
                first = generation == 0
                generation = int(answer["generation"])
                if not first or answer["clusters"] != self._clusters:
                    self._clusters_changed(list(answer["clusters"]))

    def _clusters_changed(self, names: list[str], *, notify: bool = True) -> None:
        self._clusters = sorted(names)
        write_kubeconfigs(self.settings, self._clusters)
        if notify:
            for listener in list(self._listeners):
                try:
                    listener(self._clusters)
                except Exception:
                    log.exception("a sandbox cluster listener failed")

    def on_clusters_changed(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener(sorted names)`` (on the follower thread) when the sandbox's clusters change."""
        self._listeners.append(listener)

    # --- what the parent reads and does ---------------------------------------------------------------

    def clusters(self) -> list[str]:
        return list(self._clusters)

    def info(self) -> dict[str, Any]:
        return {**describe(self.settings, self.clusters()), "simulated": self._simulated}

    def faults(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/_sandbox/faults"))

    def inject(self, kind: str, target: dict[str, str], count: int | None) -> dict[str, Any]:
        return dict(self._request("POST", "/_sandbox/faults", {"kind": kind, "target": target, "count": count}))

    def clear(self, fault_id: str) -> list[dict[str, Any]]:
        return list(self._request("DELETE", f"/_sandbox/faults/{urllib.parse.quote(fault_id, safe='')}"))

    def calls(self, **filters: Any) -> list[dict[str, Any]]:
        """The call ledger, filtered (see :mod:`sandbox.ledger`)."""
        query = urllib.parse.urlencode({k: str(v).lower() if isinstance(v, bool) else v
                                        for k, v in filters.items() if v is not None})
        return list(self._request("GET", f"/_sandbox/calls?{query}")["calls"])

    def stop(self) -> None:
        """Close the child's stdin (it saves its state and exits); terminate it if it lingers."""
        self._stopping.set()
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(self.STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("the sandbox did not stop within %.0fs: terminating it", self.STOP_TIMEOUT)
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._follower is not None:
            self._follower.join(5)
            self._follower = None


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("error", exc.reason))
    except (OSError, ValueError, AttributeError):
        return str(exc.reason)


def control_token(settings: Settings) -> str:
    """The token of the sandbox's control API: made once per installation, kept 0600 in the data directory."""
    return secret_file(sandbox_dir(settings) / "control-token")


def ledger_path(settings: Settings) -> Path:
    return sandbox_dir(settings) / "calls.jsonl"
