"""Check EKS bearer tokens the way the EKS authenticator does, for the sandbox's Kubernetes endpoints.

A token is ``k8s-aws-v1.`` + base64url(a presigned STS ``GetCallerIdentity`` URL) whose signature covers
an ``x-k8s-aws-id: <cluster>`` header. EKS forwards the URL to STS with that header; the sandbox knows the
signing secret of its own fake credentials, so it recomputes the SigV4 query signature instead: a token
made for one cluster is refused by another, and tokens older than 15 minutes are refused.

Like EKS's authenticator, tokens presigned for AWS's own STS hostnames (``sts.amazonaws.com`` and
``sts.<region>.amazonaws.com`` of the signing region) are accepted: that is what ``aws eks get-token``
makes from a kubeconfig written by ``aws eks update-kubeconfig``, whose exec command carries no endpoint
URL. Nothing is sent to STS; only the signature, made with the sandbox's secret, decides.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import time
from collections.abc import Callable, Collection, Mapping
from urllib.parse import parse_qsl, quote, urlsplit

PREFIX = "k8s-aws-v1."
MAX_AGE = 15 * 60


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _quote(value: str) -> str:
    return quote(value, safe="-_.~")


def verify_eks_token(token: str, cluster: str, secrets: Mapping[str, str], *, hosts: Collection[str],
                     now: Callable[[], float] = time.time) -> bool:
    """True when ``token`` is a fresh presigned GetCallerIdentity for ``cluster`` signed by a known key.

    ``secrets`` maps access key ids to secret keys (the sandbox's credentials); ``hosts`` are the STS
    endpoints (``host[:port]``) a token may be presigned for besides AWS's own.
    """
    return eks_token_access_key(token, cluster, secrets, hosts=hosts, now=now) is not None


def eks_token_access_key(token: str, cluster: str, secrets: Mapping[str, str], *, hosts: Collection[str],
                         now: Callable[[], float] = time.time) -> str | None:
    """The access key id that signed ``token`` when it is valid for ``cluster`` (see :func:`verify_eks_token`),
    else ``None``."""
    if not token.startswith(PREFIX):
        return None
    try:
        raw = token[len(PREFIX):]
        url = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    if params.get("Action") != "GetCallerIdentity" or params.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
        return None
    signed = params.get("X-Amz-SignedHeaders", "").split(";")
    if "x-k8s-aws-id" not in signed or "host" not in signed:
        return None
    try:
        access_key, date, region, service, terminal = params["X-Amz-Credential"].split("/")
        stamp = calendar.timegm(time.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    except (KeyError, ValueError):
        return None
    if service != "sts" or terminal != "aws4_request" or not 0 <= now() - stamp <= MAX_AGE:
        return None
    if parts.netloc not in hosts and parts.netloc not in {"sts.amazonaws.com", f"sts.{region}.amazonaws.com"}:
        return None
    secret = secrets.get(access_key)
    if secret is None:
        return None
    headers = {"host": parts.netloc, "x-k8s-aws-id": cluster}
    query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(params.items()) if k != "X-Amz-Signature")
    key = _sign(_sign(_sign(_sign(("AWS4" + secret).encode(), date), region), service), terminal)
    scope = f"{date}/{region}/{service}/{terminal}"
    given = params.get("X-Amz-Signature", "")
    # botocore signs the (empty) payload over http and leaves it unsigned over https
    for payload in ("UNSIGNED-PAYLOAD", hashlib.sha256(b"").hexdigest()):
        canonical = "\n".join([
            "GET", parts.path or "/", query,
            "".join(f"{name}:{headers.get(name, '')}\n" for name in signed), ";".join(signed), payload,
        ])
        to_sign = "\n".join(["AWS4-HMAC-SHA256", params["X-Amz-Date"], scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        if hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), given):
            return access_key
    return None
