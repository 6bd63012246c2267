"""The SSRF guard of every outbound test call the control plane makes to an inference endpoint.

The control plane runs with AWS credentials on a host whose instance metadata service hands them out, so a
request it makes on a user's behalf must never reach link-local or metadata addresses, however the address is
spelled: ``169.254.169.254``, ``fd00:ec2::254``, IPv4-mapped, -compatible, NAT64, 6to4 and Teredo IPv6 forms
of them, the decimal / octal / hex / short IPv4 spellings the C resolver accepts (``2852039166``,
``0251.0376.0251.0376``, ``0xa9fea9fe``, ``169.254.43518``), the unspecified ``0.0.0.0`` / ``[::]`` and
loopback. A hostname is resolved once, every address it has must pass, and the caller connects to the checked
address (pinned): a second lookup could answer differently (DNS rebinding). Paths for the Kubernetes API's
service proxy are refused when they contain a dot segment or an encoded separator, in any encoding, and only
the engine paths a test needs are allowed. Redirects are never followed (the caller's client is built so).

This module only decides; it never connects. Every refusal is :class:`~services.errors.Forbidden`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from services.errors import Forbidden

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: the engine endpoints a test call may reach through the service proxy
ALLOWED_PATHS = frozenset({"v1/chat/completions", "v1/completions", "v1/models", "health"})
_BLOCKED = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
    "::/128", "::1/128", "fe80::/10", "fd00:ec2::/32", "ff00::/8", "64:ff9b:1::/48")]
_NUMERIC_V4 = re.compile(r"^[0-9a-fA-FxX.]+$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]"
                       r"([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_REGION = r"[a-z]{2}(-[a-z]+)+-\d"
_ELB_NAME = re.compile(rf"^[a-z0-9-]+\.(elb\.{_REGION}\.amazonaws\.com|{_REGION}\.elb\.amazonaws\.com)(\.cn)?$")

Resolver = Callable[..., list[tuple[Any, ...]]]
_WELL_KNOWN_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries: mapped (::ffff:a.b.c.d), translated (::ffff:0:a.b.c.d), compatible
    (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4 (2002:AABB:CCDD::) or Teredo. (The local-use NAT64 prefix
    64:ff9b:1::/48 is blocked whole: where it embeds an address depends on the prefix length its operator chose,
    RFC 6052, so no reading of it can be trusted.)"""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    packed = ip.packed
    if ip in _TRANSLATED or ip in _WELL_KNOWN_NAT64 or (packed[:12] == bytes(12) and
                                                      ip not in ipaddress.ip_network("::/127")):
        return ipaddress.IPv4Address(packed[12:])
    return None


def check_ip(ip: IPAddress) -> IPAddress:
    """``ip`` if a test call may reach it; :class:`Forbidden` for unspecified, loopback, link-local (the metadata
    service), multicast and reserved addresses, directly or embedded in an IPv6 form."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            raise Forbidden(f"refusing {ip}: a scoped IPv6 address is link-local")
        inner = _embedded_v4(ip)
        if inner is not None:
            check_ip(inner)
    for net in _BLOCKED:
        if ip.version == net.version and ip in net:
            raise Forbidden(f"refusing {ip}: test calls never go to {net} (loopback, link-local, metadata, "
                            "unspecified or multicast addresses)", details={"address": str(ip)})
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_loopback or \
            (isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address("255.255.255.255")):
        raise Forbidden(f"refusing {ip}: not a unicast address a test call may reach", details={"address": str(ip)})
    return ip


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any form a client would accept (bracketed IPv6 with or without a zone,
    dotted / decimal / octal / hex / short IPv4), or None when it is a name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            raise Forbidden(f"refusing host {host!r}: not a valid IPv6 address") from None
    if _NUMERIC_V4.match(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text.rstrip(".")))
        except OSError:
            if text.replace(".", "").isdigit():
                raise Forbidden(f"refusing host {host!r}: a malformed numeric address") from None
    return None


def check_host(host: str, port: int, resolve: Resolver = socket.getaddrinfo) -> str:
    """The one address a test call to ``host`` connects to: a literal checked as is, or a name resolved once with
    every answer checked (one bad answer refuses the name). Connect to the returned address, sending ``host``
    as the Host header: never look the name up again."""
    if not host or len(host) > 253:
        raise Forbidden(f"refusing host {host!r}")
    literal = literal_address(host)
    if literal is not None:
        return str(check_ip(literal))
    if not _DNS_NAME.match(host):
        raise Forbidden(f"refusing host {host!r}: not a DNS name")
    try:
        answers = resolve(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Forbidden(f"refusing host {host!r}: it does not resolve ({exc})") from None
    addresses = [ipaddress.ip_address(str(a[4][0]).split("%", 1)[0]) for a in answers]
    if not addresses:
        raise Forbidden(f"refusing host {host!r}: it resolves to no address")
    for address in addresses:
        check_ip(address)
    return str(addresses[0])


def check_load_balancer_name(host: str) -> str:
    """``host`` when it is a name AWS gives an Elastic Load Balancer (NLBs ``<name>-<id>.elb.<region>.amazonaws.com``,
    ALBs and classic ones ``<name>-<id>.<region>.elb.amazonaws.com``, ``.com.cn`` in China): the Service's status
    is writable by anyone who may update Services, so a test call never follows another name or an address
    written there."""
    name = host.strip().rstrip(".").lower()
    if not (_DNS_NAME.match(name) and _ELB_NAME.match(name)):
        raise Forbidden(f"refusing load balancer {host!r}: not an Elastic Load Balancing name "
                        "(…elb.<region>.amazonaws.com): test it with via 'service_proxy'")
    return name


def check_path(path: str) -> str:
    """``path`` (relative to the engine's root) if it is one a test may reach; refused when it has dot segments,
    encoded separators or dots (``%2e``, ``%2f``, ``%5c``, double-encoded ``%25…``), backslashes, a query or a
    fragment, or names no test endpoint."""
    decoded = path
    for _ in range(3):  # %252e -> %2e -> .
        decoded = unquote(decoded)
    if "%" in path or "\\" in decoded or "?" in decoded or "#" in decoded or "\x00" in decoded:
        raise Forbidden(f"refusing path {path!r}: encoded characters, backslashes, queries and fragments are "
                        "not allowed")
    segments = decoded.strip("/").split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise Forbidden(f"refusing path {path!r}: empty or dot segments are not allowed")
    clean = "/".join(segments)
    if clean not in ALLOWED_PATHS:
        raise Forbidden(f"refusing path {path!r}: a test call reaches only {', '.join(sorted(ALLOWED_PATHS))}")
    return clean


def service_proxy_path(namespace: str, service: str, port: int, path: str) -> str:
    """The Kubernetes API path that proxies to ``path`` on ``service``'s ``port`` (all parts checked)."""
    for part in (namespace, service):
        if not _NAME.match(part):
            raise Forbidden(f"refusing {part!r}: not a Kubernetes name")
    if not 1 <= port <= 65535:
        raise Forbidden(f"refusing port {port}")
    return f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/{check_path(path)}"
