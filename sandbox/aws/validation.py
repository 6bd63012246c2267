"""Server-side input validation as AWS does it, driven by the installed botocore service model.

botocore checks only types, unknown members, required members and minimums on the client; enums, patterns,
maximum lengths and maximum values are checked by the service. The sandbox must reject the same requests
AWS rejects, with the same error: one ``ValidationException`` listing *every* violation, worded like AWS's
Coral framework ("2 validation errors detected: Value 'x' at 'clusterName' failed to satisfy constraint:
Member must satisfy regular expression pattern: ..."). Member paths use the wire name with a lower-case
first letter and ``.N.member.`` for list items, as AWS writes them.

AWS patterns are Java regular expressions matched against the whole value; :func:`java_regex` translates
the constructs Python's ``re`` cannot parse (``\\p{L}``-style Unicode categories, ``\\p{Alnum}``, a
``(?i)`` that is not at the start, UTF-16 surrogate-pair ranges). This module never mutates the params.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from typing import Any

from botocore.model import ListShape, MapShape, OperationModel, Shape, StringShape, StructureShape

from .base import AwsError

MAX_ENUM_SHOWN = 2000  # AWS lists the whole enum value set in the message


@functools.lru_cache(maxsize=1)
def _category_ranges() -> dict[str, str]:
    """Character-class bodies (ranges) for each one-letter Unicode general category (L, M, N, P, S, Z, C)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for code in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(code))[0]
        spans = ranges.setdefault(cat, [])
        if spans and spans[-1][1] == code - 1:
            spans[-1] = (spans[-1][0], code)
        else:
            spans.append((code, code))

    def body(spans: list[tuple[int, int]]) -> str:
        return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in spans)

    return {cat: body(spans) for cat, spans in ranges.items()}


_POSIX = {"Alnum": "a-zA-Z0-9", "Alpha": "a-zA-Z", "Digit": "0-9", "Upper": "A-Z", "Lower": "a-z",
          "Punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "Space": " \\t\\n\\x0b\\f\\r",
          "XDigit": "0-9a-fA-F"}
_PROPERTY = re.compile(r"\\p\{(\w+)\}")


def _property_body(name: str) -> str:
    if name in _POSIX:
        return _POSIX[name]
    cat = name[:1]
    ranges = _category_ranges()
    if len(name) <= 2 and cat in ranges:
        return ranges[cat]
    raise ValueError(f"unsupported Java regex property \\p{{{name}}}")


def _translate_properties(pattern: str) -> str:
    """Replace ``\\p{X}`` with its ranges: bare inside a character class, bracketed outside one."""
    out: list[str] = []
    i = 0
    in_class = False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            match = _PROPERTY.match(pattern, i)
            if match:
                body = _property_body(match.group(1))
                out.append(body if in_class else f"[{body}]")
                i = match.end()
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def java_regex(pattern: str) -> re.Pattern[str]:
    """Compile an AWS (Java) pattern for :func:`re.fullmatch`-style use (Java's ``String.matches``)."""
    flags = 0
    if "(?i)" in pattern:
        pattern = pattern.replace("(?i)", "")
        flags |= re.IGNORECASE
    # Java strings are UTF-16: a surrogate-pair range means "every supplementary character".
    pattern = pattern.replace("\\uD800\\uDC00-\\uDBFF\\uDFFF", "\\U00010000-\\U0010FFFF")
    pattern = _translate_properties(pattern)
    # Java accepts a quantifier on the end anchor (seen in tag patterns as "$" + "{1,128}"); it means "$".
    pattern = re.sub(r"\$\{\d+(,\d*)?\}", "$", pattern)
    return re.compile(pattern, flags)


def _wire_name(member: str, shape: Shape) -> str:
    name = str(shape.serialization.get("name", member))
    return name[:1].lower() + name[1:]


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, value: Any, path: str, constraint: str) -> None:
        shown = "null" if value is None else f"'{_show(value)}'"
        self.errors.append(f"Value {shown} at '{path}' failed to satisfy constraint: {constraint}")

    def check(self, shape: Shape, value: Any, path: str) -> None:
        if value is None:
            return
        meta = shape.metadata
        if isinstance(shape, StructureShape):
            self._structure(shape, value, path)
        elif isinstance(shape, ListShape):
            self._sized(meta, value, path, "length")
            if isinstance(value, list):
                for index, item in enumerate(value, start=1):
                    self.check(shape.member, item, f"{path}.{index}.member" if path else str(index))
        elif isinstance(shape, MapShape):
            self._sized(meta, value, path, "length")
            if isinstance(value, dict):
                for key, item in value.items():
                    self._scalar(shape.key, key, f"{path}.key", "Map keys must satisfy constraint: ")
                    self.check(shape.value, item, f"{path}.{key}" if path else str(key))
        else:
            self._scalar(shape, value, path, "")

    def _structure(self, shape: StructureShape, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            return
        for name in shape.required_members:
            if value.get(name) is None:
                self.fail(None, self._join(path, name, shape.members[name]), "Member must not be null")
        for name, member in shape.members.items():
            if name in value:
                self.check(member, value[name], self._join(path, name, member))

    @staticmethod
    def _join(path: str, name: str, member: Shape) -> str:
        wire = _wire_name(name, member)
        return f"{path}.{wire}" if path else wire

    def _sized(self, meta: dict[str, Any], value: Any, path: str, what: str, prefix: str = "") -> None:
        try:
            size = len(value)
        except TypeError:
            return
        if "max" in meta and size > meta["max"]:
            self.fail(value, path, f"{prefix}Member must have {what} less than or equal to {meta['max']}")
        if "min" in meta and size < meta["min"]:
            self.fail(value, path, f"{prefix}Member must have {what} greater than or equal to {meta['min']}")

    def _scalar(self, shape: Shape, value: Any, path: str, prefix: str) -> None:
        meta = shape.metadata
        kind = shape.type_name
        if isinstance(shape, StringShape) and isinstance(value, str):
            if shape.enum and value not in shape.enum:
                values = ", ".join(shape.enum[:MAX_ENUM_SHOWN])
                self.fail(value, path, f"{prefix}Member must satisfy enum value set: [{values}]")
            self._sized(meta, value, path, "length", prefix)
            pattern = meta.get("pattern")
            if pattern and not java_regex(pattern).fullmatch(value):
                self.fail(value, path, f"{prefix}Member must satisfy regular expression pattern: {pattern}")
        elif kind in ("integer", "long", "float", "double") and isinstance(value, int | float) \
                and not isinstance(value, bool):
            if "max" in meta and value > meta["max"]:
                self.fail(value, path, f"{prefix}Member must have value less than or equal to {meta['max']}")
            if "min" in meta and value < meta["min"]:
                self.fail(value, path, f"{prefix}Member must have value greater than or equal to {meta['min']}")
        elif kind == "blob" and isinstance(value, bytes | str):
            self._sized(meta, value, path, "length", prefix)


def violations(operation: OperationModel, params: dict[str, Any]) -> list[str]:
    """Every constraint ``params`` break, in AWS's wording (empty when the input is valid)."""
    checker = _Checker()
    if operation.input_shape is not None:
        checker.check(operation.input_shape, params, "")
    return checker.errors


def validate(operation: OperationModel, params: dict[str, Any]) -> None:
    """Raise AWS's ``ValidationException`` listing every violation, or return when the input is valid."""
    errors = violations(operation, params)
    if errors:
        noun = "error" if len(errors) == 1 else "errors"
        raise AwsError("ValidationException", f"{len(errors)} validation {noun} detected: " + "; ".join(errors))
