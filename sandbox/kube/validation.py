"""Schema validation of written objects, answering like the API server: all field errors at once.

* Built-in kinds are checked against the Kubernetes OpenAPI schemas bundled by ``kubernetes-validate``
  (the ``-local-strict`` flavour for the served minor version). We build one ``Draft202012Validator``
  per kind and collect ``iter_errors`` ourselves, because the package's ``validate()`` stops at the first
  error.
* Custom resources are checked against their CRD's ``openAPIV3Schema`` after translating the Kubernetes
  extensions JSON Schema does not know: ``nullable``, ``x-kubernetes-int-or-string``,
  ``x-kubernetes-preserve-unknown-fields`` and ``x-kubernetes-embedded-resource``. Defaults from the schema
  are applied on write.

Unknown fields follow the ``fieldValidation`` query parameter: ``Strict`` (what kubectl sends) makes
them errors, ``Warn`` (the server default) and ``Ignore`` prune them, ``Warn`` also returns warnings.
CEL rules (``x-kubernetes-validations``) and ``format`` are not checked.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from referencing import Registry, Resource

from .cel import CelRules
from .errors import FieldError
from .resources import ResourceType

SCHEMA_VERSION = "v1.31.0-local-strict"
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass
class Outcome:
    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # dotted paths of pruned / rejected fields


def field_path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _describe(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | int | float | bool) or value is None else type(value).__name__


def _convert_error(err: jsonschema.ValidationError, outcome: Outcome, obj: Any) -> None:
    path = list(err.absolute_path)
    where = field_path(path)
    if err.validator == "additionalProperties":
        props = set((err.schema.get("properties") or {}) if isinstance(err.schema, dict) else {})
        patterns = list((err.schema.get("patternProperties") or {}) if isinstance(err.schema, dict) else {})
        for extra in sorted(err.instance):
            if extra not in props and not any(re.search(p, extra) for p in patterns):
                outcome.unknown.append(field_path([*path, extra]))
        return
    if err.validator == "required":
        missing = re.match(r"'(.*)' is a required property", err.message)
        name = missing[1] if missing else ""
        outcome.errors.append(FieldError(field_path([*path, name]), "Required value", "FieldValueRequired"))
        return
    label = where or "<root>"
    if err.validator == "type":
        expected = err.validator_value if isinstance(err.validator_value, str) else \
            next(t for t in err.validator_value if t != "null")
        got = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}.get(
            type(err.instance), "null")
        msg = f'Invalid value: "{got}": {label} in body must be of type {expected}: "{got}"'
    elif err.validator == "enum":
        allowed = ", ".join(_describe(v) for v in err.validator_value if v is not None)
        outcome.errors.append(FieldError(where, f"Unsupported value: {_describe(err.instance)}: supported values: "
                                                f"{allowed}", "FieldValueNotSupported"))
        return
    elif err.validator in ("minimum", "maximum"):
        op = "greater" if err.validator == "minimum" else "less"
        msg = f"Invalid value: {_describe(err.instance)}: {label} in body should be {op} than or equal to " \
              f"{err.validator_value}"
    elif err.validator == "pattern":
        msg = f"Invalid value: {_describe(err.instance)}: {label} in body should match '{err.validator_value}'"
    else:
        msg = f"Invalid value: {_describe(err.instance)}: {err.message}"
    outcome.errors.append(FieldError(where, msg))


def prune(obj: Any, dotted: str) -> None:
    """Remove the field at a path produced by :func:`field_path`."""
    parts: list[Any] = []
    for token in re.findall(r"[^.\[\]]+|\[\d+\]", dotted):
        parts.append(int(token[1:-1]) if token.startswith("[") else token)
    cur = obj
    for p in parts[:-1]:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(cur, dict):
        cur.pop(parts[-1], None)


def check_metadata(obj: dict[str, Any], rt: ResourceType) -> list[FieldError]:
    errors: list[FieldError] = []
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    pattern = _DNS1123_LABEL if rt.plural == "namespaces" else _DNS1123_SUBDOMAIN
    if not name:
        errors.append(FieldError("metadata.name", "Required value: name or generateName is required",
                                 "FieldValueRequired"))
    elif rt.crd is None and rt.plural != "nodes" and (len(name) > 253 or not pattern.match(name)):
        errors.append(FieldError("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 '
                                 "subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                                 "and must start and end with an alphanumeric character"))
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is not None and not (isinstance(values, dict) and all(isinstance(v, str) for v in values.values())):
            errors.append(FieldError(f"metadata.{key}", "Invalid value: values must be strings"))
    return errors


class BuiltinValidator:
    """Validators for built-in kinds, compiled lazily and shared by all clusters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / SCHEMA_VERSION
        self._registry: Registry | None = None
        self._validators: dict[str, jsonschema.protocols.Validator | None] = {}

    def _validator(self, rt: ResourceType) -> jsonschema.protocols.Validator | None:
        group_prefix = rt.group.split(".")[0]
        name = f"{rt.kind.lower()}-{group_prefix + '-' if rt.group else ''}{rt.version}.json"
        with self._lock:
            if name in self._validators:
                return self._validators[name]
            if self._registry is None:
                defs = json.loads((self._base / "_definitions.json").read_text())
                self._registry = Resource.from_contents(defs) @ Registry()
            path = self._base / name
            validator = None
            if path.is_file():
                schema = json.loads(path.read_text())
                registry = Resource.from_contents(schema) @ self._registry
                validator = jsonschema.Draft202012Validator(schema, registry=registry)
            self._validators[name] = validator
            return validator

    def validate(self, rt: ResourceType, obj: dict[str, Any]) -> Outcome:
        outcome = Outcome()
        validator = self._validator(rt)
        if validator is not None:
            for err in validator.iter_errors(obj):
                _convert_error(err, outcome, obj)
        return outcome


# --- CRD schemas ------------------------------------------------------------------------------------------

_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_DROP = {"nullable", "default", "description", "example", "externalDocs", "format", "title"}


def crd_to_jsonschema(schema: dict[str, Any], root: bool = True, closed: bool = True) -> dict[str, Any]:
    """Translate a structural CRD schema into Draft 4 JSON Schema that flags unknown fields. Objects inside
    ``allOf``/``anyOf``/``oneOf`` branches are never closed (``closed=False``): a branch only constrains the
    fields it names, and the structural schema around it already decides which fields are known."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes") or key in _DROP:
            continue
        if key == "properties":
            out[key] = {k: crd_to_jsonschema(v, False, closed) for k, v in value.items()}
        elif key in ("items", "not", "additionalProperties") and isinstance(value, dict):
            out[key] = crd_to_jsonschema(value, False, closed)
        elif key in _SUBSCHEMA_LISTS:
            out[key] = [crd_to_jsonschema(v, False, False) for v in value]
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    props = out.setdefault("properties", {}) if (root or schema.get("x-kubernetes-embedded-resource")) else \
        out.get("properties")
    if root or schema.get("x-kubernetes-embedded-resource"):
        assert props is not None
        props["apiVersion"] = {"type": "string"}
        props["kind"] = {"type": "string"}
        props["metadata"] = {"type": "object"}
    if closed and props is not None and not schema.get("x-kubernetes-preserve-unknown-fields") \
            and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def apply_defaults(schema: dict[str, Any], value: Any, root: bool = True) -> None:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if root and key == "metadata":
                continue
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(sub, value[key], False)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for item in value.values():
                apply_defaults(extra, item, False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item, False)


class CustomValidator:
    """Compiled validators for CRD versions, keyed by the CRD's name, version and resourceVersion."""

    def __init__(self) -> None:
        self.cel = CelRules()  # x-kubernetes-validations
        self._cache: dict[tuple[str, str, int], jsonschema.protocols.Validator] = {}
        self._lock = threading.Lock()

    def validate(self, rt: ResourceType, obj: dict[str, Any], crd_rv: int) -> Outcome:
        outcome = Outcome()
        if rt.schema is None:
            return outcome
        key = (rt.crd or "", rt.version, crd_rv)
        with self._lock:
            validator = self._cache.get(key)
            if validator is None:
                validator = jsonschema.Draft4Validator(crd_to_jsonschema(rt.schema))
                self._cache = {k: v for k, v in self._cache.items() if k[:2] != key[:2]}
                self._cache[key] = validator
        for err in validator.iter_errors(obj):
            _convert_error(err, outcome, obj)
        return outcome


def finish(outcome: Outcome, obj: dict[str, Any], mode: str) -> list[str]:
    """Resolve unknown fields by ``fieldValidation`` mode; return warnings (mode ``Warn``)."""
    if not outcome.unknown:
        return []
    if mode == "Strict":
        outcome.errors.extend(FieldError(path, f'unknown field "{path}"') for path in outcome.unknown)
        return []
    for path in sorted(outcome.unknown, key=len, reverse=True):
        prune(obj, path)
    return [f'unknown field "{path}"' for path in outcome.unknown] if mode == "Warn" else []
