"""moto behind the front: an in-process moto server with a replayable log of the requests that changed it.

moto has no persistence of its own, so the world keeps state across restarts by logging every *mutating*
request forwarded to moto and replaying the log into a freshly reset moto on the next start:

* reads (GET/HEAD, and ``Describe*``/``List*``/``Get*``/``Head*`` actions of the query and JSON protocols)
  are never logged, so a restart costs the mutations only, however much a dashboard polled;
* mutating requests are serialised under one lock; before each one moto's random generator is reseeded
  with ``base seed + sequence number`` and the request is appended to the log, under the same lock, only
  after moto answered it successfully. Replay reseeds the same way, so every id comes back the same
  whatever the read traffic or the interleaving of concurrent clients was;
* bodies over 1 MiB (S3 uploads) are kept as files in ``moto-bodies/`` next to the log, not inlined;
* moto creates some state lazily, with random ids, on the first requests after a reset (the default VPC of
  a region, IAM's partitions); two reads at start, under the base seed, create it before anything else, so
  whether a read or a mutation came first live makes no difference to the ids.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

MOTO_SEED = 20260101
BODY_INLINE_LIMIT = 1024 * 1024
TIMEOUT_SECONDS = 120
_READ_PREFIXES = ("Describe", "List", "Get", "Head", "Simulate")


@dataclass(frozen=True)
class Subnet:
    """What EC2 says about a subnet: its VPC, IPv4 CIDR block and availability zone (name and id)."""

    vpc: str
    cidr: str
    zone: str
    zone_id: str


@dataclass
class Forwarded:
    """moto's answer to one forwarded request: status and headers now, the body read in chunks."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    _response: http.client.HTTPResponse
    _conn: http.client.HTTPConnection

    def read(self, size: int | None = None) -> bytes:
        return self._response.read(size)

    def close(self) -> None:
        self._response.close()
        self._conn.close()


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def is_read(method: str, uri: str, headers: Mapping[str, str], body: bytes) -> bool:
    """Whether a request only reads moto's state (and so needs neither the lock nor the log)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return True
    action = parse_qs(urlsplit(uri).query).get("Action", [""])[0]
    target = _header(headers, "x-amz-target")
    if not action and target:
        action = target.rpartition(".")[2]
    if not action and "x-www-form-urlencoded" in _header(headers, "content-type") and len(body) < 65536:
        action = parse_qs(body.decode("utf-8", "replace")).get("Action", [""])[0]
    return action.startswith(_READ_PREFIXES)


class MotoBackend:
    """moto's in-process server, reset and seeded on start, with a mutation log it replays (see the module)."""

    def __init__(self, log_path: Path | None, seed: int = MOTO_SEED, *, region: str = "us-west-2",
                 account: str = "123456789012") -> None:
        os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._log_path = log_path
        self._seed = seed
        self._region = region
        self._account = account
        self._lock = threading.Lock()  # serialises mutating requests and the log
        self._sequence = 0  # mutating requests logged (replayed or live) so far
        self.replayed = 0
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _bodies(self) -> Path:
        assert self._log_path is not None
        return self._log_path.parent / "moto-bodies"

    def start(self) -> int:
        """Start, reset and replay the log; returns how many requests were replayed."""
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self._send("POST", "/moto-api/reset", {}, b"").close()
        self._reseed(self._seed)
        for _ in range(2):  # the second request after a reset creates IAM's other partitions: see the module
            self._ec2_query({"Action": "DescribeVpcs", "Version": "2016-11-15"}, self._region)
        self._sequence = 0
        self.replayed = self._replay()
        return self.replayed

    def stop(self) -> None:
        if self.port:
            self._server.stop()
            self.port = 0

    @staticmethod
    def _reseed(value: int) -> None:
        from moto.moto_api._internal import mock_random

        mock_random.seed(value)

    def _send(self, method: str, uri: str, headers: Mapping[str, str], body: bytes) -> Forwarded:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_SECONDS)
        try:
            conn.request(method, uri, body=body if method in ("POST", "PUT", "PATCH") or body else None,
                         headers=dict(headers))
            response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        return Forwarded(response.status, response.reason, response.getheaders(), response, conn)

    def forward(self, method: str, uri: str, headers: Mapping[str, str], body: bytes) -> Forwarded:
        """Send one request to moto; a successful mutating one is logged (see the module docstring)."""
        if is_read(method, uri, headers, body) or uri.startswith("/moto-api"):
            return self._send(method, uri, headers, body)
        with self._lock:
            seed = self._seed + self._sequence
            self._reseed(seed)
            forwarded = self._send(method, uri, headers, body)
            if forwarded.status < 400:
                self._sequence += 1
                self._append(seed, method, uri, headers, body)
            return forwarded

    def _append(self, seed: int, method: str, uri: str, headers: Mapping[str, str], body: bytes) -> None:
        if self._log_path is None:
            return
        entry: dict[str, object] = {"seed": seed, "method": method, "uri": uri, "headers": dict(headers)}
        if len(body) > BODY_INLINE_LIMIT:
            self._bodies.mkdir(exist_ok=True)
            name = f"{seed}.bin"
            with (self._bodies / name).open("wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            entry["body_file"] = name
        else:
            entry["body"] = base64.b64encode(body).decode()
        with self._log_path.open("a") as fh:  # on disk before moto's answer is relayed
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _replay(self) -> int:
        if self._log_path is None or not self._log_path.exists():
            return 0
        count = 0
        with self._log_path.open() as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:  # a line torn by a crash mid-write: moto never answered it
                    continue
                if "seed" in entry:  # logs written before per-request seeding replay under the start seed
                    self._reseed(int(entry["seed"]))
                    self._sequence = int(entry["seed"]) - self._seed + 1
                body = ((self._bodies / entry["body_file"]).read_bytes() if "body_file" in entry
                        else base64.b64decode(entry["body"]))
                self._send(entry["method"], entry["uri"], entry["headers"], body).close()
                count += 1
        return count

    def _ec2_query(self, params: dict[str, str], region: str) -> str:
        headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
                   "Authorization": f"AWS4-HMAC-SHA256 Credential=sandbox/20260101/{region}/ec2/aws4_request, "
                                    "SignedHeaders=host, Signature=sandbox"}
        forwarded = self._send("POST", "/", headers, urlencode(params).encode())
        try:
            return forwarded.read().decode()
        finally:
            forwarded.close()

    def subnet(self, subnet_id: str, region: str) -> Subnet | None:
        """A moto subnet's VPC, CIDR and zone (``None`` if there is none): a read, so it is not logged."""
        text = self._ec2_query({"Action": "DescribeSubnets", "Version": "2016-11-15", "SubnetId.1": subnet_id},
                               region)

        def tag(name: str) -> str:
            match = re.search(rf"<{name}>([^<]+)</{name}>", text)
            return match.group(1) if match else ""

        if not re.fullmatch(r"vpc-[0-9a-f]+", tag("vpcId")):
            return None
        return Subnet(tag("vpcId"), tag("cidrBlock"), tag("availabilityZone"), tag("availabilityZoneId"))
