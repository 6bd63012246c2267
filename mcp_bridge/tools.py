"""Turn the server's OpenAPI document into MCP tool specs, and tool calls back into HTTP requests.

The document is generated from the REST route table, and routes carry ``x-mcp-tool`` (name and honest
hints) and ``x-required-role``. So a tool is a live route by construction: the bridge cannot offer
something the server does not serve, and it offers only what the token's role may call.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

ROLE_RANK = {"viewer": 0, "operator": 1, "admin": 2}
_REF = re.compile(r"#/components/schemas/")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    method: str
    path: str
    role: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool
    idempotent: bool
    path_params: tuple[str, ...] = ()
    query_params: tuple[str, ...] = ()
    body_params: tuple[str, ...] = ()
    output_schema: dict[str, Any] | None = field(default=None)


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_REF.sub("#/$defs/", v) if k == "$ref" and isinstance(v, str) else _rewrite_refs(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        return dict(components[ref.rsplit("/", 1)[1]])
    return schema


def tool_specs(document: dict[str, Any], role: str) -> list[ToolSpec]:
    """Every route marked as a tool that ``role`` may call, with one merged JSON input schema."""
    components: dict[str, Any] = document.get("components", {}).get("schemas", {})
    rank = ROLE_RANK[role]
    specs: list[ToolSpec] = []
    for path, methods in document.get("paths", {}).items():
        for method, op in methods.items():
            meta = op.get("x-mcp-tool")
            if not meta or ROLE_RANK[op.get("x-required-role", "admin")] > rank:
                continue
            properties: dict[str, Any] = {}
            required: list[str] = []
            path_params: list[str] = []
            query_params: list[str] = []
            body_params: list[str] = []
            for param in op.get("parameters", []):
                schema = dict(param.get("schema", {}))
                if param.get("description"):
                    schema["description"] = param["description"]
                properties[param["name"]] = schema
                if param.get("required"):
                    required.append(param["name"])
                (path_params if param["in"] == "path" else query_params).append(param["name"])
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None:
                resolved = _resolve(body, components)
                for name, prop in resolved.get("properties", {}).items():
                    if name in properties:
                        raise ValueError(f"{meta['name']}: body field {name!r} clashes with a parameter")
                    properties[name] = prop
                    body_params.append(name)
                required += resolved.get("required", [])
            input_schema: dict[str, Any] = {"type": "object", "properties": properties,
                                            "additionalProperties": False}
            if required:
                input_schema["required"] = required
            input_schema = _rewrite_refs(input_schema)
            if "$defs" not in input_schema and "#/$defs/" in str(input_schema):
                input_schema["$defs"] = _rewrite_refs(copy.deepcopy(components))
            description = op.get("description") or op.get("summary", "")
            if not meta.get("readOnlyHint", True):
                description += (" Mutating: the result names the operation id; follow it with "
                                "operations_get (use its wait argument to long-poll).")
            specs.append(ToolSpec(
                name=meta["name"], title=meta.get("title", meta["name"]), description=description,
                method=method.upper(), path=path, role=op.get("x-required-role", "admin"),
                input_schema=input_schema, read_only=bool(meta.get("readOnlyHint")),
                destructive=bool(meta.get("destructiveHint")), idempotent=bool(meta.get("idempotentHint")),
                path_params=tuple(path_params), query_params=tuple(query_params),
                body_params=tuple(body_params),
            ))
    return sorted(specs, key=lambda s: s.name)


@dataclass(frozen=True)
class HttpCall:
    method: str
    path: str
    params: dict[str, Any]
    json: dict[str, Any] | None


def to_http(spec: ToolSpec, arguments: dict[str, Any]) -> HttpCall:
    """Split tool arguments into path, query and body; the REST server judges the body's fields."""
    path = spec.path
    for name in spec.path_params:
        if name not in arguments:
            raise ValueError(f"missing required argument {name!r}")
        text = str(arguments[name])
        if text in ("", ".", "..") or any(c in text for c in "/?#%\\") or not text.isprintable():
            raise ValueError(f"argument {name!r} must be a plain identifier, got {text!r}")
        path = path.replace("{" + name + "}", quote(text, safe=""))
    params: dict[str, Any] = {}
    for name in spec.query_params:
        value = arguments.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            params[name] = "true" if value else "false"
        elif isinstance(value, list):
            params[name] = ",".join(str(v) for v in value)
        else:
            params[name] = value
    known = set(spec.path_params) | set(spec.query_params)
    body = {k: v for k, v in arguments.items() if k not in known}
    if body and not spec.body_params:
        raise ValueError(f"unknown argument(s) {sorted(body)}; {spec.name} takes {sorted(known) or 'none'}")
    return HttpCall(spec.method, path, params, body if (spec.body_params or body) else None)
