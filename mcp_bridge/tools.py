"""Turn the server's OpenAPI document into MCP tool specs, and tool calls back into HTTP requests.

The document is generated from the REST route table, and routes carry ``x-mcp-tool`` (name and honest
hints) and ``x-required-role``. So a tool is a live route by construction: the bridge cannot offer
something the server does not serve, and it offers only what the token's role may call.

Agent clients have hard limits (some send only the first 40 tools, some reject a result over 25,000
tokens, and definitions eat context), so a tool's schema carries only the ``$defs`` it reaches, tools are
grouped in toolsets by noun (a default set, others on request) and every result is capped with a hint
naming the argument that pages or narrows it.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

ROLE_RANK = {"viewer": 0, "operator": 1, "admin": 2}
_REF = re.compile(r"#/components/schemas/")
_REF_NAME = re.compile(r'"\$ref": "#/components/schemas/([^"]+)"')
#: toolsets (route tags) an agent gets unless it asks: the everyday nouns; audit, sandbox and
#: tokens are on request (``--toolsets audit,sandbox`` or ``all``)
#: what a bridge offers without --toolsets: the everyday reads and the cluster noun (an agent's context budget,
#: tests/test_mcp_tools.py); each capability's playbook names the toolsets it needs (skills/*.md ``toolsets``)
DEFAULT_TOOLSETS = ("system", "operations", "backups", "clusters", "nodes")
#: query arguments that page or narrow a list, named in the hint of a result that was cut
PAGING_ARGS = ("before", "before_id", "after", "limit", "status", "kind", "target", "actor", "action", "cluster",
               "group", "health")
RESULT_CHAR_CAP = 64_000  # about 16,000 tokens at ~4 characters a token


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
    toolset: str = "system"
    answers_operation: bool = False
    open_world: bool = False

    def definition_size(self) -> int:
        """Characters of the definition a client receives (name, title, description, schema, hints)."""
        return len(json.dumps({"name": self.name, "title": self.title, "description": self.description,
                               "inputSchema": self.input_schema,
                               "annotations": {"readOnlyHint": self.read_only, "destructiveHint": self.destructive,
                                               "idempotentHint": self.idempotent,
                                               "openWorldHint": self.open_world}}))


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_REF.sub("#/$defs/", v) if k == "$ref" and isinstance(v, str) else _rewrite_refs(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


def _reachable(node: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The component schemas ``node`` refers to, directly or through each other."""
    found: dict[str, Any] = {}
    todo = _REF_NAME.findall(json.dumps(node))
    while todo:
        name = todo.pop()
        if name in found or name not in components:
            continue
        found[name] = components[name]
        todo += _REF_NAME.findall(json.dumps(components[name]))
    return found


def _answers(op: dict[str, Any], model: str) -> bool:
    for response in op.get("responses", {}).values():
        schema = response.get("content", {}).get("application/json", {}).get("schema", {})
        if schema.get("$ref", "").endswith(f"/{model}"):
            return True
    return False


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
            reached = _reachable(input_schema, components)
            input_schema = _rewrite_refs(input_schema)
            if reached:
                input_schema["$defs"] = _rewrite_refs(copy.deepcopy(reached))
            description = op.get("description") or op.get("summary", "")
            answers_operation = _answers(op, "Accepted")
            if answers_operation:
                description += (" Mutating: the result names the operation id; follow it with "
                                "operations_get (use its wait argument to long-poll).")
            elif not meta.get("readOnlyHint", True):
                description += " Takes effect at once: the result is the new state (no operation to follow)."
            specs.append(ToolSpec(
                name=meta["name"], title=meta.get("title", meta["name"]), description=description,
                method=method.upper(), path=path, role=op.get("x-required-role", "admin"),
                input_schema=input_schema, read_only=bool(meta.get("readOnlyHint")),
                destructive=bool(meta.get("destructiveHint")), idempotent=bool(meta.get("idempotentHint")),
                path_params=tuple(path_params), query_params=tuple(query_params),
                body_params=tuple(body_params), toolset=(op.get("tags") or ["system"])[0],
                answers_operation=answers_operation, open_world=bool(meta.get("openWorldHint", False)),
            ))
    return sorted(specs, key=lambda s: s.name)


def select_toolsets(specs: list[ToolSpec], wanted: str | None) -> list[ToolSpec]:
    """``None``: the default toolsets; ``all``; or names separated by commas (unknown names are refused)."""
    if wanted is None:
        return [s for s in specs if s.toolset in DEFAULT_TOOLSETS]
    names = {n.strip() for n in wanted.split(",") if n.strip()}
    if "all" in names:
        return list(specs)
    known = {s.toolset for s in specs}
    unknown = sorted(names - known - set(DEFAULT_TOOLSETS))
    if unknown:
        raise ValueError(f"unknown toolset(s) {unknown}; this role has {sorted(known)} (or 'all')")
    return [s for s in specs if s.toolset in names]


def cap_text(text: str, cap: int = RESULT_CHAR_CAP) -> str:
    """A text answer (logs, a kubeconfig) as itself, not JSON: past ``cap`` its end is kept (a log's newest
    lines and its closing continuation line), after one line saying how much was cut."""
    if len(text) <= cap:
        return text
    kept = text[len(text) - cap + 200:]
    kept = kept[kept.find("\n") + 1:] if "\n" in kept else kept
    return f"# truncated: the first {len(text) - len(kept)} of {len(text)} characters were cut; ask for less " \
           f"(a smaller tail, or narrower arguments)\n{kept}"


def cap_result(spec: ToolSpec, payload: Any, cap: int = RESULT_CHAR_CAP) -> tuple[str, Any]:
    """The result as text (and structured content) of at most about ``cap`` characters: a list keeps its
    first items and says how to read on; anything else is cut with the same hint."""
    text = json.dumps(payload)
    if len(text) <= cap:
        return text, payload
    hint_args = [a for a in PAGING_ARGS if a in spec.query_params]
    how = (f"narrow or page it with {', '.join(hint_args)}" if hint_args
           else "ask for less (narrower arguments)")
    if isinstance(payload, list):
        low, high = 0, len(payload)
        while low < high:  # the most leading items that fit
            mid = (low + high + 1) // 2
            if len(json.dumps(payload[:mid])) <= cap - 500:
                low = mid
            else:
                high = mid - 1
        page = "before" if "before" in hint_args else ("before_id" if "before_id" in hint_args else None)
        if page:
            how = f"pass {page}=<the last item's id> for the next page, or narrow it with {', '.join(hint_args)}"
        note = {"truncated": True, "returned": low, "total": len(payload), "continue": how}
        structured = {"items": payload[:low], **note}
        return json.dumps(structured), structured
    def cut(length: int) -> dict[str, Any]:
        return {"partial": text[:length], "truncated": True, "characters": len(text), "continue": how}

    low, high = 0, len(text)
    while low < high:  # the longest prefix whose (re-escaped) answer fits
        mid = (low + high + 1) // 2
        if len(json.dumps(cut(mid))) <= cap:
            low = mid
        else:
            high = mid - 1
    partial = cut(low)
    return json.dumps(partial), partial


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
