"""What this installation is about to create, or created, for a cluster, where AWS gives no tag to find it by.

A VPC CIDR block association carries no tags, and a crash between ``AssociateVpcCidrBlock`` and the
compute subnet's create (which carries the association's id in a tag) would leave a block nobody can
prove ours: a brand-new operation, or a delete, sees one more block in the user's VPC. So the intent is
written here, in a transaction of its own, *before* the call; the call's answer completes the row. Any
later ``ensure_compute_subnet`` and the network teardown read it: an association whose CIDR is recorded
for the cluster and the VPC is ours. Rows are keyed by cluster, kind, scope (the VPC) and key (the
CIDR); the teardown drops a row once what it names is gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.clock import Clock
from services.db import Database

CIDR_BLOCK = "vpc-cidr-block"  # scope: the VPC id; key: the CIDR; ref: the association id once AWS answered


@dataclass(frozen=True)
class Intent:
    cluster: str
    kind: str
    scope: str
    key: str
    ref: str | None  # what AWS answered (an id), None while only intended
    recorded_at: float


class ResourceIntents:
    """The ``resource_intents`` table: each write commits on its own, before (or right after) the AWS call."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    def intend(self, cluster: str, kind: str, scope: str, key: str) -> None:
        """Record, durably and before the call, that ``key`` is about to be created in ``scope``."""
        with self.db.tx() as conn:
            conn.execute("INSERT OR IGNORE INTO resource_intents (cluster, kind, scope, key, ref, recorded_at) "
                         "VALUES (?, ?, ?, ?, NULL, ?)", (cluster, kind, scope, key, self.clock.now()))

    def created(self, cluster: str, kind: str, scope: str, key: str, ref: str) -> None:
        """Complete an intent with what AWS answered."""
        with self.db.tx() as conn:
            conn.execute("UPDATE resource_intents SET ref = ? WHERE cluster = ? AND kind = ? AND scope = ? AND key = ?",
                         (ref, cluster, kind, scope, key))

    def recorded(self, cluster: str, kind: str, scope: str | None = None) -> list[Intent]:
        rows = self.db.query("SELECT * FROM resource_intents WHERE cluster = ? AND kind = ? AND (? IS NULL OR "
                             "scope = ?) ORDER BY scope, key", (cluster, kind, scope, scope))
        return [Intent(r["cluster"], r["kind"], r["scope"], r["key"], r["ref"], r["recorded_at"]) for r in rows]

    def forget(self, cluster: str, kind: str, scope: str, key: str) -> None:
        """Drop an intent whose resource is gone (or was never made)."""
        with self.db.tx() as conn:
            conn.execute("DELETE FROM resource_intents WHERE cluster = ? AND kind = ? AND scope = ? AND key = ?",
                         (cluster, kind, scope, key))

