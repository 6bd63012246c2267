"""The ``tokens`` noun (admin): list, create, revoke. Each verb's side effects — the audit row, and for a
revocation the ``token``/``revoked`` event that closes the token's open WebSockets — happen inside it,
once, whichever face calls it (REST, CLI)."""

from __future__ import annotations

from services.audit import AuditLog
from services.auth import Principal, Role, TokenCreate, TokenCreated, TokenInfo, TokenStore
from services.events import Event, EventBus
from services.verbs import verb


class Tokens:
    def __init__(self, store: TokenStore, audit: AuditLog, bus: EventBus) -> None:
        self.store = store
        self.audit = audit
        self.bus = bus

    @verb(Role.ADMIN)
    def list_tokens(self, principal: Principal) -> list[TokenInfo]:
        return self.store.list()

    @verb(Role.ADMIN)
    def create_token(self, principal: Principal, request: TokenCreate) -> TokenCreated:
        created = self.store.create(request, created_by=principal.name)
        self.audit.record(principal, "token.create", created.id, {"name": created.name, "role": created.role.value},
                          "succeeded")
        return created

    @verb(Role.ADMIN)
    def revoke_token(self, principal: Principal, token_id: str) -> TokenInfo:
        info = self.store.revoke(token_id, principal)
        self.audit.record(principal, "token.revoke", info.id, {}, "succeeded")
        self.bus.publish(Event("token", "revoked", {"id": info.id}))  # its open WebSockets close
        return info
