"""Response models several faces share (REST, panes, MCP tools): the answer to a mutation, who am I, health."""

from __future__ import annotations

from pydantic import Field

from services.auth import Role
from services.models import ResponseModel
from services.operations import STATUS_TOOL, OperationView


class Accepted(ResponseModel):
    """The answer to every mutation: the operation it started (or the one this request already made)."""

    operation: OperationView
    created: bool = Field(..., description="false when an identical request already made this operation")
    status_url: str
    status_tool: str = Field(STATUS_TOOL, description="the MCP tool that reports this operation's progress")
    message: str
    decided: list[str] = Field(default_factory=list, description="what the server decided for the caller (e.g. "
                                                                  "a training plan's zone and type), if anything")


class Whoami(ResponseModel):
    name: str
    role: Role
    face: str
    token_id: str | None = None
    allowed_roles: list[Role] = Field(..., description="roles whose routes this principal may call")


class Health(ResponseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
