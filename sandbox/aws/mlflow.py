"""The sandbox's SageMaker managed MLflow: tracking servers as the SageMaker API describes them.

Moto has no MLflow tracking servers. This simulator owns ``CreateMlflowTrackingServer``, ``Describe…``,
``List…``, ``Delete…``, ``Start…``/``Stop…`` and ``CreatePresignedMlflowTrackingServerUrl`` (the front has
validated names, sizes and patterns against the installed botocore model, sagemaker 2017-07-24, as for
HyperPod). What SageMaker checks semantically is checked here: the ``RoleArn`` exists and trusts
``sagemaker.amazonaws.com``, the ``ArtifactStoreUri`` names an existing bucket, a name is unique in the
account. Statuses move only in :meth:`MlflowTrackingServers.tick`, on the sandbox clock: Creating → Created
after :data:`CREATE_SECONDS` (AWS: "it can take up to 25 minutes to complete tracking server creation",
docs.aws.amazon.com/sagemaker/latest/dg/mlflow-create-tracking-server-cli.html; the speed factor shortens
it), Deleting → gone, Stopping → Stopped, Starting → Started.

Behind every server stands the sandbox's one real ``mlflow server`` (:mod:`sandbox.mlflow_server`), reached
through the proxy front :mod:`sandbox.mlflow_proxy`; :meth:`MlflowTrackingServers.serving` is what it asks.
The servers are dispatched, ticked and saved with the HyperPod simulator (one SageMaker service).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from .base import AwsError, Call, SimClock
from .hyperpod_checks import SAGEMAKER, WorldFacts, check_role, invalid

CREATE_SECONDS = 1200.0  # Creating -> Created (AWS: up to 25 minutes)
DELETE_SECONDS = 300.0
STOP_SECONDS = 300.0
START_SECONDS = 600.0
DEFAULT_VERSION = "3.0"
SERVING = ("Created", "Started", "Updated", "MaintenanceComplete")  # the states that answer MLflow calls
_S3 = re.compile(r"(?:s3|https)://([^/]+)/?(.*)")
_TRANSITIONS = {"Creating": ("Created", "created"), "Deleting": (None, "deleted"), "Stopping": ("Stopped", "stopped"),
                "Starting": ("Started", "started")}


def url_safe_id(name: str, account: str) -> str:
    """A stable made-up host id, as in ``https://t-<id>.<region>.experiments.sagemaker.aws``."""
    import hashlib
    return hashlib.sha256(f"{account}/{name}".encode()).hexdigest()[:12]


class MlflowTrackingServers:
    """SageMaker's MLflow tracking servers of one account and region (an extension of the HyperPod simulator)."""

    service = "sagemaker"
    state_key = "mlflow_tracking_servers"
    operations = frozenset({
        "CreateMlflowTrackingServer", "DescribeMlflowTrackingServer", "ListMlflowTrackingServers",
        "DeleteMlflowTrackingServer", "StartMlflowTrackingServer", "StopMlflowTrackingServer",
        "CreatePresignedMlflowTrackingServerUrl",
    })

    def __init__(self, clock: SimClock, facts: WorldFacts | None, *, account: str, region: str,
                 ui_base: str = "") -> None:
        self.clock = clock
        self.facts = facts
        self.account = account
        self.region = region
        self.ui_base = ui_base  # where presigned UI links point (the proxy front); set by the world when served
        self.servers: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()

    # --- SimulatedService ------------------------------------------------------------------------------

    def handle(self, call: Call) -> dict[str, Any]:
        handler = getattr(self, "_op_" + call.operation)
        with self._lock:
            answer: dict[str, Any] = handler(call.params, self.clock.now())
            return answer

    def tick(self, now: float) -> None:
        with self._lock:
            for name, server in list(self.servers.items()):
                status = server["TrackingServerStatus"]
                if status not in _TRANSITIONS or now < server["_due"]:
                    continue
                after, _ = _TRANSITIONS[status]
                if after is None:
                    del self.servers[name]
                    continue
                server["TrackingServerStatus"] = after
                server["IsActive"] = "Active" if after in SERVING else "Inactive"
                server["LastModifiedTime"] = server["_due"]

    def to_state(self) -> dict[str, Any]:
        with self._lock:
            # presigned tokens stay in memory only: a sign-in link is a credential, never written to disk
            return {"servers": [{k: v for k, v in s.items() if k != "_tokens"} for s in self.servers.values()]}

    def load_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.servers = {s["TrackingServerName"]: dict(s) for s in state.get("servers", [])}

    # --- what the proxy front asks ---------------------------------------------------------------------

    def serving(self, arn: str) -> tuple[bool, str]:
        """Whether the tracking server ``arn`` answers MLflow calls now, and if not, why (SageMaker's words)."""
        with self._lock:
            for server in self.servers.values():
                if server["TrackingServerArn"] == arn:
                    status = server["TrackingServerStatus"]
                    if status in SERVING:
                        return True, ""
                    return False, f"Tracking server {server['TrackingServerName']} is {status}, not available."
        return False, f"Tracking server {arn} does not exist."

    def redeem(self, token: str) -> bool:
        """Whether ``token`` is a presigned UI token that has not expired (single-use, as AWS's are). Links
        expire in wall-clock seconds, not on the sped-up sandbox clock: a person opens them, not AWS."""
        with self._lock:
            for server in self.servers.values():
                tokens: dict[str, float] = server.setdefault("_tokens", {})
                expires = tokens.pop(token, None)
                if expires is not None:
                    return time.time() <= expires and server["TrackingServerStatus"] in SERVING
        return False

    # --- helpers ----------------------------------------------------------------------------------------

    def _arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account}:mlflow-tracking-server/{name}"

    def _find(self, name: str) -> dict[str, Any]:
        server = self.servers.get(name)
        if server is None:
            raise AwsError("ResourceNotFound", f"Tracking server {name} does not exist.")
        return server

    def _view(self, server: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in server.items() if not k.startswith("_") and k != "Tags"}
        for key in ("CreationTime", "LastModifiedTime"):
            out[key] = dt.datetime.fromtimestamp(server[key], dt.UTC)
        return out

    def _move(self, server: dict[str, Any], status: str, seconds: float, now: float) -> None:
        server["TrackingServerStatus"] = status
        server["IsActive"] = "Inactive"
        server["_due"] = now + seconds
        server["LastModifiedTime"] = now

    # --- operations -------------------------------------------------------------------------------------

    def _op_CreateMlflowTrackingServer(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        name = p["TrackingServerName"]
        if name in self.servers:
            raise AwsError("ResourceInUse", f"Tracking server {name} already exists.")
        match = _S3.fullmatch(p["ArtifactStoreUri"])
        if match is None:
            raise invalid(f"ArtifactStoreUri {p['ArtifactStoreUri']} is not an S3 URI.")
        if self.facts is not None:
            check_role(self.facts, p["RoleArn"], SAGEMAKER)
            if not self.facts.bucket_exists(match.group(1)):
                raise invalid(f"The S3 bucket {match.group(1)} of ArtifactStoreUri does not exist or is not "
                              "accessible.")
        arn = self._arn(name)
        server: dict[str, Any] = {
            "TrackingServerArn": arn, "TrackingServerName": name, "ArtifactStoreUri": p["ArtifactStoreUri"],
            "TrackingServerSize": p.get("TrackingServerSize", "Small"),
            "MlflowVersion": p.get("MlflowVersion", DEFAULT_VERSION), "RoleArn": p["RoleArn"],
            "TrackingServerUrl": f"https://t-{url_safe_id(name, self.account)}.{self.region}."
                                 "experiments.sagemaker.aws",
            "AutomaticModelRegistration": bool(p.get("AutomaticModelRegistration", False)),
            "WeeklyMaintenanceWindowStart": p.get("WeeklyMaintenanceWindowStart", "Tue:03:30"),
            "CreationTime": now, "Tags": list(p.get("Tags") or []),
        }
        self._move(server, "Creating", CREATE_SECONDS, now)
        self.servers[name] = server
        return {"TrackingServerArn": arn}

    def _op_DescribeMlflowTrackingServer(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self._view(self._find(p["TrackingServerName"]))

    def _op_ListMlflowTrackingServers(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        found = [s for s in self.servers.values()
                 if p.get("TrackingServerStatus") in (None, s["TrackingServerStatus"])
                 and p.get("MlflowVersion") in (None, s["MlflowVersion"])]
        key = {"Name": "TrackingServerName", "Status": "TrackingServerStatus"}.get(p.get("SortBy", ""), "CreationTime")
        found.sort(key=lambda s: s[key], reverse=p.get("SortOrder", "Descending") == "Descending")
        start = int(p.get("NextToken") or 0)
        size = int(p.get("MaxResults") or 100)
        page = found[start:start + size]
        answer: dict[str, Any] = {"TrackingServerSummaries": [
            {k: v for k, v in self._view(s).items() if k in ("TrackingServerArn", "TrackingServerName", "CreationTime",
                                                             "LastModifiedTime", "TrackingServerStatus", "IsActive",
                                                             "MlflowVersion")} for s in page]}
        if start + size < len(found):
            answer["NextToken"] = str(start + size)
        return answer

    def _transition(self, p: dict[str, Any], allowed: Callable[[str], bool], why: str, to: str, seconds: float,
                    now: float) -> dict[str, Any]:
        """Move the named server to ``to`` for ``seconds`` if its status is ``allowed``, else the API's
        ConflictException ending with ``why``."""
        server = self._find(p["TrackingServerName"])
        if not allowed(server["TrackingServerStatus"]):
            raise AwsError("ConflictException", f"Tracking server {server['TrackingServerName']} is "
                                                f"{server['TrackingServerStatus']}{why}")
        self._move(server, to, seconds, now)
        return {"TrackingServerArn": server["TrackingServerArn"]}

    def _op_DeleteMlflowTrackingServer(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self._transition(p, lambda s: s not in ("Creating", "Deleting", "Starting", "Stopping"),
                                " and cannot be deleted now.", "Deleting", DELETE_SECONDS, now)

    def _op_StopMlflowTrackingServer(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self._transition(p, lambda s: s in SERVING, ": only a running server stops.", "Stopping",
                                STOP_SECONDS, now)

    def _op_StartMlflowTrackingServer(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self._transition(p, lambda s: s == "Stopped", ": only a stopped server starts.", "Starting",
                                START_SECONDS, now)

    def _op_CreatePresignedMlflowTrackingServerUrl(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        server = self._find(p["TrackingServerName"])
        if server["TrackingServerStatus"] not in SERVING:
            raise AwsError("ValidationException", f"Tracking server {server['TrackingServerName']} is "
                                                  f"{server['TrackingServerStatus']}, not available.")
        token = secrets.token_urlsafe(24)
        server.setdefault("_tokens", {})[token] = time.time() + float(p.get("ExpiresInSeconds") or 300)
        base = self.ui_base or server["TrackingServerUrl"]
        return {"AuthorizedUrl": f"{base}/auth?authToken={token}"}
