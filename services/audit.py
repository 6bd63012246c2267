"""The audit log: who did what, through which face, and how it ended.

``face`` is the transport the server saw (``ui`` dashboard session, ``api`` bearer token, ``cli``,
``system``); ``client`` is what the caller claimed to be (``X-InstantStart-Face``, e.g. ``mcp``), kept as a
claim. Refused requests (failed sign-ins, 403s) are recorded too, by whoever they could be traced to.

Rows are append-only. Request bodies are stored as validated models dump them, so ``SecretStr`` fields are
already masked; nothing here ever sees a secret in clear.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.auth import Principal, Role
from services.clock import Clock
from services.db import Database, dumps, loads
from services.models import RequestModel, ResponseModel
from services.verbs import verb


class AuditEntry(ResponseModel):
    id: int
    ts: float
    actor: str
    role: str
    face: str = Field(..., description="the transport the server saw: ui (dashboard session), api (bearer token), "
                                        "cli or system; older rows may say rest or mcp")
    client: str = Field("", description="what the caller claimed to be (X-InstantStart-Face), e.g. mcp; "
                                        "a claim, not verified")
    action: str
    target: str
    request: Any
    outcome: str
    operation_id: str | None = None
    detail: str = ""


class AuditQuery(RequestModel):
    """Filter the audit log; newest first."""

    actor: str | None = Field(None, description="only rows by this token name")
    action: str | None = Field(None, description="only this action, e.g. 'backup.create' or 'token.create'")
    face: str | None = Field(None, description="ui, api, cli or system")
    client: str | None = Field(None, description="only rows whose caller claimed to be this client, e.g. mcp")
    operation_id: str | None = Field(None, description="only rows about this operation")
    before_id: int | None = Field(None, ge=1, description="page: rows with an id below this")
    limit: int = Field(50, ge=1, le=500, description="at most this many rows")


TARGET_MAX = 300
DETAIL_MAX = 1_000


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class AuditLog:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    def record(
        self,
        principal: Principal,
        action: str,
        target: str,
        request: Any,
        outcome: str,
        operation_id: str | None = None,
        detail: str = "",
        conn: Any = None,
    ) -> None:
        """Append a row; pass ``conn`` to make it part of the caller's transaction."""
        self._insert((self.clock.now(), principal.name, principal.role.value, principal.face, principal.client,
                      action, target, dumps(request), outcome, operation_id, detail), conn)

    def record_refusal(self, action: str, target: str, detail: str, *, face: str, client: str = "",
                       actor: str = "anonymous", role: str = "none") -> None:
        """A refused request whose caller is not (or not yet) a principal: a failed sign-in, a bad origin."""
        self._insert((self.clock.now(), actor, role, face, client, action, target, dumps({}), "denied", None,
                      detail), None)

    def _insert(self, row: tuple[Any, ...], conn: Any) -> None:
        # anonymous callers choose the path (target) and parts of the detail: bound what one row can cost
        row = (*row[:6], _clip(row[6], TARGET_MAX), *row[7:10], _clip(row[10], DETAIL_MAX))
        sql = ("INSERT INTO audit(ts, actor, role, face, client, action, target, request, outcome, operation_id,"
               " detail) VALUES (?,?,?,?,?,?,?,?,?,?,?)")
        if conn is not None:
            conn.execute(sql, row)
        else:
            with self.db.tx() as own:
                own.execute(sql, row)

    @verb(Role.VIEWER)
    def list_entries(self, principal: Principal, query: AuditQuery | None = None) -> list[AuditEntry]:
        """The audit trail, newest first (the ``audit`` noun's one read)."""
        return self.list(query or AuditQuery())

    def list(self, query: AuditQuery) -> list[AuditEntry]:
        where, params = [], []
        for column in ("actor", "action", "face", "client", "operation_id"):
            value = getattr(query, column)
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if query.before_id is not None:
            where.append("id<?")
            params.append(query.before_id)
        sql = "SELECT * FROM audit" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(query.limit)
        return [
            AuditEntry(id=r["id"], ts=r["ts"], actor=r["actor"], role=r["role"], face=r["face"],
                       client=r["client"], action=r["action"], target=r["target"], request=loads(r["request"]),
                       outcome=r["outcome"], operation_id=r["operation_id"], detail=r["detail"])
            for r in self.db.query(sql, params)
        ]
