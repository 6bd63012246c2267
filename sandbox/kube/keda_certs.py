"""The KEDA operator's certificate rotation (``--enable-cert-rotation=true``), as a simulated program of the
``ghcr.io/kedacore/keda`` container.

KEDA's operator makes a self-signed CA and one serving certificate for its services (the operator's gRPC service,
the metrics API server, the admission webhooks), keeps them in the Secret ``kedaorg-certs`` of its own namespace
(``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``; every KEDA component mounts it at ``/certs``) and writes the CA
into the ``caBundle`` of its APIService ``v1beta1.external.metrics.k8s.io``, so kube-aggregator can verify the
metrics API server (keda.sh/docs/2.17/operate/security; :mod:`.aggregator` checks it). It does that with its
ServiceAccount's rights: where RBAC does not grant the rotator's (``list``/``watch``/``create`` Secrets and
``get``/``update`` its own in its namespace, ``list``/``watch`` APIServices and ``get``/``update`` its own,
``list``/``watch`` ValidatingWebhookConfigurations: KEDA registers its ``keda-admission`` webhook with the rotator
as well as the APIService (kedacore/keda ``pkg/certificates/certificate_manager.go``), and the rotator's informer
for that kind never syncs without them, whether or not the webhook is installed), it logs ``unable to set up cert
rotation`` with the API's refusal and exits 1, as the operator does; without the leader-election Lease rights
(``get``/``create``/``update`` in its namespace) it logs the refusal and waits, doing nothing. Without the flag it
only runs (the certificates are then the user's). The rotation is level-based: a missing Secret or key is made
again, a drifted ``caBundle`` is written again (both with updates, as cert-controller writes: no patch right
needed), each check ``RESYNC`` seconds of the cluster's clock apart. Not simulated: expiry and renewal, the
admission webhooks' ``caBundle``, the scaling itself (:mod:`.keda`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .processes import Process, program
from .store import Obj

RBAC = "rbac.authorization.k8s.io"
SECRET_KEY = ("", "secrets")
API_SERVICE_KEY = ("apiregistration.k8s.io", "apiservices")
SECRET = "kedaorg-certs"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
SERVICES = ("keda-operator", "keda-operator-metrics-apiserver", "keda-admission-webhooks")
CA_NAME, CA_ORGANIZATION = "KEDA", "KEDAORG"  # KEDA's defaults (--ca-name, --ca-organization)
VALID_DAYS = 3650
RESYNC = 10.0  # seconds of the cluster's clock between two checks
MANAGER = WriteOptions(manager="keda-operator")


def _operator(pod: Obj, container: dict[str, Any]) -> bool:
    return str(container.get("image", "")).rsplit(":", 1)[0].endswith("/kedacore/keda")


def _flag(argv: list[str], name: str) -> bool:
    """A boolean flag of the operator (``--x``, ``--x=true``; the last one wins; off by default)."""
    values = [a.partition("=")[2] or "true" for a in argv if a.partition("=")[0] == name]
    return bool(values) and values[-1].lower() == "true"


def dns_names(namespace: str, services: tuple[str, ...] = SERVICES) -> list[str]:
    return [name for svc in services for name in
            (svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local")]


def make_certs(names: list[str], ca_common_name: str = CA_NAME,
               organization: str = CA_ORGANIZATION) -> dict[str, bytes]:
    """A self-signed CA and a serving certificate it signs for ``names`` (PEM): ``ca.crt``, ``ca.key``,
    ``tls.crt``, ``tls.key``."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                            x509.NameAttribute(NameOID.COMMON_NAME, ca_common_name)])
    ca = (x509.CertificateBuilder().subject_name(ca_subject).issuer_name(ca_subject)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                                     x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .sign(ca_key, hashes.SHA256()))

    def private(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    return {"ca.crt": ca.public_bytes(serialization.Encoding.PEM), "ca.key": private(ca_key),
            "tls.crt": cert.public_bytes(serialization.Encoding.PEM), "tls.key": private(key)}


def granted(cluster: Cluster, account: tuple[str, str], namespace: str, group: str, resource: str, verb: str,
            name: str = "") -> bool:
    """Whether the ServiceAccount ``account`` (namespace, name) may ``verb`` ``group``/``resource`` (the object
    ``name``, where one is named) in ``namespace`` ("" for a cluster-scoped resource): through RoleBindings there or
    ClusterRoleBindings. A rule with ``resourceNames`` grants only on those names, and never ``create``, ``list``
    or ``watch``."""
    store = cluster.store
    bindings = [b for _, b in store.items((RBAC, "clusterrolebindings"))]
    if namespace:
        bindings += [b for _, b in store.items((RBAC, "rolebindings"), namespace)]
    for binding in bindings:
        bound_in = binding["metadata"].get("namespace", "")
        if not any(s.get("kind") == "ServiceAccount" and (s.get("namespace") or bound_in, s.get("name")) == account
                   for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = store.get((RBAC, "roles"), (bound_in, str(ref.get("name")))) if ref.get("kind") == "Role" \
            else store.get((RBAC, "clusterroles"), ("", str(ref.get("name"))))
        for rule in (role or {}).get("rules") or []:
            names = rule.get("resourceNames") or []
            if {group, "*"} & set(rule.get("apiGroups") or []) and {resource, "*"} & set(rule.get("resources") or []) \
                    and {verb, "*"} & set(rule.get("verbs") or []) \
                    and (not names or (name in names and verb not in ("create", "list", "watch"))):
                return True
    return False


def _forbidden(proc: Process, verb: str, resource: str, group: str, namespace: str, name: str) -> str:
    what = f"{resource}.{group}" if group else resource
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    return (f'{what}{f" {json.dumps(name)}" if name else ""} is forbidden: User "system:serviceaccount:'
            f'{proc.namespace}:{(proc.pod_obj.get("spec") or {}).get("serviceAccountName") or "default"}" cannot '
            f'{verb} resource "{resource}" in API group "{group}"{where}')


def _missing(proc: Process, needs: tuple[tuple[str, str, str, str], ...]) -> str:
    """The API's refusal of the first (group, resource, verb, name) in ``needs`` RBAC does not grant ("": none)."""
    account = (proc.namespace, str((proc.pod_obj.get("spec") or {}).get("serviceAccountName") or "default"))
    for group, resource, verb, name in needs:
        namespace = "" if resource in CLUSTER_SCOPED else proc.namespace
        if not granted(proc.cluster, account, namespace, group, resource, verb, name):
            return _forbidden(proc, verb, resource, group, namespace, name)
    return ""


CLUSTER_SCOPED = ("apiservices", "validatingwebhookconfigurations")
LEADER_ELECTION = tuple(("coordination.k8s.io", "leases", v, "operator.keda.sh") for v in ("get", "create", "update"))
# the rotator's informers list and watch Secrets, APIServices and ValidatingWebhookConfigurations (the kinds of its
# webhooks); it reads and writes its own Secret and reads and updates the APIService
CERT_ROTATION = (*(("", "secrets", v, "") for v in ("list", "watch", "create")),
                 *(("", "secrets", v, SECRET) for v in ("get", "update")),
                 *(("apiregistration.k8s.io", "apiservices", v, API_SERVICE) for v in ("get", "update")),
                 *(("apiregistration.k8s.io", "apiservices", v, "") for v in ("list", "watch")),
                 *(("admissionregistration.k8s.io", "validatingwebhookconfigurations", v, "")
                   for v in ("list", "watch")))


def _allowed(proc: Process, group: str, resource: str, verb: str, name: str) -> None:
    """Refuse a write RBAC does not grant the operator, as the API server would (the rotator's writes are updates)."""
    why = _missing(proc, ((group, resource, verb, name),))
    if why:
        raise ApiError(403, "Forbidden", why)


def rotate(proc: Process) -> None:
    """One level-based pass: the Secret holds a CA and a serving certificate, the APIService trusts that CA."""
    cluster, namespace = proc.cluster, proc.namespace
    secret = cluster.store.get(SECRET_KEY, (namespace, SECRET))
    data = (secret or {}).get("data") or {}
    if not all(data.get(k) for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")):
        made = {k: base64.b64encode(v).decode() for k, v in make_certs(dns_names(namespace)).items()}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": namespace},
                "type": "kubernetes.io/tls", "data": made}
        rt = cluster.lookup("", "v1", "secrets")
        if secret is None:
            _allowed(proc, "", "secrets", "create", "")
            cluster.create(rt, namespace, body, MANAGER)
        else:
            _allowed(proc, "", "secrets", "update", SECRET)
            cluster.replace(rt, namespace, SECRET, {**secret, "data": made}, MANAGER)
        data = made
        proc.log(f'INFO\tcert-rotation\tcertificates written to secret "{namespace}/{SECRET}"')
    api = cluster.store.get(API_SERVICE_KEY, ("", API_SERVICE))
    if api is not None and (api.get("spec") or {}).get("caBundle") != data["ca.crt"]:
        _allowed(proc, "apiregistration.k8s.io", "apiservices", "update", API_SERVICE)
        cluster.replace(cluster.lookup("apiregistration.k8s.io", "v1", "apiservices"), None, API_SERVICE,
                        {**api, "spec": {**(api.get("spec") or {}), "caBundle": data["ca.crt"]}}, MANAGER)
        proc.log(f'INFO\tcert-rotation\tCA injected into the caBundle of APIService "{API_SERVICE}"')


@program(_operator)
def operate(proc: Process) -> int:
    proc.log("INFO\tsetup\tStarting manager (KEDA operator simulated by the InstantStart sandbox on pod "
             f"{proc.pod})")
    rotation = _flag(proc.argv, "--enable-cert-rotation")
    why = _missing(proc, CERT_ROTATION) if rotation else ""
    if why:
        proc.log(f"ERROR\tsetup\tunable to set up cert rotation\t{json.dumps({'error': why})}")
        return 1
    held = _missing(proc, LEADER_ELECTION) if _flag(proc.argv, "--leader-elect") else ""
    if held or not rotation:  # without the lease nothing runs, as without leader election rights
        if held:
            proc.log(f"E leaderelection.go] error retrieving resource lock {proc.namespace}/operator.keda.sh: {held}")
        proc.sleep(float("inf"))
        return 0
    while True:
        try:
            rotate(proc)
        except ApiError as exc:  # a concurrent write or a right revoked: the next check writes again
            proc.log(f"ERROR\tcert-rotation\t{exc.message}")
        proc.sleep(RESYNC)
