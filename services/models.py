"""Base request model and validation helpers shared by REST, panes and MCP tool schemas.

Requests forbid unknown fields. An unknown field is answered with the closest known name, so an agent
that guessed ``instancetype`` learns ``instance_type`` in one round trip instead of three.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from services.errors import Invalid

#: where training jobs, model downloads and their logs live unless the user picks another namespace: HyperPod's
#: job auto-resume recognises only ``kubeflow`` or a ``hyperpod``-prefixed namespace
TRAINING_NAMESPACE = "hyperpod-ns-training"
#: the service account training pods run as (the MLflow pod identity association names it)
TRAINING_SERVICE_ACCOUNT = "instantstart-training"

M = TypeVar("M", bound=BaseModel)


class RequestModel(BaseModel):
    """Base of every request body and query: unknown fields are rejected, not dropped."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class ResponseModel(BaseModel):
    """Base of response bodies; responses may grow fields, so clients must ignore unknown ones."""

    model_config = ConfigDict(extra="ignore")


class ReusedResponse(ResponseModel):
    """A response that a memory-only read hands out many times, unchanged, until what it was derived from
    changes (a cluster's detail, the status summary): its JSON is encoded once, when a face first asks
    (:meth:`encoded`), and kept with it. Nothing changes such an object after it is handed out; a copy that
    differs (``model_copy``) gets its own encoding (:meth:`with_encoded`), never its original's."""

    _encoded: str | None = PrivateAttr(default=None)

    def encoded(self) -> str:
        """This response as JSON (``model_dump_json()``), encoded at most once."""
        private = self.__pydantic_private__  # read directly: ``self._encoded`` goes through pydantic's __getattr__
        assert private is not None
        text: str | None = private.get("_encoded")
        if text is None:
            text = private["_encoded"] = self.model_dump_json()
        return text

    def with_encoded(self, text: str) -> None:
        """Set the encoding of a copy made from an encoded original (``text`` is what it encodes to)."""
        assert self.__pydantic_private__ is not None
        self.__pydantic_private__["_encoded"] = text


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model inside an annotation such as ``list[Foo] | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return None
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """Walk a pydantic error location down to the model that owns its last key."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return current if part == loc[-1] else None
        current = _nested_model(field.annotation)
    return current


def _suggest(model: type[BaseModel] | None, name: str) -> str | None:
    if model is None:
        return None
    names = list(model.model_fields)
    names += [f.alias for f in model.model_fields.values() if f.alias]
    match = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if not match:
        match = [n for n in names if n.replace("_", "").lower() == name.replace("_", "").lower()][:1]
    return match[0] if match else None


def field_errors(model: type[BaseModel], exc: ValidationError) -> list[dict[str, Any]]:
    """Every field error of ``exc`` as ``{"field", "message", "type"}``, with did-you-mean hints."""
    out: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(body)"
        message = str(err["msg"])
        if err["type"] == "extra_forbidden" and loc:
            owner = _model_at(model, loc[:-1]) if len(loc) > 1 else model
            hint = _suggest(owner, str(loc[-1]))
            message = "unknown field" + (f". Did you mean '{hint}'?" if hint else "")
            if owner is not None:
                message += f" Known fields: {', '.join(owner.model_fields)}."
        out.append({"field": field, "message": message, "type": err["type"]})
    return out


def parse(model: type[M], data: Any) -> M:
    """Validate ``data`` into ``model`` or raise :class:`Invalid` listing *all* field errors."""
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(model, exc)
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        raise Invalid(f"invalid {model.__name__}: {summary}", details={"fields": errors}) from None
