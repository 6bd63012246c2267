"""REST routes of the tokens noun (``services/tokens.py``): admin only, and not offered to agents."""

from __future__ import annotations

from app.api.base import Call, Reply, Route
from services.auth import TokenCreate, TokenCreated, TokenInfo
from services.tokens import Tokens
from services.verbs import role_of


def _tokens_list(call: Call) -> Reply:
    return Reply(call.services.token_verbs.list_tokens(call.principal))


def _tokens_create(call: Call) -> Reply:
    return Reply(call.services.token_verbs.create_token(call.principal, call.body), status=201)


def _tokens_revoke(call: Call) -> Reply:
    return Reply(call.services.token_verbs.revoke_token(call.principal, call.path["id"]))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/tokens", "tokens_list", "List API tokens", role_of(Tokens.list_tokens), _tokens_list,
          response=TokenInfo, many=True, tag="tokens", mcp=False),
    Route("POST", "/api/v1/tokens", "tokens_create", "Create an API token", role_of(Tokens.create_token),
          _tokens_create,
          body=TokenCreate, response=TokenCreated, read_only=False, idempotent=False, status=201,
          tag="tokens", mcp=False),
    Route("DELETE", "/api/v1/tokens/{id}", "tokens_revoke", "Revoke an API token", role_of(Tokens.revoke_token),
          _tokens_revoke,
          response=TokenInfo, path_params={"id": "token id (the part after 'ist_')"}, read_only=False,
          destructive=True, tag="tokens", mcp=False),
]
