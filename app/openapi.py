"""The OpenAPI 3.1 document, generated from the route table and its pydantic models.

It describes exactly what the server does: every status a route can answer (no catch-all ``default``),
the error codes the envelope can carry, which bodies are optional, which routes need no token, and the
integer bounds the server enforces. ``x-mcp-tool`` and ``x-required-role`` feed the MCP bridge.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.api.base import Route
from app.routes import ROUTES, ErrorEnvelope
from services import __version__
from services.models import RequestModel

SQLITE_MAX = 2**63 - 1  # what an SQLite INTEGER holds; integer query fields are bounded to it
SQLITE_MIN = -(2**63)
PUBLIC_PATHS = ("/healthz", "/readyz")  # answered without a token

ERRORS: dict[int, str] = {
    401: "no credentials, or a token that is unknown or revoked",
    403: "the role does not allow this, or a dashboard session's XSRF token or Origin is wrong",
    404: "no such resource",
    409: "the target's state forbids it now (e.g. an active operation on it)",
    413: "the request body is over the limit (setting api_max_body_bytes); it was not read",
    422: "invalid query, body or Content-Type; details.fields lists each problem",
    429: "too many at once: this token's event WebSockets or long-polls, or failed sign-ins waiting for its id",
    431: "request headers over 256 KiB",
    500: "internal (an unclassified bug: please report) or permanent (a classified failure)",
    503: "transient: retry later; readyz: not ready",
}


def _models(routes: list[Route]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = [ErrorEnvelope]
    for r in routes:
        for model in (r.query, r.body, r.response, *(m for _, m in r.also)):
            if model is not None and model not in seen:
                seen.append(model)
    return seen


def _bound_ints(schema: dict[str, Any]) -> dict[str, Any]:
    """Integer schemas get the SQLite bounds the server enforces, unless they declare tighter ones."""
    if schema.get("type") == "integer":
        schema = dict(schema)
        schema.setdefault("maximum", SQLITE_MAX)
        schema.setdefault("minimum", SQLITE_MIN)
    if "anyOf" in schema:
        schema = {**schema, "anyOf": [_bound_ints(s) for s in schema["anyOf"]]}
    return schema


def error_statuses(r: Route) -> list[int]:
    """The error statuses a route can answer, from what it takes and what it guards."""
    statuses = {413, 422, 431, 500}
    if r.path in PUBLIC_PATHS:
        return sorted(statuses | ({503} if r.path == "/readyz" else set()))
    statuses |= {401, 403, 429, 503}
    if r.path_params:
        statuses.add(404)
    if not r.read_only:
        statuses |= {404, 409}
    return sorted(statuses)


def _body_required(model: type[BaseModel]) -> bool:
    fields = getattr(model, "model_fields", {})
    return any(f.is_required() for f in fields.values())


def openapi_document(routes: list[Route] = ROUTES) -> dict[str, Any]:
    """OpenAPI 3.1, generated from the routes and pydantic models; ``x-mcp-tool`` feeds the bridge."""
    from app.rest import SESSION_COOKIE
    models = _models(routes)
    keys = [(m, "validation" if issubclass(m, RequestModel) else "serialization") for m in models]
    refs, defs = models_json_schema(keys, ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
    schemas = defs.get("$defs", {})

    def ref(model: type[BaseModel], request: bool) -> dict[str, Any]:
        return dict(refs[(model, "validation" if request else "serialization")])

    error = {"content": {"application/json": {"schema": ref(ErrorEnvelope, False)}}}
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        params: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "description": desc, "schema": {"type": "string"}}
            for name, desc in r.path_params.items()
        ]
        if r.query is not None:
            qschema = r.query.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, prop in qschema.get("properties", {}).items():
                prop = _bound_ints(dict(prop))
                desc = prop.pop("description", "")
                desc = (desc.rstrip(".") + ". " if desc else "") + "An empty value means not given."
                params.append({"name": name, "in": "query", "required": name in qschema.get("required", []),
                               "description": desc, "schema": prop})
        ok: dict[str, Any] = {"description": "OK" if r.status < 300 else "accepted"}
        if r.status == 202:
            ok["headers"] = {"Location": {"description": "the operation's status URL", "required": True,
                                          "schema": {"type": "string"}}}
        responses: dict[str, Any] = {str(r.status): ok}
        for status in error_statuses(r):
            responses[str(status)] = {"description": ERRORS[status], **error}
        if r.path == "/readyz" and r.response is not None:  # not ready: the same body, with status unavailable
            responses["503"] = {"description": "not ready: see checks",
                                "content": {"application/json": {"schema": ref(r.response, False)}}}
        op: dict[str, Any] = {
            "operationId": r.name,
            "summary": r.summary,
            "description": r.description or r.summary,
            "tags": [r.tag],
            "parameters": params,
            "x-required-role": r.role.value,
            "responses": responses,
        }
        if r.media_type != "application/json":
            ok["content"] = {r.media_type.split(";")[0]: {"schema": {"type": "string"}}}
        elif r.response is not None:
            schema = ref(r.response, False)
            if r.many:
                schema = {"type": "array", "items": schema}
            ok["content"] = {"application/json": {"schema": schema}}
        for status, model in r.also:
            responses[str(status)] = {"description": "OK" if status < 300 else "accepted",
                                      "content": {"application/json": {"schema": ref(model, False)}}}
        if r.body is not None:
            op["requestBody"] = {"required": _body_required(r.body),
                                 "content": {"application/json": {"schema": ref(r.body, True)}}}
        op["security"] = [] if r.path in PUBLIC_PATHS else [{"bearer": []}, {"session": []}]
        if r.mcp:
            op["x-mcp-tool"] = {"name": r.name, "title": r.summary, "readOnlyHint": r.read_only,
                                "destructiveHint": r.destructive, "idempotentHint": r.idempotent,
                                "openWorldHint": r.open_world}
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "InstantStart", "version": __version__,
                 "description": "Control plane for SageMaker HyperPod on EKS. Mutations answer 202 with an "
                                "operation; follow it at its status_url (long-poll with ?wait=N). Errors are "
                                "{\"error\": {\"code\", \"message\", \"details\"}}; /healthz and /readyz need "
                                "no token."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an API token (ist_...)"},
                "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE},
            },
        },
    }
