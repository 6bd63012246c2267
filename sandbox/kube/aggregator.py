"""kube-aggregator's availability check of ``APIService`` objects (``apiregistration.k8s.io/v1``).

An APIService without ``spec.service`` is served by the API server itself: ``Available=True`` (``Local``). One
naming a Service is ``Available`` once that Service exists, has a ready endpoint (a Running, Ready pod its
selector matches) and passes the discovery check, with the aggregator's reasons and messages before:
``ServiceNotFound``, ``MissingEndpoints``, ``FailedDiscoveryCheck``. The discovery check is the aggregator's
``GET https://<clusterIP>:<port>/apis/<group>/<version>`` with TLS verified for ``<service>.<namespace>.svc``
against ``caBundle`` (no ``caBundle``: the system roots, which trust no cluster-made CA), unless
``insecureSkipTLSVerify``. The certificate the server presents is the ``tls.crt`` of a Secret volume its ready
pod mounts (the servers behind APIServices serve their ``/certs``; KEDA's operator writes its own,
:mod:`.keda_certs`); a pod mounting none presents the self-signed certificate a server makes for itself, which
nothing verifies. Requests under a group/version an APIService registers are answered 503 ``service
unavailable`` while it is not Available (:func:`unavailable`); an Available one is not proxied (nothing serves
the group). Consumers ask :func:`available` (the KEDA controller, before reading its external metrics).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from .cluster import Cluster
from .operator_support import write_status
from .proxy import ready_endpoint
from .resources import POD_KEY
from .selectors import labels_match, parse_label_selector
from .store import Key, Loc, Obj, WatchEvent

KEY: Key = ("apiregistration.k8s.io", "apiservices")
DEPLOY_KEY: Key = ("apps", "deployments")
SECRET_KEY: Key = ("", "secrets")
UNKNOWN_AUTHORITY = "x509: certificate signed by unknown authority"
MANAGER = "kube-apiserver"


def _check(cluster: Cluster, api: Obj) -> tuple[str, str, str]:
    """(status, reason, message) of the Available condition as kube-aggregator computes it."""
    service = (api.get("spec") or {}).get("service")
    if not service:
        return "True", "Local", "Local APIServices are always available"
    namespace, name = str(service.get("namespace", "")), str(service.get("name", ""))
    svc = cluster.store.get(("", "services"), (namespace, name))
    if svc is None:
        return "False", "ServiceNotFound", f'service/{name} in "{namespace}" is not present'
    selector = (svc.get("spec") or {}).get("selector") or {}
    parsed = parse_label_selector(",".join(f"{k}={v}" for k, v in sorted(selector.items())))
    ready = [pod for _, pod in cluster.store.items(POD_KEY, namespace)
             if selector and labels_match(parsed, pod["metadata"].get("labels") or {}) and ready_endpoint(pod)]
    port = int(service.get("port") or 443)
    if not ready:
        named = next((str(p.get("name") or "") for p in (svc.get("spec") or {}).get("ports") or []
                      if int(p.get("port") or 0) == port), "")
        return "False", "MissingEndpoints", f'endpoints for service/{name} in "{namespace}" have no addresses ' \
                                            f'with port name "{named}"'
    spec = api.get("spec") or {}
    if not spec.get("insecureSkipTLSVerify"):
        failure = _tls_failure(cluster, spec, f"{name}.{namespace}.svc", ready[0])
        if failure:
            url = f"https://{(svc.get('spec') or {}).get('clusterIP', '')}:{port}/apis/{spec.get('group', '')}/" \
                  f"{spec.get('version', '')}"
            return "False", "FailedDiscoveryCheck", f'failing or missing response from {url}: Get "{url}": {failure}'
    return "True", "Passed", "all checks passed"


def _serving_cert(cluster: Cluster, pod: Obj) -> bytes | None:
    """The ``tls.crt`` of the first Secret volume of ``pod`` that holds one (None: the server's own self-signed
    certificate)."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = (volume.get("secret") or {}).get("secretName")
        secret = cluster.store.get(SECRET_KEY, (pod["metadata"].get("namespace", ""), str(name))) if name else None
        encoded = ((secret or {}).get("data") or {}).get("tls.crt")
        if encoded:
            return base64.b64decode(str(encoded))
    return None


def _tls_failure(cluster: Cluster, spec: dict[str, Any], server_name: str, pod: Obj) -> str:
    """Why the aggregator's TLS client refuses the server's certificate, in Go's words ("" when it verifies)."""
    bundle = spec.get("caBundle") or ""
    try:
        roots = x509.load_pem_x509_certificates(base64.b64decode(str(bundle), validate=True)) if bundle else []
    except (ValueError, binascii.Error):
        return "unable to load root certificates: unable to parse bytes as PEM block"
    presented = _serving_cert(cluster, pod)
    if presented is None:
        return f"tls: failed to verify certificate: {UNKNOWN_AUTHORITY}"
    try:
        leaf = x509.load_pem_x509_certificates(presented)[0]
    except ValueError:
        return "remote error: tls: internal error"  # the server cannot load its own certificate
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    if server_name not in names:  # Go checks the name before it builds the chain
        return f"tls: failed to verify certificate: x509: certificate is valid for {', '.join(names)}, not " \
               f"{server_name}"
    if not any(_issued_by(leaf, root) for root in roots):
        return f"tls: failed to verify certificate: {UNKNOWN_AUTHORITY}"
    return ""


def _issued_by(leaf: x509.Certificate, root: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _available_condition(api: Obj) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in (api.get("status") or {}).get("conditions") or []
                                  if c.get("type") == "Available"), {})
    return found


def reconcile(cluster: Cluster, loc: Loc) -> None:
    api = cluster.store.get(KEY, loc)
    if api is None or api["metadata"].get("deletionTimestamp"):
        return
    status, reason, message = _check(cluster, api)
    old = _available_condition(api)
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    available: dict[str, Any] = {"type": "Available", "status": status, "reason": reason, "message": message,
                                 "lastTransitionTime": since or cluster.now_iso()}
    write_status(cluster, KEY, api, {"conditions": [available]}, MANAGER)


def woken_by(cluster: Cluster, event: WatchEvent) -> set[tuple[Key, Loc]]:
    """The APIServices to check again when a Deployment of their Service's namespace changes (its pods came up
    or went away) or a Secret there does (the certificate its server presents)."""
    if event.key not in (DEPLOY_KEY, SECRET_KEY):
        return set()
    namespace = event.obj["metadata"].get("namespace", "")
    return {(KEY, loc) for loc, api in cluster.store.items(KEY)
            if ((api.get("spec") or {}).get("service") or {}).get("namespace") == namespace}


def available(cluster: Cluster, name: str) -> tuple[bool, str]:
    """Whether the APIService ``name`` exists and is Available, and why not."""
    api = cluster.store.get(KEY, ("", name))
    if api is None:
        return False, "the server could not find the requested resource"
    if _available_condition(api).get("status") != "True":
        return False, "the server is currently unable to handle the request"
    return True, ""


def unavailable(cluster: Cluster, group: str, version: str) -> bool:
    """Whether ``/apis/<group>/<version>`` belongs to an APIService with a Service that is not Available (the
    aggregator answers 503 there)."""
    return any((api.get("spec") or {}).get("service") and _available_condition(api).get("status") != "True"
               for _, api in cluster.store.items(KEY)
               if (api.get("spec") or {}).get("group") == group and (api.get("spec") or {}).get("version") == version)
