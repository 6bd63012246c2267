"""How a request finds the operation it already made, so a retried request never starts a second one.

An explicit ``Idempotency-Key`` and the derived key (the request's fingerprint, while its operation is
active) both belong to the principal that sent them: another token reusing a key, or sending the same
body, finds nothing of the first one's and learns nothing about it. A kind may also *coalesce*: while one
of its operations on a target is active, any request for that target joins it (a backup requested while
a backup runs is that backup).

Targets are paths (``cluster/<c>``, ``cluster/<c>/group/<g>``, ``cluster/<c>/node/<id>``). A request that
joins nothing conflicts with every active operation on its target, on a target enclosing it or on one it
encloses (a group scale and a cluster delete conflict; two groups do not): :func:`conflicting_operation`,
asked inside the transaction that would insert the row, so two racing submits cannot both pass.
"""

from __future__ import annotations

import hashlib
from typing import Any

from services.auth import Principal
from services.db import dumps
from services.errors import Conflict
from services.operation_views import ACTIVE
from services.stages import OperationKind


def request_fingerprint(kind_name: str, target: str, normalized: Any, principal: Principal) -> str:
    return hashlib.sha256(dumps([kind_name, target, normalized, principal.scope]).encode()).hexdigest()


def scoped_idempotency_key(key: str | None, principal: Principal) -> str | None:
    return None if key is None else f"{principal.scope}/{key}"


def existing_operation(conn: Any, kind: OperationKind[Any], target: str, fingerprint: str,
                       scoped_key: str | None) -> tuple[str | None, str]:
    """(operation id, audit outcome) of the operation this request joins, or (None, '') for a new one."""
    active = [s.value for s in ACTIVE]
    if scoped_key is not None:
        row = conn.execute("SELECT id, fingerprint FROM operations WHERE idempotency_key=?",
                           (scoped_key,)).fetchone()
        if row is not None:
            if row["fingerprint"] != fingerprint:
                raise Conflict("this Idempotency-Key was already used for a different request",
                               details={"operation_id": row["id"]})
            return row["id"], "deduplicated"
    else:
        row = conn.execute("SELECT id FROM operations WHERE fingerprint=? AND status IN (?,?,?) "
                           "ORDER BY created_at DESC LIMIT 1", (fingerprint, *active)).fetchone()
        if row is not None:
            return row["id"], "deduplicated"
    if kind.coalesce:
        row = conn.execute("SELECT id FROM operations WHERE kind=? AND target=? AND status IN (?,?,?) "
                           "ORDER BY created_at LIMIT 1", (kind.name, target, *active)).fetchone()
        if row is not None:
            return row["id"], "merged"
    return None, ""


def conflicting_operation(conn: Any, target: str) -> Any:
    """The oldest active operation on ``target``, an ancestor of it or a descendant of it, if any."""
    active = [s.value for s in ACTIVE]
    return conn.execute(
        "SELECT id, kind, target, status FROM operations WHERE status IN (?,?,?) AND ("
        " target = ?"
        " OR substr(?, 1, length(target) + 1) = target || '/'"  # an ancestor: cluster/c for cluster/c/group/g
        " OR substr(target, 1, length(?) + 1) = ? || '/'"  # a descendant: cluster/c/group/g for cluster/c
        ") ORDER BY created_at LIMIT 1", (*active, target, target, target, target)).fetchone()
