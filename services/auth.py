"""API tokens with roles. Tokens are stored hashed; the secret is shown once, when it is made.

A token reads ``ist_<id>_<secret>``: the id finds the row, the hash of the whole token proves it. Roles are
ordered: ``viewer`` reads, ``operator`` mutates, ``admin`` also destroys and manages tokens. Every REST
route declares the least role it needs; :meth:`Principal.require` is the single check.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pydantic import Field

from services.clock import Clock
from services.db import Database
from services.errors import Conflict, Forbidden, NotFound, Unauthorized
from services.models import RequestModel, ResponseModel


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]  # checked several times per request: a lookup, not a walk of the enum


_RANK = {role: i for i, role in enumerate(Role)}


@dataclass(frozen=True)
class Principal:
    """Who is calling, through which face. ``name`` goes into the audit log.

    ``face`` is the transport the server saw (``ui``: a dashboard session, ``api``: a bearer token, ``cli``,
    ``system``); ``client`` is what the caller says it is (the ``X-InstantStart-Face`` header, e.g. ``mcp``),
    recorded as a claim and never trusted. ``session`` is the dashboard session id, when there is one."""

    name: str
    role: Role
    token_id: str | None = None
    face: str = "api"
    client: str = ""
    session: str | None = field(default=None, repr=False)

    @property
    def scope(self) -> str:
        """What idempotency keys are scoped to: the token, else the name (dev mode, CLI, system)."""
        return f"token:{self.token_id}" if self.token_id else f"name:{self.name}"

    def allows(self, role: Role) -> bool:
        return self.role.rank >= role.rank

    def require(self, role: Role) -> None:
        if not self.allows(role):
            raise Forbidden(
                f"this needs the {role.value} role; token {self.name!r} has {self.role.value}",
                details={"required_role": role.value, "role": self.role.value},
            )

    def via(self, face: str) -> Principal:
        return replace(self, face=face)


SYSTEM = Principal("system", Role.ADMIN, None, "system")


class TokenCreate(RequestModel):
    """Make a new API token. Its secret is returned once and never again."""

    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$",
                      description="a label for the token, e.g. 'ci' or 'alice'")
    role: Role = Field(..., description="viewer (read), operator (mutate) or admin (destroy, tokens)")


class TokenInfo(ResponseModel):
    id: str
    name: str
    role: Role
    created_at: float
    created_by: str
    last_used_at: float | None = None
    revoked: bool = False


class TokenCreated(TokenInfo):
    token: str = Field(..., description="the secret; store it now, it is not shown again")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


#: one answer for every token that does not sign in, so the answer never tells which token ids exist
INVALID_TOKEN = "unknown token: check that it was copied whole; a revoked token is refused the same way"
_NO_HASH = _hash("ist_00000000_no-such-token")
TOKEN_ID = re.compile(r"^[0-9a-f]{8}$")
MAX_CLIENTS_KEPT = 16  # principals kept per cached token, one per (face, client claim) it was answered for


def token_id_of(token: str) -> str | None:
    """The id part of ``ist_<id>_<secret>`` when it is well formed (safe to log and audit), else None."""
    parts = token.split("_", 2)
    if len(parts) == 3 and parts[0] == "ist" and TOKEN_ID.match(parts[1]):
        return parts[1]
    return None


@dataclass(frozen=True)
class _Admitted:
    """A token that signed in here: who it is, when its last use was recorded, and under which generation;
    ``principals`` keeps the principal made for each (face, client) it was answered for (a few at most)."""

    name: str
    role: Role
    token_id: str
    touched_at: float
    generation: tuple[int, int, int]
    principals: dict[tuple[str, str], Principal] = field(default_factory=dict, compare=False)


class TokenStore:
    """Token rows, and an in-memory cache of the principals of tokens that signed in (keyed by the sha256 of
    the whole token), so a request with a known token needs no database read and no thread.

    The cache holds only tokens that signed in; an unknown, wrong or revoked token always takes the database
    path (same work, same answer). Every revocation, by this process or another one with the same data
    directory (the CLI), replaces the *generation file* next to the database; :meth:`cached` compares that
    file's identity with the one its entry was admitted under. A revocation by this process clears the cache
    at once; one by another process is seen within ``GENERATION_RECHECK`` seconds, as the file is looked at
    (one ``stat``, ~7 µs, the largest piece of a cached sign-in) at most that often. ``last_used_at`` is
    still recorded at most every ``TOUCH_INTERVAL``: an entry that is due is not answered from memory, and
    the database path records the use."""

    # last_used_at is refreshed at most this often, so reads do not turn into writes
    TOUCH_INTERVAL = 60.0
    #: the generation file is looked at (``stat``) at most this often while cached tokens are answered
    GENERATION_RECHECK = 0.05

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.generation_path = db.path.with_name(db.path.name + ".tokens-generation")
        self._admitted: dict[str, _Admitted] = {}
        self._seen: tuple[float, tuple[int, int, int]] | None = None  # (when, the generation then)
        # revocations by this process, counted once the new generation file is in place; what was read before
        # one (a generation, a token row) is stored only if none happened since (compare-and-set under the lock)
        self._lock = threading.Lock()
        self._revocations = 0

    def _current_generation(self) -> tuple[int, int, int]:
        """The generation as of at most ``GENERATION_RECHECK`` seconds ago (a clock gone back looks again)."""
        now, seen = self.clock.now(), self._seen
        if seen is not None and 0 <= now - seen[0] < self.GENERATION_RECHECK:
            return seen[1]
        revocations, generation = self._observe()
        with self._lock:
            if revocations == self._revocations:
                self._seen = (now, generation)
        return generation

    def _observe(self) -> tuple[int, tuple[int, int, int]]:
        """This process's revocation count, then the generation file's identity (in that order: a count that
        is still current when a result is stored means the file was read after every revocation counted)."""
        with self._lock:
            revocations = self._revocations
        return revocations, self._generation()

    def _generation(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.generation_path)
        except FileNotFoundError:
            return (0, 0, 0)
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def _bump_generation(self) -> None:
        """A token was revoked: every process's cached principals are void (their next request re-reads)."""
        with self._lock:
            self._admitted.clear()
            self._seen = None
        fresh = self.generation_path.with_name(f"{self.generation_path.name}.{secrets.token_hex(4)}")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(8).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(fresh, self.generation_path)  # a new inode: the identity every reader compares
        with self._lock:  # after the file: a sign-in that read the old one cannot store it or its row any more
            self._revocations += 1
            self._admitted.clear()
            self._seen = None

    def cached(self, token: str, face: str = "api", client: str = "") -> Principal | None:
        """The principal of a token that signed in before, from memory; ``None`` means "ask
        :meth:`authenticate`" (never seen, revoked since, or its last use is due to be recorded)."""
        entry = self._admitted.get(_hash(token))
        if entry is None or entry.generation != self._current_generation():
            return None
        if self.clock.now() - entry.touched_at > self.TOUCH_INTERVAL:
            return None
        principal = entry.principals.get((face, client))
        if principal is None:  # frozen, so one per (face, client) is shared by the token's requests
            if len(entry.principals) >= MAX_CLIENTS_KEPT:
                entry.principals.clear()
            principal = entry.principals[face, client] = Principal(entry.name, entry.role, entry.token_id, face,
                                                                   client)
        return principal

    def create(self, request: TokenCreate, created_by: str) -> TokenCreated:
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM tokens WHERE name=? AND revoked_at IS NULL",
                            (request.name,)).fetchone():
                raise Conflict(f"an active token named {request.name!r} exists; revoke it or pick another name")
            return self._insert(conn, request.name, request.role, created_by)

    def _insert(self, conn: Any, name: str, role: Role, created_by: str) -> TokenCreated:
        token_id = secrets.token_hex(4)
        token = f"ist_{token_id}_{secrets.token_urlsafe(32)}"
        now = self.clock.now()
        conn.execute("INSERT INTO tokens(id, name, role, hash, created_at, created_by) VALUES (?,?,?,?,?,?)",
                     (token_id, name, role.value, _hash(token), now, created_by))
        return TokenCreated(id=token_id, name=name, role=role, created_at=now, created_by=created_by, token=token)

    def bootstrap_admin(self) -> str | None:
        """On the very first start, make an admin token and return its secret; afterwards, ``None``.

        The marker and the token are written together, so a crash or a name clash cannot leave an
        installation marked as bootstrapped without its admin token."""
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM meta WHERE key='bootstrapped'").fetchone():
                return None
            conn.execute("INSERT INTO meta(key, value) VALUES ('bootstrapped', '1')")
            taken = conn.execute("SELECT 1 FROM tokens WHERE name='admin' AND revoked_at IS NULL").fetchone()
            name = f"admin-{secrets.token_hex(3)}" if taken else "admin"
            return self._insert(conn, name, Role.ADMIN, "first-start").token

    def authenticate(self, token: str, face: str = "api", client: str = "") -> Principal:
        """The principal of a presented token. Unknown and revoked tokens get the same answer after the
        same work (one row read, one hash comparison), so neither the message nor the time tells them apart."""
        token_id = token_id_of(token)
        if token_id is None:
            raise Unauthorized("malformed token; expected 'ist_<id>_<secret>'")
        revocations, generation = self._observe()  # before the row: a revocation after it voids what is read
        row = self.db.query_one("SELECT * FROM tokens WHERE id=?", (token_id,))
        hashed = _hash(token)
        matches = hmac.compare_digest(row["hash"] if row is not None else _NO_HASH, hashed)
        if row is None or not matches or row["revoked_at"] is not None:
            raise Unauthorized(INVALID_TOKEN)
        now = self.clock.now()
        touched = row["last_used_at"]
        if touched is None or now - touched > self.TOUCH_INTERVAL:
            with self.db.tx() as conn:
                conn.execute("UPDATE tokens SET last_used_at=? WHERE id=?", (now, row["id"]))
            touched = now
        with self._lock:
            if revocations == self._revocations:  # else a revocation ran meanwhile: the next request re-reads
                self._seen = (now, generation)
                self._admitted[hashed] = _Admitted(row["name"], Role(row["role"]), row["id"], touched, generation)
        return Principal(row["name"], Role(row["role"]), row["id"], face, client)

    def principal(self, token_id: str, face: str) -> Principal:
        """The principal behind an active token id (a dashboard session's token)."""
        row = self.db.query_one("SELECT * FROM tokens WHERE id=? AND revoked_at IS NULL", (token_id,))
        if row is None:
            raise Unauthorized("session token is unknown or revoked; log in again")
        return Principal(row["name"], Role(row["role"]), row["id"], face)

    def list(self) -> list[TokenInfo]:
        rows = self.db.query("SELECT * FROM tokens ORDER BY created_at, id")
        return [
            TokenInfo(id=r["id"], name=r["name"], role=Role(r["role"]), created_at=r["created_at"],
                      created_by=r["created_by"], last_used_at=r["last_used_at"],
                      revoked=r["revoked_at"] is not None)
            for r in rows
        ]

    def revoke(self, token_id: str, by: Principal) -> TokenInfo:
        with self.db.tx() as conn:
            row = conn.execute("SELECT * FROM tokens WHERE id=?", (token_id,)).fetchone()
            if row is None:
                raise NotFound(f"no token with id {token_id!r}")
            if row["revoked_at"] is not None:
                raise Conflict(f"token {token_id!r} is already revoked")
            if token_id == by.token_id:
                raise Conflict("a token cannot revoke itself; use another admin token")
            conn.execute("UPDATE tokens SET revoked_at=? WHERE id=?", (self.clock.now(), token_id))
        self._bump_generation()
        return next(t for t in self.list() if t.id == token_id)
