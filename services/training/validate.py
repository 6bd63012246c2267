"""Checks a training manifest before it is sent: against its CRD's openAPIV3Schema (the copies the product
ships: the reconstructed partial HyperPodPyTorchJob schema in ``crds/``, the Kubeflow and KubeRay CRDs the
components apply), then with a server-side dry run through the cluster's API client, which runs the API server's
own validation and admission without persisting anything. Both report a 422 naming each failing field."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import jsonschema
import yaml
from kubernetes import client as k8s

from services.errors import Invalid, NotFound
from services.training.manifests import KINDS, RenderedJob

#: kind -> its schema file inside the ``services`` package (read as data: importing services.components is not
#: needed, and would pull in the whole components layer)
SCHEMAS: dict[str, str] = {
    "HyperPodPyTorchJob": "training/crds/hyperpodpytorchjob.partial-schema.RECONSTRUCTED.yaml",
    "PyTorchJob": "components/crds/kubeflow.org_pytorchjobs.yaml",
    "RayJob": "components/crds/ray.io_rayjobs.yaml",
}
MAX_ERRORS = 20


@functools.cache
def crd_schema(path: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of the file ``path`` inside the ``services`` package: a CRD's served ``version``, or a
    bare schema file. Shared with the managed inference endpoints (``services/inference/managed_render.py``)."""
    text = resources.files("services").joinpath(path).read_text()
    loaded: dict[str, Any] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if loaded.get("kind") != "CustomResourceDefinition":
        return loaded
    for served in loaded["spec"]["versions"]:
        if served["name"] == version:
            found: dict[str, Any] = served["schema"]["openAPIV3Schema"]
            return found
    raise Invalid(f"the shipped CRD {path} serves no version {version}")


def schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema ``kind`` is validated against (a CRD's served version, or a bare schema file)."""
    if kind not in SCHEMAS:
        raise Invalid(f"kind: {kind!r} is not a training kind; kinds: {', '.join(SCHEMAS)}")
    return crd_schema(SCHEMAS[kind], KINDS[kind].version)


def errors_against(found: dict[str, Any], manifest: dict[str, Any]) -> list[dict[str, str]]:
    """Each place ``manifest`` breaks the schema ``found``, as ``{"field", "message"}`` (empty: it conforms)."""
    validator = jsonschema.Draft7Validator(found)
    errors = sorted(validator.iter_errors(manifest), key=lambda e: [str(p) for p in e.absolute_path])
    return [{"field": ".".join(str(p) for p in e.absolute_path) or "(root)", "message": e.message}
            for e in errors[:MAX_ERRORS]]


def schema_errors(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """Each place ``manifest`` breaks its kind's schema, as ``{"field", "message"}`` (empty: it conforms)."""
    return errors_against(schema(str(manifest.get("kind"))), manifest)


def check_schema(manifest: dict[str, Any]) -> None:
    """Raise :class:`Invalid` (422) listing where ``manifest`` breaks its CRD's schema."""
    refuse_errors(manifest, schema_errors(manifest))


def refuse_errors(manifest: dict[str, Any], errors: list[dict[str, str]]) -> None:
    """Raise :class:`Invalid` (422) listing ``errors``, where ``manifest`` breaks its CRD's schema, if any."""
    if errors:
        listed = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        raise Invalid(f"the {manifest.get('kind')} manifest does not match its CRD schema: {listed}",
                      details={"fields": errors})


def dry_run(api_client: k8s.ApiClient, rendered: RenderedJob, namespace: str) -> dict[str, Any]:
    """Create the job's companions and custom resource with ``dryRun=All`` in ``namespace`` (nothing is stored):
    the API server's answer for the resource, or the taxonomy's error (422 with the API's causes; 404 when the
    kind's CRD is not installed)."""
    core = k8s.CoreV1Api(api_client)
    for obj in rendered.companions:
        body = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
        if obj.get("kind") == "ConfigMap":
            core.create_namespaced_config_map(namespace, body, dry_run="All")  # type: ignore[arg-type]
    kind = KINDS[rendered.kind]
    body = {**rendered.manifest, "metadata": {**rendered.manifest["metadata"], "namespace": namespace}}
    try:
        answer = k8s.CustomObjectsApi(api_client).create_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, body, dry_run="All")
    except NotFound as exc:
        raise NotFound(f"the cluster does not serve {kind.plural}.{kind.group}/{kind.version} (is its operator "
                       f"installed?): {exc.message}", details=exc.details) from exc
    return answer if isinstance(answer, dict) else {}
