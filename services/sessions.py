"""Dashboard sessions, kept server-side, and the sign-in throttle.

A session is a row: the cookie carries a random session id (signed), the row only its hash, so neither the
database nor a backup of it holds anything a browser could present. A session ends when its owner signs
out, when it has been idle longer than the idle timeout, when its lifetime is over, or when its token is
revoked; after that the cookie opens nothing, wherever it was copied to. Each session has its own XSRF
token, so a token an attacker planted in a cookie never matches the session it is sent with.

The throttle delays sign-ins (it never locks out): behind SSM port forwarding every client is 127.0.0.1,
and a lockout would lock out the admin along with the attacker.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from services.auth import Principal, TokenStore
from services.clock import Clock
from services.db import Database
from services.errors import Unauthorized


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class NewSession:
    id: str = ""
    xsrf: str = ""


class SessionStore:
    #: last_seen_at is written at most this often (a fraction of the idle timeout), so reads stay reads
    TOUCH_FRACTION = 0.05

    def __init__(self, db: Database, clock: Clock, tokens: TokenStore, *, lifetime: float,
                 idle_timeout: float) -> None:
        self.db = db
        self.clock = clock
        self.tokens = tokens
        self.lifetime = lifetime
        self.idle_timeout = idle_timeout

    def open(self, principal: Principal) -> NewSession:
        """A new session for a principal that just signed in with its token."""
        if principal.token_id is None:
            raise Unauthorized("only a token can open a dashboard session")
        session = NewSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        now = self.clock.now()
        with self.db.tx() as conn:
            conn.execute("INSERT INTO sessions(id_hash, token_id, xsrf_hash, created_at, last_seen_at, expires_at)"
                         " VALUES (?,?,?,?,?,?)", (_hash(session.id), principal.token_id, _hash(session.xsrf),
                                                  now, now, now + self.lifetime))
            # ended sessions are kept a lifetime for the record, then dropped
            conn.execute("DELETE FROM sessions WHERE expires_at < ?", (now - self.lifetime,))
        return session

    def principal(self, session_id: str, face: str = "ui", *, touch: bool = True) -> Principal:
        """The principal of a live session (its token still active); a request (``touch``) refreshes its idle
        clock, a background re-check does not."""
        now = self.clock.now()
        row = self.db.query_one("SELECT * FROM sessions WHERE id_hash=?", (_hash(session_id),))
        if row is None or row["ended_at"] is not None:
            raise Unauthorized("this session has ended; sign in again")
        ended = ("expired" if now >= row["expires_at"] else
                 "idle" if now - row["last_seen_at"] > self.idle_timeout else None)
        if ended is not None:
            self._end(row["id_hash"], ended, now)
            raise Unauthorized(f"this session has ended ({ended}); sign in again")
        principal = self.tokens.principal(row["token_id"], face)
        if touch and now - row["last_seen_at"] > self.idle_timeout * self.TOUCH_FRACTION:
            with self.db.tx() as conn:
                conn.execute("UPDATE sessions SET last_seen_at=? WHERE id_hash=? AND ended_at IS NULL",
                             (now, row["id_hash"]))
        return Principal(principal.name, principal.role, principal.token_id, face, session=session_id)

    def check_xsrf(self, session_id: str, presented: str | None) -> bool:
        """Whether ``presented`` is this session's own XSRF token."""
        if not presented:
            return False
        row = self.db.query_one("SELECT xsrf_hash FROM sessions WHERE id_hash=?", (_hash(session_id),))
        return row is not None and hmac.compare_digest(row["xsrf_hash"], _hash(presented))

    def end(self, session_id: str, reason: str = "signed out") -> bool:
        """End a session (sign-out); True when it was live."""
        return self._end(_hash(session_id), reason, self.clock.now())

    def _end(self, id_hash: str, reason: str, now: float) -> bool:
        with self.db.tx() as conn:
            cur = conn.execute("UPDATE sessions SET ended_at=?, end_reason=? WHERE id_hash=? AND ended_at IS NULL",
                               (now, reason, id_hash))
        return cur.rowcount == 1


@dataclass
class _Failures:
    count: int = 0
    next_at: float = 0.0
    last: float = 0.0
    pending: int = 0


class SignInThrottle:
    """An exponential delay on failed sign-ins per (client address, token id).

    The token is checked first: a correct one is admitted at once, whatever failed before it (so knowing a
    token id never locks its owner out; behind SSM port forwarding every client is 127.0.0.1). A failure
    is answered only after its delay: after n failures ``base * 2**(n-1)`` seconds (at most ``cap``), and
    failures that arrive together wait in turn, each behind the one before, so parallel guessing is no
    faster than sequential. At most ``MAX_PENDING`` failures of one key wait at a time; more are refused
    at once with 429. A success clears the key."""

    MAX_KEYS = 10_000
    MAX_PENDING = 32

    def __init__(self, clock: Clock, *, base: float, cap: float) -> None:
        self.clock = clock
        self.base = base
        self.cap = cap
        self._keys: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._lock = threading.Lock()

    def _step(self, count: int) -> float:
        return 0.0 if count == 0 else min(self.cap, self.base * 2 ** min(count - 1, 30))

    def failed(self, address: str, token_id: str) -> float | None:
        """Record a failure; the seconds to wait before answering it (queued behind the key's other
        failures, each step at most ``cap``), or None when too many already wait (answer 429 at once)."""
        now = self.clock.now()
        with self._lock:
            key = (address, token_id)
            state = self._keys.pop(key, None) or _Failures()
            if state.count and not state.pending and now - state.last > 10 * max(self.cap, 1.0):
                state = _Failures()  # long quiet: start over
            self._keys[key] = state
            while len(self._keys) > self.MAX_KEYS:
                self._keys.popitem(last=False)
            if state.pending >= self.MAX_PENDING:
                return None
            state.count += 1
            state.last = now
            start = max(now, state.next_at)
            state.next_at = start + self._step(state.count)
            state.pending += 1
            return state.next_at - now

    def answered(self, address: str, token_id: str) -> None:
        """A delayed failure has been answered (or its client went away)."""
        with self._lock:
            state = self._keys.get((address, token_id))
            if state is not None and state.pending:
                state.pending -= 1

    def succeeded(self, address: str, token_id: str) -> None:
        if (address, token_id) not in self._keys:  # the usual case, without the lock: nothing to clear
            return
        with self._lock:
            self._keys.pop((address, token_id), None)
