"""CRD validation rules (``x-kubernetes-validations``), evaluated with ``cel-python`` as the API server does.

Each rule is a CEL expression over ``self`` (the value at the schema node carrying it) and, for a
transition rule, ``oldSelf`` (the stored value at the same place): a transition rule runs only on an
update where the old value exists, with object properties and map entries correlated by key (array items
are not correlated, so their transition rules are skipped, as the API server does for lists that are not
``listType: map``). A rule that evaluates to false is the API server's 422 cause: ``<path>: Invalid value:
"<type>": <message>`` (the rule's ``message``, else ``failed rule: <rule>``; ``fieldPath`` appended to the
path). Rules are compiled once per process. A rule using a Kubernetes CEL library function that
``cel-python`` lacks fails to compile or evaluate and is skipped (listed in ``sandbox/README.md``): never
a refusal the API server would not give.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import celpy
from celpy.adapter import json_to_cel

from .errors import FieldError

log = logging.getLogger(__name__)
_MISSING = object()


class CelRules:
    """Compiled rules, shared by every cluster of an emulator."""

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._lock = threading.Lock()
        self._programs: dict[str, Any] = {}

    def _program(self, rule: str) -> Any:
        with self._lock:
            if rule not in self._programs:
                try:
                    self._programs[rule] = self._env.program(self._env.compile(rule))
                except Exception as exc:  # a Kubernetes extension cel-python does not know
                    log.info("CEL rule not evaluated (does not compile here): %s: %s", rule, exc)
                    self._programs[rule] = None
            return self._programs[rule]

    def errors(self, schema: dict[str, Any] | None, obj: Any, old: Any = None) -> list[FieldError]:
        found: list[FieldError] = []
        if schema is not None:
            self._walk(schema, obj, old if old is not None else _MISSING, "", found)
        return found

    def _walk(self, schema: dict[str, Any], value: Any, old: Any, path: str, found: list[FieldError]) -> None:
        if value is None:
            return
        for rule in schema.get("x-kubernetes-validations") or []:
            self._check(rule, value, old, path, found)
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key) if key in props else (extra if isinstance(extra, dict) else None)
                if sub is None:
                    continue
                before = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                self._walk(sub, item, before, f"{path}.{key}" if path else key, found)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                self._walk(schema["items"], item, _MISSING, f"{path}[{index}]", found)

    def _check(self, rule: dict[str, Any], value: Any, old: Any, path: str, found: list[FieldError]) -> None:
        text = rule.get("rule")
        if not isinstance(text, str):
            return
        transition = "oldSelf" in text
        if transition and old is _MISSING:
            return
        program = self._program(text)
        if program is None:
            return
        activation = {"self": json_to_cel(value)}
        if transition:
            activation["oldSelf"] = json_to_cel(old)
        try:
            result = program.evaluate(activation)
        except Exception as exc:
            log.info("CEL rule not evaluated: %s: %s", text, exc)
            return
        if isinstance(result, Exception) or bool(result):
            return
        message = rule.get("message") or f"failed rule: {text}"
        field = path + (rule.get("fieldPath") or "")
        field = field.lstrip(".")
        found.append(FieldError(field, f'Invalid value: "{_type_name(value)}": {message}'))


def _type_name(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"
