"""The SSRF guard of outbound test calls (services/inference/egress.py), exhaustively: every spelling of the
metadata, link-local, loopback and unspecified addresses, DNS answers pinned and all checked, and service-proxy
path tricks."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import urllib3

from services.errors import Forbidden, Transient
from services.inference import egress, testcall
from services.inference.models import EndpointTest

METADATA_FORMS = [
    "169.254.169.254", "[169.254.169.254]", "2852039166", "0xa9fea9fe", "0xA9FEA9FE", "0251.0376.0251.0376",
    "0251.254.169.254", "0xa9.0xfe.0xa9.0xfe", "169.254.43518", "169.16689662", "169.254.169.254.",
    "fd00:ec2::254", "[fd00:ec2::254]", "FD00:EC2:0:0:0:0:0:254", "fd00:ec2::253",
    "::ffff:169.254.169.254", "[::ffff:a9fe:a9fe]", "::ffff:a9fe:a9fe", "0:0:0:0:0:ffff:169.254.169.254",
    "::169.254.169.254", "64:ff9b::169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1",
    "fe80::1", "[fe80::1%eth0]", "169.254.0.1",
    "::ffff:0:a9fe:a9fe", "::ffff:0:169.254.169.254",  # IPv4-translated (RFC 2765)
    "64:ff9b:1:a9fe:a9:fe00::", "64:ff9b:1::a9fe:a9fe", "64:ff9b:1::cb00:7107",  # local-use NAT64: refused whole
]
UNSPECIFIED_AND_LOOPBACK = ["0.0.0.0", "0", "0x0", "00.0.0.0", "[::]", "::", "0:0:0:0:0:0:0:0", "127.0.0.1",
                            "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "::1", "[::1]",
                            "::ffff:127.0.0.1", "::ffff:0.0.0.0", "224.0.0.1", "ff02::1", "255.255.255.255",
                            "240.0.0.1"]


@pytest.mark.parametrize("host", METADATA_FORMS + UNSPECIFIED_AND_LOOPBACK)
def test_every_spelling_of_a_forbidden_address_is_refused(host: str) -> None:
    with pytest.raises(Forbidden):
        egress.check_host(host, 80, resolve=_never)


@pytest.mark.parametrize("host", ["10.0.12.7", "172.31.4.5", "192.168.1.10", "100.64.3.2", "52.1.2.3",
                                  "[2600:1f18::5]", "2600:1f18::5", "::ffff:10.0.0.5"])
def test_unicast_vpc_and_public_addresses_pass_as_themselves(host: str) -> None:
    address = egress.check_host(host, 80, resolve=_never)
    assert address in (host.strip("[]"), "::ffff:a00:5")


def _never(*_: Any, **__: Any) -> list[tuple[Any, ...]]:
    raise AssertionError("a literal address is never looked up")


def _answers(*addresses: str) -> Any:
    calls: list[str] = []

    def resolve(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        calls.append(host)
        family = socket.AF_INET6 if ":" in addresses[0] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]
    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def test_a_name_is_resolved_once_and_the_checked_address_is_what_the_caller_connects_to() -> None:
    resolve = _answers("10.0.1.20", "10.0.2.20")
    assert egress.check_host("internal-chat-123.elb.us-east-1.amazonaws.com", 80, resolve=resolve) == "10.0.1.20"
    assert resolve.calls == ["internal-chat-123.elb.us-east-1.amazonaws.com"]


@pytest.mark.parametrize("answers", [("10.0.1.20", "169.254.169.254"), ("127.0.0.1",), ("fd00:ec2::254",),
                                     ("::ffff:169.254.169.254",), ("0.0.0.0",)])
def test_one_bad_dns_answer_refuses_the_name(answers: tuple[str, ...]) -> None:
    with pytest.raises(Forbidden):
        egress.check_host("rebind.example.com", 80, resolve=_answers(*answers))


def test_names_that_do_not_resolve_or_are_not_names_are_refused() -> None:
    def fails(*_: Any, **__: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror("no such host")
    with pytest.raises(Forbidden, match="does not resolve"):
        egress.check_host("nowhere.example.com", 80, resolve=fails)
    for host in ("", "a b.com", "evil.com/x", "user@host", "x" * 300, "host:80"):
        with pytest.raises(Forbidden):
            egress.check_host(host, 80, resolve=_answers("10.0.0.1"))


@pytest.mark.parametrize("path", ["v1/chat/completions", "/v1/completions", "v1/models", "health"])
def test_engine_paths_pass(path: str) -> None:
    assert egress.check_path(path) == path.strip("/")


@pytest.mark.parametrize("path", [
    "../v1/chat/completions", "v1/../../api/v1/secrets", "v1/./models", "./health", "v1//models",
    "%2e%2e/v1/models", "%2E%2E/health", "v1/%2e%2e/%2e%2e/api", "v1%2fmodels", "v1%2Fmodels", "..%2fhealth",
    "%252e%252e/health", "..%5chealth", "v1\\models", "health?x=1", "health#frag", "v1/models%00",
    "api/v1/namespaces/kube-system/secrets", "metrics", "",
])
def test_path_tricks_are_refused(path: str) -> None:
    with pytest.raises(Forbidden):
        egress.check_path(path)


def test_the_service_proxy_path_checks_every_part() -> None:
    assert egress.service_proxy_path("ns", "chat", 8000, "v1/chat/completions") == \
        "/api/v1/namespaces/ns/services/chat:8000/proxy/v1/chat/completions"
    for namespace, name, port in (("ns/../kube-system", "chat", 80), ("ns", "chat:80", 80), ("ns", "Chat", 80),
                                  ("ns", "chat", 0), ("ns", "chat", 70000)):
        with pytest.raises(Forbidden):
            egress.service_proxy_path(namespace, name, port, "health")


# ----- the load-balancer test call: resolved once, sent to the checked address, capped, no redirects ---------


CHECKED = "203.0.113.7"  # a public (documentation) address the guard lets through; nothing is sent to it


class Dialled:
    """urllib3's connection pool, made for the address the guard checked but connected to the local test engine:
    tests send traffic only to 127.0.0.1."""

    def __init__(self, engine_port: int) -> None:
        self.engine_port = engine_port
        self.addresses: list[tuple[str, int]] = []

    def __call__(self, address: str, port: int, **options: Any) -> urllib3.HTTPConnectionPool:
        self.addresses.append((address, port))
        return urllib3.HTTPConnectionPool("127.0.0.1", self.engine_port, **options)


class _Engine(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append((self.path, str(self.headers.get("Host")), body))
        if self.path == "/v1/completions":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        answer = json.dumps({"choices": [{"message": {"content": "x" * 100_000}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-served-by", "pod-a")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_: Any) -> None:
        return None


@pytest.fixture
def engine() -> Iterator[Dialled]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Engine.seen = []
    yield Dialled(int(server.server_address[1]))
    server.shutdown()
    server.server_close()


def test_the_load_balancer_call_goes_to_the_checked_address_with_the_name_as_host(engine: Dialled) -> None:
    resolve = _answers(CHECKED)
    name = "k8s-chat-0123.elb.us-west-2.amazonaws.com"
    result = testcall.call_load_balancer(name, 8000, "chat", EndpointTest(prompt="hi"), resolve=resolve,
                                         connect=engine)
    assert resolve.calls == [name] and engine.addresses == [(CHECKED, 8000)]
    assert result.status == 200 and result.truncated and len(json.dumps(result.answer)) <= 70_000
    assert result.headers["x-served-by"] == "pod-a" and result.path == f"http://{name}:8000/v1/chat/completions"
    path, host, body = _Engine.seen[0]
    assert (path, host) == ("/v1/chat/completions", f"{name}:8000")
    assert json.loads(body)["messages"] == [{"role": "user", "content": "hi"}]


def test_a_redirect_is_answered_not_followed(engine: Dialled) -> None:
    result = testcall.call_load_balancer("lb.example.com", 8000, "chat", EndpointTest(api="completion"),
                                         resolve=_answers(CHECKED), connect=engine)
    assert result.status == 302 and len(_Engine.seen) == 1


def test_a_load_balancer_name_resolving_to_metadata_is_never_dialled() -> None:
    with pytest.raises(Forbidden):
        testcall.call_load_balancer("evil.example.com", 80, "chat", EndpointTest(),
                                    resolve=_answers("10.0.0.8", "169.254.169.254"))


@pytest.mark.parametrize("name", ["k8s-ns-chat-0123abcd.elb.us-west-2.amazonaws.com",
                                  "my-alb-1.us-west-2.elb.amazonaws.com", "x-1.elb.cn-north-1.amazonaws.com.cn",
                                  "K8S-A.ELB.US-GOV-WEST-1.AMAZONAWS.COM."])
def test_a_load_balancer_is_tested_by_an_elastic_load_balancing_name(name: str) -> None:
    assert egress.check_load_balancer_name(name) == name.lower().rstrip(".")


@pytest.mark.parametrize("written", ["10.0.0.8", "169.254.169.254", "[::1]", "evil.example.com",
                                     "x.elb.us-west-2.amazonaws.com.evil.com", "x.elb.us-west-2.amazonaws.com@evil",
                                     "x.elb.amazonaws.com", "x.elb.us-west-2.amazonaws.com:80"])
def test_an_address_anyone_may_write_into_the_service_status_is_never_dialled(written: str) -> None:
    """Whoever may update a Service may write its status.loadBalancer: only an ELB name is followed."""
    with pytest.raises(Forbidden):
        egress.check_load_balancer_name(written)


class _Trickle(BaseHTTPRequestHandler):
    """An engine that announces an answer, then sends it a byte at a time, slower than any deadline."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "600")
        self.end_headers()
        try:
            for _ in range(600):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)  # the trickle itself, not a wait for the test
        except OSError:  # the caller cut the answer
            return

    def log_message(self, *_: Any) -> None:
        return None


def test_an_answer_that_trickles_past_the_deadline_is_cut() -> None:
    """The socket timeout is per read: an engine sending a byte now and then would hold the worker thread
    forever; the whole answer must come within the call's time."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(Transient, match="still answering after 1 s"):
            testcall.call_load_balancer("lb-1.elb.us-west-2.amazonaws.com", 8000, "chat", EndpointTest(),
                                        resolve=_answers(CHECKED), connect=Dialled(int(server.server_address[1])),
                                        timeout=1.0)
    finally:
        server.shutdown()
        server.server_close()


def _rebinding(*rounds: str) -> Any:
    """A resolver that answers ``rounds[0]`` to the first lookup, ``rounds[1]`` to the next, ... (a DNS rebinding
    server with a zero TTL: public first, the metadata service next)."""
    calls: list[str] = []

    def resolve(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        calls.append(host)
        address = rounds[min(len(calls), len(rounds)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def test_a_rebinding_name_is_resolved_once_and_the_call_goes_to_its_first_answer_only(engine: Dialled) -> None:
    """The name answers a public address, then 169.254.169.254: the test call looks it up once, connects to the
    first (checked) answer with the name as Host, and a second call looks it up afresh and is refused there,
    before any connection."""
    resolve = _rebinding(CHECKED, "169.254.169.254")
    name = "k8s-rebind-0123.elb.us-west-2.amazonaws.com"
    first = testcall.call_load_balancer(name, 8000, "chat", EndpointTest(prompt="hi"), resolve=resolve,
                                        connect=engine)
    assert first.status == 200
    assert resolve.calls == [name] and engine.addresses == [(CHECKED, 8000)]
    assert [host for _, host, _ in _Engine.seen] == [f"{name}:8000"]
    with pytest.raises(Forbidden, match=r"169\.254\.169\.254"):
        testcall.call_load_balancer(name, 8000, "chat", EndpointTest(prompt="hi"), resolve=resolve, connect=engine)
    assert resolve.calls == [name, name] and engine.addresses == [(CHECKED, 8000)]
