"""A REST call's query and path arguments as its route's models take them (shared by app/rest.py's handler and
app/fast_reads.py)."""

from __future__ import annotations

import typing
from typing import Any

from tornado.escape import url_unescape

from app.api.base import Route
from app.openapi import SQLITE_MAX, SQLITE_MIN
from services.errors import Invalid
from services.models import RequestModel, parse


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(annotation))


def _is_int(annotation: Any) -> bool:
    if annotation is int:
        return True
    return any(_is_int(a) for a in typing.get_args(annotation))


def query_dict(model: type[RequestModel], arguments: dict[str, list[bytes]]) -> dict[str, Any]:
    """Query arguments to a dict for ``model``: list fields accept repeats and commas; an empty value
    (``?before=``) means the field was not given, for every field alike."""
    out: dict[str, Any] = {}
    too_big: list[dict[str, Any]] = []
    for key, raw in arguments.items():
        values = [v.decode() for v in raw if v.strip()]
        if not values:
            continue
        field = model.model_fields.get(key)
        if field is not None and _is_list(field.annotation):
            out[key] = [part for v in values for part in v.split(",") if part]
            continue
        out[key] = values[-1]
        if field is not None and _is_int(field.annotation) and _outside_sqlite(values[-1]):
            too_big.append({"field": key, "message": f"must be between {SQLITE_MIN} and {SQLITE_MAX}",
                            "type": "int_range"})
    if too_big:
        raise Invalid(f"invalid {model.__name__}: " + "; ".join(f"{e['field']}: {e['message']}" for e in too_big),
                      details={"fields": too_big})
    return out


def _outside_sqlite(value: str) -> bool:
    try:
        number = int(value.strip())
    except ValueError:
        return False  # not an integer at all: the model says so
    return not SQLITE_MIN <= number <= SQLITE_MAX


def call_query(route: Route, arguments: dict[str, list[bytes]]) -> Any:
    """The route's parsed query model, ``None`` when it has none."""
    return parse(route.query, query_dict(route.query, arguments)) if route.query else None


def path_arguments(params: dict[str, str]) -> dict[str, str]:
    """Path parameters as Tornado decodes its own (percent-decoded, then UTF-8: ``UnicodeDecodeError`` if not)."""
    return {k: url_unescape(v, encoding=None, plus=False).decode("utf-8") for k, v in params.items()}
